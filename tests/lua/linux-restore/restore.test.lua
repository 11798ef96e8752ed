-- Fixture restore of a Linux guest whose user space (the agent) ran: the
-- restored VM is the snapshot's guest (its marker), the agent reconnects
-- over vsock and answers, and a snapshot of it restores again.
-- real_kernel.rs runs this file only where it works (not on kvm_pvm yet:
-- docs/vmm.md, "Not done yet").
local vm = provium:vm_fixture("base")

test("the restored guest is the fixture's, and its agent answers", function(t)
  t:assert_eq(vm:state(), "booted")
  t:assert_eq(vm:read_file("/etc/provium-fixture"), "base\n")
  t:assert_eq(vm:run("echo restored").stdout, "restored\n")
end)

test("snapshot then restore: the agent answers again, with the snapshot's files", function(t)
  vm:write_file("/tmp/before", "in the snapshot")
  local s = vm:snapshot()
  vm:write_file("/tmp/after", "not in the snapshot")
  vm:shutdown()
  vm:restore(s)
  t:assert_eq(vm:read_file("/tmp/before"), "in the snapshot")
  t:assert_raises(function() vm:stat("/tmp/after") end)
  s:delete()
end)

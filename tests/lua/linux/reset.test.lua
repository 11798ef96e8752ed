-- vm:reset() on a Linux guest restored from the base fixture: the guest
-- reboots through the boot path (a whole kernel boot, slow where the guest
-- kernel is emulated), its tmpfs state is gone, and a new Hello comes from
-- the restarted agent.
local vm = provium:vm_fixture("base")

test("reset: a new boot, a new agent, tmpfs state gone", function(t)
  vm:write_file("/tmp/before-reset", "x")
  local boot_id = vm:read_file("/proc/sys/kernel/random/boot_id")
  vm:reset()
  t:assert_eq(vm:state(), "booted")
  t:assert_raises(function() vm:stat("/tmp/before-reset") end)
  t:assert_neq(vm:read_file("/proc/sys/kernel/random/boot_id"), boot_id)
  t:assert_eq(vm:run("echo after-reset").stdout, "after-reset\n")
end)

-- provium.reset_between_tests: file-scope VMs are restored to the state
-- the chunk left them in before every test.
provium.reset_between_tests = true

local vm = provium:vm("reset", "linux"):boot()
vm:write_file("/srv/baseline", "base")

test("a test mutates file-scope state", function(t)
  t:assert_eq(vm:read_file("/srv/baseline"), "base")
  vm:write_file("/srv/baseline", "mutated")
  vm:write_file("/srv/extra", "x")
end)

test("a failing test mutates too", function(t)
  vm:write_file("/srv/baseline", "mutated again")
  t:assert(false, "deliberate failure")
end)

test("the next test sees the baseline again", function(t)
  t:assert_eq(vm:read_file("/srv/baseline"), "base")
  t:assert_raises(function() vm:stat("/srv/extra") end)
end)

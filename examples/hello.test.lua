-- A first look at Provium: one VM, commands, files, assertions.
local vm = provium:vm("hello", "linux"):boot()

test("runs a shell command", function(t)
  local r = vm:run("echo hello from $(hostname)")
  r:assert_ok()
  t:assert_eq(r.stdout, "hello from hello\n")
end)

test("argv form needs no shell", function(t)
  local r = vm:run("printf", {"%s-%s", "a", "b"})
  t:assert_eq(r.stdout, "a-b")
end)

test("files round-trip", function(t)
  vm:write_file("/tmp/greeting", "hi there")
  t:assert_eq(vm:read_file("/tmp/greeting"), "hi there")
  local st = vm:stat("/tmp/greeting")
  t:assert_eq(st.size, 8)
  t:assert_eq(st.entry_type, "file")
end)

test("exit codes and stderr are captured", function(t)
  local r = vm:run("echo oops >&2; exit 3")
  t:assert_eq(r.exit_code, 3)
  t:assert_eq(r.stderr, "oops\n")
  t:assert(not r:ok())
end)

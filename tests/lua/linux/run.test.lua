-- vm:run in every form, streams, signals and timeouts, inside a Linux guest
-- restored from the base fixture. Every run is a fork+exec in the guest,
-- which costs seconds when the guest kernel is emulated (kvm_pvm), so each
-- test makes few of them.
local vm = provium:vm_fixture("base")

test("the fixture's guest answers: its marker, its kernel, a shell", function(t)
  t:assert_eq(vm:state(), "booted")
  t:assert_eq(vm:read_file("/etc/provium-fixture"), "base\n")
  t:assert_eq(vm:read_file("/proc/sys/kernel/ostype"), "Linux\n")
  -- Booted with the agent overlay the backend built (the `linux` profile),
  -- not the prebuilt one devices.test.lua's guests carry.
  t:assert_raises(function() vm:read_file("/etc/provium-prebuilt-overlay") end)
  local r = vm:run("echo $((6 * 7)) $(cat /proc/sys/kernel/ostype) $$")
  t:assert_eq(r.status, "exited")
  t:assert_eq(r.exit_code, 0)
  local answer, os_type, pid = r.stdout:match("^(%d+) (%S+) (%d+)\n$")
  t:assert_eq(answer, "42")
  t:assert_eq(os_type, "Linux")
  t:assert(tonumber(pid) > 1, "the shell is not PID 1: " .. r.stdout)
end)

test("argv form: no shell, arguments verbatim", function(t)
  local r = vm:run("echo", {"$HOME", "a b"})
  t:assert_eq(r.stdout, "$HOME a b\n")
end)

test("opts form: env, cwd, stdin; env_clear leaves only the given keys", function(t)
  local r = vm:run("sh", {args = {"-c", "echo $FOO; pwd; cat"}, env = {FOO = "bar"}, cwd = "/proc", stdin = "piped"})
  t:assert_eq(r.stdout, "bar\n/proc\npiped")
  r = vm:run("/usr/bin/env", {args = {}, env = {ONLY = "1"}, env_clear = true})
  t:assert_eq(r.stdout, "ONLY=1\n")
end)

test("exit codes, stderr, a signalled command and a timeout", function(t)
  local r = vm:run("echo err >&2; exit 3")
  t:assert_eq(r.exit_code, 3)
  t:assert_eq(r.stderr, "err\n")
  t:assert(not r:ok())
  r = vm:run("kill -9 $$")
  t:assert_eq(r.status, "signalled")
  t:assert_eq(r.signal, 9)
  r = vm:run("sleep 600", {timeout = "3s"})
  t:assert(r.timed_out, "sleep 600 with a 3 s timeout did not time out")
end)

test("run_async: stdin, a live stdout stream, a signal by name", function(t)
  local p = vm:run_async("read line; echo got:$line; exec sleep 600")
  t:assert(p:pid() > 1)
  t:assert_eq(p:stdin_write("hello\n"), 6)
  local s = p:stdout_stream()
  s:expect("got:hello\n", "120s")
  t:assert_eq(p:status().running, true)
  p:kill("sigterm")
  t:assert_eq(p:wait("120s").signal, 15)
end)

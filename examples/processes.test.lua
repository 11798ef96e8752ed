-- Async processes, streams and timeouts.
local vm = provium:vm("procs", "linux"):boot()

test("a timeout kills the command", function(t)
  local r = vm:run("sleep 30", {timeout = "300ms"})
  t:assert(r.timed_out)
  t:assert_eq(r.exit_code, -2)
end)

test("stdin streams into a running process", function(t)
  local p = vm:run_async("cat")
  p:stdin_write("line one\n")
  p:close_stdin()
  local r = p:wait("5s")
  t:assert_eq(r.stdout, "line one\n")
end)

test("tail a log while it grows", function(t)
  vm:write_file("/tmp/app.log", "")
  local tail = vm:tail_file("/tmp/app.log", {start = "beginning"})
  vm:run("echo ready >> /tmp/app.log")
  tail:expect("ready", "5s")
end)

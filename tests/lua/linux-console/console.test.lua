-- The agent over the virtio-console channel (agent_channel = "console"),
-- restored from this suite's base fixture: runs with stdin and streams,
-- files bigger than a port buffer, workers and batches, and a snapshot in
-- the middle of a session. Each run is a fork+exec in an emulated guest
-- kernel on kvm_pvm: the tests make few of them.
local vm = provium:vm_fixture("base")

test("the agent serves on the console port, not vsock", function(t)
  t:assert_eq(vm:read_file("/etc/provium-fixture"), "base\n")
  local r = vm:run("cat /sys/class/virtio-ports/*/name; echo; cat /sys/bus/virtio/devices/*/device; cat /proc/cmdline")
  t:assert(r.stdout:find("^org.provium.agent\n") ~= nil, r.stdout)
  -- The VM has a console device (0x0003) and no vsock device (0x0013).
  t:assert_contains(r.stdout, "0x0003\n")
  t:assert(r.stdout:find("0x0013", 1, true) == nil, "a vsock device: " .. r.stdout)
  t:assert_contains(r.stdout, "provium.agent_channel=console")
end)

test("run: exit codes, stdin, a live stream and a signal", function(t)
  local r = vm:run("sh", {args = {"-c", "echo $FOO; cat; exit 3"}, env = {FOO = "bar"}, stdin = "piped"})
  t:assert_eq(r.stdout, "bar\npiped")
  t:assert_eq(r.exit_code, 3)
  local p = vm:run_async("read line; echo got:$line; exec sleep 600")
  t:assert_eq(p:stdin_write("hello\n"), 6)
  p:stdout_stream():expect("got:hello\n", "120s")
  p:kill("sigterm")
  t:assert_eq(p:wait("120s").signal, 15)
end)

test("files bigger than the port's buffers cross intact", function(t)
  -- 256 KiB: many 32 KiB port writes one way, 64 KiB host reads the other.
  local big = string.rep("0123456789abcdef", 16384)
  vm:write_file("/tmp/big", big)
  t:assert_eq(vm:run("wc -c < /tmp/big").stdout, "262144\n")
  t:assert_eq(vm:read_file("/tmp/big"), big)
  local r = vm:run("cat /tmp/big")
  t:assert_eq(#r.stdout, #big)
  t:assert(r.stdout == big, "the 256 KiB stdout came back changed")
end)

test("workers have their own handles; a batch is one round trip", function(t)
  local w = vm:spawn_worker()
  w:write_file("/tmp/w", "worker")
  local f = w:open_file("/tmp/w", {read = true})
  t:assert_eq(f:read(6), "worker")
  t:assert_eq(w:run("echo from worker").stdout, "from worker\n")
  w:close()
  local results = vm:batch(function(b)
    b:write_file("/tmp/ba", "1")
    b:read_file("/tmp/ba")
    b:stat("/tmp/missing")
  end)
  t:assert_eq(#results, 3)
  t:assert_eq(results[2].ok, "1")
  t:assert_contains(results[3].err, "No such file or directory")
end)

test("a snapshot mid-session: the original goes on, a restore starts afresh", function(t)
  vm:write_file("/tmp/before", "x")
  local s = vm:snapshot()
  -- The original VM keeps its session (the same connection).
  t:assert_eq(vm:read_file("/tmp/before"), "x")
  vm:write_file("/tmp/after", "only in the original")
  -- The restored VM's host side is new: the device tells the guest the old
  -- session is gone (PORT_OPEN 0), the agent closes and reopens the port,
  -- and only then does the new session start.
  local c = provium:vm("restored", "linux")
  c:restore(s)
  t:assert_eq(c:read_file("/tmp/before"), "x")
  t:assert_raises(function() c:stat("/tmp/after") end)
  t:assert_eq(c:run("echo fresh").stdout, "fresh\n")
  -- And again into the same VM: a second fresh session.
  c:shutdown()
  c:restore(s)
  t:assert_eq(c:run("echo again").stdout, "again\n")
  t:assert_eq(vm:run("echo original").stdout, "original\n")
  s:delete()
end)

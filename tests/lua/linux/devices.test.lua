-- virtio-blk faults and virtio-net through the switch, seen from inside two
-- Linux guests restored from the lab fixture `pair` (pair.fixture.lua): `a`
-- has a disk and a NIC, `b` a NIC, both on bridge `lan`.
local IMAGE_BYTES = 16 << 20

local pair = provium:lab_fixture("pair")
local a, b, lan = pair.a, pair.b, pair.lan
local disk = a:disk("data")

-- Reads a block of /dev/vda at `mib` MiB through the agent (guest user
-- space: open(2)/read(2) on the block device). Each call uses a fresh MiB so
-- the guest's page cache never answers for the device.
local dev = a:open_file("/dev/vda", {read = true})
local function read_at(mib)
  dev:seek(mib << 20)
  return dev:read(512)
end

test("the guest sees the disk as /dev/vda with the image's bytes and size", function(t)
  t:assert_eq(read_at(0), string.rep("d", 512))
  t:assert_eq(a:read_file("/sys/block/vda/size"), tostring(IMAGE_BYTES // 512) .. "\n")
end)

test("eio_read fails the guest's own read of /dev/vda; clearing it heals", function(t)
  disk:fault_inject("eio_read")
  t:assert_contains(t:assert_raises(function() read_at(1) end), "Input/output error")
  local r = a:run("dd if=/dev/vda of=/dev/null bs=4096 count=1 skip=1024")
  t:assert(not r:ok(), "dd under eio_read succeeded: " .. r.stdout .. r.stderr)
  t:assert_contains(r.stderr, "Input/output error")
  disk:clear_faults()
  t:assert_eq(read_at(2), string.rep("d", 512))
  t:assert_contains(a:console():read_log(), "I/O error, dev vda")
end)

test("slow: the guest's clock measures every request's delay", function(t)
  disk:clear_faults() -- whatever an earlier failed test left
  local c = a:clock()
  disk:fault_inject("slow")
  local before = c:get_ns()
  local reads = 8
  for i = 1, reads do
    t:assert_eq(read_at(2 + i), string.rep("d", 512))
  end
  local elapsed_ms = (c:get_ns() - before) / 1e6
  disk:clear_faults()
  -- A lower bound only: each uncached read is at least one request, and the
  -- block backend holds each for SLOW_COMPLETION_MS (50 ms) before completing it.
  t:assert(elapsed_ms >= reads * 50, "8 slow reads took " .. elapsed_ms .. " ms by the guest's clock")
end)

test("two guests ping over the switch; a partition drops it; unpartition heals", function(t)
  a:run("ip addr add 10.0.0.1/24 dev eth0 && ip link set eth0 up"):assert_ok()
  b:run("ip addr add 10.0.0.2/24 dev eth0 && ip link set eth0 up"):assert_ok()
  t:assert_eq(a:read_file("/sys/class/net/eth0/address"), lan:nic(a):mac() .. "\n")
  local ping = function(from, ip) return from:run("ping -c 1 -W 5 " .. ip) end
  local r = ping(a, "10.0.0.2")
  t:assert(r:ok(), "a -> b over virtio-net: " .. r.stdout .. r.stderr)
  t:assert_contains(r.stdout, "1 packets received")
  lan:partition(a, b)
  t:assert(not ping(a, "10.0.0.2"):ok(), "a -> b must fail while partitioned")
  lan:unpartition(a, b)
  r = ping(b, "10.0.0.1")
  t:assert(r:ok(), "b -> a after unpartition: " .. r.stdout .. r.stderr)
  dev:close()
end)

test("the restored lab is the fixture's: its members, the disk's image", function(t)
  t:assert_eq(table.concat(pair:vm_names(), ","), "a,b")
  t:assert_eq(table.concat(pair:bridge_names(), ","), "lan")
  t:assert_eq(disk:size(), IMAGE_BYTES)
  -- The image outlives the fixture's build: every restore reads it.
  local f = assert(io.open(disk:image(), "rb"))
  t:assert_eq(f:read(4), "dddd")
  f:close()
end)

test("agent_overlay_path: both guests run the agent from the prebuilt overlay", function(t)
  -- The marker exists only in the overlay harness/tests/real_kernel.rs
  -- wrote; an overlay the backend built from the agent binary has none.
  for _, vm in ipairs({a, b}) do
    t:assert_eq(vm:read_file("/etc/provium-prebuilt-overlay"), "prebuilt agent overlay\n")
  end
end)

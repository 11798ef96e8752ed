-- vm:fork and lab:fork in real guests (docs/snapshots.md, "Forking"): the
-- lab fixture `pair` (a with a disk, a and b on bridge `lan`) forked two
-- ways, and the seeded base fixture forked for its rng stream. Each copy is
-- a restore of one snapshot taken while the source was paused: its own
-- memory (copy-on-write), disk copy, bridges and agent.

local pair = provium:lab_fixture("pair")
local a, b, lan = pair.a, pair.b, pair.lan
a:run("ip addr add 10.0.0.1/24 dev eth0 && ip link set eth0 up"):assert_ok()
b:run("ip addr add 10.0.0.2/24 dev eth0 && ip link set eth0 up"):assert_ok()

local function ping(from, ip)
  return from:run("ping -c 1 -W 5 " .. ip):ok()
end

-- The first 64 bytes of the sector of /dev/vda at `mib` MiB (or dd's
-- error), read by the guest with O_DIRECT (so the guest's page cache never
-- answers for the device).
local function read_vda(vm, mib)
  return vm:run("dd if=/dev/vda bs=512 count=1 skip=" .. (mib * 2048) .. " iflag=direct 2>&1 | head -c 64")
end

test("copies keep their own writes, memory and disk; the source is unchanged", function(t)
  a:write_file("/tmp/state", "before")
  local copies = pair:fork(2)
  local one, two = copies[1], copies[2]
  t:assert_eq(one:name(), pair:name() .. ".1")
  for i, c in ipairs(copies) do
    t:assert_eq(c.a:read_file("/tmp/state"), "before", "copy " .. i .. " has the source's files")
    c.a:write_file("/tmp/state", "copy " .. i)
  end
  t:assert_eq(one.a:read_file("/tmp/state"), "copy 1")
  t:assert_eq(two.a:read_file("/tmp/state"), "copy 2")
  t:assert_eq(a:read_file("/tmp/state"), "before", "the source is unchanged")
  -- Disk: copy 1 writes its own copy of the image (one whole sector at
  -- 2 MiB, O_DIRECT).
  one.a:write_file("/tmp/sector", "one" .. string.rep("o", 509))
  one.a:run("dd if=/tmp/sector of=/dev/vda bs=512 count=1 seek=4096 conv=notrunc oflag=direct"):assert_ok()
  t:assert_eq(read_vda(one.a, 2).stdout, "one" .. string.rep("o", 61))
  t:assert_eq(read_vda(two.a, 2).stdout, string.rep("d", 64), "copy 2's disk is its own")
  t:assert_eq(read_vda(a, 2).stdout, string.rep("d", 64), "and so is the source's")
end)

test("a partition in copy 1 does not cut copy 2, nor the source", function(t)
  local copies = pair:fork(2)
  local one, two = copies[1], copies[2]
  one.lan:partition(one.a, one.b)
  t:assert(not ping(one.a, "10.0.0.2"), "copy 1 is partitioned")
  t:assert(ping(two.a, "10.0.0.2"), "copy 2 is not")
  t:assert(ping(a, "10.0.0.2"), "nor the source")
  t:assert(not lan:is_partitioned(a, b))
end)

test("an eio_read on copy 1's disk does not touch copy 2's", function(t)
  local copies = pair:fork(2)
  copies[1].a:disk("data"):fault_inject("eio_read")
  t:assert_contains(read_vda(copies[1].a, 2).stdout, "Input/output error")
  t:assert_eq(read_vda(copies[2].a, 2).stdout, string.rep("d", 64))
  t:assert_eq(read_vda(a, 3).stdout, string.rep("d", 64))
end)

-- `n` bytes of `vm`'s /dev/hwrng (virtio-rng), read by the agent.
local function hwrng(vm, n)
  local f = vm:open_file("/dev/hwrng", {read = true})
  local got = ""
  while #got < n do
    local chunk = f:read(n - #got)
    assert(#chunk > 0, "/dev/hwrng ended after " .. #got .. " bytes")
    got = got .. chunk
  end
  f:close()
  return got
end

test("copies of a seeded VM read the same rng stream; a copy forks again", function(t)
  local base = provium:vm_fixture("base")
  local copies = base:fork(2)
  -- The kernel's hwrng thread draws from the device too (in chunks, on its
  -- own timer), so one copy may be a chunk or two further along: the same
  -- stream shows as 32 bytes of one found in the other's next 1024.
  local ahead = hwrng(copies[1], 1024)
  local other = hwrng(copies[2], 64)
  t:assert(ahead:find(other:sub(1, 32), 1, true) ~= nil,
    "the copies' /dev/hwrng bytes are not one stream")
  local again = copies[1]:fork(1)[1]
  t:assert_eq(again:name(), "base.1.1")
  t:assert_eq(again:read_file("/etc/provium-fixture"), "base\n")
end)

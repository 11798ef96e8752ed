-- Devices after boot on kvm (docs/disks.md, docs/networking.md): two Linux
-- guests restored from the base fixture, which had no disk and no NIC, get
-- them while they run. The kvm backend made each VM's disk and NIC slots
-- at boot (the profile's `disk_slots`/`nic_slots`, 2 each by default): an
-- empty /dev/vdX of size 0 and a down ethN, which an attach fills (capacity
-- change, link up, each with a config interrupt the guest's driver acts on).
local IMAGE_BYTES = 4 << 20

local a = provium:vm_fixture("base")
local b = provium:vm_fixture("base")

-- Polls `path` in `vm` until it reads `want` (the guest's driver acts on
-- the config interrupt in a work item: shortly after the host returns).
local function await_file(t, vm, path, want)
  local got
  for _ = 1, 600 do
    got = vm:read_file(path)
    if got == want then
      return
    end
    vm:clock():sleep("100ms")
  end
  t:assert_eq(got, want)
end

test("a restored guest gets a disk after boot: its bytes through /dev/vda, a snapshot keeps it, eio_read fails it, detach empties it", function(t)
  local img = os.tmpname()
  local f = assert(io.open(img, "wb"))
  f:write(string.rep("h", IMAGE_BYTES))
  f:close()
  t:assert_eq(a:read_file("/sys/block/vda/size"), "0\n") -- the empty slot
  local disk = a:attach_disk({id = "late", image = img})
  t:assert_eq(disk:guest_device(), "/dev/vda")
  await_file(t, a, "/sys/block/vda/size", tostring(IMAGE_BYTES // 512) .. "\n")
  local dev = a:open_file("/dev/vda", {read = true})
  t:assert_eq(dev:read(512), string.rep("h", 512))
  dev:close()
  -- A snapshot holds the disk added after boot: a restore puts it back
  -- into its slot (a new Disk handle, as for the snapshot's other disks).
  local s = a:snapshot()
  a:shutdown()
  a:restore(s)
  s:delete()
  disk = a:disk("late")
  t:assert_eq(disk:guest_device(), "/dev/vda")
  t:assert_eq(a:read_file("/sys/block/vda/size"), tostring(IMAGE_BYTES // 512) .. "\n")
  dev = a:open_file("/dev/vda", {read = true})
  dev:seek(1 << 20)
  t:assert_eq(dev:read(512), string.rep("h", 512))
  disk:fault_inject("eio_read")
  dev:seek(2 << 20) -- a MiB the page cache has not seen
  t:assert_contains(t:assert_raises(function() dev:read(512) end), "Input/output error")
  disk:clear_faults()
  dev:close()
  disk:detach()
  await_file(t, a, "/sys/block/vda/size", "0\n")
  os.remove(img)
end)

test("two restored guests without a NIC join a new bridge, ping, a partition cuts them, a snapshot keeps the NIC", function(t)
  local lan = provium:bridge("late")
  lan:attach({a, b})
  for i, vm in ipairs({a, b}) do
    local nic = lan:nic(vm)
    t:assert_eq(nic:ifname(), "eth0")
    t:assert_eq(vm:read_file("/sys/class/net/eth0/address"), nic:mac() .. "\n")
    vm:run("ip addr add 10.0.9." .. i .. "/24 dev eth0 && ip link set eth0 up"):assert_ok()
    await_file(t, vm, "/sys/class/net/eth0/carrier", "1\n")
  end
  local ping = function(from, ip) return from:run("ping -c 1 -W 5 " .. ip) end
  local r = ping(a, "10.0.9.2")
  t:assert(r:ok(), "a -> b over NICs added after boot: " .. r.stdout .. r.stderr)
  -- A NIC added after boot is an ordinary switch port: its counters, a
  -- capture on it and the bridge's latency act on it as on one from boot.
  local nic_a = lan:nic(a)
  local before = nic_a:counters()
  local cap = nic_a:capture()
  r = ping(a, "10.0.9.2")
  t:assert(r:ok(), "a -> b with a capture: " .. r.stdout .. r.stderr)
  local pcap = table.concat(cap:drain("1s"))
  cap:close()
  -- The pcap file header (24 bytes) and at least the request and reply,
  -- each a 16-byte record header and an ICMP frame (42 bytes or more).
  t:assert(#pcap >= 24 + 2 * (16 + 42), "capture of a ping: " .. #pcap .. " bytes")
  local after = nic_a:counters()
  t:assert(after.tx_packets > before.tx_packets, "a's request counted on its late NIC")
  t:assert(after.rx_packets > before.rx_packets, "b's reply counted on a's late NIC")
  lan:add_latency(100)
  r = a:run("ping -c 1 -W 10 10.0.9.2")
  local rtt = tonumber(r.stdout:match("time=([%d%.]+) ms"))
  t:assert(rtt ~= nil and rtt >= 199, "100 ms each way on late NICs: " .. r.stdout .. r.stderr)
  lan:reset()
  lan:partition(a, b)
  t:assert(not ping(a, "10.0.9.2"):ok(), "a -> b must fail while partitioned")
  lan:unpartition(a, b)
  -- A snapshot holds the NIC added after boot: a restore plugs its slot
  -- back onto the bridge with the member's MAC, and the guest carries on.
  local s = a:snapshot()
  a:shutdown()
  a:restore(s)
  s:delete()
  local nic = lan:nic(a)
  t:assert_eq(nic:ifname(), "eth0")
  t:assert_eq(a:read_file("/sys/class/net/eth0/address"), nic:mac() .. "\n")
  r = ping(a, "10.0.9.2")
  t:assert(r:ok(), "a -> b after a's snapshot and restore: " .. r.stdout .. r.stderr)
  -- bridge:detach on kvm parks the slot: the interface stays, its carrier goes.
  lan:detach(b)
  await_file(t, b, "/sys/class/net/eth0/carrier", "0\n")
end)

-- Two local sandboxes on one bridge: NICs realised at boot, ping, NIC
-- lookups, counters, pcap captures, link down and up.

local pcap_parse = require("network.pcap")

local lan = provium:bridge("lan")
local a = provium:vm("a", "linux")
local b = provium:vm("b", "linux")
-- Attached before boot: each sandbox gets eth0 when it boots.
lan:attach({a, b})
a:boot()
b:boot()
a:run("ip addr add 10.0.0.1/24 dev eth0 && ip link set eth0 up"):assert_ok()
b:run("ip addr add 10.0.0.2/24 dev eth0 && ip link set eth0 up"):assert_ok()

local function ping(from, ip)
  return from:run("ping -c 1 -W 1 " .. ip):ok()
end

test("two sandboxes on one bridge ping each other", function(t)
  t:assert(ping(a, "10.0.0.2"), "a -> b")
  t:assert(ping(b, "10.0.0.1"), "b -> a")
  t:assert_eq(table.concat(lan:members(), ","), "a,b")
end)

test("each NIC is eth0 with the bridge's deterministic MAC", function(t)
  local nic = a:nic("lan")
  t:assert_eq(nic:ifname(), "eth0")
  t:assert_eq(nic:vm_name(), "a")
  t:assert_eq(nic:bridge(), "lan")
  t:assert_eq(a:nic("eth0"):mac(), nic:mac())
  t:assert_eq(lan:nic(a):mac(), nic:mac())
  t:assert(nic:mac() ~= lan:nic(b):mac())
  local addr = a:run("cat /sys/class/net/eth0/address"):assert_ok().stdout
  t:assert_eq(addr, nic:mac() .. "\n")
end)

test("counters move with traffic, from the guest's perspective", function(t)
  local before_a = a:nic("lan"):counters()
  local before_b = b:nic("lan"):counters()
  t:assert(ping(a, "10.0.0.2"))
  local after_a = a:nic("lan"):counters()
  local after_b = b:nic("lan"):counters()
  t:assert(after_a.tx_packets > before_a.tx_packets, "a sent")
  t:assert(after_a.rx_packets > before_a.rx_packets, "a received the reply")
  t:assert(after_a.tx_bytes > before_a.tx_bytes)
  t:assert(after_b.rx_packets > before_b.rx_packets, "b received the request")
  t:assert_eq(after_a.errors, 0)
end)

-- Counts the ICMP echo requests and replies in a capture; the pcap bytes are
-- checked field by field on the way (network/pcap.lua).
local function icmp_echoes(pcap)
  local requests, replies = 0, 0
  for _, frame in ipairs(pcap_parse.frames(pcap)) do
    local icmp_type = pcap_parse.icmp_echo(frame)
    if icmp_type == 8 then requests = requests + 1 end
    if icmp_type == 0 then replies = replies + 1 end
  end
  return requests, replies
end

test("bridge capture is pcap holding the ICMP exchange", function(t)
  local cap = lan:capture()
  t:assert_eq(cap:kind(), "capture")
  t:assert(a:run("ping -c 3 -i 0.2 -W 1 10.0.0.2"):ok())
  local pcap = table.concat(cap:drain("1s"))
  cap:close()
  local requests, replies = icmp_echoes(pcap)
  t:assert(requests >= 3, "requests: " .. requests)
  t:assert(replies >= 3, "replies: " .. replies)
  t:assert_eq(cap:next(), nil, "closed capture is EOF")
  t:assert(cap:eof())
end)

test("nic capture sees one NIC's traffic", function(t)
  local cap = b:nic("lan"):capture()
  t:assert_eq(b:open_stream_count(), 1, "a live nic capture counts as a stream")
  t:assert(ping(a, "10.0.0.2"))
  local requests, replies = icmp_echoes(table.concat(cap:drain("1s")))
  t:assert(requests >= 1 and replies >= 1, requests .. " requests, " .. replies .. " replies")
  cap:close()
  t:assert_eq(b:open_stream_count(), 0)
end)

test("a capture left open is closed at the end of its test", function(t)
  local cap = lan:capture()
  t:assert_eq(#lan:live_captures(), 1)
  t:assert(cap:creation_site().line > 0)
end)

test("the previous test's capture was auto-closed", function(t)
  t:assert_eq(#lan:live_captures(), 0)
end)

test("disconnect takes the link down; reconnect heals", function(t)
  local nic = a:nic("lan")
  nic:disconnect()
  t:assert(not nic:is_connected())
  t:assert(not ping(a, "10.0.0.2"), "ping must fail with the link down")
  local link = a:run("ip -o link show eth0"):assert_ok().stdout
  t:assert(link:find("NO-CARRIER", 1, true) ~= nil, link)
  nic:reconnect()
  t:assert(nic:is_connected())
  wait_until(function() return ping(a, "10.0.0.2") end, {timeout = "10s", desc = "ping after reconnect"})
end)

test("detach takes the NIC's link down in the guest; attach brings a fresh one", function(t)
  lan:detach(b)
  t:assert_eq(table.concat(lan:members(), ","), "a")
  -- As the reference's set_link(false): the interface stays, without carrier.
  local link = b:run("ip -o link show eth0"):assert_ok().stdout
  t:assert(link:find("NO-CARRIER", 1, true) ~= nil, "eth0 after detach: " .. link)
  t:assert(not ping(a, "10.0.0.2"), "ping must fail once b is detached")
  lan:attach(b)
  t:assert_eq(b:nic("lan"):ifname(), "eth0")
  local addrs = b:run("ip -o -4 addr show dev eth0"):assert_ok().stdout
  t:assert(addrs:find("10.0.0.2", 1, true) == nil, "a fresh eth0, not the parked one: " .. addrs)
  b:run("ip addr add 10.0.0.2/24 dev eth0 && ip link set eth0 up"):assert_ok()
  wait_until(function() return ping(a, "10.0.0.2") end, {timeout = "10s", desc = "ping after re-attach"})
end)

test("a test-scope VM attached to the file's bridge leaves it at test end", function(t)
  local c = provium:vm("c", "linux"):boot()
  lan:attach(c)
  t:assert_eq(c:nic("eth0"):ifname(), "eth0")
  c:run("ip addr add 10.0.0.3/24 dev eth0 && ip link set eth0 up"):assert_ok()
  wait_until(function() return ping(c, "10.0.0.1") end, {timeout = "10s", desc = "c reaches a"})
end)

test("after the test, c is no longer a member", function(t)
  t:assert_eq(table.concat(lan:members(), ","), "a,b")
end)

test("closing a bridge leaves each NIC without carrier; a new bridge gives a fresh one", function(t)
  local d = provium:vm("d", "linux"):boot()
  local e = provium:vm("e", "linux"):boot()
  local side = provium:bridge("side")
  side:attach({d, e})
  d:run("ip addr add 10.7.0.1/24 dev eth0 && ip link set eth0 up"):assert_ok()
  e:run("ip addr add 10.7.0.2/24 dev eth0 && ip link set eth0 up"):assert_ok()
  wait_until(function() return ping(d, "10.7.0.2") end, {timeout = "10s", desc = "d reaches e"})
  side:close()
  -- The interface stays, as a VM's NIC does once its host side is gone:
  -- link down, nothing crosses.
  local link = d:run("ip -o link show eth0"):assert_ok().stdout
  t:assert(link:find("NO-CARRIER", 1, true) ~= nil, link)
  t:assert(not ping(d, "10.7.0.2"), "no traffic once the bridge is closed")
  -- Another bridge takes the name again: a fresh eth0, without the old
  -- one's address, that carries traffic.
  local other = provium:bridge("other")
  other:attach({d, e})
  t:assert_eq(d:nic("other"):ifname(), "eth0")
  local addrs = d:run("ip -o addr show dev eth0"):assert_ok().stdout
  t:assert(addrs:find("10.7.0.1", 1, true) == nil, "the fresh eth0 kept no address: " .. addrs)
  d:run("ip addr add 10.7.0.1/24 dev eth0 && ip link set eth0 up"):assert_ok()
  e:run("ip addr add 10.7.0.2/24 dev eth0 && ip link set eth0 up"):assert_ok()
  wait_until(function() return ping(d, "10.7.0.2") end, {timeout = "10s", desc = "d reaches e on the new bridge"})
end)

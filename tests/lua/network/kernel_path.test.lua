-- The kernel path (docs/networking.md): between two local sandboxes the
-- kernel forwards the plain directions, and each rule a test declares takes
-- its direction back through the switch before the call returns.

local lan = provium:bridge("lan")
local a = provium:vm("a", "linux")
local b = provium:vm("b", "linux")
lan:attach({a, b})
a:boot()
b:boot()
a:run("ip addr add 10.0.0.1/24 dev eth0 && ip link set eth0 up"):assert_ok()
b:run("ip addr add 10.0.0.2/24 dev eth0 && ip link set eth0 up"):assert_ok()

local function ping(from, ip)
  return from:run("ping -c 1 -W 1 " .. ip):ok()
end

test("unimpaired pings take the kernel path, and the counters see them", function(t)
  t:assert(ping(a, "10.0.0.2"), "warm the neighbour caches")
  local s0, na = lan:stats(), a:nic("lan"):counters()
  t:assert(a:run("ping -c 5 -i 0.2 -W 1 10.0.0.2"):ok())
  local s1, ma = lan:stats(), a:nic("lan"):counters()
  t:assert(s1.kernel_path - s0.kernel_path >= 10, "10 echoes: " .. (s1.kernel_path - s0.kernel_path))
  t:assert(ma.tx_packets - na.tx_packets >= 5, "a's requests counted")
  t:assert(ma.rx_packets - na.rx_packets >= 5, "a's replies counted")
  t:assert(s1.delivered - s0.delivered >= 10, "and delivered")
end)

test("a partition holds on the very next frame", function(t)
  lan:partition(a, b)
  local s0 = lan:stats()
  t:assert(not ping(a, "10.0.0.2"), "no echo through a partition")
  t:assert(lan:stats().dropped_partition > s0.dropped_partition, "the switch dropped it")
  lan:unpartition(a, b)
  t:assert(ping(a, "10.0.0.2"))
end)

test("a drop rate on one pair direction decides in the switch", function(t)
  lan:directional_drop_rate({from = b, to = a, p = 100})
  local s0 = lan:stats()
  t:assert(not ping(a, "10.0.0.2"), "every reply dropped")
  t:assert(lan:stats().dropped_impairment > s0.dropped_impairment)
  lan:directional_drop_rate({from = b, to = a, p = 0})
  t:assert(ping(a, "10.0.0.2"))
end)

test("a latency on one direction applies to the next echo", function(t)
  lan:add_directional_latency({from = a, to = b, ms = 150})
  local r = a:run("ping -c 1 -W 2 10.0.0.2"):assert_ok()
  local ms = tonumber(r.stdout:match("time=([%d.]+) ms"))
  t:assert(ms ~= nil and ms >= 150, "rtt " .. tostring(ms) .. " ms under a 150 ms latency")
  lan:reset()
end)

-- A bridge made with {kernel_path = false} sends every frame through the
-- switch (for captures inside the sandboxes: docs/networking.md).
local switched = provium:bridge("switched", {kernel_path = false})
switched:attach({a, b})

test("a bridge with kernel_path = false carries every frame itself", function(t)
  local ea, eb = a:nic("switched"):ifname(), b:nic("switched"):ifname()
  t:assert(ea ~= "eth0", "the second bridge's NIC: " .. ea)
  a:run("ip addr add 10.1.0.1/24 dev " .. ea .. " && ip link set " .. ea .. " up"):assert_ok()
  b:run("ip addr add 10.1.0.2/24 dev " .. eb .. " && ip link set " .. eb .. " up"):assert_ok()
  local s0 = switched:stats()
  t:assert(a:run("ping -c 3 -i 0.2 -W 1 10.1.0.2"):ok())
  local s1 = switched:stats()
  t:assert_eq(s1.kernel_path, 0, "nothing took the kernel path")
  t:assert(s1.delivered - s0.delivered >= 6, "the switch delivered the echoes")
end)

test("opts apply only where a bridge is created", function(t)
  local ok, e = pcall(function() provium:bridge("switched", {kernel_path = true}) end)
  t:assert(not ok)
  t:assert(tostring(e):find("exists already", 1, true) ~= nil, tostring(e))
end)

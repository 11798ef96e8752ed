-- Latency (seen as ping RTT), drop rate 100 % and 0 %, directional forms,
-- bandwidth bookkeeping, reset. Drop-rate statistics, seeded reproduction and
-- bandwidth pacing are in statistics.test.lua.

local lan = provium:bridge("lan")
local a = provium:vm("a", "linux"):boot()
local b = provium:vm("b", "linux"):boot()
lan:attach({a, b})
a:run("ip addr add 10.0.0.1/24 dev eth0 && ip link set eth0 up"):assert_ok()
b:run("ip addr add 10.0.0.2/24 dev eth0 && ip link set eth0 up"):assert_ok()
a:run("ip neigh replace 10.0.0.2 lladdr " .. lan:nic(b):mac() .. " dev eth0 nud permanent"):assert_ok()
b:run("ip neigh replace 10.0.0.1 lladdr " .. lan:nic(a):mac() .. " dev eth0 nud permanent"):assert_ok()

local function ping(from, ip)
  return from:run("ping -c 1 -W 1 " .. ip):ok()
end

-- The RTT of one ping, in ms (fails the test when the ping fails).
local function rtt_ms(t, from, ip)
  local r = from:run("ping -c 1 -W 3 " .. ip)
  t:assert(r:ok(), "ping failed: " .. r.stdout .. r.stderr)
  local ms = tonumber(r.stdout:match("time=([%d%.]+) ms"))
  t:assert(ms ~= nil, "no RTT in: " .. r.stdout)
  return ms
end

test("whole-bridge latency shows in the RTT, both ways", function(t)
  lan:reset()
  lan:add_latency(100)
  t:assert_eq(lan:latency_ms(), 100)
  -- 100 ms each way: every RTT is at least 200 ms (ping prints whole ms at
  -- this size), and about 200 ms: the median of five stays under 300 ms, so a
  -- delay applied twice on a path (400 ms) fails while a loaded machine's
  -- scheduling delays pass.
  local r = a:run("ping -n -c 5 -i 0.2 -W 3 10.0.0.2")
  t:assert(r:ok(), "ping failed: " .. r.stdout .. r.stderr)
  local rtts = {}
  for ms in r.stdout:gmatch("time=([%d%.]+) ms") do
    rtts[#rtts + 1] = tonumber(ms)
  end
  t:assert_eq(#rtts, 5, r.stdout)
  table.sort(rtts)
  t:assert(rtts[1] >= 199, "rtt " .. rtts[1] .. " ms < 200 ms")
  t:assert(rtts[3] < 300, "median rtt " .. rtts[3] .. " ms, not about 200 ms")
  lan:reset()
  t:assert_eq(lan:latency_ms(), 0)
end)

test("directional latency delays only its pair", function(t)
  lan:reset()
  lan:add_latency({from = a, to = b, ms = 150})
  local imp = lan:pair_impairment(a, b)
  t:assert_eq(imp.ms, 150)
  t:assert_eq(lan:pair_impairment(b, a).ms, nil)
  t:assert(rtt_ms(t, a, "10.0.0.2") >= 149)
  t:assert(rtt_ms(t, b, "10.0.0.1") >= 149, "the reply b <- a path is the delayed one")
  lan:add_directional_latency({from = b, to = a, ms = 60})
  t:assert(rtt_ms(t, a, "10.0.0.2") >= 209)
  lan:reset()
  t:assert_eq(lan:pair_impairment(a, b).ms, nil)
end)

test("drop rate 100 % blocks, 0 % passes", function(t)
  lan:reset()
  lan:drop_rate(100)
  t:assert_eq(lan:drop_rate_pct(), 100)
  t:assert(not ping(a, "10.0.0.2"))
  t:assert(lan:stats().dropped_impairment > 0)
  lan:drop_rate(0)
  t:assert(ping(a, "10.0.0.2"))
end)

test("directional drop rate 100 % blocks only its pair", function(t)
  lan:reset()
  lan:directional_drop_rate({from = b, to = a, p = 100})
  t:assert_eq(lan:pair_impairment(b, a).p, 100)
  t:assert(not ping(a, "10.0.0.2"), "the reply b -> a is dropped")
  lan:drop_rate({from = b, to = a, p = 0})
  t:assert(ping(a, "10.0.0.2"))
end)

test("bandwidth limits are recorded whole-bridge and per pair", function(t)
  lan:reset()
  lan:bandwidth_limit(1024 * 1024)
  lan:bandwidth_limit({from = a, to = b, bps = 500000})
  t:assert_eq(lan:bandwidth_bps(), 1024 * 1024)
  t:assert_eq(lan:pair_impairment(a, b).bps, 500000)
  t:assert(ping(a, "10.0.0.2"), "small packets pass under a cap")
  lan:reset()
  t:assert_eq(lan:bandwidth_bps(), 0)
end)

test("directional impairments need both ends attached", function(t)
  local ok, e = pcall(function() lan:add_latency({from = a, to = "ghost", ms = 5}) end)
  t:assert(not ok)
  t:assert(tostring(e):find("vm `ghost` is not attached to bridge `lan`; call bridge:attach first", 1, true) ~= nil,
    tostring(e))
end)

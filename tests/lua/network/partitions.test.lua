-- Partitions (symmetric and directional, exactly as declared), partition_all
-- and restore_all, isolation, and reset keeping isolation.
--
-- Neighbour entries are static, so no ARP is needed and a directional
-- partition can be observed on ICMP alone: with a -> b dropped, a's echo
-- requests never reach b, while b's requests still reach a (a's kernel
-- counts them as Icmp InEchos in /proc/net/snmp) although b never sees the
-- replies.

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

-- Echo requests this sandbox's kernel has received (Icmp InEchos).
local function in_echos(vm)
  local snmp = vm:run("cat /proc/net/snmp"):assert_ok().stdout
  local names, values
  for line in snmp:gmatch("[^\n]+") do
    if line:match("^Icmp: %a") then
      names = line
    elseif line:match("^Icmp: %d") then
      values = line
    end
  end
  local keys, i = {}, 0
  for k in names:gmatch("%S+") do keys[#keys + 1] = k end
  for v in values:gmatch("%S+") do
    i = i + 1
    if keys[i] == "InEchos" then return tonumber(v) end
  end
  error("no InEchos in /proc/net/snmp")
end

local function clean()
  lan:reset()
  lan:unisolate(a)
  lan:unisolate(b)
end

test("baseline: both directions flow", function(t)
  clean()
  t:assert(ping(a, "10.0.0.2"))
  t:assert(ping(b, "10.0.0.1"))
end)

test("symmetric partition drops both ways; unpartition heals", function(t)
  clean()
  lan:partition(a, b)
  t:assert(lan:is_partitioned(a, b))
  t:assert(lan:is_partitioned(b, a))
  local ea, eb = in_echos(a), in_echos(b)
  t:assert(not ping(a, "10.0.0.2"), "a -> b must fail")
  t:assert(not ping(b, "10.0.0.1"), "b -> a must fail")
  t:assert_eq(in_echos(a), ea, "no request reached a")
  t:assert_eq(in_echos(b), eb, "no request reached b")
  lan:unpartition(a, b)
  t:assert(not lan:is_partitioned(a, b))
  t:assert(ping(a, "10.0.0.2"))
end)

test("directional partition drops only from -> to", function(t)
  clean()
  lan:partition({from = a, to = b})
  t:assert(lan:is_partitioned(a, b))
  t:assert(not lan:is_partitioned(b, a))
  local ea, eb = in_echos(a), in_echos(b)
  -- a's request never reaches b.
  t:assert(not ping(a, "10.0.0.2"))
  t:assert_eq(in_echos(b), eb, "a -> b is dropped")
  -- b's request reaches a; a's reply (a -> b) is dropped, so b's ping fails.
  t:assert(not ping(b, "10.0.0.1"))
  t:assert_eq(in_echos(a), ea + 1, "b -> a still flows")
  lan:unpartition({from = a, to = b})
  t:assert(ping(a, "10.0.0.2"))
  t:assert(ping(b, "10.0.0.1"))
end)

test("the other direction, declared the other way", function(t)
  clean()
  lan:partition({from = b, to = a})
  local ea, eb = in_echos(a), in_echos(b)
  t:assert(not ping(a, "10.0.0.2"))
  t:assert_eq(in_echos(b), eb + 1, "a -> b still flows")
  t:assert_eq(in_echos(a), ea, "b -> a is dropped")
  lan:unpartition({from = b, to = a})
  t:assert(ping(b, "10.0.0.1"))
end)

test("partition_all and restore_all", function(t)
  clean()
  lan:partition_all()
  t:assert(lan:is_partitioned(a, b) and lan:is_partitioned(b, a))
  t:assert(not ping(a, "10.0.0.2"))
  lan:restore_all()
  t:assert_eq(#lan:partitions(), 0)
  t:assert(ping(a, "10.0.0.2"))
end)

test("isolation cuts a VM off both ways", function(t)
  clean()
  lan:isolate(a)
  t:assert(lan:is_isolated(a))
  t:assert(not lan:is_isolated(b))
  t:assert(not ping(a, "10.0.0.2"))
  t:assert(not ping(b, "10.0.0.1"))
  lan:unisolate(a)
  t:assert(not lan:is_isolated(a))
  t:assert(ping(a, "10.0.0.2"))
end)

test("reset lifts partitions and impairments but keeps isolation", function(t)
  clean()
  lan:isolate(b)
  lan:partition(a, b)
  lan:add_latency(20)
  lan:reset()
  t:assert(not lan:is_partitioned(a, b))
  t:assert_eq(lan:latency_ms(), 0)
  t:assert(lan:is_isolated(b), "isolation survives reset")
  t:assert(not ping(a, "10.0.0.2"), "still isolated after reset")
  lan:unisolate(b)
  t:assert(ping(a, "10.0.0.2"))
end)

-- Forty local sandboxes on one bridge (issue 31): every member reaches the
-- first, and closing the bridge leaves no kernel-path wire, filter or tc
-- action in any of them. No timing is asserted: docs/benchmarking.md
-- ("Scale") has the figures, from benches/scale.sh.

local n = 40
local lan = provium:bridge("lan")
local vms = {}
for i = 1, n do
  vms[i] = provium:vm("m" .. i, "linux"):boot()
end
lan:attach(vms)

local function ip(i)
  return string.format("10.31.%d.%d", (i - 1) // 250, (i - 1) % 250 + 1)
end
for i = 1, n do
  vms[i]:run("ip addr add " .. ip(i) .. "/16 dev eth0 && ip link set eth0 up"):assert_ok()
end

test("every member of a bridge of forty reaches the first", function(t)
  for i = 2, n do
    t:assert(vms[i]:run("ping -c 1 -W 2 " .. ip(1)):ok(), "m" .. i .. " -> m1")
  end
  -- The pings asked for wires between m1 and each other member (built in
  -- the background; reading the stats settles them): the next echoes
  -- take the kernel path.
  local before = lan:stats().kernel_path
  t:assert(vms[n]:run("ping -c 2 -i 0.2 -W 2 " .. ip(1)):ok(), "m" .. n .. " -> m1 again")
  t:assert(lan:stats().kernel_path >= before + 4, "the echoes took the kernel path")
end)

test("closing the bridge leaves no wire end and no tc action in any member", function(t)
  lan:close()
  -- Wire ends are `pvk` + 9 characters; our actions' indices start at
  -- 0x40000000 (tc's own are small).
  local check = "! ip -o link show | grep -q ' pvk' && "
    .. "[ \"$(tc actions ls action mirred | awk '$1 == \"index\" && $2 >= 1073741824' | wc -l)\" = 0 ]"
  for i = 1, n do
    local r = vms[i]:run(check)
    t:assert(r:ok(), "m" .. i .. " still has a wire or action: " .. r.stdout .. r.stderr)
  end
end)

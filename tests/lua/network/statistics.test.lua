-- The impairments' statistics and timing as the guests see them: a 30 % drop
-- rate loses about 30 % of the frames (within an exact binomial bound), the
-- same seed drops the same packets, and a 1 Mbit/s cap paces a TCP transfer at
-- about 1 Mbit/s. Timing assertions are behavioural: lower bounds that follow
-- from the impairment itself, upper bounds several times the nominal value.
-- (Latency as an RTT of about twice the one-way delay is in
-- impairments.test.lua.)

local pcap_parse = require("network.pcap")

local lan = provium:bridge("lan")
local a = provium:vm("a", "linux"):boot()
local b = provium:vm("b", "linux"):boot()
lan:attach({a, b})
-- IPv6 off first: router solicitations, MLD reports and DAD probes would add
-- frames at moments the test does not control. Drops are decided per frame of
-- a pair (the n-th frame from a to b), so the tests below need the pings to be
-- the only frames; static neighbours keep ARP out for the same reason.
for _, vm in ipairs({a, b}) do
  -- /proc/sys directly: sysctl(8) is in procps, which minimal Debian lacks.
  vm:run("echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && echo 1 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6")
    :assert_ok()
end
a:run("ip addr add 10.0.0.1/24 dev eth0 && ip link set eth0 up"):assert_ok()
b:run("ip addr add 10.0.0.2/24 dev eth0 && ip link set eth0 up"):assert_ok()
a:run("ip neigh replace 10.0.0.2 lladdr " .. lan:nic(b):mac() .. " dev eth0 nud permanent"):assert_ok()
b:run("ip neigh replace 10.0.0.1 lladdr " .. lan:nic(a):mac() .. " dev eth0 nud permanent"):assert_ok()

-- The exact binomial interval [lo, hi] for n trials of probability p with
-- P(X < lo) <= tail and P(X > hi) <= tail. The pmf is summed in log space:
-- 0.49^1000 underflows a double.
local function binomial_interval(n, p, tail)
  local logpmf = {}
  local lp, lq = math.log(p), math.log(1 - p)
  logpmf[0] = n * lq
  for k = 0, n - 1 do
    logpmf[k + 1] = logpmf[k] + math.log((n - k) / (k + 1)) + lp - lq
  end
  local lo, sum = 0, 0
  while sum + math.exp(logpmf[lo]) <= tail do
    sum = sum + math.exp(logpmf[lo])
    lo = lo + 1
  end
  local hi = n
  sum = 0
  while sum + math.exp(logpmf[hi]) <= tail do
    sum = sum + math.exp(logpmf[hi])
    hi = hi - 1
  end
  return lo, hi
end

-- Each check below fails a correct switch with probability at most 2e-6 for
-- a random seed (1e-6 per tail), and is deterministic for a fixed one (CI
-- runs with PROVIUM_SEED=4242). For n = 1000 the intervals are 233..370 drops
-- at p = 0.3 (23.3 % to 37.0 %: a 20 % or 40 % rate fails) and 435..585 at
-- p = 0.51.
local TAIL = 1e-6

local function assert_binomial(t, what, k, n, p)
  local lo, hi = binomial_interval(n, p, TAIL)
  t:assert(k >= lo and k <= hi, string.format(
    "%s: %d of %d lost (%.1f %%), outside the binomial interval %d..%d for p = %.2f",
    what, k, n, 100 * k / n, lo, hi, p))
end

-- Pings b from a `count` times, every `interval` s. Returns the set of
-- icmp_seq that ping saw answered and ping's transmitted count. (ping waits
-- about two of its longest RTTs after the last request, so on a loaded
-- machine a last reply can still come after it exits: the switch's counters
-- and captures, not this set, are the exact record.)
local function ping_seqs(t, count, interval)
  local r = a:run(string.format("ping -n -q -c %d -i %s 10.0.0.2", count, interval))
  local sent, received = r.stdout:match("(%d+) packets transmitted, (%d+) received")
  t:assert(sent ~= nil, "no ping summary: " .. r.stdout .. r.stderr)
  return tonumber(sent), tonumber(received)
end

test("a 30 % drop rate loses 30 % of the frames each way", function(t)
  lan:reset()
  lan:drop_rate(30)
  local na, nb, s0 = a:nic("lan"):counters(), b:nic("lan"):counters(), lan:stats()
  local sent, received = ping_seqs(t, 1000, "0.002")
  -- Let any reply still in flight land before reading the counters: wait
  -- until a's receive count holds still for one polling interval.
  local last = -1
  wait_until(function()
    local now = a:nic("lan"):counters().rx_packets
    local still = now == last
    last = now
    return still
  end, {timeout = "10s", interval = "300ms", desc = "the replies settle"})
  local ma, mb, s1 = a:nic("lan"):counters(), b:nic("lan"):counters(), lan:stats()
  local requests = ma.tx_packets - na.tx_packets
  local arrived = mb.rx_packets - nb.rx_packets
  local replies = mb.tx_packets - nb.tx_packets
  local answered = ma.rx_packets - na.rx_packets
  -- The frames are exactly the pings, so these counts are the trials.
  t:assert_eq(sent, 1000)
  t:assert_eq(requests, sent, "a sent only the echo requests")
  t:assert_eq(replies, arrived, "b answered every request that reached it")
  t:assert(received <= answered, "ping saw more replies than the switch delivered")
  print(string.format("drop-rate: a -> b lost %d of %d, b -> a lost %d of %d, ping lost %d of %d",
    requests - arrived, requests, replies - answered, replies, sent - received, sent))
  t:assert_eq(s1.dropped_impairment - s0.dropped_impairment, (requests - arrived) + (replies - answered))
  assert_binomial(t, "a -> b", requests - arrived, requests, 0.3)
  assert_binomial(t, "b -> a", replies - answered, replies, 0.3)
  -- What the guest sees: a ping needs both its frames through, so
  -- 1 - 0.7 * 0.7 = 51 % of the round trips fail.
  assert_binomial(t, "ping round trips", sent - received, sent, 0.51)
  lan:reset()
end)

-- The sequence numbers of the ICMP echoes of `icmp_type` in a capture.
local function echo_seqs(cap, icmp_type, wait)
  local seqs = {}
  for _, frame in ipairs(pcap_parse.frames(table.concat(cap:drain(wait)))) do
    local ty, seq = pcap_parse.icmp_echo(frame)
    if ty == icmp_type then seqs[seq] = true end
  end
  cap:close()
  return seqs
end

-- Runs 200 pings under a fresh 30 % whole-bridge drop rate and returns which
-- requests (a -> b) and which replies (b -> a) the switch dropped, as lists
-- of icmp_seq. Each nic capture records the frames delivered to its NIC,
-- late ones included, so the lists are exact whatever the timing.
-- bridge:reset() forgets every pair's drop stream, so each call starts both
-- streams afresh from the bridge seed.
local function lost_after_reset(t)
  lan:reset()
  lan:drop_rate(30)
  local cap_a, cap_b = a:nic("lan"):capture(), b:nic("lan"):capture()
  local sent = ping_seqs(t, 200, "0.005")
  t:assert_eq(sent, 200)
  local to_b = echo_seqs(cap_b, 8, "1s")
  local to_a = echo_seqs(cap_a, 0, "200ms")
  lan:reset()
  local requests, replies = {}, {}
  for seq = 1, sent do
    if not to_b[seq] then
      requests[#requests + 1] = seq
    elseif not to_a[seq] then
      replies[#replies + 1] = seq
    end
  end
  return table.concat(requests, ","), table.concat(replies, ",")
end

-- harness/tests/lua_network.rs also runs this test alone (--tag
-- seeded-drops) in separate runs, and compares the printed lists across runs
-- and seeds.
test("the same seed drops the same packets", {tags = {"seeded-drops"}}, function(t)
  local requests, replies = lost_after_reset(t)
  local requests2, replies2 = lost_after_reset(t)
  print(string.format("seeded-drops: run seed %s lost requests %s lost replies %s",
    tostring(lan:seed()), requests, replies))
  t:assert(requests ~= "" and replies ~= "", "a 30 % drop rate lost nothing in 200 pings")
  t:assert_eq(requests2, requests, "after a reset, the same seed lost other requests")
  t:assert_eq(replies2, replies, "after a reset, the same seed lost other replies")
end)

-- Sends `bytes` from a to b over TCP and returns the seconds it took, from
-- before the connect until b has acknowledged the last byte at the
-- application level (so the data has crossed the switch, not just reached
-- a's socket buffer). perl's IO::Socket::INET is in perl-base, which every
-- Debian system has; no other tool is needed.
local function tcp_transfer(t, bytes)
  local server = b:run_async([[perl -MIO::Socket::INET -e '
    my $s = IO::Socket::INET->new(LocalAddr => "10.0.0.2", LocalPort => 5001,
      Proto => "tcp", Listen => 1, ReuseAddr => 1) or die "listen: $@";
    my $c = $s->accept or die "accept: $!";
    my ($n, $buf) = (0, "");
    while (my $r = sysread($c, $buf, 65536)) { $n += $r }
    print $c "$n\n";
    close $c;']])
  wait_until(function()
    return b:run("ss -Hltn 'sport = :5001'"):assert_ok().stdout ~= ""
  end, {timeout = "10s", desc = "the receiver listens"})
  local r = a:run(string.format([[s=$(date +%%s%%N)
    perl -MIO::Socket::INET -e '
      my $c = IO::Socket::INET->new(PeerAddr => "10.0.0.2", PeerPort => 5001,
        Proto => "tcp") or die "connect: $@";
      my ($d, $off) = ("x" x %d, 0);
      while ($off < length $d) {
        my $w = syswrite($c, $d, length($d) - $off, $off);
        die "write: $!" unless defined $w;
        $off += $w;
      }
      shutdown($c, 1);
      my $ack = <$c>;
      print "ack=$ack";' || exit 1
    e=$(date +%%s%%N)
    echo "elapsed_ns=$((e - s))"]], bytes), {timeout = 60})
  t:assert(r:ok(), "transfer failed: " .. r.stdout .. r.stderr)
  t:assert_eq(tonumber(r.stdout:match("ack=(%d+)")), bytes, "b received every byte")
  t:assert(server:wait("10s"):ok(), "the receiver failed")
  return tonumber(r.stdout:match("elapsed_ns=(%d+)")) / 1e9
end

test("a 1 Mbit/s cap paces a TCP transfer at about 1 Mbit/s", function(t)
  local bytes = 250000
  lan:reset()
  local free = tcp_transfer(t, bytes)
  lan:bandwidth_limit(1000000)
  local capped = tcp_transfer(t, bytes)
  lan:reset()
  print(string.format("bandwidth: %d bytes in %.3f s uncapped, %.3f s at 1 Mbit/s (%.0f kbit/s of payload)",
    bytes, free, capped, bytes * 8 / capped / 1000))
  -- The payload alone is 2,000,000 bits; the bucket starts with one burst
  -- (12,112 bits at this rate) and then admits 10^6 bits per second, so no
  -- correct switch delivers it in less than 1.988 s.
  t:assert(capped >= 1.95, string.format("%.3f s: faster than the 1 Mbit/s cap allows", capped))
  -- Nominal is about 2.1 s with the TCP/IP headers; 3x covers slow start and
  -- a loaded machine.
  t:assert(capped <= 6, string.format("%.3f s: far slower than 1 Mbit/s", capped))
  -- Without the cap the same transfer is much faster: the time above is the
  -- cap's, not the tools'.
  t:assert(free * 2 < capped, string.format("uncapped %.3f s vs capped %.3f s", free, capped))
end)

-- vm:fork(n) and lab:fork(n): running copies of a running VM or lab, from
-- one instant (docs/snapshots.md, "Forking"). On the local backend a copy
-- is a fresh sandbox with the source's files and network configuration;
-- disk and rng checks need the kvm backend and say so when they skip.

local function ping(from, ip)
  return from:run("ping -c 1 -W 2 " .. ip):ok()
end

test("each copy's writes stay its own and the source is unchanged", function(t)
  local a = provium:vm("fa", "linux"):boot()
  a:write_file("/srv/state", "before")
  local copies = a:fork(2)
  t:assert_eq(#copies, 2)
  t:assert_eq(copies[1]:name(), "fa.1")
  t:assert_eq(copies[2]:name(), "fa.2")
  t:assert_eq(a:state(), "booted", "the source keeps running")
  for i, c in ipairs(copies) do
    t:assert_eq(c:state(), "booted")
    t:assert_eq(c:read_file("/srv/state"), "before", "copy " .. i .. " has the source's files")
    c:write_file("/srv/state", "copy " .. i)
  end
  a:write_file("/srv/only-source", "x")
  t:assert_eq(copies[1]:read_file("/srv/state"), "copy 1")
  t:assert_eq(copies[2]:read_file("/srv/state"), "copy 2")
  t:assert_eq(a:read_file("/srv/state"), "before", "the source is unchanged")
  t:assert_raises(function() copies[1]:stat("/srv/only-source") end)
end)

test("a second fork of a copy works, and a second fork never reuses a name", function(t)
  local a = provium:vm("fb", "linux"):boot()
  a:write_file("/srv/gen", "0")
  local first = a:fork(1)[1]
  first:write_file("/srv/gen", "1")
  local second = first:fork(1)[1]
  t:assert_eq(second:name(), "fb.1.1")
  t:assert_eq(second:read_file("/srv/gen"), "1")
  t:assert_eq(a:fork(1)[1]:name(), "fb.2")
end)

test("bad forks are refused by name and leave no copy behind", function(t)
  local a = provium:vm("fc", "linux")
  t:assert_contains(t:assert_raises(function() a:fork(1) end),
    "vm:fork: vm `fc`: vm `fc` is created, and only a running VM forks (call vm:boot() or vm:restore() first)")
  a:boot()
  t:assert_contains(t:assert_raises(function() a:fork(0) end),
    "n must be a whole number of copies, 1 or more, got 0 (call fork(1) or more)")
  t:assert_contains(t:assert_raises(function() a:fork(1.5) end), "got 1.5")
  t:assert_contains(t:assert_raises(function() a:fork(100000000) end), "over the pool's memory budget")
  a:write_file("/srv/log", "x\n")
  local tail = a:tail_file("/srv/log")
  local msg = t:assert_raises(function() a:fork(1) end)
  t:assert_contains(msg, "vm:fork() refused")
  t:assert_contains(msg, 'tail_file("/srv/log") at ')
  t:assert_contains(msg, "Close the streams before forking")
  tail:close()
  -- None of the refusals made a copy: the next one is the first.
  t:assert_eq(a:fork(1)[1]:name(), "fc.1")
end)

test("a partition in copy 1 does not cut copy 2, nor the source", function(t)
  local site = provium:lab("site")
  local lan = site:bridge("lan")
  local a = site:vm("a", "linux"):boot()
  local b = site:vm("b", "linux"):boot()
  lan:attach({a, b})
  a:run("ip addr add 10.0.0.1/24 dev eth0 && ip link set eth0 up"):assert_ok()
  b:run("ip addr add 10.0.0.2/24 dev eth0 && ip link set eth0 up"):assert_ok()
  t:assert(ping(a, "10.0.0.2"), "the source's members reach each other")
  local copies = site:fork(2)
  t:assert_eq(#copies, 2)
  local one, two = copies[1], copies[2]
  t:assert_eq(one:name(), "site.1")
  one.lan:partition(one.a, one.b)
  t:assert(not ping(one.a, "10.0.0.2"), "copy 1 is partitioned")
  t:assert(ping(two.a, "10.0.0.2"), "copy 2 is not")
  t:assert(ping(a, "10.0.0.2"), "nor the source")
  t:assert(not lan:is_partitioned(a, b))
  -- Same addresses in every copy, and still no copy reaches another's.
  two.a:write_file("/srv/who", "two")
  t:assert_raises(function() one.a:stat("/srv/who") end)
end)

test("an eio_read on copy 1's disk does not touch copy 2's", function(t)
  local probe = provium:vm("fd-probe", "linux")
  if not pcall(function() probe:attach_disk({id = "x", size = "1M"}) end) then
    t:skip("the local backend has no block devices; run this file with --vmm kvm")
  end
  local img = os.tmpname()
  local f = io.open(img, "wb"); f:write(string.rep("d", 4096)); f:close()
  local a = provium:vm("fd", "linux")
  a:attach_disk({id = "data", image = img})
  a:boot()
  local copies = a:fork(2)
  copies[1]:disk("data"):fault_inject("eio_read")
  t:assert_raises(function() copies[1]:run("dd if=/dev/vda of=/dev/null bs=512 count=1 iflag=direct"):assert_ok() end)
  copies[2]:run("dd if=/dev/vda of=/dev/null bs=512 count=1 iflag=direct"):assert_ok()
  copies[2]:write_file("/tmp/sector", "two" .. string.rep("t", 509))
  copies[2]:run("dd if=/tmp/sector of=/dev/vda bs=512 count=1 conv=notrunc oflag=direct"):assert_ok()
  local first = "dd if=/dev/vda bs=512 count=1 iflag=direct 2>/dev/null | head -c 3"
  t:assert_eq(copies[2]:run(first).stdout, "two")
  t:assert_eq(a:run(first).stdout, "ddd", "the source's disk is its own")
  os.remove(img)
end)

test("copies of a seeded VM read the same rng stream", function(t)
  local a = provium:vm("fe", "linux")
  local ok = pcall(function() a:boot({rng_seed = 42}) end)
  if not ok or not a:run("test -c /dev/hwrng"):ok() then
    t:skip("this backend has no seeded virtio-rng (the local sandbox reads the host's); run with --vmm kvm")
  end
  local copies = a:fork(2)
  local function hwrng(vm, n)
    local f = vm:open_file("/dev/hwrng", {read = true})
    local got = ""
    while #got < n do
      local chunk = f:read(n - #got)
      t:assert(#chunk > 0, "/dev/hwrng ended")
      got = got .. chunk
    end
    f:close()
    return got
  end
  -- The guest kernel's hwrng thread draws from the device too, so one copy
  -- may be a chunk or two further along: one stream shows as 32 bytes of
  -- one copy found in the other's next 1024.
  local ahead = hwrng(copies[1], 1024)
  t:assert(ahead:find(hwrng(copies[2], 64):sub(1, 32), 1, true) ~= nil,
    "the copies' /dev/hwrng bytes are not one stream")
end)

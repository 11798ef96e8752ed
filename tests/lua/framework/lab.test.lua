-- The provium global as a Lab: reserved keys, pack/unpack, claims,
-- barriers, sub-labs and the scope rules, without booting anything.

provium:claim({memory = "256M", cpus = 1})

test("claims are one-shot per file", function(t)
  local e = t:assert_raises(function() provium:claim({cpus = 1}) end)
  t:assert_contains(e, "lab claim already held; one-shot per lab")
end)

test("pack and unpack pass through to string.pack", function(t)
  local s = provium:pack(">I4 I4 s2", 1, 2, "hi")
  local a, b, c = provium:unpack(">I4 I4 s2", s)
  t:assert_eq(a, 1)
  t:assert_eq(b, 2)
  t:assert_eq(c, "hi")
  t:assert_eq(provium.pack("<I2", 258), "\2\1")
end)

test("barriers", function(t)
  t:assert(provium:barrier("checkpoint", 1))
  t:assert(not provium:barrier("pair", 2, 0.05))
  -- Reusable across rounds.
  t:assert(provium:barrier("checkpoint", 1))
end)

test("names and dot lookup", function(t)
  t:assert_eq(provium:name(), "provium")
  t:assert_eq(provium.nothing_here, nil)
  local dc = provium:lab("dc1")
  t:assert_eq(dc:name(), "dc1")
  t:assert_eq(provium.dc1:name(), "dc1")
  local anon = provium:lab()
  t:assert_eq(anon:name(), "__lab_0")
  t:assert_eq(#provium:sub_lab_names(), 2)
end)

test("sub-labs created in a test are gone in the next", function(t)
  t:assert_eq(provium.dc1, nil)
  t:assert_eq(#provium:sub_lab_names(), 0)
end)

test("reserved names and settings", function(t)
  t:assert_contains(t:assert_raises(function() provium:lab("pack") end), "reserved name")
  t:assert_contains(t:assert_raises(function() provium.timeout = 5 end), "only be set at file scope")
  t:assert_contains(t:assert_raises(function() provium.anything = 1 end), "cannot assign provium.anything")
  -- Settings belong to the file's root lab, not to a sub-lab of any name.
  local sub = provium:lab("provium_like")
  t:assert_contains(t:assert_raises(function() sub.timeout = 5 end), "only be set at file scope")
end)

test("vm lookups and sizing errors", function(t)
  t:assert_contains(t:assert_raises(function() provium:vm("ghost") end), "no vm named `ghost`")
  t:assert_contains(t:assert_raises(function() provium:vm("v", "linux", {memory = "lots"}) end), "bad size `lots`")
  t:assert_contains(t:assert_raises(function() provium:vm("v", "linux", {rng_seed = 1}) end),
    "`rng_seed` is a boot option")
  t:assert_contains(t:assert_raises(function() provium:vm("v", "nope") end), "profile `nope` not found")
end)

-- The t context: every assertion's message carries the offending values,
-- and failures recorded before a pcall swallowed them stay failures.

test("assert_eq names both values", function(t)
  local e = t:assert_raises(function() t:assert_eq(1, 2) end)
  t:assert_eq(e, "1 ~= 2")
  e = t:assert_raises(function() t:assert_eq("a", "b", "names") end)
  t:assert_eq(e, 'names: "a" ~= "b"')
end)

test("assert_neq and assert_contains", function(t)
  local e = t:assert_raises(function() t:assert_neq(3, 3, "same") end)
  t:assert_eq(e, "same: 3 == 3")
  t:assert_contains("hello world", "o w")
  e = t:assert_raises(function() t:assert_contains("abc", "x") end)
  t:assert_eq(e, '"abc" does not contain "x"')
  -- Non-strings are refused outright, not compared.
  local ok, err = pcall(function() t:assert_contains({}, "x") end)
  t:assert(not ok)
  t:assert_contains(err, "both arguments must be strings")
end)

test("assert defaults and custom messages", function(t)
  t:assert_eq(t:assert_raises(function() t:assert(false) end), "assertion failed")
  t:assert_eq(t:assert_raises(function() t:assert(nil, "why") end), "why")
  t:assert_eq(t:assert(42), 42)
end)

test("assert_raises fails when nothing raises, and restores the sticky record", function(t)
  -- The inner assert_raises records a failure; the outer one catches the
  -- raise and puts the record back as it was (clean), so this test passes.
  local e = t:assert_raises(function()
    t:assert_raises(function() end, "inner")
  end)
  t:assert_eq(e, "inner: expected to raise")
end)

test("t carries name and meta", {tags = {"x"}, owner = "me"}, function(t)
  t:assert_eq(t.name, "t carries name and meta")
  t:assert_eq(t.meta.owner, "me")
  t:assert_eq(t.meta.tags[1], "x")
end)

test("wait_until returns the truthy value", function(t)
  local n = 0
  local v = wait_until(function()
    n = n + 1
    if n >= 3 then return "done" end
  end, {timeout = "2s", interval = 0.01})
  t:assert_eq(v, "done")
  t:assert_eq(n, 3)
end)

test("wait_until times out with its description", function(t)
  local e = t:assert_raises(function()
    wait_until(function() return false end, {timeout = 0.05, interval = 0.01, desc = "pigs fly"})
  end)
  t:assert_contains(e, "wait_until: pigs fly not met within 0.05s")
  e = t:assert_raises(function() wait_until(function() end, {timeout = "soon"}) end)
  t:assert_contains(e, "bad timeout string `soon`")
end)

test("wait_until propagates a raising predicate at once", function(t)
  local calls = 0
  local e = t:assert_raises(function()
    wait_until(function() calls = calls + 1; error("broken probe", 0) end, {timeout = 5})
  end)
  t:assert_eq(e, "broken probe")
  t:assert_eq(calls, 1)
end)

test("t:log accepts any value", function(t)
  t:log("text")
  t:log(42)
  t:log(nil)
end)

-- Host-side helpers: json and the test framework itself.
test("json round-trips tables", function(t)
  local s = json.encode({a = 1, b = {1, 2, 3}})
  t:assert_eq(s, '{"a":1,"b":[1,2,3]}')
  t:assert_eq(json.decode(s).b[3], 3)
end)

test("assert_raises returns the error", function(t)
  local e = t:assert_raises(function() error("boom", 0) end)
  t:assert_eq(e, "boom")
end)

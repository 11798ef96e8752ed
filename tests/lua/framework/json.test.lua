-- The json global: array detection, integer precision, null rules.

test("encode shapes", function(t)
  t:assert_eq(json.encode({a = 1, b = "x"}), '{"a":1,"b":"x"}')
  t:assert_eq(json.encode({10, 20, 30}), "[10,20,30]")
  t:assert_eq(json.encode(true), "true")
  t:assert_eq(json.encode(nil), "null")
  t:assert_eq(json.encode({a = 1, b = nil}), '{"a":1}')
  t:assert_eq(json.encode({[1] = 1, [3] = 3}), "[1,null,3]")
  t:assert_eq(json.encode({1, 2, name = "x"}), '{"1":1,"2":2,"name":"x"}')
  t:assert_eq(json.encode(1.5), "1.5")
end)

test("encode errors", function(t)
  t:assert_contains(t:assert_raises(function() json.encode(print) end), "cannot encode a function")
  local cyc = {}
  cyc.self = cyc
  t:assert_contains(t:assert_raises(function() json.encode(cyc) end), "nesting too deep")
  t:assert_contains(t:assert_raises(function() json.encode(0/0) end), "not representable")
end)

test("decode numbers exactly", function(t)
  t:assert_eq(json.decode("9007199254740993"), 9007199254740993)
  t:assert_eq(math.type(json.decode("42")), "integer")
  t:assert_eq(json.decode("18446744073709551615"), -1)
  t:assert_eq(json.decode("18446744073709551615"), tonumber("0xFFFFFFFFFFFFFFFF"))
  t:assert_eq(math.type(json.decode("3.25")), "float")
  t:assert_eq(json.decode("1e2"), 100.0)
end)

test("decode nulls", function(t)
  t:assert_eq(json.decode("null"), nil)
  local o = json.decode('{"k": null, "j": 1}')
  t:assert_eq(o.k, nil)
  for k in pairs(o) do t:assert_neq(k, "k") end
  local a = json.decode("[1, null, 3]")
  t:assert_eq(a[1], 1)
  t:assert_eq(a[2], nil)
  t:assert_eq(a[3], 3)
  t:assert_eq(json.decode('{"a": {"b": ["c", "d"]}}').a.b[2], "d")
end)

test("decode errors name the position", function(t)
  t:assert_contains(t:assert_raises(function() json.decode("{bad") end), "json.decode: ")
  t:assert_contains(t:assert_raises(function() json.decode("[1,") end), "line 1")
end)

-- Per-test scopes: creation is local, lookup falls through to the file root,
-- and a name declared at file scope cannot be shadowed.
local shared = provium:vm("shared", "linux")
local fed = provium:lab("dc1")
fed:vm("web", "linux")

test("file-scope resources are visible from a test", function(t)
  t:assert_eq(provium:vm("shared"), shared)
  t:assert_eq(provium.shared, shared)
  t:assert_eq(provium.dc1.web:name(), "web")
end)

test("a test may not shadow a file-scope name", function(t)
  local e = t:assert_raises(function() provium:vm("shared", "linux") end)
  t:assert_contains(e, "name `shared` already declared at parent scope (lab `provium`)")
  t:assert_contains(e, 'use `provium:vm("shared")` to reuse it')
end)

test("test-scope VMs are local to the test", function(t)
  local mine = provium:vm("mine", "linux")
  t:assert_eq(provium.mine, mine)
  -- Listings do not walk up to the parent.
  t:assert_eq(#provium:vm_names(), 1)
end)

test("... and gone in the next test", function(t)
  t:assert_eq(provium.mine, nil)
  t:assert_eq(provium:vm("mine", "linux"):state(), "created")
end)

test("federation sub-labs do not fall through", function(t)
  t:assert_eq(fed.shared, nil)
  t:assert_contains(t:assert_raises(function() fed:vm("shared") end), "no vm named `shared` in lab `dc1`")
end)

test("duplicates in one lab are refused", function(t)
  provium:vm("twice", "linux")
  t:assert_contains(t:assert_raises(function() provium:vm("twice", "linux") end), "DuplicateVmName")
end)

test("include and remove are graph-only", function(t)
  local other = provium:lab("other")
  other:include(shared)
  t:assert_eq(other.shared, shared)
  other:remove("shared")
  t:assert_eq(other.shared, nil)
  t:assert_eq(shared:state(), "created")
  local kinds = {}
  for _, m in ipairs(provium:members()) do kinds[#kinds + 1] = m.kind .. ":" .. m.name end
  table.sort(kinds)
  t:assert_eq(table.concat(kinds, ","), "sub_lab:other")
end)

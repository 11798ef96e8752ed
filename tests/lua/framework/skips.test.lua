-- Skips: declarative, inline, and inline-after-pcall.
test("declarative skip", {skip = "not today"}, function(t)
  error("must not run")
end)

test("inline skip", function(t)
  t:skip("inline reason")
  error("unreachable")
end)

test("slow tests are skipped without --include-slow", {slow = true}, function(t)
  error("must not run")
end)

-- The test framework installed onto every test file's Lua state: test(),
-- todo(), wait_until() and the `t` context. The runner (runner/file.rs) reads
-- the registry through _provium_framework and drives one test at a time.
-- Rust provides: _provium_host.sleep(seconds), _provium_host.now() (seconds,
-- monotonic), _provium_host.duration(value, what) -> seconds.

local host = _provium_host

-- Errors raised by Provium's own (Rust) functions arrive as error objects;
-- test code sees their message as a plain string, as with error("...").
local errmsg = host.errmsg
local raw_pcall, raw_xpcall = pcall, xpcall

function pcall(f, ...)
  local r = table.pack(raw_pcall(f, ...))
  if not r[1] then
    r[2] = errmsg(r[2])
  end
  return table.unpack(r, 1, r.n)
end

function xpcall(f, handler, ...)
  return raw_xpcall(f, function(e) return handler(errmsg(e)) end, ...)
end
local registry = { tests = {}, names = {}, todo = nil }

-- Raised by t:skip(); recognised by identity, never shown to users.
local SKIP = setmetatable({}, { __tostring = function() return "skip" end })

function test(name, meta, fn)
  if type(name) ~= "string" then
    error("test: the name must be a string (got " .. type(name) .. ")", 2)
  end
  if fn == nil then
    fn, meta = meta, nil
  end
  if type(fn) ~= "function" then
    error("test: `" .. name .. "` needs a function body: test(name, [meta,] function(t) ... end)", 2)
  end
  if meta ~= nil and type(meta) ~= "table" then
    error("test: `" .. name .. "`: meta must be a table (got " .. type(meta) .. ")", 2)
  end
  if registry.names[name] then
    error("test: duplicate name `" .. name .. "` in this file", 2)
  end
  registry.names[name] = true
  registry.tests[#registry.tests + 1] = { name = name, meta = meta or {}, fn = fn }
end

function todo(reason)
  registry.todo = reason == nil and "todo" or tostring(reason)
end

function wait_until(predicate, opts)
  if type(predicate) ~= "function" then
    error("wait_until: the predicate must be a function", 2)
  end
  opts = opts or {}
  local timeout = host.duration(opts.timeout == nil and 10 or opts.timeout, "wait_until: timeout")
  local interval = host.duration(opts.interval == nil and 0.1 or opts.interval, "wait_until: interval")
  local desc = opts.desc or "condition"
  local deadline = host.now() + timeout
  while true do
    -- A raising predicate propagates at once: it is a bug, not "not yet".
    local value = predicate()
    if value then
      return value
    end
    if host.now() >= deadline then
      error(string.format("wait_until: %s not met within %gs", desc, timeout), 2)
    end
    host.sleep(interval)
  end
end

local function show(v)
  if type(v) == "string" then
    return string.format("%q", v)
  end
  return tostring(v)
end

local function prefixed(msg, text)
  if msg == nil then
    return text
  end
  return tostring(msg) .. ": " .. text
end

local T = {}
T.__index = T

-- Record the first failure (sticky: survives a pcall that swallows the
-- raise) and raise it.
function T:_failed(message)
  if self._failure == nil then
    self._failure = message
  end
  error(message, 0)
end

function T:assert(cond, msg)
  if not cond then
    self:_failed(msg == nil and "assertion failed" or tostring(msg))
  end
  return cond
end

function T:assert_eq(a, b, msg)
  if a ~= b then
    self:_failed(prefixed(msg, show(a) .. " ~= " .. show(b)))
  end
end

function T:assert_neq(a, b, msg)
  if a == b then
    self:_failed(prefixed(msg, show(a) .. " == " .. show(b)))
  end
end

function T:assert_contains(haystack, needle, msg)
  if type(haystack) ~= "string" or type(needle) ~= "string" then
    error(string.format("assert_contains: both arguments must be strings (got %s, %s); "
      .. "to search a table use a loop with t:assert", type(haystack), type(needle)), 2)
  end
  if string.find(haystack, needle, 1, true) == nil then
    self:_failed(prefixed(msg, show(haystack) .. " does not contain " .. show(needle)))
  end
end

function T:assert_raises(fn, msg)
  if type(fn) ~= "function" then
    error("assert_raises: expected a function (got " .. type(fn) .. ")", 2)
  end
  -- An assertion inside fn (used to trigger the raise) must not poison the
  -- rest of the test: save the sticky record and restore it on a raise.
  local saved = self._failure
  local ok, err = pcall(fn)
  if ok then
    self:_failed(prefixed(msg, "expected to raise"))
  end
  self._failure = saved
  return err
end

function T:fail(msg)
  self:_failed(msg == nil and "explicit failure (t:fail)" or tostring(msg))
end

function T:skip(reason)
  self._skip = reason == nil and "skipped" or tostring(reason)
  error(SKIP, 0)
end

function T:log(msg)
  self._log[#self._log + 1] = tostring(msg)
end

local function message_of(err)
  err = errmsg(err)
  if type(err) == "string" then
    return err
  end
  local mt = getmetatable(err)
  if type(err) == "table" and not (mt and mt.__tostring) then
    -- Show the fields (one level deep, sorted) rather than an address.
    local parts = {}
    for k, v in pairs(err) do
      parts[#parts + 1] = tostring(k) .. " = " .. show(v)
    end
    table.sort(parts)
    return "error object: {" .. table.concat(parts, ", ") .. "}"
  end
  return tostring(err)
end

-- Runs one test; returns status ("passed"|"failed"|"skipped"), message, log.
local function run_test(entry)
  local t = setmetatable({ name = entry.name, meta = entry.meta, _log = {} }, T)
  local ok, err = pcall(entry.fn, t)
  if t._failure ~= nil then
    return "failed", t._failure, t._log
  end
  if not ok then
    if err == SKIP then
      return "skipped", t._skip, t._log
    end
    return "failed", message_of(err), t._log
  end
  if t._skip ~= nil then
    -- t:skip() raised but the body swallowed it with pcall: still a skip.
    return "skipped", t._skip, t._log
  end
  return "passed", nil, t._log
end

_provium_framework = { registry = registry, run_test = run_test }

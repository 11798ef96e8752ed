-- disk:read_sectors / disk:write_sectors: host-side, on the backing image,
-- 512-byte sectors. Nothing boots.
local h = require("disks.helper")
local has_disks = h.probe()

local function disk(t, vm_name, bytes, fill)
  if not has_disks then t:skip(h.NO_DISKS) end
  local img = h.image(bytes, fill)
  return provium:vm(vm_name, "linux"):attach_disk({id = "vda", image = img}), img
end

test("reads are whole sectors from the image", function(t)
  local d, img = disk(t, "s1", 8 * 512)
  -- Mark sectors 2 and 3 in the file itself.
  local f = assert(io.open(img, "r+b"))
  f:seek("set", 2 * 512); f:write(string.rep("A", 512) .. string.rep("B", 512)); f:close()
  t:assert_eq(d:read_sectors(0, 1), string.rep("\0", 512))
  local two = d:read_sectors(2, 2)
  t:assert_eq(#two, 1024)
  t:assert_eq(two, string.rep("A", 512) .. string.rep("B", 512))
  t:assert_eq(#d:read_sectors(0, 8), 8 * 512, "the whole disk")
  t:assert_eq(d:read_sectors(3, 0), "", "zero sectors read nothing")
  t:assert_eq(d:read_sectors(2.0, 1), string.rep("A", 512), "an integral float is a sector number")
  os.remove(img)
end)

test("writes land verbatim at the sector's byte offset", function(t)
  local d, img = disk(t, "s2", 8 * 512, ".")
  d:write_sectors(5, "hello, sector 5")
  local bytes = h.slurp(img)
  t:assert_eq(bytes:sub(5 * 512 + 1, 5 * 512 + 15), "hello, sector 5")
  t:assert_eq(bytes:sub(5 * 512 + 16, 5 * 512 + 16), ".", "not padded to a sector")
  t:assert_eq(#bytes, 8 * 512, "the image did not grow")
  t:assert_eq(d:read_sectors(5, 1):sub(1, 15), "hello, sector 5")
  -- A write may span sectors, up to the last byte of the image.
  d:write_sectors(6, string.rep("x", 1024))
  t:assert_eq(d:read_sectors(6, 2), string.rep("x", 1024))
  d:write_sectors(7, "")
  t:assert_eq(h.slurp(img):sub(-512), string.rep("x", 512), "an empty write changes nothing")
  os.remove(img)
end)

test("ranges past the end are errors naming the size", function(t)
  -- 8 whole sectors and a partial one: the partial sector is not readable.
  local d, img = disk(t, "s3", 8 * 512 + 100)
  t:assert_contains(t:assert_raises(function() d:read_sectors(7, 2) end),
    "disk:read_sectors: sectors 7..7+2 are past the end of disk `vda` (8 sectors: image " .. img .. " is 4196 bytes)")
  t:assert_contains(t:assert_raises(function() d:read_sectors(8, 1) end), "past the end of disk `vda`")
  t:assert_contains(t:assert_raises(function() d:read_sectors(math.maxinteger, 2) end), "past the end")
  t:assert_eq(#d:read_sectors(7, 1), 512, "the last whole sector reads")
  t:assert_contains(t:assert_raises(function() d:write_sectors(8, string.rep("y", 101)) end),
    "disk:write_sectors: 101 bytes at sector 8 end at byte 4197, past the end of disk `vda`")
  t:assert_contains(t:assert_raises(function() d:write_sectors(math.maxinteger, "y") end),
    "disk:write_sectors: sector " .. math.maxinteger .. " is past the end of disk `vda`")
  d:write_sectors(8, string.rep("y", 100))
  t:assert_eq(#h.slurp(img), 8 * 512 + 100, "a refused write never grows the image")
  os.remove(img)
end)

test("bad arguments are named", function(t)
  local d, img = disk(t, "s4", 4 * 512)
  t:assert_contains(t:assert_raises(function() d:read_sectors(-1, 1) end),
    "disk:read_sectors: offset must be a whole number of sectors >= 0, got -1")
  t:assert_contains(t:assert_raises(function() d:read_sectors(0, 1.5) end),
    "disk:read_sectors: count must be a whole number of sectors >= 0, got 1.5")
  t:assert_contains(t:assert_raises(function() d:read_sectors(0) end),
    "disk:read_sectors: count must be a whole number of sectors >= 0, got nil")
  t:assert_contains(t:assert_raises(function() d:write_sectors("0", "x") end),
    "disk:write_sectors: offset must be a whole number of sectors >= 0, got string")
  t:assert_contains(t:assert_raises(function() d:write_sectors(0, 42) end),
    "disk:write_sectors: data must be a string of bytes, got integer")
  os.remove(img)
end)

test("without an image, sector ops say disk:with_image is required", function(t)
  if not has_disks then t:skip(h.NO_DISKS) end
  local d = provium:vm("s5", "linux"):attach_disk({id = "vdb", size = 1024 * 1024})
  t:assert_eq(t:assert_raises(function() d:read_sectors(0, 1) end),
    "disk:read_sectors: no backing image — disk:with_image required")
  t:assert_eq(t:assert_raises(function() d:write_sectors(0, "x") end),
    "disk:write_sectors: no backing image — disk:with_image required")
end)

test("detach: sector ops error, the image is left alone, detach is idempotent", function(t)
  local d, img = disk(t, "s6", 4 * 512, "k")
  d:detach()
  d:detach()
  t:assert_eq(d:is_detached(), true)
  t:assert_eq(t:assert_raises(function() d:read_sectors(0, 1) end), "disk:read_sectors: disk is detached")
  t:assert_eq(t:assert_raises(function() d:write_sectors(0, "x") end), "disk:write_sectors: disk is detached")
  t:assert_eq(h.slurp(img), string.rep("k", 4 * 512))
  -- The lookup still finds it (a detached handle, not a vanished one).
  t:assert_eq(provium:vm("s6"):disk("vda"):is_detached(), true)
  os.remove(img)
end)

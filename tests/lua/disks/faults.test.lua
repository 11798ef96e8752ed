-- Fault injection through the Disk: the modes, their order of checks, and
-- that they act on host-side sector ops. (That the same fault set reaches
-- the guest's virtio-blk requests is tested in Rust, through the VMM's block
-- layer: harness/src/backend/kvm/config.rs.) Nothing boots.
local h = require("disks.helper")
local has_disks = h.probe()

local function disk(t, vm_name, fill)
  if not has_disks then t:skip(h.NO_DISKS) end
  local img = h.image(8 * 512, fill)
  return provium:vm(vm_name, "linux"):attach_disk({id = "vda", image = img}), img
end

test("eio_read fails reads only, before any I/O", function(t)
  local d, img = disk(t, "f1", "r")
  d:fault_inject("eio_read")
  t:assert_eq(t:assert_raises(function() d:read_sectors(0, 1) end), "disk:read_sectors: EIO (fault_inject)")
  -- EIO comes before the bounds check: no I/O is attempted at all.
  t:assert_eq(t:assert_raises(function() d:read_sectors(100, 1) end), "disk:read_sectors: EIO (fault_inject)")
  d:write_sectors(0, "written under eio_read")
  t:assert_eq(h.slurp(img):sub(1, 22), "written under eio_read", "writes still work")
  d:clear_faults()
  t:assert_eq(d:read_sectors(0, 1):sub(1, 22), "written under eio_read")
  os.remove(img)
end)

test("eio_write fails writes only, and the image is not touched", function(t)
  local d, img = disk(t, "f2", "w")
  d:fault_inject("eio_write")
  t:assert_eq(t:assert_raises(function() d:write_sectors(0, "lost") end), "disk:write_sectors: EIO (fault_inject)")
  t:assert_eq(h.slurp(img), string.rep("w", 8 * 512), "nothing was written")
  t:assert_eq(d:read_sectors(0, 1), string.rep("w", 512), "reads still work")
  d:clear_faults()
  d:write_sectors(0, "kept")
  t:assert_eq(d:read_sectors(0, 1):sub(1, 4), "kept")
  os.remove(img)
end)

test("unknown modes are refused with the valid list", function(t)
  local d, img = disk(t, "f3")
  t:assert_eq(t:assert_raises(function() d:fault_inject("eio") end),
    "disk:fault_inject: unknown mode `eio` (valid: eio_read, eio_write, slow)")
  t:assert_eq(t:assert_raises(function() d:fault_inject(nil) end),
    "disk:fault_inject: mode must be a string (valid: eio_read, eio_write, slow), got nil")
  t:assert_eq(#d:active_faults(), 0, "a refused mode activates nothing")
  os.remove(img)
end)

test("active_faults lists the active modes in a fixed order; clear_faults clears them all", function(t)
  local d, img = disk(t, "f4")
  d:fault_inject("slow")
  d:fault_inject("eio_read")
  d:fault_inject("slow") -- again: still once
  local a = d:active_faults()
  t:assert_eq(#a, 2)
  t:assert_eq(a[1], "eio_read")
  t:assert_eq(a[2], "slow")
  d:fault_inject("eio_write")
  t:assert_eq(table.concat(d:active_faults(), ","), "eio_read,eio_write,slow")
  d:clear_faults()
  t:assert_eq(#d:active_faults(), 0)
  t:assert_eq(#d:read_sectors(0, 1), 512, "reads recover after clear")
  os.remove(img)
end)

test("slow + eio_read is still EIO", function(t)
  local d, img = disk(t, "f5")
  d:fault_inject("slow")
  d:fault_inject("eio_read")
  t:assert_eq(t:assert_raises(function() d:read_sectors(0, 1) end), "disk:read_sectors: EIO (fault_inject)")
  d:write_sectors(0, "slow write") -- slow, but eio_read does not affect writes
  t:assert_eq(h.slurp(img):sub(1, 10), "slow write")
  os.remove(img)
end)

test("slow delays each op by 50 ms and does not change its outcome", function(t)
  local d, img = disk(t, "f6")
  d:fault_inject("slow")
  -- os.time() has 1 s resolution; 21 ops take at least 21 x 50 ms > 1 s,
  -- so at least one whole second boundary passes. A lower bound only.
  local before = os.time()
  for i = 0, 20 do
    if i % 2 == 0 then
      d:write_sectors(i % 8, "slow " .. i)
    else
      t:assert_eq(#d:read_sectors(i % 8, 1), 512)
    end
  end
  t:assert(os.time() - before >= 1, "21 slow ops took less than a second")
  t:assert_eq(d:read_sectors(4, 1):sub(1, 7), "slow 20", "the writes still landed")
  os.remove(img)
end)

test("faults on a detached disk: the detached error comes first", function(t)
  local d, img = disk(t, "f7")
  d:fault_inject("eio_read")
  d:detach()
  t:assert_eq(t:assert_raises(function() d:read_sectors(0, 1) end), "disk:read_sectors: disk is detached")
  os.remove(img)
end)

-- vm:attach_disk / vm:disk and the Disk accessors, on a kvm-backend VM that
-- is created but never booted (nothing here needs a guest). On the local
-- backend only the refusal test runs; the rest skip, saying why.
local h = require("disks.helper")
local has_disks, probe_err = h.probe()

local function need_disks(t)
  if not has_disks then t:skip(h.NO_DISKS) end
end

test("the local backend refuses disks, naming the backend and the fix", function(t)
  if has_disks then t:skip("this run's backend (kvm) has disks; the refusal is the local backend's") end
  t:assert_contains(tostring(probe_err), "vm:attach_disk: vm `disk-probe`: the local backend has no block devices")
  t:assert_contains(tostring(probe_err), "run with --vmm kvm")
end)

test("defaults: id attached-<vm>, size 4 GiB, no image", function(t)
  need_disks(t)
  local vm = provium:vm("d1", "linux")
  local d = vm:attach_disk()
  t:assert_eq(d:id(), "attached-d1")
  t:assert_eq(d:size(), 4 * 1024 * 1024 * 1024)
  t:assert_eq(d:image(), nil)
  t:assert_eq(d:is_detached(), false)
  t:assert_eq(d:guest_device(), nil, "no guest device before boot")
  t:assert_eq(tostring(d), "Disk(attached-d1 on d1)")
  t:assert_eq(#d:active_faults(), 0)
end)

test("size: bytes or a size string; an image's live size wins", function(t)
  need_disks(t)
  local vm = provium:vm("d2", "linux")
  t:assert_eq(vm:attach_disk({id = "a", size = 1024 * 1024}):size(), 1024 * 1024)
  t:assert_eq(vm:attach_disk({id = "b", size = "2M"}):size(), 2 * 1024 * 1024)
  local img = h.image(8 * 512)
  local d = vm:attach_disk({id = "c", size = 512, image = img})
  t:assert_eq(d:size(), 8 * 512)
  -- Resize the file under the disk: :size() reports the live size.
  local f = assert(io.open(img, "ab")); f:write(string.rep("\0", 512)); f:close()
  t:assert_eq(d:size(), 9 * 512)
  os.remove(img)
  t:assert_contains(t:assert_raises(function() d:size() end), "disk:size: disk `c`: cannot stat image")
end)

test("vm:disk finds attached disks by id and names the known ones otherwise", function(t)
  need_disks(t)
  local vm = provium:vm("d3", "linux")
  local img1, img2 = h.image(4096), h.image(4096)
  local data = vm:attach_disk({id = "vdb", size = 1024 * 1024, image = img1})
  local logs = vm:attach_disk({id = "vdc", size = 1024 * 1024, image = img2})
  -- The same disk: a fault set through one handle shows through the other.
  vm:disk("vdb"):fault_inject("slow")
  t:assert_eq(data:active_faults()[1], "slow")
  t:assert_eq(#logs:active_faults(), 0, "faults are per disk")
  t:assert_eq(vm:disk("vdc"), logs)
  t:assert_neq(vm:disk("vdb"), logs)
  local e = t:assert_raises(function() vm:disk("vdz") end)
  t:assert_contains(e, 'vm:disk("vdz"): vm `d3` has no disk with that id (disks: vdb, vdc)')
  t:assert_contains(t:assert_raises(function() vm:disk(7) end), "vm:disk: the id must be a string, got integer")
  local empty = provium:vm("d3e", "linux")
  t:assert_contains(t:assert_raises(function() empty:disk("x") end), "(disks: none)")
  os.remove(img1); os.remove(img2)
end)

test("bad opts are named, with the fix", function(t)
  need_disks(t)
  local vm = provium:vm("d4", "linux")
  local cases = {
    {{sise = 1}, "vm:attach_disk: unknown option `sise` (accepted: id, size, image)"},
    {{size = 1000}, "vm:attach_disk: size 1000 is not a positive multiple of the 512-byte sector (round it, e.g. 1024)"},
    {{size = 0}, "vm:attach_disk: size must be a positive number of bytes"},
    {{size = "lots"}, "vm:attach_disk: size: "},
    {{id = ""}, "vm:attach_disk: id must be a non-empty name"},
    {{id = 5}, "vm:attach_disk: id must be a string like \"vdb\", got integer"},
    {{image = 5}, "vm:attach_disk: image must be a path string, got integer"},
    {{image = "/nonexistent/disk.img"}, "vm:attach_disk: image /nonexistent/disk.img: No such file or directory (os error 2) (create the backing file first; Provium does not create it)"},
    {{image = "/tmp"}, "vm:attach_disk: image /tmp is not a regular file"},
  }
  for _, c in ipairs(cases) do
    t:assert_contains(t:assert_raises(function() vm:attach_disk(c[1]) end), c[2])
  end
  t:assert_contains(t:assert_raises(function() vm:attach_disk("vda") end),
    "vm:attach_disk: opts must be a table like {id = \"vda\", image = \"/path/disk.img\"}, got string")
  -- Nothing was attached by the refused calls.
  t:assert_contains(t:assert_raises(function() vm:disk("attached-d4") end), "(disks: none)")
end)

test("duplicate ids and a shared image file are refused", function(t)
  need_disks(t)
  local vm = provium:vm("d5", "linux")
  local img = h.image(4096)
  vm:attach_disk({id = "vda", image = img})
  t:assert_contains(t:assert_raises(function() vm:attach_disk({id = "vda"}) end),
    "vm:attach_disk: vm `d5` already has a disk `vda` (ids are unique per VM")
  t:assert_contains(t:assert_raises(function() vm:attach_disk({id = "vdb", image = img}) end),
    "already backs disk `vda` of vm `d5`")
  -- Another VM may have a disk of the same id.
  t:assert_eq(provium:vm("d5b", "linux"):attach_disk({id = "vda"}):id(), "vda")
  os.remove(img)
end)

test("with_image gives an image-less disk its file, once", function(t)
  need_disks(t)
  local vm = provium:vm("d6", "linux")
  local img = h.image(2 * 512, "z")
  local d = vm:attach_disk({id = "scratch", size = 512})
  t:assert_eq(d:with_image(img), d, "returns the disk, for chaining")
  t:assert_eq(d:read_sectors(1, 1), string.rep("z", 512))
  t:assert_contains(t:assert_raises(function() d:with_image(img) end),
    "disk:with_image: disk `scratch` already has image")
  t:assert_contains(t:assert_raises(function() d:with_image(3) end), "disk:with_image: path must be a string, got integer")
  local other = vm:attach_disk({id = "other"})
  t:assert_contains(t:assert_raises(function() other:with_image("/nonexistent/x") end),
    "disk:with_image: image /nonexistent/x: No such file")
  t:assert_contains(t:assert_raises(function() other:with_image(img) end), "already backs disk `scratch`")
  other:detach()
  t:assert_eq(t:assert_raises(function() other:with_image(img) end), "disk:with_image: disk is detached")
  os.remove(img)
end)

test("a shut-down VM takes no disk, and its disks are detached", function(t)
  need_disks(t)
  local vm = provium:vm("d7", "linux")
  local img = h.image(4096)
  local d = vm:attach_disk({id = "vda", image = img})
  vm:shutdown()
  t:assert_eq(d:is_detached(), true)
  t:assert_eq(t:assert_raises(function() d:read_sectors(0, 1) end), "disk:read_sectors: disk is detached")
  t:assert_contains(t:assert_raises(function() vm:attach_disk({id = "vdb"}) end),
    "vm:attach_disk: vm `d7` is shutdown; attach disks to a created vm (given at vm:boot()) or a booted one (into a disk slot)")
  os.remove(img)
end)

test("booting refuses a disk without an image, naming the fix", function(t)
  need_disks(t)
  local vm = provium:vm("d8", "linux")
  vm:attach_disk({id = "blank"})
  local e = t:assert_raises(function() vm:boot() end)
  t:assert_contains(e, "vm:boot: vm `d8`: disk `blank` has no backing image")
  t:assert_contains(e, "disk:with_image(path) before vm:boot()")
  t:assert_eq(vm:state(), "created", "nothing was started")
end)

test("a boot that fails before the VM is built gives no disk a guest device", function(t)
  need_disks(t)
  -- This config's profile kernel does not exist: the boot fails early.
  local vm = provium:vm("d9", "linux")
  local img = h.image(4096)
  local d = vm:attach_disk({id = "vda", image = img})
  t:assert_contains(t:assert_raises(function() vm:boot() end), "does not exist")
  t:assert_eq(d:guest_device(), nil)
  t:assert_eq(vm:state(), "created")
  t:assert_eq(d:is_detached(), false, "the disk is still attached")
  os.remove(img)
end)

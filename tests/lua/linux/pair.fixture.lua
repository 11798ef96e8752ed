-- The suite's lab fixture: two Linux guests on bridge `lan`, `a` with a
-- 16 MiB disk filled with "d". Disks and NICs are announced on the kernel
-- command line at boot (no hotplug without ACPI), so they are part of the
-- snapshot; every restore recreates them (the disk from its image as it
-- is then, the NICs on a bridge of the same name with the same MACs).
-- devices.test.lua restores it, which proves a lab fixture with a bridge
-- and a disk on kvm. Both boot the `linux-overlay` profile, whose agent
-- comes from a prebuilt overlay (`agent_overlay_path`, written by
-- harness/tests/real_kernel.rs with a marker file in it).
local IMAGE_BYTES = 16 << 20

local img = os.tmpname()
local f = assert(io.open(img, "wb"))
f:write(string.rep("d", IMAGE_BYTES))
f:close()

local lan = provium:bridge("lan")
local a = provium:vm("a", "linux-overlay")
local b = provium:vm("b", "linux-overlay")
a:attach_disk({id = "data", image = img})
lan:attach({a, b})
provium:boot() -- both at once
return provium:snapshot()

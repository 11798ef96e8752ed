-- The one boot of the real-guest tier (tests/README.md, tier 6): a Linux
-- guest with the agent injected, booted once and snapshotted into the
-- fixture cache; every other file of this suite restores it (vm_fixture with
-- the name "base"). The marker proves a restore runs the
-- snapshot's guest, not a fresh boot. The rng seed pins the guest's
-- virtio-rng stream in every VM restored from it (machine.test.lua).
local vm = provium:vm("base", "linux"):boot({rng_seed = 0x5eed})
vm:write_file("/etc/provium-fixture", "base\n")
return vm:snapshot()

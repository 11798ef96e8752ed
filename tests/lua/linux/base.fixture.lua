-- The one boot of the real-guest tier (tests/README.md, tier 6): a Linux
-- guest with the agent injected, booted once and snapshotted into the
-- fixture cache; every other file of this suite restores it (vm_fixture with
-- the name "base"). The marker proves a restore runs the
-- snapshot's guest, not a fresh boot.
local vm = provium:vm("base", "linux"):boot()
vm:write_file("/etc/provium-fixture", "base\n")
return vm:snapshot()

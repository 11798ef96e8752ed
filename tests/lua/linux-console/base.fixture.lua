-- The console channel's one boot (harness/tests/real_kernel.rs): the same
-- guest as tests/lua/linux's base fixture, on a profile with
-- agent_channel = "console", so the VMM gives it a virtio-console port
-- instead of vsock and the agent serves there. Booted once, snapshotted
-- with the session live; every test restores it, which makes the restored
-- guest end that session and start a fresh one on the port.
local vm = provium:vm("base", "linux"):boot({rng_seed = 0x5eed})
vm:write_file("/etc/provium-fixture", "base\n")
return vm:snapshot()

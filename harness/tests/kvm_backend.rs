//! The `kvm` backend through `provium --vmm kvm` and Lua: what this machine
//! (kvm_pvm, DESIGN.md "This machine's KVM") can prove, and `--vmm auto`.
//!
//! - The probe kernel (tier 5) boots with the agent injected: the kernel
//!   finds our overlay's agent as rdinit ("Run /sbin/provium-agent as init
//!   process" in the console log and the failed test's excerpt) and runs it.
//!   The agent is a stand-in static ELF that only calls exit(0), so init
//!   exits and `vm:boot()` fails at once with the kernel's panic
//!   ("Attempted to kill init! exitcode=0x00000000": its system call ran,
//!   which on kvm_pvm takes the probe kernel's shims). The real agent's
//!   Hello is the real-kernel tier's; a tiny binary keeps the emulated
//!   kernel's cpio unpacking short.
//! - The tiny guest (no vsock driver) with `inject_agent = false` and a 2 s
//!   agent timeout: the boot fails within it, saying the kernel never reached
//!   init, with the guest's banner in the console excerpt; the dead VM's
//!   Console still reads its log, its stream is at EOF, writes are refused.
//! - `--vmm auto` picks kvm for a usable /dev/kvm and a profile kernel, and
//!   local (saying why) when that profile's initrd is missing.
//! - `KvmMachine::reset` and `power_button` on the tiny guest (which has no
//!   agent, so `vm:boot()` never reaches Booted in Lua here): a reset
//!   rebuilds the machine and then fails honestly, quoting only the new
//!   boot's console; the power button powers off a guest that reads its
//!   keyboard and powers off (tiny guest `W`), and says why for one that
//!   ignores it.
//!
//! KVM tests need /dev/kvm (`PROVIUM_SKIP_KVM=1` skips, printing why); the
//! probe test needs the probe kernel (`PROVIUM_SKIP_PROBE_KERNEL=1` skips).

mod common;

use common::{kvm_or_skip, probe_initrd, probe_kernel, PROBE_CMDLINE};

use std::path::Path;
use std::process::{Command, Output};

use provium_protocol::frame::{read_message, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::{Event, EventFrame};
use provium_vmm::tiny_guest;

fn write_exe(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn project(toml: &str, test: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("provium.toml"),
        format!("[provium]\nroots = [\"tests\"]\n\n{toml}"),
    )
    .unwrap();
    std::fs::create_dir_all(d.path().join("tests")).unwrap();
    std::fs::write(d.path().join("tests/kvm.test.lua"), test).unwrap();
    d
}

fn run(dir: &Path, vmm: &str, envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_provium"))
        .args([
            "--vmm",
            vmm,
            "--no-preflight",
            "--no-ksm",
            "--timeout",
            "1200",
        ])
        .arg("--save-events")
        .arg(dir.join("events.bin"))
        .current_dir(dir)
        .env("PROVIUM_RERUN_STATE", dir.join("rerun.json"))
        .env("PROVIUM_OVERLAY_CACHE", dir.join("overlay-cache"))
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

fn events(dir: &Path) -> Vec<Event> {
    let bytes = std::fs::read(dir.join("events.bin")).unwrap();
    let mut r = &bytes[..];
    let mut out = Vec::new();
    while let Some(f) = read_message::<EventFrame, _>(&mut r, DEFAULT_MAX_FRAME_BYTES).unwrap() {
        out.push(f.event);
    }
    out
}

/// The one TestFailed event: (reason, console excerpt).
fn failure(dir: &Path, o: &Output) -> (String, String) {
    let failed: Vec<_> = events(dir)
        .into_iter()
        .filter_map(|e| match e {
            Event::TestFailed(f) => Some((f.reason, f.console_excerpt)),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 1, "one failed test expected; {o:?}");
    failed.into_iter().next().unwrap()
}

/// A static x86-64 ELF whose whole program is `exit(0)` (`mov eax, 60;
/// xor edi, edi; syscall`), loaded at 0x400000.
fn exit0_elf() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    let code = [0xb8, 60, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05];
    let size = (64 + 56 + code.len()) as u64;
    let mut elf = b"\x7fELF\x02\x01\x01\x00".to_vec();
    elf.extend([0u8; 8]);
    elf.extend(2u16.to_le_bytes()); // ET_EXEC
    elf.extend(0x3eu16.to_le_bytes()); // x86-64
    elf.extend(1u32.to_le_bytes());
    elf.extend((BASE + 120).to_le_bytes()); // entry: the code
    elf.extend(64u64.to_le_bytes()); // phoff
    elf.extend(0u64.to_le_bytes()); // shoff
    elf.extend(0u32.to_le_bytes());
    for h in [64u16, 56, 1, 0, 0, 0] {
        elf.extend(h.to_le_bytes()); // ehsize, phentsize, phnum, sh*
    }
    elf.extend(1u32.to_le_bytes()); // PT_LOAD
    elf.extend(5u32.to_le_bytes()); // R+X
    for v in [0, BASE, BASE, size, size, 0x1000] {
        elf.extend(v.to_le_bytes());
    }
    elf.extend(code);
    elf
}

#[test]
fn the_exit0_stand_in_exits_0() {
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("exit0");
    write_exe(&exe, &exit0_elf());
    let status = Command::new(&exe).status().unwrap();
    assert_eq!(status.code(), Some(0));
}

// File-scope VMs: a test-scope VM is shut down (scope exit) before the
// runner takes the failed test's console excerpt.
const PROBE_TEST: &str = r#"
local vm = provium:vm("v", "probe", {memory = "256M"})
test("boot", function(t)
    local ok, e = pcall(function() vm:boot() end)
    t:assert(not ok, "the stand-in agent exits at once: vm:boot() must fail")
    t:assert_eq(vm:state(), "dead")
    t:assert(vm:cid() ~= nil and vm:cid() >= 3, "a guest CID was assigned")
    local log = vm:console():read_log()
    t:assert(log:find("Run /sbin/provium-agent as init process", 1, true), "rdinit line in the log")
    -- The probe kernel has ACPI: the harness gives it the DSDT's devices
    -- and no virtio_mmio.device= words (never both: docs/vmm.md, "ACPI").
    t:assert(log:find("ACPI: DSDT", 1, true), "our devices in the ACPI tables")
    t:assert(not log:find("virtio_mmio.device=", 1, true), "no command-line devices beside them")
    error(e)
end)
"#;

#[test]
fn probe_kernel_boot_fails_honestly_with_the_console() {
    let test = "probe_kernel_boot_fails_honestly_with_the_console";
    if !kvm_or_skip(test) {
        return;
    }
    let Some(kernel) = probe_kernel(test) else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let initrd = probe_initrd(d.path());
    let agent = d.path().join("stand-in-agent");
    write_exe(&agent, &exit0_elf());
    let p = project(
        &format!(
            "[profiles.probe]\nkernel = {kernel:?}\ninitrd = {initrd:?}\ncmdline = {PROBE_CMDLINE:?}\nguest_os = \"linux\"\n"
        ),
        PROBE_TEST,
    );
    let t0 = std::time::Instant::now();
    let o = run(
        p.path(),
        "kvm",
        &[
            ("PROVIUM_AGENT", agent.to_str().unwrap()),
            // Long enough to reach init on a loaded 2-core machine; the
            // panic comes right after init.
            ("PROVIUM_KVM_AGENT_TIMEOUT", "1100"),
        ],
    );
    eprintln!("probe boot to the honest failure: {:?}", t0.elapsed());
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let (reason, excerpt) = failure(p.path(), &o);
    for want in [
        "vm:boot: vm `v`: the agent did not answer",
        "the guest kernel panicked before its agent answered",
        "last console lines:",
        // exit(0) ran: the stand-in's system call reached the kernel.
        "Attempted to kill init! exitcode=0x00000000",
    ] {
        assert!(reason.contains(want), "missing {want:?} in:\n{reason}");
    }
    assert!(
        excerpt.starts_with("--- v console ---")
            && excerpt.contains("Run /sbin/provium-agent as init process"),
        "console excerpt:\n{excerpt}"
    );
}

const TINY_TEST: &str = r#"
local vm = provium:vm("v", "tiny", {memory = "64M"})
test("boot", function(t)
    local c = vm:console()
    local ok, e = pcall(function() c:read_log() end)
    t:assert(not ok and tostring(e):find("VM not booted", 1, true), tostring(e))
    ok, e = pcall(function() vm:boot({rng_seed = 7}) end)
    t:assert(not ok, "no agent: the boot must fail")
    t:assert_eq(vm:state(), "dead")
    t:assert(c:read_log():find("PROVIUM-TINY-GUEST v1", 1, true), "banner in the log")
    t:assert_eq(c:expect("READY", "5s"), "READY")
    local ok2, e2 = pcall(function() c:expect("never printed", "100ms") end)
    t:assert(not ok2 and tostring(e2):find("never printed", 1, true), tostring(e2))
    local s = c:read()
    t:assert_eq(s:next("100ms"), nil)
    t:assert(s:eof(), "a dead VM's console stream is at EOF")
    s:close()
    local ok3, e3 = pcall(function() c:write("x") end)
    t:assert(not ok3 and tostring(e3):find("is dead", 1, true), tostring(e3))
    local ok4, e4 = pcall(function() c:write("x", {timeout_ms = 5}) end)
    t:assert(not ok4 and tostring(e4):find("timeout_ms is not supported", 1, true), tostring(e4))
    c:close()
    error(e)
end)
"#;

#[test]
fn agent_timeout_bounds_a_boot_without_an_agent() {
    let test = "agent_timeout_bounds_a_boot_without_an_agent";
    if !kvm_or_skip(test) {
        return;
    }
    let p = project(
        "[profiles.tiny]\nkernel = \"tiny.bzImage\"\ncmdline = \"tiny\"\nguest_os = \"linux\"\ninject_agent = false\n",
        TINY_TEST,
    );
    std::fs::write(p.path().join("tiny.bzImage"), tiny_guest::BZIMAGE).unwrap();
    let o = run(p.path(), "kvm", &[("PROVIUM_KVM_AGENT_TIMEOUT", "2")]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let (reason, excerpt) = failure(p.path(), &o);
    for want in [
        "no Hello from the agent on vsock port 1024",
        "within 2s",
        "PROVIUM_KVM_AGENT_TIMEOUT",
        "the kernel never reached init",
        tiny_guest::BANNER,
    ] {
        assert!(reason.contains(want), "missing {want:?} in:\n{reason}");
    }
    assert!(excerpt.contains(tiny_guest::BANNER), "excerpt:\n{excerpt}");
}

#[test]
fn vmm_auto_picks_kvm_for_a_bootable_profile() {
    let d = tempfile::tempdir().unwrap();
    let kernel = d.path().join("k.bzImage");
    std::fs::write(&kernel, tiny_guest::BZIMAGE).unwrap();
    let kvm_usable = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    let noop = "test(\"noop\", function(t) end)\n";
    let tiny =
        format!("[profiles.tiny]\nkernel = {kernel:?}\ncmdline = \"tiny\"\nguest_os = \"linux\"\n");
    let p = project(&tiny, noop);
    let o = run(p.path(), "auto", &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    let want = if kvm_usable {
        format!(
            "provium: --vmm auto: using the kvm backend (/dev/kvm is usable and profile `tiny`'s \
             kernel {} exists)",
            kernel.display()
        )
    } else {
        eprintln!("vmm_auto_picks_kvm_for_a_bootable_profile: /dev/kvm is not usable here: local expected");
        "provium: --vmm auto: using the local backend (/dev/kvm is not usable".to_string()
    };
    assert!(err.contains(&want), "missing {want:?} in:\n{err}");
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    if !kvm_usable {
        return;
    }
    // The same profile with an initrd that is not there: local, saying why.
    let p = project(&format!("{tiny}initrd = \"missing.cpio\"\n"), noop);
    let o = run(p.path(), "auto", &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("provium: --vmm auto: using the local backend (profile `tiny`'s initrd ")
            && err.contains("missing.cpio does not exist)"),
        "{err}"
    );
}

/// A VM declared inside the failing test is closed with the test's scope;
/// its console must still be in the failure's excerpt.
#[test]
fn a_test_scoped_vm_is_in_the_console_excerpt() {
    let test = "a_test_scoped_vm_is_in_the_console_excerpt";
    if !kvm_or_skip(test) {
        return;
    }
    let p = project(
        "[profiles.tiny]\nkernel = \"tiny.bzImage\"\ncmdline = \"tiny\"\nguest_os = \"linux\"\ninject_agent = false\n",
        "test('boot', function(t) provium:vm('scoped', 'tiny', {memory = '64M'}):boot() end)\n",
    );
    std::fs::write(p.path().join("tiny.bzImage"), tiny_guest::BZIMAGE).unwrap();
    let o = run(p.path(), "kvm", &[("PROVIUM_KVM_AGENT_TIMEOUT", "2")]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let (_, excerpt) = failure(p.path(), &o);
    assert!(
        excerpt.starts_with("--- scoped console ---") && excerpt.contains(tiny_guest::BANNER),
        "excerpt:\n{excerpt}"
    );
}

/// A profile for the tiny guest (written into `dir`), without the agent.
fn tiny_profile(dir: &Path) -> provium::config::Profile {
    let kernel = dir.join("tiny.bzImage");
    std::fs::write(&kernel, tiny_guest::BZIMAGE).unwrap();
    provium::config::Profile {
        name: "tiny".into(),
        kernel: Some(kernel),
        initrd: None,
        cmdline: "tiny".into(),
        cmdline_file: None,
        guest_os: "linux".into(),
        transport: Default::default(),
        inject_agent: false,
        agent_overlay_path: None,
        agent_channel: Default::default(),
        modules: None,
        build: None,
        build_out: dir.to_path_buf(),
        disk_slots: provium::config::profile::DEFAULT_DISK_SLOTS,
        nic_slots: provium::config::profile::DEFAULT_NIC_SLOTS,
    }
}

/// Devices after boot on kvm: a machine with no disk and no NIC gets one
/// disk slot and one NIC slot (the profile's `disk_slots`/`nic_slots`).
/// The tiny guest drives the first virtio-blk and virtio-net devices from
/// console commands: the empty slot fails its requests; `add_disk` gives it
/// the image (GET_ID, the bytes, eio_read apply); dropping the lease empties
/// it again. The NIC slot's link is down until `add_nic` plugs it into a
/// switch (config interrupt, link up, frames flow), and back down when the
/// lease goes. A second add past the limit names it and the profile key.
#[test]
fn a_running_kvm_machine_gets_a_disk_and_a_nic_in_its_slots() {
    use provium::backend::{self, BackendKind, DiskSpec, MachineSpec};
    use provium::error_chain::flatten;
    use provium_netsetup::{Port, Switch, SwitchConfig};
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;
    use std::time::Duration;

    let test = "a_running_kvm_machine_gets_a_disk_and_a_nic_in_its_slots";
    if !kvm_or_skip(test) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let profile = provium::config::Profile {
        disk_slots: 1,
        nic_slots: 1,
        ..tiny_profile(d.path())
    };
    let spec = MachineSpec {
        vm_name: "v".into(),
        profile_name: "tiny".into(),
        profile: Some(profile),
        memory_bytes: 64 << 20,
        cpus: 1,
        settings: provium::settings::Settings::from_env(),
        ..MachineSpec::default()
    };
    let kvm = backend::for_kind(BackendKind::Kvm);
    let m = kvm.boot(&spec).unwrap();
    assert!(m.capabilities().disks_after_boot.is_yes());
    let c = m.console().expect("kvm has a console");
    let wait = |s: &str, n: usize| {
        assert!(
            c.wait_for(s.as_bytes(), n, Duration::from_secs(60)),
            "{s:?} x{n}; console:\n{}",
            c.log_string()
        )
    };
    wait(tiny_guest::READY, 1);
    // rng, vsock, then the disk slot and the NIC slot.
    let log = c.log_string();
    assert!(log.contains("virtio_mmio.device=4K@0xd0002000:7"), "{log}");
    assert!(log.contains("virtio_mmio.device=4K@0xd0003000:8"), "{log}");

    // The empty slot: size 0, every request fails.
    c.write_input(&[tiny_guest::CMD_BLK_RW, 0x10]).unwrap();
    wait("BLK-RW w=01 r=01 data=00000000 bad\n", 1);

    let img = d.path().join("late.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let disk = DiskSpec {
        id: "late-disk".into(),
        image: img.clone(),
        faults: Default::default(),
    };
    let added = m.add_disk(&disk).unwrap();
    assert_eq!(added.guest_device, "/dev/vda");
    c.write_input(&[tiny_guest::CMD_BLK_ID]).unwrap();
    wait("BLK-ID s=00 late-disk\n", 1);
    c.write_input(&[tiny_guest::CMD_BLK_RW, 0x20]).unwrap();
    wait("BLK-RW w=00 r=00 data=20212223 ok\n", 1);
    let mut sector1 = vec![0u8; 512];
    std::fs::File::open(&img)
        .unwrap()
        .read_exact_at(&mut sector1, 512)
        .unwrap();
    assert_eq!(
        &sector1[..4],
        &[0x20, 0x21, 0x22, 0x23],
        "the guest wrote the image"
    );
    disk.faults.set("eio_read", true);
    c.write_input(&[tiny_guest::CMD_BLK_RW, 0x30]).unwrap();
    wait("BLK-RW w=00 r=01 data=00000000 bad\n", 1);
    disk.faults.set("eio_read", false);
    let e = flatten(&m.add_disk(&disk).unwrap_err());
    assert!(
        e.contains("all 1 disk slot(s) of profile `tiny` in use")
            && e.contains("raise `disk_slots`"),
        "{e}"
    );
    // A snapshot holds the disk added after boot: a restore that puts it
    // back into its slot serves the guest from it; one whose slot is empty
    // is refused, naming both sizes.
    m.pause().unwrap();
    let snap = d.path().join("v.snap");
    m.snapshot_to(&snap, &[]).unwrap();
    m.resume().unwrap();
    let e = kvm.restore(&spec, &snap).err().map(|e| flatten(&e));
    assert!(
        e.as_deref()
            .is_some_and(|e| e.contains("had 2048 sectors") && e.contains("has 0")),
        "{e:?}"
    );
    let with_disk = MachineSpec {
        slot_disks: vec![provium::backend::SlotDisk {
            slot: added.slot,
            disk: disk.clone(),
        }],
        ..spec.clone()
    };
    let r = kvm.restore(&with_disk, &snap).unwrap();
    let back = r.take_restored_disks();
    assert_eq!(back.len(), 1);
    assert_eq!(
        (back[0].guest_device.as_str(), back[0].slot),
        ("/dev/vda", 0)
    );
    let rc = r.console().expect("kvm has a console");
    rc.write_input(&[tiny_guest::CMD_BLK_RW, 0x50]).unwrap();
    assert!(
        rc.wait_for(
            b"BLK-RW w=00 r=00 data=50515253 ok\n",
            1,
            Duration::from_secs(60)
        ),
        "{}",
        rc.log_string()
    );
    r.kill();
    drop(back);
    added.lease.release();
    c.write_input(&[tiny_guest::CMD_BLK_RW, 0x40]).unwrap();
    wait("BLK-RW w=01 r=01 data=00000000 bad\n", 2);

    // The NIC slot: link down until plugged into the switch.
    c.write_input(&[tiny_guest::CMD_NET_UP]).unwrap();
    wait("NET-UP status=00\n", 1);
    let lan = Switch::new("lan", SwitchConfig::default());
    let peer = lan
        .attach("peer", "02:00:00:00:00:99".parse().unwrap())
        .unwrap();
    let mut connect = |mac| {
        Ok(Arc::new(lan.attach("v", mac)?))
            as Result<Arc<Port>, Box<dyn std::error::Error + Send + Sync>>
    };
    let nic = m.add_nic("eth0", &mut connect).unwrap();
    assert_eq!(nic.ifname, "eth0");
    c.write_input(&[tiny_guest::CMD_NET_LINK]).unwrap();
    wait("NET-LINK cfg-irq=02 status=01\n", 1);
    // A snapshot taken while the slot is plugged (its RX buffer posted): a
    // restore that plugs the slot into a port of another switch from the
    // start (what vm:restore does with the recorded bridge and MAC)
    // receives from it.
    m.pause().unwrap();
    let snap = d.path().join("v-nic.snap");
    m.snapshot_to(&snap, &[]).unwrap();
    m.resume().unwrap();
    let lan2 = Switch::new("lan2", SwitchConfig::default());
    let peer2 = lan2
        .attach("peer", "02:00:00:00:00:99".parse().unwrap())
        .unwrap();
    let with_nic = MachineSpec {
        slot_nics: vec![provium::backend::SlotNic {
            slot: nic.slot,
            bridge: "lan2".into(),
            port: Arc::new(lan2.attach("v", nic.mac).unwrap()),
        }],
        ..spec.clone()
    };
    let r = kvm.restore(&with_nic, &snap).unwrap();
    let back = r.take_restored_nics();
    assert_eq!(back.len(), 1);
    assert_eq!(
        (back[0].0.as_str(), back[0].1.ifname.as_str(), back[0].1.mac),
        ("lan2", "eth0", nic.mac)
    );
    let rc = r.console().expect("kvm has a console");
    let mut again = nic.mac.0.to_vec();
    again.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x99, 0x88, 0xb5]);
    again.extend_from_slice(b"BACK-NIC");
    again.resize(64, 0);
    peer2.send(&again).unwrap();
    rc.write_input(&[tiny_guest::CMD_NET_RX]).unwrap();
    assert!(
        rc.wait_for(b"NET-RX BACK-NIC\n", 1, Duration::from_secs(60)),
        "{}",
        rc.log_string()
    );
    r.kill();
    drop(back);
    let mut to_guest = nic.mac.0.to_vec();
    to_guest.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x99, 0x88, 0xb5]);
    to_guest.extend_from_slice(b"LATE-NIC");
    to_guest.resize(64, 0);
    peer.send(&to_guest).unwrap();
    c.write_input(&[tiny_guest::CMD_NET_RX]).unwrap();
    wait("NET-RX LATE-NIC\n", 1);
    let e = flatten(&m.add_nic("eth1", &mut connect).unwrap_err());
    assert!(e.contains("raise `nic_slots`"), "{e}");
    nic.lease.release();
    c.write_input(&[tiny_guest::CMD_NET_LINK]).unwrap();
    wait("NET-LINK cfg-irq=02 status=00\n", 1);
    m.kill();
}

/// The kvm backend's NIC path below Lua: `MachineSpec::nics` become
/// virtio-net devices of the booted VM. The tiny guest (no agent) drives its
/// device from console commands: its frame reaches the switch with the MAC
/// the harness chose, and a switch-side disconnect is the guest's link down.
/// A booted kvm machine refuses a new NIC, naming the fix.
#[test]
fn kvm_machine_nic_sends_to_the_switch_and_follows_the_link() {
    use provium::backend::NicSpec;
    use provium::backend::{self, BackendKind, MachineSpec};
    use provium::error_chain::flatten;
    use provium::lua::bridge::nic_mac;
    use provium_netsetup::{Switch, SwitchConfig};
    use std::sync::Arc;
    use std::time::Duration;

    let test = "kvm_machine_nic_sends_to_the_switch_and_follows_the_link";
    if !kvm_or_skip(test) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let profile = tiny_profile(d.path());
    let lan = Switch::new("lan", SwitchConfig::default());
    let mac = nic_mac("v", "lan", &[]);
    let port = Arc::new(lan.attach("v", mac).unwrap());
    let peer = lan
        .attach("peer", "02:00:00:00:00:99".parse().unwrap())
        .unwrap();
    let bare = MachineSpec {
        vm_name: "v".into(),
        profile_name: "tiny".into(),
        profile: Some(profile.clone()),
        memory_bytes: 64 << 20,
        cpus: 1,
        settings: provium::settings::Settings::from_env(),
        ..MachineSpec::default()
    };
    let spec = MachineSpec {
        nics: vec![NicSpec::on_port(port)],
        ..bare.clone()
    };
    let kvm = backend::for_kind(BackendKind::Kvm);
    let m = kvm.boot(&spec).unwrap();
    let c = m.console().expect("kvm has a console");
    let wait = |s: &str, n: usize| {
        assert!(
            c.wait_for(s.as_bytes(), n, Duration::from_secs(60)),
            "{s:?} x{n}; console:\n{}",
            c.log_string()
        )
    };
    wait(tiny_guest::READY, 1);
    // rng (0), vsock (1), then the NIC (2): announced after the backend's
    // own devices, and before the profile's disk and NIC slots.
    assert!(
        c.log_string()
            .contains("virtio_mmio.device=4K@0xd0002000:7 virtio_mmio.device=4K@0xd0003000:8"),
        "{}",
        c.log_string()
    );
    c.write_input(&[tiny_guest::CMD_NET_UP]).unwrap();
    wait("NET-UP status=01\n", 1);
    let f = peer.recv_timeout(Duration::from_secs(60)).expect("a frame");
    assert_eq!(
        &f[6..12],
        &mac.0,
        "the harness's MAC, read from config space"
    );
    lan.disconnect("v").unwrap();
    c.write_input(&[tiny_guest::CMD_NET_LINK]).unwrap();
    wait("NET-LINK cfg-irq=02 status=00\n", 1);

    assert!(m.capabilities().has_vmm_nics());
    let e = flatten(&m.open_nic("eth1", mac).unwrap_err());
    assert!(
        e.contains("NIC slots") && e.contains("attach the bridge before vm:boot()"),
        "{e}"
    );

    // Snapshot, then restore with a NIC on another switch (what
    // vm:restore() does for a VM attached to bridges): the guest's posted
    // RX buffer takes a frame from the new switch.
    lan.reconnect("v").unwrap();
    m.pause().unwrap();
    let snap = d.path().join("v.snap");
    m.snapshot_to(&snap, &[]).unwrap();
    m.kill();
    let lan2 = Switch::new("lan2", SwitchConfig::default());
    let peer2 = lan2
        .attach("peer", "02:00:00:00:00:98".parse().unwrap())
        .unwrap();
    let nic2 = NicSpec::on_port(Arc::new(lan2.attach("v", mac).unwrap()));
    let with_nic2 = MachineSpec {
        nics: vec![nic2],
        ..bare.clone()
    };
    let restored = kvm.restore(&with_nic2, &snap).unwrap();
    let c2 = restored.console().expect("kvm has a console");
    let mut to_guest = mac.0.to_vec();
    to_guest.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x98, 0x88, 0xb5]);
    to_guest.extend_from_slice(b"RESTORED-NIC");
    to_guest.resize(64, 0);
    peer2.send(&to_guest).unwrap();
    c2.write_input(&[tiny_guest::CMD_NET_RX]).unwrap();
    assert!(
        c2.wait_for(b"NET-RX RESTORED-NIC\n", 1, Duration::from_secs(60)),
        "{}",
        c2.log_string()
    );
    // Without its NIC the snapshot's device list does not match.
    let e = kvm.restore(&bare, &snap).err().map(|e| flatten(&e));
    assert!(
        e.as_deref()
            .is_some_and(|e| e.contains("virtio devices in the snapshot")),
        "{e:?}"
    );
    restored.kill();
}

/// Through Lua: a bridge attached before `vm:boot()` is a virtio-net device
/// on the kvm backend (its `virtio_mmio.device=` entry is on the guest's
/// command line, after rng and vsock), even though the boot itself then fails
/// here for lack of an agent.
#[test]
fn a_bridge_attached_before_boot_is_a_virtio_net_device() {
    let test = "a_bridge_attached_before_boot_is_a_virtio_net_device";
    if !kvm_or_skip(test) {
        return;
    }
    let p = project(
        "[profiles.tiny]\nkernel = \"tiny.bzImage\"\ncmdline = \"tiny\"\nguest_os = \"linux\"\ninject_agent = false\n",
        r#"
local lan = provium:bridge("lan")
local wan = provium:bridge("wan")
local vm = provium:vm("v", "tiny", {memory = "64M"})
wan:attach(vm)
lan:attach(vm)
test("boot", function(t)
    local ok, e = pcall(function() vm:boot() end)
    t:assert(not ok, "no agent: the boot must fail")
    local log = vm:console():read_log()
    -- rng, vsock, then one NIC per bridge: lan (eth0), wan (eth1), then the slots.
    t:assert(log:find("virtio_mmio.device=4K@0xd0002000:7 virtio_mmio.device=4K@0xd0003000:8 ", 1, true), log)
    error(e)
end)
"#,
    );
    std::fs::write(p.path().join("tiny.bzImage"), tiny_guest::BZIMAGE).unwrap();
    let o = run(p.path(), "kvm", &[("PROVIUM_KVM_AGENT_TIMEOUT", "2")]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let (reason, _) = failure(p.path(), &o);
    assert!(reason.contains("no Hello from the agent"), "{reason}");
}

mod machine_level {
    use super::*;
    use std::time::{Duration, Instant};

    use provium::backend::kvm::KvmMachine;
    use provium::backend::{CidAllocator, MachineSpec};
    use provium_vmm::{StopReason, VmState};

    /// The tiny guest booted through the kvm backend, READY on its console.
    fn tiny_machine(test: &str, dir: &Path) -> Option<KvmMachine> {
        if !kvm_or_skip(test) {
            return None;
        }
        let profile = tiny_profile(dir);
        let opts = MachineSpec {
            vm_name: "v".into(),
            memory_bytes: 64 << 20,
            cpus: 1,
            settings: provium::settings::Settings::from_env(),
            ..MachineSpec::default()
        };
        let m = KvmMachine::build(&opts, &profile, CidAllocator::FIRST, None)
            .unwrap()
            .with_agent_timeout(Duration::from_secs(2))
            .with_power_off_timeout(Duration::from_secs(2));
        m.start().unwrap();
        wait_console(&m, tiny_guest::READY, 1);
        Some(m)
    }

    fn wait_console(m: &KvmMachine, needle: &str, count: usize) {
        let c = m.console();
        assert!(
            c.wait_for(needle.as_bytes(), count, Duration::from_secs(60)),
            "{needle:?} x{count}; log:\n{}",
            c.log_string()
        );
    }

    #[test]
    fn reset_reconnects_or_fails_with_this_boots_console() {
        let test = "reset_reconnects_or_fails_with_this_boots_console";
        let d = tempfile::tempdir().unwrap();
        let Some(m) = tiny_machine(test, d.path()) else {
            return;
        };
        let t0 = Instant::now();
        let e = match m.reset() {
            Ok(_) => panic!("the tiny guest has no agent: no Hello after a reset"),
            Err(e) => provium::error_chain::flatten(&e),
        };
        assert_eq!(m.vm().boot_count(), 2, "the boot path ran again");
        for want in [
            "the guest was reset, but no Hello from the agent",
            "within 2s",
            "the kernel never reached init",
            tiny_guest::BANNER,
        ] {
            assert!(e.contains(want), "missing {want:?} in:\n{e}");
        }
        // Both boots printed the banner; the error quotes only the new one.
        assert_eq!(
            m.console().log_string().matches(tiny_guest::BANNER).count(),
            2
        );
        assert_eq!(e.matches(tiny_guest::BANNER).count(), 1, "{e}");
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "bounded by the agent timeout"
        );
    }

    #[test]
    fn power_button_powers_off_a_guest_that_honours_it() {
        let test = "power_button_powers_off_a_guest_that_honours_it";
        let d = tempfile::tempdir().unwrap();
        let Some(m) = tiny_machine(test, d.path()) else {
            return;
        };
        m.console()
            .write_input(&[tiny_guest::CMD_KEYBOARD_THEN_POWER_OFF])
            .unwrap();
        wait_console(&m, tiny_guest::KBD_ARMED, 1);
        m.power_button().expect("the guest powers off");
        assert_eq!(m.vm().state(), VmState::Shutdown);
        assert_eq!(m.vm().stop_reason(), Some(StopReason::GuestPowerOff));
        let log = m.console().log_string();
        assert!(log.contains("kbd=1411e071e0f071f011f014"), "{log}");
    }

    /// A Linux guest without ACPI prints "reboot: Power down" and halts.
    /// The tiny guest cannot echo that line (its `P` means power off), so
    /// the line goes into the console the way COM1's output does.
    #[test]
    fn power_button_takes_the_kernels_power_down_line_as_the_power_off() {
        let test = "power_button_takes_the_kernels_power_down_line_as_the_power_off";
        let d = tempfile::tempdir().unwrap();
        let Some(m) = tiny_machine(test, d.path()) else {
            return;
        };
        let line = format!("{}\n", provium::backend::kvm::KERNEL_POWER_DOWN);
        m.console().push_output(line.as_bytes());
        m.power_button()
            .expect("the halted kernel counts as powered off");
        assert_eq!(m.vm().state(), VmState::Shutdown);
    }

    #[test]
    fn power_button_ignored_by_the_guest_fails_and_says_why() {
        let test = "power_button_ignored_by_the_guest_fails_and_says_why";
        let d = tempfile::tempdir().unwrap();
        let Some(m) = tiny_machine(test, d.path()) else {
            return;
        };
        let e = m
            .power_button()
            .expect_err("the guest ignores its keyboard")
            .to_string();
        for want in [
            "did not power off within 2s",
            "SERIO_I8042",
            "init must power off on SIGINT",
            tiny_guest::READY,
        ] {
            assert!(e.contains(want), "missing {want:?} in:\n{e}");
        }
        assert_eq!(
            m.vm().state(),
            VmState::Booted,
            "the caller decides to shut down"
        );
    }
}

/// Restores of Lua VMs whose snapshot's machine had a disk (`vda`) and a
/// NIC (bridge `lan`), on the tiny guest. It has no agent, so every restore
/// here ends at "the agent did not answer": reaching that far means the
/// restored machine was built, which the VMM refuses unless it has the
/// snapshot's devices (before this was fixed, each failed earlier with
/// "N virtio devices in the snapshot, M in this VM"). The snapshot is taken
/// below Lua (a Lua boot never completes without an agent) with the two
/// sections a Lua snapshot writes.
mod restored_devices {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    use provium::backend::kvm::KvmMachine;
    use provium::backend::{CidAllocator, MachineSpec};
    use provium::backend::{DiskSpec, NicSpec};
    use provium::lua::bridge::nic_mac;
    use provium::lua::snapshot::{
        DiskDecl, NicDecl, VmDecl, VmDevices, VM_DECL_SECTION, VM_DEVICES_SECTION,
    };
    use provium_netsetup::{Switch, SwitchConfig};

    const TINY: &str = "[profiles.tiny]\nkernel = \"tiny.bzImage\"\ncmdline = \"tiny\"\nguest_os = \"linux\"\ninject_agent = false\n";
    const IMAGE_BYTES: u64 = 1 << 20;

    /// A 1 MiB disk image at `dir/name`.
    fn image(dir: &Path, name: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, vec![0u8; IMAGE_BYTES as usize]).unwrap();
        p.canonicalize().unwrap()
    }

    /// Writes a snapshot of the tiny guest `v` (64 MiB, 1 vCPU) booted with
    /// disk `vda` over `image` and one NIC on bridge `lan` (the MAC a Lua
    /// attach gives it) to `snap`, with the `vm-decl` and `vm-devices`
    /// sections `vm:snapshot()` writes. Returns the MAC.
    fn tiny_snapshot(
        dir: &Path,
        snap: &Path,
        image: &Path,
        bridge_lab: Option<Vec<String>>,
    ) -> provium_netsetup::MacAddr {
        let profile = tiny_profile(dir);
        let lan = Switch::new("lan", SwitchConfig::default());
        let mac = nic_mac("v", "lan", &[]);
        let opts = MachineSpec {
            vm_name: "v".into(),
            memory_bytes: 64 << 20,
            cpus: 1,
            settings: provium::settings::Settings::from_env(),
            nics: vec![NicSpec::on_port(Arc::new(lan.attach("v", mac).unwrap()))],
            disks: vec![DiskSpec {
                image: image.to_path_buf(),
                id: "vda".into(),
                faults: Default::default(),
            }],
            ..MachineSpec::default()
        };
        let m = KvmMachine::build(&opts, &profile, CidAllocator::FIRST, None).unwrap();
        m.start().unwrap();
        let c = m.console();
        assert!(
            c.wait_for(tiny_guest::READY.as_bytes(), 1, Duration::from_secs(60)),
            "{}",
            c.log_string()
        );
        m.pause().unwrap();
        let decl = VmDecl {
            name: "v".into(),
            profile: "tiny".into(),
            memory_bytes: 64 << 20,
            cpus: 1,
            rng_seed: None,
        };
        let devices = VmDevices {
            slot_disks: vec![],
            slot_nics: vec![],
            disks: vec![DiskDecl {
                id: "vda".into(),
                image: image.to_path_buf(),
                size_bytes: IMAGE_BYTES,
                detached: false,
            }],
            nics: vec![NicDecl {
                bridge: "lan".into(),
                mac: mac.to_string(),
                attached: true,
                connected: true,
                bridge_lab,
            }],
        };
        m.snapshot_to(
            snap,
            &[
                (VM_DECL_SECTION, decl.to_json()),
                (VM_DEVICES_SECTION, devices.to_json()),
            ],
        )
        .unwrap();
        m.kill();
        mac
    }

    /// `provium --vmm kvm --config <abs>` (an absolute config, so the
    /// profile paths in fixture keys are the ones this test computes).
    fn run_with_config(dir: &Path) -> Output {
        Command::new(env!("CARGO_BIN_EXE_provium"))
            .args([
                "--vmm",
                "kvm",
                "--no-preflight",
                "--no-ksm",
                "--timeout",
                "600",
            ])
            .arg("--config")
            .arg(dir.join("provium.toml"))
            .arg("--save-events")
            .arg(dir.join("events.bin"))
            .current_dir(dir)
            .env("PROVIUM_RERUN_STATE", dir.join("rerun.json"))
            .env("PROVIUM_OVERLAY_CACHE", dir.join("overlay-cache"))
            .env("PROVIUM_KVM_AGENT_TIMEOUT", "2")
            .output()
            .unwrap()
    }

    fn assert_restored_machine(reason: &str) {
        assert!(
            reason.contains("vm:restore: vm `v`: the agent did not answer"),
            "the restore must reach the restored machine's agent:\n{reason}"
        );
        assert!(!reason.contains("virtio devices"), "{reason}");
    }

    /// `vm:shutdown(); vm:restore(s)` of a VM with a disk and a bridge: the
    /// shutdown detached its disk and took it off the bridge; the restore
    /// gives the machine the snapshot's disk (a new handle; the old one
    /// stays detached) and puts it back on `lan` with the snapshot's MAC.
    #[test]
    fn a_bridged_vm_shut_down_then_restored_has_its_disk_and_nic_again() {
        let test = "a_bridged_vm_shut_down_then_restored_has_its_disk_and_nic_again";
        if !kvm_or_skip(test) {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let img = image(d.path(), "vda.img");
        let snap = d.path().join("v.snap");
        let mac = tiny_snapshot(d.path(), &snap, &img, None);
        let p = project(
            TINY,
            &format!(
                r#"
local lan = provium:bridge("lan")
local vm = provium:vm("v", "tiny", {{memory = "64M"}})
local disk = vm:attach_disk({{id = "vda", image = {img:?}}})
lan:attach(vm)
test("restore", function(t)
    t:assert(not pcall(function() vm:boot() end), "no agent: the boot fails")
    vm:shutdown()
    t:assert_eq(#lan:members(), 0, "a shut-down VM is off its bridge")
    t:assert(disk:is_detached(), "and its disk is detached")
    local ok, e = pcall(function() vm:restore({snap:?}) end)
    t:assert(not ok, "no agent: the restore ends at the agent")
    t:assert_eq(vm:state(), "dead")
    t:assert_eq(table.concat(lan:members(), ","), "v")
    t:assert_eq(lan:nic(vm):mac(), "{mac}")
    t:assert(not vm:disk("vda"):is_detached(), "the restored machine has the snapshot's disk")
    t:assert(disk:is_detached(), "the old handle stays detached")
    error(e)
end)
"#
            ),
        );
        std::fs::copy(d.path().join("tiny.bzImage"), p.path().join("tiny.bzImage")).unwrap();
        let o = run(p.path(), "kvm", &[("PROVIUM_KVM_AGENT_TIMEOUT", "2")]);
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        let (reason, _) = failure(p.path(), &o);
        assert_restored_machine(&reason);
    }

    /// `lab:restore(dir)` of a lab snapshot whose VM (in sub-lab `site`) was
    /// on bridge `lan` of the snapshotted lab: the restoring lab gets a
    /// bridge `lan`, the new VM is on it, and its machine has the disk.
    #[test]
    fn a_lab_restore_makes_the_bridge_its_vm_was_on() {
        let test = "a_lab_restore_makes_the_bridge_its_vm_was_on";
        if !kvm_or_skip(test) {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let img = image(d.path(), "vda.img");
        let lab = d.path().join("lab");
        std::fs::create_dir(&lab).unwrap();
        let mac = tiny_snapshot(d.path(), &lab.join("v.snap"), &img, Some(vec![]));
        let mut index = provium_snapshot::LabIndex::new("provium");
        index.vms.push(provium_snapshot::LabVm {
            lab_path: vec!["site".into()],
            name: "v".into(),
            profile: "tiny".into(),
            memory_bytes: 64 << 20,
            cpus: 1,
            file: "v.snap".into(),
        });
        index.write(&lab).unwrap();
        let p = project(
            TINY,
            &format!(
                r#"
test("lab restore", function(t)
    local ok, e = pcall(function() provium:restore({lab:?}) end)
    t:assert(not ok, "no agent: the restore ends at the agent")
    local vm = provium.site.v
    t:assert_eq(vm:state(), "dead")
    t:assert_eq(table.concat(provium:bridge_names(), ","), "lan")
    t:assert_eq(table.concat(provium.site:bridge_names(), ","), "")
    t:assert_eq(table.concat(provium.lan:members(), ","), "v")
    t:assert_eq(provium.lan:nic(vm):mac(), "{mac}")
    t:assert(not vm:disk("vda"):is_detached(), "the restored machine has the snapshot's disk")
    error(e)
end)
"#
            ),
        );
        std::fs::copy(d.path().join("tiny.bzImage"), p.path().join("tiny.bzImage")).unwrap();
        let o = run(p.path(), "kvm", &[("PROVIUM_KVM_AGENT_TIMEOUT", "2")]);
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        let (reason, _) = failure(p.path(), &o);
        assert_restored_machine(&reason);
    }

    /// A project whose fixture `base` is already in the cache as the tiny
    /// snapshot (its build, if it ran, would fail saying so). Returns the
    /// project and the cached entry's path.
    fn cached_fixture_project(test_lua: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let p = project(&format!("cache_dir = \"cache\"\n\n{TINY}"), test_lua);
        std::fs::write(
            p.path().join("tests/base.fixture.lua"),
            "error(\"base: the fixture was built, not restored\")\nreturn nil\n",
        )
        .unwrap();
        let img = image(p.path(), "vda.img");
        let snap = p.path().join("base.snap");
        tiny_snapshot(p.path(), &snap, &img, None);
        let config = provium::config::Config::load(
            &p.path().join("provium.toml"),
            &provium::settings::Settings::from_env(),
        )
        .unwrap();
        let roots: Vec<std::path::PathBuf> = config
            .roots
            .iter()
            .map(|r| r.canonicalize().unwrap())
            .collect();
        let key = provium::fixture::key::KeyComputer::new(
            &roots,
            &config,
            provium_protocol::PROTOCOL_VERSION,
        )
        .for_backend("kvm")
        .key("base")
        .unwrap();
        let cache = provium_snapshot::FixtureCache::open(&config.cache_dir).unwrap();
        let entry = cache.install_vm(&key, &snap).unwrap();
        (p, entry)
    }

    /// `vm_fixture` of a fixture whose VM had a disk and a NIC: the new VM
    /// gets both (bridge `lan` is made in the lab, which has none), so the
    /// cached entry restores into a machine. (Its agent then does not
    /// answer, which evicts the entry and rebuilds it: that build fails.)
    #[test]
    fn vm_fixture_gives_the_new_vm_the_fixture_vms_disk_and_nic() {
        let test = "vm_fixture_gives_the_new_vm_the_fixture_vms_disk_and_nic";
        if !kvm_or_skip(test) {
            return;
        }
        let (p, _) = cached_fixture_project(
            r#"
test("fixture", function(t)
    local ok, e = pcall(function() return provium:vm_fixture("base") end)
    t:assert(not ok, "no agent: the restore ends at the agent")
    t:assert_eq(table.concat(provium:bridge_names(), ","), "lan")
    error(e)
end)
"#,
        );
        let o = run_with_config(p.path());
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        let stderr = String::from_utf8_lossy(&o.stderr);
        let warning = stderr
            .lines()
            .find(|l| l.starts_with("provium: warning: fixture `base`: cached entry"))
            .unwrap_or_else(|| panic!("the cached entry was not restored:\n{stderr}"));
        assert_restored_machine(warning);
        let (reason, _) = failure(p.path(), &o);
        assert!(
            reason.contains("base: the fixture was built, not restored"),
            "{reason}"
        );
    }

    /// A fixture whose recorded disk image is gone does not fit: that is
    /// said by name and the entry is kept (no eviction, no rebuild), since
    /// rebuilding would not bring the image back.
    #[test]
    fn a_fixture_whose_disk_image_is_gone_is_a_mismatch_not_a_corrupt_entry() {
        let test = "a_fixture_whose_disk_image_is_gone_is_a_mismatch_not_a_corrupt_entry";
        if !kvm_or_skip(test) {
            return;
        }
        let (p, entry) = cached_fixture_project(
            "test(\"fixture\", function(t) provium:vm_fixture(\"base\") end)\n",
        );
        std::fs::remove_file(p.path().join("vda.img")).unwrap();
        let o = run_with_config(p.path());
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        let (reason, _) = failure(p.path(), &o);
        for want in [
            "vm_fixture(\"base\"): fixture `base`: cached entry",
            "does not fit what it is restored into, so it was kept (a configuration mismatch, not a bad entry)",
            "disk `vda`",
            "vda.img: No such file",
        ] {
            assert!(reason.contains(want), "missing {want:?} in:\n{reason}");
        }
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!stderr.contains("evicting it"), "{stderr}");
        assert!(entry.exists(), "the entry is kept");
        assert!(
            !events(p.path())
                .iter()
                .any(|e| matches!(e, Event::FixtureBuildStarted(_))),
            "no rebuild"
        );
    }
}

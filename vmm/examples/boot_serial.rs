//! Boots one VM on the VMM in its own process and copies the guest's serial
//! output to stdout as it arrives: what `qemu-system-x86_64 -serial stdio`
//! does, so `benches/boot_restore.sh` can time both the same way (process
//! start to first byte, to a console line) and read each process's RSS.
//!
//! ```text
//! boot_serial --tiny [--mem MIB]
//! boot_serial --kernel BZIMAGE [--initrd CPIO] [--cmdline TEXT] [--mem MIB] [--cpus N]
//! ```
//!
//! It runs until stdin closes (the bench measures the RSS in between), or
//! until the guest stops. Exit status 1 with a message on stderr when the VM
//! cannot be built.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use provium_vmm::{BootSource, ConsoleRead, KernelImage, Vm, VmConfig};

fn usage() -> ! {
    eprintln!(
        "usage: boot_serial --tiny | --kernel BZIMAGE [--initrd CPIO] [--cmdline TEXT] [--mem MIB] [--cpus N]"
    );
    std::process::exit(2)
}

fn main() {
    let mut kernel = None;
    let mut initrd = None;
    let mut cmdline = "console=ttyS0".to_string();
    let mut mem_mib = 64u64;
    let mut cpus = 1u8;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--tiny" => kernel = Some(KernelImage::Bytes(provium_vmm::tiny_guest::BZIMAGE.into())),
            "--kernel" => kernel = Some(KernelImage::Path(PathBuf::from(val()))),
            "--initrd" => initrd = Some(PathBuf::from(val())),
            "--cmdline" => cmdline = val(),
            "--mem" => mem_mib = val().parse().unwrap_or_else(|_| usage()),
            "--cpus" => cpus = val().parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    let Some(kernel) = kernel else { usage() };
    let mut cfg = VmConfig::new(BootSource {
        kernel,
        initrd,
        cmdline,
    });
    cfg.machine.mem_size_mib = mem_mib;
    cfg.machine.vcpu_count = cpus;
    let vm = match Vm::new(cfg) {
        Ok(vm) => vm,
        Err(e) => {
            eprintln!("boot_serial: {e}");
            std::process::exit(1);
        }
    };
    let sub = vm.console().subscribe();
    if let Err(e) = vm.boot() {
        eprintln!("boot_serial: {e}");
        std::process::exit(1);
    }
    // stdin closing ends the run (the bench reads our RSS first).
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        let _ = tx.send(());
    });
    let mut out = std::io::stdout().lock();
    loop {
        match sub.read_timeout(Duration::from_millis(20)) {
            ConsoleRead::Data(d) => {
                if out.write_all(&d).and_then(|()| out.flush()).is_err() {
                    break;
                }
            }
            ConsoleRead::Eof => break,
            ConsoleRead::Timeout => {}
        }
        if rx.try_recv().is_ok() {
            break;
        }
    }
    let _ = vm.shutdown();
}

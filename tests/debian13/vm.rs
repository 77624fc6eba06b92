//! The host's side: the image, the job disk, one boot under qemu, the results read back.

use std::io::{BufRead, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

/// How long the whole boot, job and power-off may take (software emulation on two cores).
fn deadline() -> Duration {
    let mins = std::env::var("GPUHOOK_VM_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(40);
    Duration::from_secs(60 * mins)
}

fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn step(what: &str) {
    println!("\n== debian13: {what}");
}

/// The packages `packaging/build.sh` made: `.deb` and `.rpm`.
fn dist(ext: &str) -> PathBuf {
    let dir = Path::new(MANIFEST).join("target/dist");
    let found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (run packaging/build.sh first)", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {ext} in {} (run packaging/build.sh first): {found:?}",
        dir.display()
    );
    found.into_iter().next().expect("package")
}

/// The job disk's contents: the packages (and a second revision of each, for the upgrade),
/// this binary, the test bed's, the LD_PRELOAD probe, and the repository files the scenarios
/// read (bind-mounted at this checkout's path in the VM, where `CARGO_MANIFEST_DIR` points).
fn stage(job: &Path, filters: &[String]) {
    let pkgs = job.join("pkgs");
    std::fs::create_dir_all(&pkgs).expect("job dir");
    let (deb, rpm) = (dist("_amd64.deb"), dist(".x86_64.rpm"));
    std::fs::copy(&deb, pkgs.join("gpuhook-1.deb")).expect("deb");
    std::fs::copy(&rpm, pkgs.join("gpuhook-1.rpm")).expect("rpm");
    let two = job.parent().expect("work").join("rev2");
    let _ = std::fs::remove_dir_all(&two);
    std::fs::create_dir_all(&two).expect("rev2");
    run(Command::new("cargo")
        .current_dir(MANIFEST)
        .args(["deb", "--no-build", "--no-strip", "-p", "gpuhook"])
        .args(["--deb-revision", "2", "-o"])
        .arg(&two));
    run(Command::new("cargo")
        .current_dir(MANIFEST)
        .args(["generate-rpm", "-p", ".", "-s", "release = \"2\"", "-o"])
        .arg(&two));
    for e in std::fs::read_dir(&two).expect("rev2") {
        let p = e.expect("entry").path();
        let name = p.to_string_lossy().into_owned();
        let to = if name.ends_with(".deb") {
            "gpuhook-2.deb"
        } else if name.ends_with(".rpm") {
            "gpuhook-2.rpm"
        } else {
            continue;
        };
        std::fs::copy(&p, pkgs.join(to)).expect("rev2 package");
    }
    for n in ["gpuhook-2.deb", "gpuhook-2.rpm"] {
        assert!(pkgs.join(n).exists(), "{n} was not built");
    }
    // A library whose constructor leaves a mark: the static hook must never load it.
    let src = job.parent().expect("work").join("evil.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n__attribute__((constructor)) static void evil(void) { FILE *f = fopen(\"/run/gpuhook-preloaded\", \"w\"); if (f) fclose(f); }\n",
    )
    .expect("evil.c");
    run(Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(pkgs.join("evil.so"))
        .arg(&src));

    let bin = job.join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let me = std::env::current_exe().expect("current_exe");
    std::fs::copy(&me, bin.join("debian13")).expect("copy this binary");
    // target/debug/deps/debian13-HASH → target/debug/gpuhook-testbed
    let testbed = me
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("gpuhook-testbed"))
        .expect("target dir");
    assert!(
        testbed.exists(),
        "{} is missing (cargo build --workspace)",
        testbed.display()
    );
    std::fs::copy(&testbed, bin.join("gpuhook-testbed")).expect("copy gpuhook-testbed");

    // What the scenarios read from the checkout.
    let tree = job.join("tree");
    for rel in [
        "scripts/vm",
        "testbed/scripts",
        "hooks",
        "packaging/config.json",
    ] {
        let from = Path::new(MANIFEST).join(rel);
        let to = tree.join(rel);
        std::fs::create_dir_all(to.parent().expect("parent")).expect("tree");
        run(Command::new("cp").arg("-a").arg(&from).arg(&to));
    }

    let quoted: Vec<String> = filters.iter().map(|f| format!("'{f}'")).collect();
    let script = format!(
        "#!/bin/sh\n# Made by tests/debian13 on the host: runs the scenarios in the VM.\n\
         export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         export RUST_BACKTRACE=1 HOME=/root\n\
         mkdir -p /job/results '{MANIFEST}' && mount --bind /job/tree '{MANIFEST}' || {{ echo 'GPUHOOK-VM: FAIL cannot mount the tree'; exit 1; }}\n\
         /job/bin/debian13 --inside {}\n",
        quoted.join(" ")
    );
    let run_path = job.join("run");
    std::fs::write(&run_path, script).expect("run");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&run_path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Boots the image with the job disk; returns when the VM powered off (or the deadline
/// passed: then it is killed). Streams the job's serial output to stdout as it comes.
///
/// The machine is a q35 with an emulated IOMMU (`intel-iommu`, the kernel's
/// `intel_iommu=on`) and two of QEMU's `edu` PCI functions at 0000:00:10.0 and 0000:00:11.0,
/// each in an IOMMU group of its own: the scenarios of `qemu.rs` pass them through to nested
/// VMs with vfio-pci.
fn boot(image: &Path, work: &Path) -> bool {
    let root = image.join("root");
    let boot_file = |prefix: &str| {
        let dir = root.join("boot");
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect();
        v.sort();
        let name = v
            .pop()
            .unwrap_or_else(|| panic!("no {prefix}* in {}", dir.display()));
        format!("/boot/{name}")
    };
    let (kernel, initrd) = (boot_file("vmlinuz-"), boot_file("initrd.img-"));
    let qemu = format!(
        "exec chroot {root} qemu-system-x86_64 -accel tcg,thread=multi -smp 2 -m 3072 \
         -machine q35 -device intel-iommu \
         -display none -monitor none -no-reboot -nic none \
         -kernel {kernel} -initrd {initrd} \
         -append 'root=/dev/vda rw console=ttyS0 panic=1 intel_iommu=on systemd.wants=gpuhook-vm.service systemd.show_status=false' \
         -drive file=/vm/cache/root.img,format=raw,if=virtio,snapshot=on \
         -drive file=/vm/run/job.img,format=raw,if=virtio \
         -device edu,addr=0x10 -device edu,addr=0x11 \
         -serial file:/vm/run/console.log -serial file:/vm/run/job.log",
        root = root.display()
    );
    let script = format!(
        "set -e; r={root}; mount --rbind /dev $r/dev; mount -t proc proc $r/proc; mount --rbind /sys $r/sys; \
         mount --bind {cache} $r/vm/cache; mount --bind {work} $r/vm/run; {qemu}",
        root = root.display(),
        cache = image.display(),
        work = work.display()
    );
    let _ = std::fs::write(work.join("job.log"), b"");
    let mut child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::from(
            std::fs::File::create(work.join("qemu.log")).expect("qemu.log"),
        ))
        .stderr(Stdio::from(
            std::fs::File::create(work.join("qemu.err")).expect("qemu.err"),
        ))
        .spawn()
        .expect("qemu");
    let start = Instant::now();
    let mut pos = 0;
    let mut booted = false;
    loop {
        pos = stream(&work.join("job.log"), pos);
        if !booted && pos > 0 {
            // The job's first line: the machine is up (kernel, systemd, its units).
            booted = true;
            println!("debian13: booted in {:.0} s", start.elapsed().as_secs_f64());
        }
        if let Some(st) = child.try_wait().expect("wait") {
            stream(&work.join("job.log"), pos);
            println!(
                "debian13: the VM stopped after {:.0} s ({st})",
                start.elapsed().as_secs_f64()
            );
            return true;
        }
        if start.elapsed() > deadline() {
            let _ = child.kill();
            let _ = child.wait();
            println!(
                "debian13: the VM was killed at its deadline ({} min; GPUHOOK_VM_MINUTES)",
                deadline().as_secs() / 60
            );
            return false;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Prints what the job wrote since `pos`; returns the new position.
fn stream(path: &Path, pos: u64) -> u64 {
    let Ok(mut f) = std::fs::File::open(path) else {
        return pos;
    };
    if f.seek(SeekFrom::Start(pos)).is_err() {
        return pos;
    }
    let mut r = std::io::BufReader::new(f);
    let mut at = pos;
    let mut line = String::new();
    while let Ok(n) = r.read_line(&mut line) {
        if n == 0 || !line.ends_with('\n') {
            break;
        }
        at += n as u64;
        print!("  vm| {}", line.replace('\r', ""));
        line.clear();
    }
    at
}

fn tail(p: &Path, n: usize) -> String {
    let s = String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

pub fn main(filters: &[String]) {
    super::common::require_root();
    let t0 = Instant::now();
    step("the image (scripts/debian13-image.sh; cached by its stamp)");
    // The script prints the image's directory as its last line.
    let printed = run(&mut Command::new(
        Path::new(MANIFEST).join("scripts/debian13-image.sh"),
    ));
    let image = PathBuf::from(printed.lines().last().unwrap_or("").trim());
    assert!(
        image.join("root/boot").is_dir() && image.join("root.img").is_file(),
        "scripts/debian13-image.sh printed {printed:?}: no image there (root/boot, root.img)"
    );
    println!(
        "debian13: image ready in {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    let work = PathBuf::from("/var/tmp/gpuhook-debian13");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");
    step("the job disk (packages, this binary, the scenarios' files)");
    let job = work.join("job");
    stage(&job, filters);
    run(Command::new("mke2fs")
        .args(["-q", "-t", "ext4", "-L", "gpuhook-job", "-d"])
        .arg(&job)
        .arg(work.join("job.img"))
        .arg("2G"));
    step("boot (qemu, software emulation); the scenarios' lines as they come");
    let t1 = Instant::now();
    let stopped = boot(&image, &work);
    let vm_secs = t1.elapsed().as_secs_f64();
    // Each scenario's log, from the job disk.
    let out = work.join("results");
    let _ = Command::new("debugfs")
        .arg("-R")
        .arg(format!("rdump /results {}", work.display()))
        .arg(work.join("job.img"))
        .output();

    let log = String::from_utf8_lossy(&std::fs::read(work.join("job.log")).unwrap_or_default())
        .replace('\r', "");
    let mut results: Vec<(String, bool, String)> = Vec::new();
    for l in log.lines() {
        let Some(rest) = l.strip_prefix("GPUHOOK-VM: RESULT ") else {
            continue;
        };
        let mut w = rest.splitn(3, ' ');
        let (name, verdict, more) = (
            w.next().unwrap_or("").to_string(),
            w.next().unwrap_or(""),
            w.next().unwrap_or("").to_string(),
        );
        results.push((name, verdict == "ok", more));
    }
    let done = log.lines().any(|l| l.starts_with("GPUHOOK-VM: DONE"));
    let expected: Vec<&str> = super::inside::SCENARIOS
        .iter()
        .filter(|s| super::inside::selected(s, filters))
        .map(|s| s.name)
        .collect();
    let mut failed = Vec::new();
    for name in &expected {
        match results.iter().filter(|r| r.0 == *name).count() {
            1 => {}
            0 => failed.push(format!("{name}: never reached")),
            n => failed.push(format!("{name}: reported {n} times")),
        }
    }
    for (name, ok, more) in &results {
        if !ok {
            failed.push(format!("{name}: {more}"));
            let f = out.join(format!("{name}.log"));
            println!("\n---- {name} ({}) ----\n{}", f.display(), tail(&f, 80));
        }
    }
    if !done {
        failed.push("the job never said DONE".into());
    }
    if !stopped || !done {
        println!(
            "\n---- the VM's console (last lines; {}) ----\n{}",
            work.join("console.log").display(),
            tail(&work.join("console.log"), 60)
        );
        println!("---- qemu ----\n{}", tail(&work.join("qemu.err"), 20));
    }
    println!(
        "\ndebian13: {} scenarios, {} passed, {} failed; VM {:.0} s, all {:.0} s; logs in {}",
        expected.len(),
        results.iter().filter(|r| r.1).count(),
        failed.len(),
        vm_secs,
        t0.elapsed().as_secs_f64(),
        work.display()
    );
    if !failed.is_empty() {
        for f in &failed {
            println!("FAILED {f}");
        }
        std::process::exit(1);
    }
}

//! Helpers shared by the integration tests: fake hosts in temporary directories, a config
//! pointing at them, and the built `gpuhook` binary driven as libvirt drives it.
#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use testbed::FakeHost;

pub mod vm;
#[allow(unused_imports)]
pub use vm::*;

/// The gpuhook binary under test: `$GPUHOOK_TEST_BIN` (e.g. the installed /usr/bin/gpuhook),
/// else the one cargo built for this test run.
pub fn bin() -> PathBuf {
    std::env::var_os("GPUHOOK_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gpuhook")))
}

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests make real device nodes and cgroups: run them as root"
    );
}

/// A fake host with its config file and state path, in a temp dir.
pub struct Host {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub state: PathBuf,
    pub paths: testbed::HostPaths,
}

impl Host {
    pub fn new(fake: FakeHost) -> Host {
        Self::with(fake, |_| {})
    }

    /// Like `new`, with a chance to change the config JSON.
    pub fn with(fake: FakeHost, edit: impl FnOnce(&mut serde_json::Value)) -> Host {
        require_root();
        // Not in /tmp: a CDI spec directory in it would be refused (others may write /tmp).
        let dir = tempfile::Builder::new()
            .prefix("gpuhook-test-")
            .tempdir_in(testbed::trusted_tmp())
            .expect("tempdir");
        let paths = fake.create(&dir.path().join("host")).expect("fake host");
        let state = dir.path().join("run/state.json");
        let mut cfg = paths.config(&state);
        // libvirt's QEMU status directory of this host (no VM runs until a test says so).
        cfg["libvirt_qemu_dir"] = serde_json::json!(dir.path().join("qemu"));
        edit(&mut cfg);
        let config = dir.path().join("config.json");
        write_config(&config, &cfg.to_string());
        Host {
            dir,
            config,
            state,
            paths,
        }
    }

    /// Changes the config JSON in place.
    pub fn edit_config(&self, edit: impl FnOnce(&mut serde_json::Value)) {
        let mut cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&self.config).expect("config")).expect("json");
        edit(&mut cfg);
        write_config(&self.config, &cfg.to_string());
    }

    /// CDI for this host: the fake NVIDIA driver's spec (as `nvidia-ctk cdi generate` writes
    /// it) in ROOT/cdi/run (the config's second, winning, spec directory; ROOT/cdi/etc the
    /// first). Returns the driver.
    pub fn with_cdi(&self, fake: &FakeHost) -> testbed::driver::FakeDriver {
        let drv = fake_driver();
        let (etc, run) = (self.root().join("cdi/etc"), self.root().join("cdi/run"));
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::create_dir_all(&run).unwrap();
        write_config(
            &run.join("nvidia.yaml"),
            &drv.nvidia_spec(fake, &self.paths),
        );
        self.edit_config(|c| c["cdi_spec_dirs"] = serde_json::json!([etc, run]));
        drv
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(bin());
        c.env("GPUHOOK_CONFIG", &self.config)
            .env_remove("GPUHOOK_VERBOSE");
        c
    }

    /// `gpuhook hook NAME OP SUBOP -` with `xml` on stdin.
    pub fn hook(&self, name: &str, op: &str, xml: &str) -> Output {
        let subop = if matches!(op, "stopped" | "release") {
            "end"
        } else {
            "begin"
        };
        run_with_stdin(self.cmd().args(["hook", name, op, subop, "-"]), xml)
    }

    pub fn list(&self) -> serde_json::Value {
        let o = self.cmd().args(["list", "--json"]).output().expect("list");
        assert!(
            o.status.success(),
            "list failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice(&o.stdout).expect("list json")
    }

    /// PCI addresses each domain holds, per `list --json` (a shared GPU's slots as
    /// `PCI/slotN`).
    pub fn holders(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut m: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for g in self.list()["gpus"].as_array().expect("gpus") {
            if let Some(d) = g["holder"]["domain"].as_str() {
                m.entry(d.to_owned())
                    .or_default()
                    .push(g["pci"].as_str().expect("pci").to_owned());
            }
            for s in g["sharing"]["holders"].as_array().into_iter().flatten() {
                m.entry(s["domain"].as_str().expect("domain").to_owned())
                    .or_default()
                    .push(s["slot"].as_str().expect("slot").to_owned());
            }
        }
        m
    }
}

/// The fake NVIDIA driver user space (real ELF libraries named like driver 535.129.03, a
/// fake nvidia-smi), built once per target directory.
pub fn fake_driver() -> testbed::driver::FakeDriver {
    testbed::driver::FakeDriver::install(
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake-nvidia-driver"),
        "535.129.03",
    )
    .expect("fake NVIDIA driver")
}

/// The NVIDIA driver the fake hosts of the `driver="host"` tests run, and the one they are
/// upgraded to.
pub const HOST_V: &str = "550.54.15";
pub const HOST_V2: &str = "560.28.03";

/// A fake NVIDIA driver of `version` for `driver="host"` at `root` (real ELF libraries with
/// SONAMEs, programs, firmware, a socket, ICD files, an `etc/ld.so.cache` written by
/// `ldconfig -r`): a copy of one built once per target directory, for the test to change.
pub fn host_driver_root(root: &Path, version: &str) -> testbed::driver::FakeDriver {
    testbed::driver::FakeDriver::install_host(
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-nvidia-host-{version}")),
        version,
    )
    .and_then(|d| d.copy_to(root))
    .expect("fake NVIDIA driver for driver=host")
}

/// The kernel module's version file of a fake host whose proc root is `proc`: `version`
/// loaded (the proprietary or the `open` module's line), or none loaded.
pub fn set_module(proc: &Path, version: Option<&str>, open: bool) {
    let p = proc.join("driver/nvidia/version");
    match version {
        Some(v) => {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, testbed::driver::version_file(v, open)).unwrap();
        }
        None => {
            let _ = std::fs::remove_file(&p);
        }
    }
}

impl Host {
    /// `driver="host"` on this host: a fake driver of `version` at ROOT/driver-root (the
    /// config's `root`), its module loaded. Returns the driver.
    pub fn with_host_driver(&self, version: &str) -> testbed::driver::FakeDriver {
        let d = host_driver_root(&self.root().join("driver-root"), version);
        self.edit_config(|c| c["root"] = serde_json::json!(d.root));
        set_module(&self.paths.proc, Some(version), false);
        d
    }
}

/// What a container with the host's driver shows (its init is pid 1): its mounts of
/// libcuda and the firmware, the links, the linker cache, nvidia-smi, a program's own
/// version, the dlopen probe, the versioned libraries and firmware of the directories that
/// have content (a root that outlives its containers keeps the empty mount points of an
/// earlier start), gpuhook's ld.so.conf.d file. (Shell builtins and the root's own
/// programs only: a shell entered with `nsenter -m` cannot run busybox's other applets.)
pub fn host_probe(v: &str) -> String {
    format!(
        r#"L=/usr/lib/x86_64-linux-gnu
grep " $L/libcuda.so.{v} " /proc/1/mounts
grep " /lib/firmware/nvidia/{v}/gsp_ga10x.bin " /proc/1/mounts
grep " /usr/share/glvnd/egl_vendor.d/10_nvidia.json " /proc/1/mounts
ls -l $L/libcuda.so.1 $L/libcuda.so
/sbin/ldconfig -p | grep libcuda.so.1
nvidia-smi
nvidia-debugdump
cuda-probe
printf 'libs:'; for f in $L/lib*.so.*.*; do test -s $f && printf ' %s' "${{f##*/}}"; done; echo
printf 'firmware:'; for d in /lib/firmware/nvidia/*; do for f in $d/*; do if test -s $f; then printf ' %s' "${{d##*/}}"; break; fi; done; done; echo
if echo x > $L/libcuda.so.{v}; then echo WRITABLE; fi
cat /etc/ld.so.conf.d/00-gpuhook-cdi.conf"#
    )
}

/// The container has driver `v`'s files as `driver="host"` gives them (read-only, nosuid,
/// nodev; the links; the linker cache; dlopen of libcuda.so.1 reporting `v`; its programs)
/// and nothing of another version.
pub fn assert_host_probe(s: &str, v: &str) {
    let lib = s
        .lines()
        .find(|l| l.contains(&format!("libcuda.so.{v} ")))
        .unwrap_or_else(|| panic!("libcuda.so.{v} not mounted: {s}"));
    assert!(lib.contains(" ro,nosuid,nodev"), "{lib}");
    assert!(
        s.contains(&format!("/lib/firmware/nvidia/{v}/gsp_ga10x.bin")),
        "{s}"
    );
    assert!(s.contains("10_nvidia.json"), "{s}");
    assert!(
        s.contains(&format!("libcuda.so.1 -> libcuda.so.{v}")),
        "{s}"
    );
    assert!(s.contains("libcuda.so -> libcuda.so.1"), "{s}");
    assert!(
        s.contains("libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        "{s}"
    );
    assert!(
        s.contains("GPU 0: /dev/nvidia0") && s.contains("1 GPUs"),
        "{s}"
    );
    assert!(
        s.contains(&format!("nvidia-debugdump (fake driver {v})")),
        "{s}"
    );
    assert!(s.contains("dlopen libcuda.so.1: ok"), "{s}");
    assert!(s.contains(&format!("driver version: {v}\n")), "{s}");
    assert!(!s.contains("WRITABLE"), "{s}");
    assert!(s.contains("/usr/lib/x86_64-linux-gnu\n"), "{s}");
    // Nothing of another driver: every versioned library and firmware directory is v's.
    let libs = s
        .lines()
        .find_map(|l| l.strip_prefix("libs:"))
        .unwrap_or_else(|| panic!("no library list: {s}"));
    assert!(libs.contains(&format!("libnvidia-ml.so.{v}")), "{libs}");
    for l in libs.split_whitespace() {
        assert!(l.ends_with(v), "{l} is not of driver {v}: {libs}");
    }
    let fw = s
        .lines()
        .find_map(|l| l.strip_prefix("firmware:"))
        .unwrap_or_else(|| panic!("no firmware list: {s}"));
    assert_eq!(fw.trim(), v, "{s}");
}

/// What the CDI checks inside a container with the fake driver print (its init is pid 1).
pub const CDI_PROBE: &str = r#"L=/usr/lib/x86_64-linux-gnu
grep " $L/libcuda.so.535.129.03 " /proc/1/mounts
grep " /lib/firmware/nvidia/535.129.03/gsp_ga10x.bin " /proc/1/mounts
ls -l $L/libcuda.so.1 $L/libcuda.so
/sbin/ldconfig -p | grep libcuda.so.1
nvidia-smi
cuda-probe
if echo x > $L/libcuda.so.535.129.03; then echo WRITABLE; fi
cat /etc/ld.so.conf.d/00-gpuhook-cdi.conf"#;

/// The driver is there as the spec says: libcuda and the firmware mounted `ro,nosuid,nodev`,
/// the links, the linker cache, nvidia-smi seeing exactly one GPU, `dlopen("libcuda.so.1")`,
/// a library that cannot be written, gpuhook's `ld.so.conf.d` file.
pub fn assert_cdi_probe(s: &str) {
    let lib = s
        .lines()
        .find(|l| l.contains("libcuda.so.535.129.03 "))
        .unwrap_or_else(|| panic!("libcuda not mounted: {s}"));
    assert!(lib.contains(" ro,nosuid,nodev"), "{lib}");
    assert!(s.contains("gsp_ga10x.bin"), "{s}");
    assert!(s.contains("libcuda.so.1 -> libcuda.so.535.129.03"), "{s}");
    assert!(s.contains("libcuda.so -> libcuda.so.1"), "{s}");
    assert!(
        s.contains("libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        "{s}"
    );
    assert!(
        s.contains("GPU 0: /dev/nvidia0") && s.contains("1 GPUs"),
        "{s}"
    );
    assert!(!s.contains("/dev/nvidia1"), "{s}");
    assert!(s.contains("dlopen libcuda.so.1: ok"), "{s}");
    assert!(!s.contains("WRITABLE"), "{s}");
    assert!(s.contains("/usr/lib/x86_64-linux-gnu\n"), "{s}");
}

/// Makes `rootfs` a merged-`/usr` root, as Debian 12 and Ubuntu images are: its
/// `/lib/x86_64-linux-gnu` moves to `/usr/lib/x86_64-linux-gnu`, and `/lib` becomes the
/// link `usr/lib`.
pub fn merge_usr(rootfs: &Path) {
    let (from, to) = (
        rootfs.join("lib/x86_64-linux-gnu"),
        rootfs.join("usr/lib/x86_64-linux-gnu"),
    );
    std::fs::create_dir_all(&to).unwrap();
    for e in std::fs::read_dir(&from).unwrap() {
        let e = e.unwrap();
        std::fs::rename(e.path(), to.join(e.file_name())).unwrap();
    }
    std::fs::remove_dir_all(rootfs.join("lib")).unwrap();
    std::os::unix::fs::symlink("usr/lib", rootfs.join("lib")).unwrap();
}

/// The spec as nvidia-ctk writes it on a merged-`/usr` host (Debian 12: ldconfig lists the
/// libraries under `/lib/x86_64-linux-gnu`): container paths, links and the cache folder
/// under `/lib`.
pub fn spec_under_lib(text: &str) -> String {
    text.replace("containerPath: /usr/lib/", "containerPath: /lib/")
        .replace("::/usr/lib/", "::/lib/")
        .replace("- /usr/lib/x86_64-linux-gnu\n", "- /lib/x86_64-linux-gnu\n")
}

/// What a merged-`/usr` container with the driver shows (see [`CDI_PROBE`]).
pub fn assert_cdi_merged(s: &str) {
    let lib = s
        .lines()
        .find(|l| l.contains("libcuda.so.535.129.03 "))
        .unwrap_or_else(|| panic!("libcuda not mounted: {s}"));
    assert!(lib.contains(" ro,nosuid,nodev"), "{lib}");
    assert!(s.contains("libcuda.so.1 -> libcuda.so.535.129.03"), "{s}");
    assert!(
        s.contains("GPU 0: /dev/nvidia0") && s.contains("1 GPUs"),
        "{s}"
    );
    assert!(s.contains("dlopen libcuda.so.1: ok"), "{s}");
    assert!(!s.contains("WRITABLE"), "{s}");
}

pub fn write_config(path: &Path, text: &str) {
    std::fs::write(path, text).expect("config");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
}

pub fn run_with_stdin(cmd: &mut Command, input: &str) -> Output {
    run_with_bytes(cmd, input.as_bytes())
}

pub fn run_with_bytes(cmd: &mut Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let data = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().expect("wait");
    let _ = writer.join();
    out
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A deterministic UUID for test domain `n`.
pub fn uuid(n: u32) -> String {
    format!("{n:08x}-0000-4000-8000-{n:012x}")
}

/// A domain XML as libvirt formats it for the hook, with `meta` inside `<metadata>`.
pub fn domain(name: &str, n: u32, meta: &str) -> String {
    format!(
        "<domain type='lxc'>\n  <name>{name}</name>\n  <uuid>{}</uuid>\n  <metadata>\n    {meta}\n  </metadata>\n  <memory unit='KiB'>65536</memory>\n  <currentMemory unit='KiB'>65536</currentMemory>\n  <vcpu placement='static'>1</vcpu>\n  <os>\n    <type arch='x86_64'>exe</type>\n    <init>/bin/sh</init>\n  </os>\n  <devices>\n    <emulator>/usr/lib/libvirt/libvirt_lxc</emulator>\n    <filesystem type='mount'>\n      <source dir='/'/>\n      <target dir='/'/>\n    </filesystem>\n  </devices>\n</domain>\n",
        uuid(n)
    )
}

pub fn gpus(attrs: &str) -> String {
    format!(r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" {attrs}/>"#)
}

/// Asserts a hook failure: exit 1, exactly one line on stderr naming the domain, containing `needle`.
pub fn assert_fails(o: &Output, name: &str, needle: &str) {
    let e = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "expected failure, got {:?}; stderr: {e}",
        o.status
    );
    assert_eq!(e.trim_end().lines().count(), 1, "not one line: {e:?}");
    assert!(
        e.starts_with(&format!("gpuhook: domain '{name}': ")),
        "does not name the domain: {e}"
    );
    assert!(e.contains(needle), "{e:?} lacks {needle:?}");
}

pub fn assert_ok(o: &Output) {
    assert_eq!(
        o.status.code(),
        Some(0),
        "expected success; stderr: {}",
        stderr(o)
    );
}

/// What the OpenStack tests install from PyPI, pinned.
pub const OPENSTACK: [&str; 2] = ["nova==34.0.0", "openstack-placement==16.0.0"];

/// The cached virtualenv with Nova and Placement (`target/openstack-venv`, made on first
/// use; a marker names what it holds, so a change of pins remakes it). One maker at a time.
pub fn openstack_venv() -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/openstack-venv");
    let marker = dir.join(OPENSTACK.join("+"));
    if !marker.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        let o = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&dir)
            .output()
            .expect("python3");
        assert_ok(&o);
        let o = Command::new(dir.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(OPENSTACK)
            .output()
            .expect("pip");
        assert_ok(&o);
        std::fs::write(&marker, "").unwrap();
    }
    dir
}

/// Runs one of the scripts in tests/openstack/ with the venv's Python; its stdout.
pub fn openstack_script(script: &str, args: &[&str]) -> String {
    let py = openstack_venv().join("bin/python");
    let o = Command::new(py)
        .arg(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/openstack")
                .join(script),
        )
        .args(args)
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .expect("python");
    assert_ok(&o);
    String::from_utf8(o.stdout).expect("utf-8")
}

/// The domain XML Nova's libvirt driver writes for an LXC instance of a flavor with these
/// extra specs (tests/openstack/nova_domain.py: Nova's own metadata classes).
pub fn nova_domain(
    name: &str,
    uuid: &str,
    init: &str,
    flavor: &str,
    specs: &serde_json::Value,
) -> String {
    openstack_script(
        "nova_domain.py",
        &[name, uuid, init, flavor, &specs.to_string()],
    )
}

/// The GPU at `pci` in a `list --json` output.
pub fn gpu_of<'a>(list: &'a serde_json::Value, pci: &str) -> &'a serde_json::Value {
    list["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["pci"] == pci)
        .unwrap_or_else(|| panic!("no GPU {pci} listed"))
}

/// A loop device over a fresh 1 MiB file of zeros (detached on drop), and the planting of
/// its block node where glibc's `ldconfig` writes (`etc/ld.so.cache~`: opened
/// `O_WRONLY|O_CREAT|O_TRUNC`, no `O_EXCL`) in a root filesystem. What a hostile image (or
/// a container root with `CAP_MKNOD`) can leave there: written through, the device's
/// backing file begins with `glibc-ld.so.cache`.
pub struct PlantedLoop {
    pub dev: String,
    pub backing: PathBuf,
}

impl PlantedLoop {
    pub fn new(dir: &Path) -> PlantedLoop {
        let backing = dir.join("loop-backing");
        std::fs::write(&backing, vec![0u8; 1 << 20]).unwrap();
        let o = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&backing)
            .output()
            .unwrap();
        assert!(o.status.success(), "losetup: {}", stderr(&o));
        let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
        PlantedLoop { dev, backing }
    }

    /// Makes the loop device's block node at `path`.
    pub fn plant(&self, path: &Path) {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(&self.dev).unwrap().rdev();
        let _ = std::fs::remove_file(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        nix::sys::stat::mknod(
            path,
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            rdev,
        )
        .unwrap();
    }

    /// Nothing was written through the device.
    pub fn untouched(&self) -> bool {
        std::fs::read(&self.backing)
            .unwrap()
            .iter()
            .all(|&b| b == 0)
    }
}

impl Drop for PlantedLoop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}
/// Processes that keep a node open ([`hold_open`]: a fake host's GPU node made openable by
/// [`openable`]; [`hold_path`]: an `O_PATH` descriptor only).
#[allow(unused_imports)]
pub use testbed::holder::{hold_open, hold_path, wait_exec, Killed};

/// Makes a fake host's GPU node (`node`, under its device root) one that opens: the number
/// of `/dev/full` (1:7) in place of its driverless 195:N (a real open of which is ENXIO).
/// Only a real open holds a GPU (an `O_PATH` descriptor does not), so the tests of a GPU
/// kept open give it a real device that nothing on a test machine keeps open. The inventory
/// takes a GPU's numbers from `stat` of the host's node, so the GPU is then 1:7 throughout:
/// the draining look, the container's node, its device-cgroup rule.
pub fn openable(node: &Path) {
    use std::os::unix::fs::MetadataExt;
    let full = std::fs::metadata("/dev/full").expect("/dev/full").rdev();
    std::fs::remove_file(node).expect("fake GPU node");
    testbed::fakehost::node(node, libc::major(full), libc::minor(full), 0o666, 0).expect("mknod");
}

/// The blueprint host with its two NVIDIA GPUs at device minors `a` and `b` (`/dev/nvidiaA`,
/// 195:A): numbers no other test's fake host has, for tests that look for open descriptors
/// by number on the whole machine.
pub fn blueprint_minors(a: u32, b: u32) -> FakeHost {
    let mut f = FakeHost::blueprint();
    let mut want = [a, b].into_iter();
    for d in &mut f.devices {
        if let testbed::fakehost::Driver::Nvidia { minor, .. } = &mut d.driver {
            if let Some(m) = want.next() {
                *minor = m;
            }
        }
    }
    f
}

/// What a container does to keep a GPU after it stops: `fdkeeper send SOCK NODE` opens the
/// node (for real: the GPU node must be made [`openable`]) and passes the descriptor over the unix
/// socket, then exits; `fdkeeper recv SOCK MARK` (outside the container) receives it, writes
/// MARK, and keeps it until killed.
const FDKEEPER_C: &str = r#"#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    strncpy(a.sun_path, argv[2], sizeof a.sun_path - 1);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    char byte = 'x';
    struct iovec io = { &byte, 1 };
    union { char b[CMSG_SPACE(sizeof(int))]; struct cmsghdr h; } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b };
    if (!strcmp(argv[1], "send")) {
        int fd = open(argv[3], O_RDONLY);
        if (fd < 0 || connect(s, (struct sockaddr *)&a, sizeof a)) { perror("send"); return 1; }
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
        if (sendmsg(s, &m, 0) != 1) { perror("sendmsg"); return 1; }
        return 0;
    }
    unlink(a.sun_path);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1)) { perror("bind"); return 1; }
    int c = accept(s, 0, 0);
    if (c < 0 || recvmsg(c, &m, 0) != 1 || !CMSG_FIRSTHDR(&m)) { perror("recvmsg"); return 1; }
    close(c);
    close(s);
    FILE *f = fopen(argv[3], "w");
    if (!f) return 1;
    fclose(f);
    pause();
    return 0;
}
"#;

/// Builds `fdkeeper` (static: it runs in containers with a root of their own) in `dir`.
pub fn fdkeeper(dir: &Path) -> PathBuf {
    let src = dir.join("fdkeeper.c");
    let bin = dir.join("fdkeeper");
    std::fs::write(&src, FDKEEPER_C).expect("fdkeeper.c");
    let o = Command::new("cc")
        .args(["-static", "-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("cc");
    assert_ok(&o);
    bin
}

/// Starts `fdkeeper recv SOCK MARK` on the host: a process outside any container's PID
/// namespace, waiting for a GPU descriptor. [`wait_mark`] says when it has it.
pub fn fd_receiver(keeper: &Path, sock: &Path, mark: &Path) -> Killed {
    let _ = std::fs::remove_file(mark);
    let _ = std::fs::remove_file(sock);
    let child = Killed(
        Command::new(keeper)
            .arg("recv")
            .arg(sock)
            .arg(mark)
            .spawn()
            .expect("fdkeeper recv"),
    );
    for _ in 0..400 {
        if sock.exists() {
            return child;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("fdkeeper made no socket {}", sock.display());
}

/// Waits (up to 20 s) for `mark` to exist.
pub fn wait_mark(mark: &Path) -> bool {
    for _ in 0..200 {
        if mark.exists() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

/// The commands an MPS daemon stand-in (testbed/scripts/mps-control-standin) logged in
/// `DIR/log/control.log`, in order.
pub fn mps_commands(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("log/control.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once("] Command: ").map(|(_, c)| c.to_string()))
        .collect()
}

/// The test bed's stand-in for nvidia-cuda-mps-control.
pub fn mps_standin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testbed/scripts/mps-control-standin")
}

/// The MPS daemon the state file at `state` records for GPU `pci`: its PID and directory.
pub fn mps_daemon(state: &Path, pci: &str) -> Option<(i32, PathBuf)> {
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state).expect("state")).expect("state json");
    let d = s.get("mps")?.get(pci)?;
    Some((
        d["proc"]["pid"].as_i64()? as i32,
        PathBuf::from(d["dir"].as_str()?),
    ))
}

/// Whether process `pid` runs (a zombie does not).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Waits up to `limit` for process `pid` to end; panics if it still runs.
pub fn wait_gone(pid: i32, limit: std::time::Duration) {
    let end = std::time::Instant::now() + limit;
    while alive(pid) {
        assert!(std::time::Instant::now() < end, "pid {pid} still runs");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A client of a unix socket, built static into a root: connects to the path it is given
/// and prints `reached WORD` with what the listener wrote.
pub fn sock_probe(rootfs: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("sock-probe.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (argc < 2 || s < 0) return 2;
    strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) { perror("connect"); return 1; }
    char b[64];
    ssize_t n = read(s, b, sizeof b - 1);
    if (n < 0) { perror("read"); return 1; }
    b[n] = 0;
    printf("reached %s\n", b);
    return 0;
}
"#,
    )
    .unwrap();
    let o = Command::new("cc")
        .args(["-static", "-O2", "-o"])
        .arg(rootfs.join("usr/bin/sock-probe"))
        .arg(&src)
        .output()
        .expect("cc");
    assert_ok(&o);
}

/// Answers every client of `l` with `word`, from a thread of its own (for the test's life).
pub fn serve(l: std::os::unix::net::UnixListener, word: &'static str) {
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let mut c = c;
            let _ = std::io::Write::write_all(&mut c, word.as_bytes());
        }
    });
}

//! Discovery over fake roots in temporary directories (files with the driver's names; the
//! ELF contents do not matter here), a linker cache laid out as glibc writes it.

use super::*;
use std::os::unix::fs::{symlink, PermissionsExt};

const V: &str = "550.54.15";
const OLD: &str = "535.129.03";
const LIB: &str = "/usr/lib/x86_64-linux-gnu";

struct Root(tempfile::TempDir);

impl Root {
    fn new() -> Root {
        // Only a file's own directory must be root's and closed to others: a private
        // temporary directory will do.
        let t = tempfile::Builder::new()
            .prefix("driver-unit-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Root(t)
    }
    fn p(&self, abs: &str) -> PathBuf {
        self.0.path().join(abs.trim_start_matches('/'))
    }
    fn file(&self, abs: &str) {
        let p = self.p(abs);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, abs).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    fn link(&self, target: &str, abs: &str) {
        let p = self.p(abs);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        symlink(target, p).unwrap();
    }
    fn socket(&self, abs: &str) {
        let p = self.p(abs);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::os::unix::net::UnixListener::bind(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    fn cache(&self, entries: &[(i32, &str, &str)]) {
        let p = self.p("/etc/ld.so.cache");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, ldcache::new_cache(entries)).unwrap();
    }
    /// A driver of version `v` in `dir`: its libraries (+ the SONAME links a real install
    /// has), vdpau, firmware.
    fn driver(&self, dir: &str, v: &str) {
        for l in ["libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"] {
            self.file(&format!("{dir}/{l}.so.{v}"));
        }
        self.file(&format!("{dir}/vdpau/libvdpau_nvidia.so.{v}"));
        self.file(&format!("/lib/firmware/nvidia/{v}/gsp_ga10x.bin"));
        self.file(&format!("/lib/firmware/nvidia/{v}/gsp_tu10x.bin"));
        self.file(&format!("/lib/firmware/nvidia/{v}/README"));
    }
    fn root(&self) -> &Path {
        self.0.path()
    }
}

/// [`check_trust`] with no `driver_socket_owners`.
fn trust(root: &Path, files: &[DriverFile]) -> Result<Vec<socket::HeldSocket>, DriverError> {
    check_trust(root, files, &socket::Owners::new(root, &[]))
}

fn paths(f: &DriverFound) -> Vec<(&str, DriverFileKind, FoundBy)> {
    f.files
        .iter()
        .map(|x| (x.path.as_str(), x.kind, x.found_by))
        .collect()
}

/// A host as a driver install leaves it, with an older driver's files left beside.
fn full_host() -> Root {
    let r = Root::new();
    r.driver(LIB, V);
    r.driver(LIB, OLD);
    r.link(&format!("libcuda.so.{V}"), &format!("{LIB}/libcuda.so.1"));
    r.file(&format!("{LIB}/libfoo.so.{V}.1"));
    r.file(&format!("{LIB}/notalib.so.{V}"));
    r.link(
        &format!("libnvidia-ml.so.{V}"),
        &format!("{LIB}/libnvidia-fake.so.{V}"),
    );
    r.file("/usr/bin/nvidia-smi");
    r.file("/usr/bin/nvidia-cuda-mps-control");
    r.file("/usr/sbin/nvidia-persistenced");
    r.file("/bin/nvidia-smi");
    r.socket("/run/nvidia-persistenced/socket");
    r.file("/usr/share/glvnd/egl_vendor.d/10_nvidia.json");
    r.file("/etc/vulkan/icd.d/nvidia_icd.json");
    r.file("/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json");
    r.file("/usr/share/egl/egl_external_platform.d/10_mesa.json");
    r.file("/etc/OpenCL/vendors/nvidia.icd");
    r.cache(&[
        (0x0303, "libcuda.so.1", &format!("{LIB}/libcuda.so.1")),
        (
            0x0003,
            "libcuda.so.1",
            "/usr/lib/i386-linux-gnu/libcuda.so.1",
        ),
        (0x0303, "libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
    ]);
    r
}

#[test]
fn finds_exactly_the_running_drivers_files() {
    let r = full_host();
    let f = discover(r.root(), V).unwrap();
    use DriverFileKind::*;
    use FoundBy::*;
    let lib = |n: &str| format!("{LIB}/{n}");
    let want: Vec<(String, DriverFileKind, FoundBy)> = vec![
        (lib(&format!("libcuda.so.{V}")), Library, LdCache),
        (lib(&format!("libnvidia-ml.so.{V}")), Library, LdCache),
        (
            lib(&format!("libnvidia-ptxjitcompiler.so.{V}")),
            Library,
            LdCache,
        ),
        (
            lib(&format!("vdpau/libvdpau_nvidia.so.{V}")),
            Library,
            LdCache,
        ),
        (
            format!("/lib/firmware/nvidia/{V}/gsp_ga10x.bin"),
            Firmware,
            Fixed,
        ),
        (
            format!("/lib/firmware/nvidia/{V}/gsp_tu10x.bin"),
            Firmware,
            Fixed,
        ),
        ("/usr/bin/nvidia-smi".into(), Program, Fixed),
        ("/usr/sbin/nvidia-persistenced".into(), Program, Fixed),
        ("/usr/bin/nvidia-cuda-mps-control".into(), Program, Fixed),
        ("/run/nvidia-persistenced/socket".into(), Socket, Fixed),
        (
            "/usr/share/glvnd/egl_vendor.d/10_nvidia.json".into(),
            Config,
            Fixed,
        ),
        ("/etc/vulkan/icd.d/nvidia_icd.json".into(), Config, Fixed),
        ("/etc/OpenCL/vendors/nvidia.icd".into(), Config, Fixed),
        (
            "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json".into(),
            Config,
            Fixed,
        ),
    ];
    let got: Vec<(String, DriverFileKind, FoundBy)> = paths(&f)
        .into_iter()
        .map(|(p, k, b)| (p.to_string(), k, b))
        .collect();
    assert_eq!(got, want);
    assert_eq!(f.lib_dirs, vec![LIB.to_string()]);
    assert_eq!(f.version, V);
    // Sources are the host's files, under the root.
    assert_eq!(f.files[0].source, r.p(&format!("{LIB}/libcuda.so.{V}")));
    // Nothing of the older driver.
    assert!(f.files.iter().all(|x| !x.path.contains(OLD)), "{f:?}");
    trust(r.root(), &f.files).unwrap();
    assert!(f.unchanged());
}

#[test]
fn merged_usr_gives_each_file_once_at_the_path_found_first() {
    let r = Root::new();
    std::fs::create_dir_all(r.p("/usr/lib")).unwrap();
    std::fs::create_dir_all(r.p("/usr/bin")).unwrap();
    r.link("usr/lib", "/lib");
    r.link("usr/bin", "/bin");
    r.driver(LIB, V);
    r.file("/usr/bin/nvidia-smi");
    // ldconfig on a merged-/usr host lists the libraries under /lib.
    r.cache(&[(0x0303, "libcuda.so.1", "/lib/x86_64-linux-gnu/libcuda.so.1")]);
    let f = discover(r.root(), V).unwrap();
    let libs: Vec<&str> = f
        .of(DriverFileKind::Library)
        .map(|x| x.path.as_str())
        .collect();
    assert_eq!(
        libs,
        vec![
            "/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
            "/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15",
            "/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.550.54.15",
            "/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.550.54.15",
        ]
    );
    assert_eq!(f.lib_dirs, vec!["/lib/x86_64-linux-gnu".to_string()]);
    // The source is the real file (links resolved under the root).
    assert_eq!(
        f.files[0].source,
        r.p("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
    );
    let progs: Vec<&str> = f
        .of(DriverFileKind::Program)
        .map(|x| x.path.as_str())
        .collect();
    assert_eq!(progs, vec!["/usr/bin/nvidia-smi"]);
}

#[test]
fn debian_layout_found_through_the_fixed_directories() {
    // Debian's packages: the libraries in nvidia/current, the linker cache naming only the
    // alternatives' links in the multiarch directory (which holds no libcuda.so.V).
    let r = Root::new();
    let cur = "/usr/lib/x86_64-linux-gnu/nvidia/current";
    r.driver(cur, V);
    r.link(
        &format!("{cur}/libcuda.so.{V}"),
        &format!("{LIB}/libcuda.so.1"),
    );
    r.cache(&[(0x0303, "libcuda.so.1", &format!("{LIB}/libcuda.so.1"))]);
    // An absolute link inside the root stays inside it.
    r.link(&format!("{cur}/libcuda.so.{V}"), "/usr/lib/abs-link");
    assert_eq!(
        resolve(r.root(), "/usr/lib/abs-link").as_deref(),
        Some(format!("{cur}/libcuda.so.{V}").as_str())
    );
    let f = discover(r.root(), V).unwrap();
    let libs: Vec<(&str, FoundBy)> = f
        .of(DriverFileKind::Library)
        .map(|x| (x.path.as_str(), x.found_by))
        .collect();
    assert_eq!(libs.len(), 4, "{libs:?}");
    assert!(libs
        .iter()
        .all(|(p, b)| p.starts_with(cur) && *b == FoundBy::Directory));
    assert_eq!(f.lib_dirs, vec![cur.to_string()]);
}

#[test]
fn no_libcuda_of_the_running_version_is_one_line() {
    let r = Root::new();
    r.driver(LIB, OLD);
    let e = discover(r.root(), V).unwrap_err();
    let m = e.to_string();
    assert!(
        m.starts_with("driver \"host\": the loaded NVIDIA kernel module is 550.54.15, but no libcuda.so.550.54.15 is installed (looked in /usr/lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu/nvidia/current, /usr/lib64, /usr/lib under "),
        "{m}"
    );
    assert_eq!(m.lines().count(), 1);
    // libnvidia-ml alone is not enough.
    r.file(&format!("{LIB}/libnvidia-ml.so.{V}"));
    assert!(matches!(
        discover(r.root(), V),
        Err(DriverError::NoLibcuda { .. })
    ));
}

#[test]
fn version_lines_of_both_modules() {
    let prop = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
    assert_eq!(parse_version(prop).as_deref(), Some("550.54.15"));
    let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.28.03  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Jul 18 20:27:51 UTC 2024\nGCC version:  gcc version 12.3.0\n";
    assert_eq!(parse_version(open).as_deref(), Some("560.28.03"));
    let arm = "NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.129.03  Thu Oct 19 18:42:12 UTC 2023\n";
    assert_eq!(parse_version(arm).as_deref(), Some("535.129.03"));
    // A version-shaped word before "Kernel Module" is not the module's.
    assert_eq!(
        parse_version("NVRM version: NVIDIA 1.2 UNIX x86_64 Kernel Module  575.51.02  Date\n")
            .as_deref(),
        Some("575.51.02")
    );
    for bad in [
        "",
        "GCC version: 12.2\n",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module\n",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  beta  x.y\n",
        "NVRM version: something 550.54.15\n",
    ] {
        assert_eq!(parse_version(bad), None, "{bad:?}");
    }
}

#[test]
fn no_module_loaded_is_one_line() {
    let t = tempfile::tempdir().unwrap();
    let e = module_version(t.path()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "driver \"host\": no NVIDIA kernel module is loaded ({}/driver/nvidia/version does not exist)",
            t.path().display()
        )
    );
    std::fs::create_dir_all(t.path().join("driver/nvidia")).unwrap();
    std::fs::write(t.path().join(VERSION_FILE), "garbage\n").unwrap();
    assert!(matches!(
        module_version(t.path()),
        Err(DriverError::NoVersion { .. })
    ));
    std::fs::write(
        t.path().join(VERSION_FILE),
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5\n",
    )
    .unwrap();
    assert_eq!(module_version(t.path()).unwrap(), "550.54.15");
}

#[test]
fn untrusted_files_and_directories_are_refused() {
    let r = full_host();
    let f = discover(r.root(), V).unwrap();
    let lib = r.p(&format!("{LIB}/libnvidia-ml.so.{V}"));
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o664)).unwrap();
    let e = trust(r.root(), &f.files).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "driver \"host\": {} has mode 0664: group or others may write it; refusing to give it",
            lib.display()
        )
    );
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o644)).unwrap();
    trust(r.root(), &f.files).unwrap();
    // Not root's.
    let smi = r.p("/usr/bin/nvidia-smi");
    std::os::unix::fs::chown(&smi, Some(1000), None).unwrap();
    assert!(matches!(
        trust(r.root(), &f.files),
        Err(DriverError::NotRoots { uid: 1000, .. })
    ));
    std::os::unix::fs::chown(&smi, Some(0), None).unwrap();
    // Its directory writable by others.
    let fw = r.p(&format!("/lib/firmware/nvidia/{V}"));
    std::fs::set_permissions(&fw, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = trust(r.root(), &f.files).unwrap_err();
    assert!(
        matches!(e, DriverError::DirWritable { mode: 0o777, .. }),
        "{e}"
    );
    std::fs::set_permissions(&fw, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A directory further up, on the way from the root: its user could swap the directory
    // below it (and the file in it) after the check, before the mount.
    let up = r.p("/usr/lib");
    std::os::unix::fs::chown(&up, Some(1000), None).unwrap();
    let e = trust(r.root(), &f.files).unwrap_err();
    assert!(
        matches!(&e, DriverError::DirNotRoots { dir, uid: 1000, .. } if *dir == up),
        "{e}"
    );
    assert!(e.to_string().contains("a directory on the way to"), "{e}");
    std::os::unix::fs::chown(&up, Some(0), None).unwrap();
    let usr = r.p("/usr");
    std::fs::set_permissions(&usr, std::fs::Permissions::from_mode(0o775)).unwrap();
    assert!(matches!(
        trust(r.root(), &f.files),
        Err(DriverError::DirWritable { mode: 0o775, dir, .. }) if dir == usr
    ));
    std::fs::set_permissions(&usr, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The root itself, and a directory above it (a sticky one may be written by others:
    // the tests' roots lie in /tmp).
    std::os::unix::fs::chown(r.root(), Some(1000), None).unwrap();
    assert!(matches!(
        trust(r.root(), &f.files),
        Err(DriverError::DirNotRoots { uid: 1000, .. })
    ));
    std::os::unix::fs::chown(r.root(), Some(0), None).unwrap();
    let above = tempfile::tempdir().unwrap();
    let nested = above.path().join("host");
    std::fs::rename(r.root(), &nested).unwrap();
    let moved: Vec<DriverFile> = f
        .files
        .iter()
        .map(|x| DriverFile {
            source: nested.join(x.source.strip_prefix(r.root()).unwrap()),
            ..x.clone()
        })
        .collect();
    trust(&nested, &moved).unwrap();
    std::fs::set_permissions(above.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(
        trust(&nested, &moved),
        Err(DriverError::DirWritable { mode: 0o777, .. })
    ));
    std::fs::set_permissions(above.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    trust(&nested, &moved).unwrap();
    // Below the root, a directory that became a link (to one as trusted) since it was found.
    let fw_dir = nested.join(format!("lib/firmware/nvidia/{V}"));
    let real_fw = nested.join("fw-elsewhere");
    std::fs::rename(&fw_dir, &real_fw).unwrap();
    symlink(&real_fw, &fw_dir).unwrap();
    assert!(matches!(
        trust(&nested, &moved),
        Err(DriverError::Changed {
            want: "directory",
            ..
        })
    ));
    std::fs::remove_file(&fw_dir).unwrap();
    std::fs::rename(&real_fw, &fw_dir).unwrap();
    std::fs::rename(&nested, r.root()).unwrap();
    // A socket is 0777 (clients must connect): root's is enough.
    assert!(trust(r.root(), &f.files).unwrap().is_empty());
    let sock = r.p("/run/nvidia-persistenced/socket");
    std::os::unix::fs::lchown(&sock, Some(1000), None).unwrap();
    assert!(matches!(
        trust(r.root(), &f.files),
        Err(DriverError::SocketOwner { .. })
    ));
    std::os::unix::fs::lchown(&sock, Some(0), None).unwrap();
    // A file replaced by a link since it was found.
    let cfgf = r.p("/etc/OpenCL/vendors/nvidia.icd");
    std::fs::remove_file(&cfgf).unwrap();
    symlink("/etc/passwd", &cfgf).unwrap();
    assert!(matches!(
        trust(r.root(), &f.files),
        Err(DriverError::Changed { .. })
    ));
}

#[test]
fn what_was_looked_at_tells_when_to_look_again() {
    let r = full_host();
    let f = discover(r.root(), V).unwrap();
    assert!(f.unchanged());
    assert!(f
        .searched
        .iter()
        .any(|s| s.path == r.p("/etc/ld.so.cache") && s.ident.is_some()));
    // A directory searched in vain that appears later.
    let missing = r.p("/usr/lib64");
    assert!(f
        .searched
        .iter()
        .any(|s| s.path == missing && s.ident.is_none()));
    std::fs::create_dir_all(&missing).unwrap();
    assert!(!f.unchanged());
    std::fs::remove_dir(&missing).unwrap();
    assert!(f.unchanged());
    // A library added to a library directory.
    std::thread::sleep(std::time::Duration::from_millis(10));
    r.file(&format!("{LIB}/libnvidia-cfg.so.{V}"));
    assert!(!f.unchanged());
    let again = discover(r.root(), V).unwrap();
    assert!(again
        .files
        .iter()
        .any(|x| x.path.ends_with("libnvidia-cfg.so.550.54.15")));
    assert!(again.unchanged());
    // The linker cache written again.
    std::thread::sleep(std::time::Duration::from_millis(10));
    r.cache(&[(0x0303, "libcuda.so.1", &format!("{LIB}/libcuda.so.1"))]);
    assert!(!again.unchanged());
}

#[test]
fn links_going_round_resolve_to_nothing() {
    let r = Root::new();
    r.link("/b", "/a");
    r.link("/a", "/b");
    assert_eq!(resolve(r.root(), "/a/x"), None);
    r.file("/usr/x");
    r.link("../../usr", "/d/e");
    assert_eq!(resolve(r.root(), "/d/e/x").as_deref(), Some("/usr/x"));
    // `..` above the root stays at the root.
    assert_eq!(resolve(r.root(), "/../../usr/x").as_deref(), Some("/usr/x"));
}

/// The one-line refusal of the cache under `r`, as `discover` gives it.
fn refusal(r: &Root) -> String {
    let e = discover(r.root(), V).unwrap_err();
    assert!(matches!(e, DriverError::LdCache { .. }), "{e}");
    let text = e.to_string();
    assert_eq!(text.lines().count(), 1, "{text}");
    let head = format!(
        "driver \"host\": linker cache {}: ",
        r.p("/etc/ld.so.cache").display()
    );
    assert!(text.starts_with(&head), "{text}");
    assert!(text.ends_with("; refusing to read it"), "{text}");
    text[head.len()..].to_string()
}

#[test]
fn an_unreadable_cache_refuses_the_request_in_one_line_naming_it() {
    let r = Root::new();
    r.driver(LIB, V);
    std::fs::create_dir_all(r.p("/etc")).unwrap();
    std::fs::write(r.p("/etc/ld.so.cache"), b"not a cache").unwrap();
    assert!(refusal(&r).starts_with("not a glibc linker cache"));
    // A cache that cuts off inside its strings.
    let good = ldcache::new_cache(&[(0x0303, "libcuda.so.1", &format!("{LIB}/libcuda.so.1"))]);
    std::fs::write(r.p("/etc/ld.so.cache"), &good[..good.len() - 3]).unwrap();
    assert_eq!(
        refusal(&r),
        "entry 0: its path at offset 85 has no NUL before the cache ends; refusing to read it"
    );
    // No cache at all: the fixed directories.
    std::fs::remove_file(r.p("/etc/ld.so.cache")).unwrap();
    let f = discover(r.root(), V).unwrap();
    assert!(f
        .of(DriverFileKind::Library)
        .all(|x| x.found_by == FoundBy::Directory));
    assert!(f
        .searched
        .iter()
        .any(|x| x.path == r.p("/etc/ld.so.cache") && x.ident.is_none()));
}

#[test]
fn a_cache_others_may_write_or_swap_is_not_read() {
    let r = Root::new();
    r.driver(LIB, V);
    r.cache(&[(0x0303, "libcuda.so.1", &format!("{LIB}/libcuda.so.1"))]);
    let cache = r.p("/etc/ld.so.cache");
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    let f = discover(r.root(), V).unwrap();
    assert!(f.files.iter().any(|x| x.found_by == FoundBy::LdCache));
    mode(&cache, 0o664);
    assert_eq!(
        refusal(&r),
        "has mode 0664: group or others may write it; refusing to read it"
    );
    mode(&cache, 0o644);
    std::os::unix::fs::chown(&cache, Some(1000), None).unwrap();
    assert_eq!(
        refusal(&r),
        "owned by uid 1000, not root; refusing to read it"
    );
    std::os::unix::fs::chown(&cache, Some(0), None).unwrap();
    mode(&r.p("/etc"), 0o777);
    assert_eq!(
        refusal(&r),
        format!(
            "a directory on the way to it ({}) has mode 0777: group or others may write it; refusing to read it",
            std::fs::canonicalize(r.p("/etc")).unwrap().display()
        )
    );
    mode(&r.p("/etc"), 0o755);
    std::os::unix::fs::chown(r.p("/etc"), Some(1000), None).unwrap();
    assert!(refusal(&r).contains("is owned by uid 1000, not root"));
    std::os::unix::fs::chown(r.p("/etc"), Some(0), None).unwrap();
    // A link in place of the cache, or of `etc`, is not followed.
    std::fs::rename(&cache, r.p("/real.cache")).unwrap();
    symlink("/real.cache", &cache).unwrap();
    assert_eq!(
        refusal(&r),
        "a symbolic link (not followed); refusing to read it"
    );
    std::fs::remove_file(&cache).unwrap();
    std::fs::rename(r.p("/etc"), r.p("/etc2")).unwrap();
    std::fs::rename(r.p("/real.cache"), r.p("/etc2/ld.so.cache")).unwrap();
    symlink("etc2", r.p("/etc")).unwrap();
    assert!(refusal(&r).contains("is a symbolic link or not a directory"));
    std::fs::remove_file(r.p("/etc")).unwrap();
    std::fs::rename(r.p("/etc2"), r.p("/etc")).unwrap();
    // A FIFO is not waited on.
    std::fs::remove_file(&cache).unwrap();
    nix::unistd::mkfifo(&cache, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    assert_eq!(refusal(&r), "not a regular file; refusing to read it");
    std::fs::remove_file(&cache).unwrap();
    // Larger than any real cache: refused by its size, before it is read.
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(ldcache::MAX_SIZE as u64 + 1)
        .unwrap();
    assert_eq!(
        refusal(&r),
        "16777217 bytes: more than the 16 MiB a linker cache is read up to; refusing to read it"
    );
    // Back to a good one: read again; but not under a root others may write.
    r.cache(&[(0x0303, "libcuda.so.1", &format!("{LIB}/libcuda.so.1"))]);
    assert!(discover(r.root(), V).is_ok());
    mode(r.root(), 0o777);
    let e = discover(r.root(), V).unwrap_err().to_string();
    mode(r.root(), 0o755);
    assert!(
        e.contains("has mode 0777: group or others may write it"),
        "{e}"
    );
}

// ---- sockets ----

/// The service account of stock packaging (`nvidia-persistenced --user nvidia-persistenced`).
const SVC: u32 = 999;
const SVC_NAME: &str = "nvidia-persistenced";
const PERSISTENCED: &str = "/run/nvidia-persistenced/socket";

/// A host whose `nvidia-persistenced` runs as its own account: `/run/nvidia-persistenced`
/// (0755) and the socket in it are that account's, as the daemon leaves them; the host's
/// passwd names it; `/run/docker.sock`, a root socket anyone would want, listens beside.
/// Returns the listeners (persistenced's, docker's).
fn service_host() -> (Root, UnixListener, UnixListener) {
    let r = full_host();
    let sock = r.p(PERSISTENCED);
    std::fs::remove_file(&sock).unwrap();
    let real = UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::os::unix::fs::lchown(&sock, Some(SVC), Some(SVC)).unwrap();
    std::os::unix::fs::chown(sock.parent().unwrap(), Some(SVC), Some(SVC)).unwrap();
    let docker = UnixListener::bind(r.p("/run/docker.sock")).unwrap();
    std::fs::write(
        r.p("/etc/passwd"),
        format!("root:x:0:0:root:/root:/bin/bash\n{SVC_NAME}:x:{SVC}:{SVC}:NVIDIA Persistence Daemon,,,:/nonexistent:/usr/sbin/nologin\n"),
    )
    .unwrap();
    (r, real, docker)
}

fn trust_with(
    root: &Path,
    files: &[DriverFile],
    named: &[SocketOwner],
) -> Result<Vec<socket::HeldSocket>, DriverError> {
    check_trust(root, files, &socket::Owners::new(root, named))
}

fn ino(p: &Path) -> (u64, u64) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.dev(), m.ino())
}

/// Which of the listeners `ls` a client connecting at `path` reaches.
fn reached(path: &Path, ls: &[&UnixListener]) -> Vec<bool> {
    let _c = std::os::unix::net::UnixStream::connect(path).unwrap();
    ls.iter()
        .map(|l| {
            l.set_nonblocking(true).unwrap();
            l.accept().is_ok()
        })
        .collect()
}

use crate::host::config::SocketOwner;
use std::os::unix::net::UnixListener;

/// The reviewer's scenario: the account that owns `/run/nvidia-persistenced/` puts a link
/// to `/run/docker.sock` (root's) where its socket was. The link is found (something is at
/// work where the daemon should be) and refused in one line naming it, whoever is named in
/// `driver_socket_owners`; docker's socket is never given.
#[test]
fn a_link_where_the_socket_was_is_never_given() {
    let (r, _real, _docker) = service_host();
    let sock = r.p(PERSISTENCED);
    std::fs::remove_file(&sock).unwrap();
    symlink("/run/docker.sock", &sock).unwrap();
    std::os::unix::fs::lchown(&sock, Some(SVC), Some(SVC)).unwrap();
    let f = discover(r.root(), V).unwrap();
    let s: Vec<&DriverFile> = f.of(DriverFileKind::Socket).collect();
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0].path, PERSISTENCED);
    assert_eq!(s[0].source, sock, "found without following the link");
    for named in [
        vec![],
        vec![SocketOwner::Name(SVC_NAME.into())],
        vec![SocketOwner::Uid(SVC), SocketOwner::Uid(0)],
    ] {
        let e = trust_with(r.root(), &f.files, &named).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("driver \"host\": the socket {} is a symbolic link; a socket is never given through one: refusing to give it", sock.display())
        );
    }
    // A link owned by root, in a root-owned directory, to a root socket: refused all the same.
    std::os::unix::fs::chown(sock.parent().unwrap(), Some(0), Some(0)).unwrap();
    std::os::unix::fs::lchown(&sock, Some(0), Some(0)).unwrap();
    assert!(matches!(
        trust(r.root(), &discover(r.root(), V).unwrap().files),
        Err(DriverError::SocketLink { .. })
    ));
    // A relative link, and one that leads nowhere.
    std::fs::remove_file(&sock).unwrap();
    symlink("../docker.sock", &sock).unwrap();
    assert!(matches!(
        trust(r.root(), &discover(r.root(), V).unwrap().files),
        Err(DriverError::SocketLink { .. })
    ));
    std::fs::remove_file(&sock).unwrap();
    symlink("/nowhere", &sock).unwrap();
    assert!(matches!(
        trust(r.root(), &discover(r.root(), V).unwrap().files),
        Err(DriverError::SocketLink { .. })
    ));
    // A socket that became a link since it was found (a cached discovery).
    std::fs::remove_file(&sock).unwrap();
    let _l = UnixListener::bind(&sock).unwrap();
    let cached = discover(r.root(), V).unwrap();
    trust(r.root(), &cached.files).unwrap();
    std::fs::remove_file(&sock).unwrap();
    symlink("/run/docker.sock", &sock).unwrap();
    assert!(matches!(
        trust(r.root(), &cached.files),
        Err(DriverError::SocketLink { .. })
    ));
}

/// A directory on the way that is a link (even to a root-owned directory holding a root
/// socket) refuses the socket, naming the link; so does a directory above that group or
/// others may write (sticky or not: below the root, sticky is no excuse).
#[test]
fn a_link_or_a_writable_directory_on_the_way_refuses_the_socket() {
    let r = full_host();
    std::fs::create_dir_all(r.p("/var/lib/fm")).unwrap();
    let _fm = UnixListener::bind(r.p("/var/lib/fm/socket")).unwrap();
    symlink("/var/lib/fm", r.p("/run/nvidia-fabricmanager")).unwrap();
    let f = discover(r.root(), V).unwrap();
    let fm = f
        .of(DriverFileKind::Socket)
        .find(|x| x.path == "/run/nvidia-fabricmanager/socket")
        .expect("the link on the way is found");
    assert_eq!(fm.source, r.p("/run/nvidia-fabricmanager/socket"));
    let e = trust(r.root(), &f.files).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "driver \"host\": a directory on the way to the socket {} ({}) is a symbolic link; a socket is never given through one: refusing to give it",
            r.p("/run/nvidia-fabricmanager/socket").display(),
            r.p("/run/nvidia-fabricmanager").display()
        )
    );
    // The link taken away: the cache's look is stale (the link was looked at, not followed).
    assert!(f.unchanged());
    std::fs::remove_file(r.p("/run/nvidia-fabricmanager")).unwrap();
    assert!(!f.unchanged());
    // `/run` itself a link (to a copy with the same socket in it).
    let f = discover(r.root(), V).unwrap();
    trust(r.root(), &f.files).unwrap();
    std::fs::rename(r.p("/run"), r.p("/run2")).unwrap();
    symlink("run2", r.p("/run")).unwrap();
    assert!(matches!(
        trust(r.root(), &f.files),
        Err(DriverError::SocketDirLink { dir, .. }) if dir == r.p("/run")
    ));
    std::fs::remove_file(r.p("/run")).unwrap();
    std::fs::rename(r.p("/run2"), r.p("/run")).unwrap();
    trust(r.root(), &f.files).unwrap();
    // A group-writable directory above the socket's: its group could rename the socket's
    // directory away and put one of its own there.
    for mode in [0o775, 0o1777] {
        std::fs::set_permissions(r.p("/run"), std::fs::Permissions::from_mode(mode)).unwrap();
        let e = trust(r.root(), &f.files).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "driver \"host\": a directory on the way to {} ({}) has mode {mode:04o}: group or others may write it; refusing to give it",
                r.p(PERSISTENCED).display(),
                r.p("/run").display()
            )
        );
    }
    std::fs::set_permissions(r.p("/run"), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The socket's own directory writable by others.
    let dir = r.p("/run/nvidia-persistenced");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o757)).unwrap();
    assert!(matches!(
        trust(r.root(), &f.files),
        Err(DriverError::DirWritable { mode: 0o757, .. })
    ));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Something else in the socket's place: a regular file is not taken; one that replaced
    // the socket since it was found is refused.
    std::fs::remove_file(r.p(PERSISTENCED)).unwrap();
    std::fs::write(r.p(PERSISTENCED), "x").unwrap();
    assert!(matches!(
        trust(r.root(), &f.files),
        Err(DriverError::Changed { want: "socket", .. })
    ));
    assert_eq!(
        discover(r.root(), V)
            .unwrap()
            .of(DriverFileKind::Socket)
            .count(),
        0
    );
}

/// The account hard-links another socket where its own was (`ln /run/docker.sock
/// /run/nvidia-persistenced/socket`, which the kernel allows on a host whose
/// `fs.protected_hardlinks` is 0: made here as root, as the account could there): no link to
/// refuse, the same inode as docker's. Refused in one line with the account named: a root
/// socket in its directory; its own socket with a name elsewhere is held with its 2 links
/// (the give looks whether the other is gpuhook's own), with 3 refused here.
#[test]
fn a_hard_link_in_the_accounts_directory_is_never_held() {
    let (r, _real, _docker) = service_host();
    let sock = r.p(PERSISTENCED);
    let named = [SocketOwner::Name(SVC_NAME.into())];
    let f = discover(r.root(), V).unwrap();
    std::fs::remove_file(&sock).unwrap();
    std::fs::hard_link(r.p("/run/docker.sock"), &sock).unwrap();
    let e = trust_with(r.root(), &f.files, &named).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("driver \"host\": the socket {} is root's, but its directory ({}) is {SVC_NAME} (uid {SVC})'s, who cannot bind a socket of root's there, only hard-link one (/run/docker.sock?): refusing to give it", sock.display(), sock.parent().unwrap().display())
    );
    // Not named: its directory is refused first.
    assert!(matches!(
        trust(r.root(), &f.files),
        Err(DriverError::SocketDirOwner { .. })
    ));
    // A socket of the account's with a name elsewhere: 2 links, held with its count (the
    // give refuses it unless the other is gpuhook's own); 3: refused here.
    std::fs::remove_file(&sock).unwrap();
    let elsewhere = r.p("/run/other.sock");
    let _l = UnixListener::bind(&elsewhere).unwrap();
    std::os::unix::fs::lchown(&elsewhere, Some(SVC), Some(SVC)).unwrap();
    std::fs::hard_link(&elsewhere, &sock).unwrap();
    let held = trust_with(r.root(), &f.files, &named).unwrap();
    assert_eq!(held[0].links, 2);
    std::fs::hard_link(&elsewhere, r.p("/run/third.sock")).unwrap();
    let e = trust_with(r.root(), &f.files, &named).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("driver \"host\": the socket {} in a directory of {SVC_NAME} (uid {SVC}) has 3 links, a name elsewhere besides its path and gpuhook's own link: a hard link the account made to another socket? refusing to give it", sock.display())
    );
}

/// Stock `nvidia-persistenced --user nvidia-persistenced`: the directory and the socket are
/// the account's. Refused in one line saying what to set; given once `driver_socket_owners`
/// names the account (by name through the host's passwd, or by uid), and then only from the
/// descriptor checked (held), as its directory is the account's.
#[test]
fn a_service_accounts_socket_needs_driver_socket_owners() {
    let (r, _real, _docker) = service_host();
    let sock = r.p(PERSISTENCED);
    let f = discover(r.root(), V).unwrap();
    let e = trust(r.root(), &f.files).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("driver \"host\": {} is owned by {SVC_NAME} (uid {SVC}), not root: name it in driver_socket_owners to give it", sock.display())
    );
    // Another account named: the same.
    let other = [SocketOwner::Name("root".into()), SocketOwner::Uid(998)];
    assert!(matches!(
        trust_with(r.root(), &f.files, &other),
        Err(DriverError::SocketOwner { .. })
    ));
    for named in [
        [SocketOwner::Name(SVC_NAME.into())],
        [SocketOwner::Uid(SVC)],
    ] {
        let held = trust_with(r.root(), &f.files, &named).unwrap();
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].path, PERSISTENCED);
        assert_eq!(
            held[0].dir_owner.to_string(),
            "nvidia-persistenced (uid 999)"
        );
        let st = nix::sys::stat::fstat(&held[0].fd).unwrap();
        assert_eq!((st.st_dev, st.st_ino), ino(&sock));
    }
    let named = [SocketOwner::Name(SVC_NAME.into())];
    // A root socket in the account's directory: refused, named or not (the account cannot
    // have bound it: it hard-linked it).
    std::os::unix::fs::lchown(&sock, Some(0), Some(0)).unwrap();
    assert!(matches!(
        trust_with(r.root(), &f.files, &named),
        Err(DriverError::SocketRootsInAccountDir { .. })
    ));
    let e = trust(r.root(), &f.files).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("driver \"host\": the directory of the socket {} ({}) is owned by {SVC_NAME} (uid {SVC}), not root: name it in driver_socket_owners to give it", sock.display(), sock.parent().unwrap().display())
    );
    // The account's socket in a root-owned directory: given by its path (nobody but root can
    // change what is there); still only when named.
    std::os::unix::fs::lchown(&sock, Some(SVC), Some(SVC)).unwrap();
    std::os::unix::fs::chown(sock.parent().unwrap(), Some(0), Some(0)).unwrap();
    assert!(trust_with(r.root(), &f.files, &named).unwrap().is_empty());
    assert!(matches!(
        trust(r.root(), &f.files),
        Err(DriverError::SocketOwner { .. })
    ));
    // Only the socket's own directory may be the account's: not one above it.
    std::os::unix::fs::chown(r.p("/run"), Some(SVC), Some(SVC)).unwrap();
    let e = trust_with(r.root(), &f.files, &named).unwrap_err();
    assert!(
        matches!(&e, DriverError::DirNotRoots { dir, uid: SVC, .. } if *dir == r.p("/run")),
        "{e}"
    );
    std::os::unix::fs::chown(r.p("/run"), Some(0), Some(0)).unwrap();
    // Names are looked up in a passwd only root may write.
    let passwd = r.p("/etc/passwd");
    std::fs::set_permissions(&passwd, std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = trust_with(r.root(), &f.files, &named).unwrap_err();
    assert!(
        e.to_string().starts_with(&format!("driver \"host\": {}: not a regular file of root's closed to group and others (uid 0, mode 0666); the names in driver_socket_owners cannot be looked up", passwd.display())),
        "{e}"
    );
    // A uid needs no passwd; nor does a start that meets only root's sockets.
    std::fs::remove_file(&passwd).unwrap();
    assert!(trust_with(r.root(), &f.files, &[SocketOwner::Uid(SVC)])
        .unwrap()
        .is_empty());
    std::os::unix::fs::lchown(&sock, Some(0), Some(0)).unwrap();
    trust_with(r.root(), &f.files, &named).unwrap();
    // Without a passwd the message names the uid alone.
    std::os::unix::fs::lchown(&sock, Some(SVC), Some(SVC)).unwrap();
    assert!(trust(r.root(), &f.files)
        .unwrap_err()
        .to_string()
        .contains(" is owned by uid 999, not root: name it in driver_socket_owners"));
}

/// The race: the account swaps its socket for a link to docker's between gpuhook's check
/// and the mount. What is given is gpuhook's hard link made from the descriptor checked, in
/// a directory of root's: whatever the account does after the check, a client of that link
/// reaches the socket checked, never docker's.
#[test]
fn the_socket_given_is_the_one_checked_whatever_is_swapped_in_after() {
    let (r, real, docker) = service_host();
    let sock = r.p(PERSISTENCED);
    let f = discover(r.root(), V).unwrap();
    let mut held = trust_with(r.root(), &f.files, &[SocketOwner::Uid(SVC)]).unwrap();
    let h = held.pop().unwrap();
    // The swap, after the check (a relative link: it leads to the fake root's docker.sock).
    let aside = r.p("/run/nvidia-persistenced/real");
    std::fs::rename(&sock, &aside).unwrap();
    symlink("../docker.sock", &sock).unwrap();
    let pins = tempfile::tempdir().unwrap();
    let dir = nix::fcntl::open(
        pins.path(),
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    let name = socket::pin_name(&h.path);
    assert_eq!(name, "run_nvidia-persistenced_socket");
    socket::pin(&h.fd, &dir, &name).unwrap();
    let given = pins.path().join(&name);
    assert_eq!(ino(&given), ino(&aside));
    assert_eq!(reached(&given, &[&real, &docker]), [true, false]);
    // Through the path the account controls: docker's (what a mount by path would give).
    assert_eq!(reached(&sock, &[&real, &docker]), [false, true]);
    // Again (a later start): the same link, nothing left behind.
    socket::pin(&h.fd, &dir, &name).unwrap();
    assert_eq!(std::fs::read_dir(pins.path()).unwrap().count(), 1);
    // A stale link of an earlier socket is replaced by the one checked now.
    std::fs::remove_file(&given).unwrap();
    std::fs::hard_link(r.p("/run/docker.sock"), &given).unwrap();
    socket::pin(&h.fd, &dir, &name).unwrap();
    assert_eq!(ino(&given), ino(&aside));
    assert_eq!(std::fs::read_dir(pins.path()).unwrap().count(), 1);
    // The socket unlinked since it was checked: nothing to link.
    std::fs::remove_file(&aside).unwrap();
    std::fs::remove_file(&given).unwrap();
    assert_eq!(
        socket::pin(&h.fd, &dir, &name),
        Err(nix::errno::Errno::ENOENT)
    );
    assert_eq!(std::fs::read_dir(pins.path()).unwrap().count(), 0);
}

#[test]
fn passwd_lines() {
    assert_eq!(
        socket::parse_passwd("root:x:0:0:root:/root:/bin/bash\n# c\n+nis::::::\nbad\nsvc:x:999:999::/:/bin/false\nno:x:abc:1::/:\n"),
        [("root".to_string(), 0), ("svc".to_string(), 999)]
    );
}

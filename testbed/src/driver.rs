//! CDI test fixtures: a fake NVIDIA driver user space (real ELF libraries and programs
//! built with `cc`), the CDI specs that `nvidia-ctk cdi generate` and `amd-ctk cdi
//! generate` would write for a fake host, and a minimal root filesystem (busybox, the
//! host's glibc, a static `ldconfig`, a `cuda-probe` program) for containers that have
//! their own root.
//!
//! Shapes are copied from the generators' sources: NVIDIA/nvidia-container-toolkit
//! (`cmd/nvidia-ctk/cdi/generate/generate_test.go`, `pkg/nvcdi`, `internal/discover`,
//! `pkg/nvcdi/transform/sorter.go`) and ROCm/container-toolkit (`internal/cdi/cdi.go`).

use crate::fakehost::{Driver, FakeHost, HostPaths};
use nix::fcntl::{Flock, FlockArg};
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A fake NVIDIA driver user-space install under a driver root, as `nvidia-ctk cdi generate --driver-root=ROOT` would see it.
#[derive(Debug, Clone)]
pub struct FakeDriver {
    /// The driver root (the host's `/` for a real install).
    pub root: PathBuf,
    /// The driver version, e.g. `535.129.03` (the fake hosts' kernel module version).
    pub version: String,
}

/// Where the libraries go, inside the root and inside containers.
pub const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";

/// The driver's libraries: file name stem and the SONAME's suffix after `.so.` (`None`:
/// the SONAME is the full versioned name, as for `libnvidia-gpucomp`). Sorted by name, the
/// order `nvidia-ctk` finds them in (a glob of `*.so.VERSION`).
const LIBS: &[(&str, Option<&str>)] = &[
    ("libcuda", Some("1")),
    ("libcudadebugger", Some("1")),
    ("libnvidia-allocator", Some("1")),
    ("libnvidia-cfg", Some("1")),
    ("libnvidia-gpucomp", None),
    ("libnvidia-ml", Some("1")),
    ("libnvidia-nvvm", Some("4")),
    ("libnvidia-opencl", Some("1")),
    ("libnvidia-ptxjitcompiler", Some("1")),
];

/// The driver's programs under `/usr/bin` that `nvidia-ctk` mounts (the ones it looks for
/// and a 535 install has; `nvidia-imex`/`nvidia-imex-ctl` are absent).
const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// GSP firmware files under `/lib/firmware/nvidia/VERSION`.
const FIRMWARE: &[&str] = &["gsp_ga10x.bin", "gsp_tu10x.bin"];

/// What the test bed builds; a root built by another revision is built again.
const BUILD_REVISION: u32 = 2;

/// The driver's ICD and config files ([`FakeDriver::config_files`]), with their text.
const CONFIG_FILES: &[(&str, &str)] = &[
    (
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "{\n    \"file_format_version\" : \"1.0.0\",\n    \"ICD\" : {\n        \"library_path\" : \"libEGL_nvidia.so.0\"\n    }\n}\n",
    ),
    (
        "/usr/share/vulkan/icd.d/nvidia_icd.json",
        "{\n    \"file_format_version\" : \"1.0.1\",\n    \"ICD\": {\n        \"library_path\": \"libGLX_nvidia.so.0\",\n        \"api_version\" : \"1.3.277\"\n    }\n}\n",
    ),
    ("/etc/OpenCL/vendors/nvidia.icd", "libnvidia-opencl.so.1\n"),
    (
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        "{\n    \"file_format_version\" : \"1.0.0\",\n    \"ICD\" : {\n        \"library_path\" : \"libnvidia-egl-gbm.so.1\"\n    }\n}\n",
    ),
];

/// The line `/proc/driver/nvidia/version` starts with for the proprietary module of
/// `version` (as 535.129.03 writes it), and for the open module (`open`).
pub fn version_file(version: &str, open: bool) -> String {
    if open {
        format!("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Jul 18 20:27:51 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    } else {
        format!("NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Oct 19 18:56:32 UTC 2023\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    }
}

/// The persistence daemon's socket.
const SOCKET: &str = "/run/nvidia-persistenced/socket";

/// The hook program the generator names in every hook.
/// The fake `nvidia-cdi-hook` in the driver root (the spec names it, as
/// `nvidia-ctk cdi generate --nvidia-cdi-hook-path=…` does): it appends its arguments to
/// ROOT/cdi-hook.log and exits 0.
const CDI_HOOK: &str = "usr/bin/nvidia-cdi-hook";

/// Scanning `/dev` for GPU nodes, shared by the fake libcuda and libnvidia-ml. A node counts
/// when it is a character device named `nvidia<digits>` and `open(O_RDWR)` reaches it: it
/// succeeds, or fails with ENXIO/ENODEV (no NVIDIA kernel module on this machine: the
/// permission and device cgroup checks passed, only the driver is missing). EPERM/EACCES
/// (device cgroup or mode) do not count.
const SCAN_C: &str = r#"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fake_is_gpu_name(const char *n) {
    if (strncmp(n, "nvidia", 6) != 0) return 0;
    n += 6;
    if (!*n) return 0;
    for (; *n; n++) if (*n < '0' || *n > '9') return 0;
    return 1;
}

static int fake_usable(const char *name) {
    char p[512];
    struct stat st;
    snprintf(p, sizeof p, "/dev/%s", name);
    if (stat(p, &st) != 0 || !S_ISCHR(st.st_mode)) return 0;
    int fd = open(p, O_RDWR | O_CLOEXEC);
    if (fd >= 0) { close(fd); return 1; }
    return errno == ENXIO || errno == ENODEV;
}

static int fake_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Fills minors (sorted) with up to max usable GPU node minors; returns how many. */
static int fake_scan(int *minors, int max) {
    DIR *d = opendir("/dev");
    int n = 0;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        if (fake_is_gpu_name(e->d_name) && fake_usable(e->d_name)) minors[n++] = atoi(e->d_name + 6);
    }
    closedir(d);
    qsort(minors, n, sizeof *minors, fake_cmp);
    return n;
}
"#;

const LIBCUDA_C: &str = r#"
int cuInit(unsigned flags) { (void)flags; return 0; }
int cuDeviceGetCount(int *count) {
    int minors[1024];
    if (!count) return 1;
    *count = fake_scan(minors, 1024);
    return 0;
}
int cuDriverGetVersion(int *v) { if (!v) return 1; *v = 12020; return 0; }
/* Which fake driver this is: what the probe reports as the driver version. */
const char *gpuhook_fake_driver_version(void) { return DRIVER_VERSION; }
"#;

const LIBNVML_C: &str = r#"
int nvmlInit_v2(void) { return 0; }
int nvmlInit(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *count) {
    int minors[1024];
    if (!count) return 2;
    *count = (unsigned)fake_scan(minors, 1024);
    return 0;
}
int nvmlSystemGetDriverVersion(char *buf, unsigned len) {
    if (!buf || len < sizeof DRIVER_VERSION) return 7;
    memcpy(buf, DRIVER_VERSION, sizeof DRIVER_VERSION);
    return 0;
}
"#;

/// `nvidia-smi`: lists the nodes itself (the same scan), the count comes from NVML.
const SMI_C: &str = r#"
int nvmlInit_v2(void);
int nvmlDeviceGetCount_v2(unsigned *count);
int main(void) {
    int minors[1024];
    unsigned count = 0;
    if (nvmlInit_v2() != 0) { fprintf(stderr, "NVML init failed\n"); return 1; }
    int n = fake_scan(minors, 1024);
    for (int i = 0; i < n; i++) printf("GPU %d: /dev/nvidia%d\n", minors[i], minors[i]);
    if (nvmlDeviceGetCount_v2(&count) != 0) { fprintf(stderr, "NVML count failed\n"); return 1; }
    printf("%u GPUs\n", count);
    return 0;
}
"#;

const TOOL_C: &str = r#"
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    const char *name = argc > 0 ? strrchr(argv[0], '/') : 0;
    printf("%s (fake driver %s)\n", name ? name + 1 : (argc > 0 ? argv[0] : "nvidia-tool"), DRIVER_VERSION);
    return 0;
}
"#;

const PROBE_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("dlopen libcuda.so.1: %s\n", dlerror()); return 1; }
    printf("dlopen libcuda.so.1: ok\n");
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    if (!init || !count) { printf("dlsym: %s\n", dlerror()); return 1; }
    int r = init(0);
    if (r != 0) { printf("cuInit: %d\n", r); return 1; }
    int n = 0;
    r = count(&n);
    if (r != 0) { printf("cuDeviceGetCount: %d\n", r); return 1; }
    printf("devices: %d\n", n);
    const char *(*ver)(void) = (const char *(*)(void))dlsym(h, "gpuhook_fake_driver_version");
    if (ver) printf("driver version: %s\n", ver());
    return 0;
}
"#;

/// Runs a command; the error names it and carries its output.
fn run(cmd: &mut Command) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .map_err(|e| format!("{shown}: cannot run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{shown} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn io<T>(what: &str, path: &Path, r: std::io::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what} {}: {e}", path.display()))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    io("write", path, fs::write(path, text))
}

fn mkdirs(path: &Path) -> Result<(), String> {
    io("mkdir", path, fs::create_dir_all(path))
}

/// `root` joined with an absolute path.
fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// Replaces whatever is at `link` with a symlink to `target`.
fn relink(target: &str, link: &Path) -> Result<(), String> {
    let _ = fs::remove_file(link);
    io("symlink", link, symlink(target, link))
}

/// Binds a unix socket at `path` and drops the listener (the socket file stays).
fn make_socket(path: &Path) -> Result<(), String> {
    listen(path).map(drop)
}

/// A unix socket listening at `path` (a daemon's, or a decoy's). Paths too long for
/// `sun_path` are reached through a short symlink to their directory.
pub fn listen(path: &Path) -> Result<std::os::unix::net::UnixListener, String> {
    use std::os::unix::net::UnixListener;
    if path.as_os_str().len() < 100 {
        return io("bind", path, UnixListener::bind(path));
    }
    let dir = path.parent().ok_or("socket path has no parent")?;
    let short = std::env::temp_dir().join(format!(
        "ghsock-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    io("symlink", &short, symlink(dir, &short))?;
    let name = path.file_name().ok_or("socket path has no name")?;
    let r = UnixListener::bind(short.join(name));
    let _ = fs::remove_file(&short);
    io("bind", path, r)
}

/// One mount of the NVIDIA spec.
struct MountEntry {
    host: PathBuf,
    container: String,
    ipc: bool,
}

/// A string as Go's YAML encoder writes it: plain unless it would read as another type.
fn yq(s: &str) -> String {
    let plain_ok = !s.is_empty()
        && s.parse::<f64>().is_err()
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "~" | "y" | "n"
        )
        && !s.contains(": ")
        && !s.contains(" #")
        && !s.ends_with(':')
        && !s.starts_with(|c: char| "!&*?|>'\"%@`{}[],#: ".contains(c))
        && !s.ends_with(' ');
    if plain_ok {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_default()
    }
}

/// Go's JSON encoding of a string (HTML-safe escapes are irrelevant for paths).
fn jq(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The sorter of `nvidia-ctk` (`transform/sorter.go`): by number of `/`, then by path.
fn depth_key(p: &str) -> (usize, String) {
    (p.matches('/').count(), p.to_string())
}

impl FakeDriver {
    /// Builds real ELF shared objects with `cc -shared -fPIC` (gcc is installed), named like the driver's:
    /// ROOT/usr/lib/x86_64-linux-gnu/{libcuda.so.VER, libnvidia-ml.so.VER, libnvidia-ptxjitcompiler.so.VER, libnvidia-nvvm.so.VER, libcudadebugger.so.VER, libnvidia-opencl.so.VER, libnvidia-cfg.so.VER, libnvidia-allocator.so.VER, libnvidia-gpucomp.so.VER}
    /// with their real SONAMEs (`libcuda.so.1`, `libnvidia-ml.so.1`, `libnvidia-nvvm.so.4`,
    /// `libnvidia-gpucomp.so.VER`, the others `.so.1`) and the SONAME symlinks a real install
    /// has (plus `libcuda.so -> libcuda.so.1`). libcuda exports `cuInit` (returns 0),
    /// `cuDeviceGetCount` and `cuDriverGetVersion`; libnvidia-ml exports `nvmlInit_v2`,
    /// `nvmlDeviceGetCount_v2`, `nvmlShutdown`, `nvmlSystemGetDriverVersion`. A GPU counts
    /// when `/dev/nvidia<digits>` is a character device and `open(O_RDWR)` succeeds or fails
    /// with ENXIO/ENODEV (the kernel reached the node but no NVIDIA module is loaded, as on
    /// machines without GPUs); EPERM/EACCES (device cgroup, mode) do not count.
    ///
    /// ROOT/usr/bin/nvidia-smi: a dynamically linked program (NEEDED `libnvidia-ml.so.1`, no
    /// rpath) that prints `GPU N: /dev/nvidiaN` per usable node (N the minor, ascending) and
    /// `N GPUs` (NVML's count), exit 0; nvidia-debugdump, nvidia-persistenced,
    /// nvidia-cuda-mps-control and nvidia-cuda-mps-server print their name and exit 0.
    /// ROOT/lib/firmware/nvidia/VER/{gsp_ga10x.bin,gsp_tu10x.bin};
    /// ROOT/run/nvidia-persistenced/socket as a real unix socket file.
    ///
    /// Builds are cached: if ROOT/.built-VER exists, reuse (installs into one root are
    /// serialized by a lock on ROOT/.lock). Returns an error string naming the failed command.
    pub fn install(root: &Path, version: &str) -> Result<FakeDriver, String> {
        mkdirs(root)?;
        let d = FakeDriver {
            root: root.to_path_buf(),
            version: version.to_string(),
        };
        let lockpath = root.join(".lock");
        let lockfile = io(
            "open",
            &lockpath,
            fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lockpath),
        )?;
        let _lock = Flock::lock(lockfile, FlockArg::LockExclusive)
            .map_err(|(_, e)| format!("flock {}: {e}", lockpath.display()))?;
        // The revision of what is built: a root built by an older test bed is built again.
        let marker = root.join(format!(".built-{BUILD_REVISION}-{version}"));
        let hook = root.join(CDI_HOOK);
        if let Some(p) = hook.parent() {
            mkdirs(p)?;
        }
        write(
            &hook,
            &format!(
                "#!/bin/sh\necho \"$*\" >> {}\n",
                root.join("cdi-hook.log").display()
            ),
        )?;
        fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", hook.display()))?;
        if marker.exists() {
            return Ok(d);
        }
        let build = root.join(format!(".build-{version}"));
        let _ = fs::remove_dir_all(&build);
        mkdirs(&build)?;
        let r = d.build(&build);
        let _ = fs::remove_dir_all(&build);
        r?;
        write(&marker, "")?;
        Ok(d)
    }

    /// The host's linker cache of the root, as a real install leaves it: `ldconfig -r ROOT`
    /// (the real, static ldconfig; it also makes the SONAME links of the newest version of
    /// each library) writes ROOT/etc/ld.so.cache in glibc's format.
    pub fn ldcache(&self) -> Result<(), String> {
        mkdirs(&self.root.join("etc"))?;
        mkdirs(&self.root.join("var/cache/ldconfig"))?;
        let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .ok_or("ldconfig not found (libc-bin)")?;
        run(Command::new(ldconfig).arg("-r").arg(&self.root))
    }

    /// [`FakeDriver::install`], then what a host the driver runs on has besides
    /// ([`FakeDriver::config_files`], the linker cache [`FakeDriver::ldcache`]): a root for
    /// `driver="host"`. Serialized with [`FakeDriver::copy_to`] by a lock on ROOT/.host-lock.
    pub fn install_host(root: &Path, version: &str) -> Result<FakeDriver, String> {
        let d = FakeDriver::install(root, version)?;
        let _lock = d.host_lock()?;
        d.config_files()?;
        d.ldcache()?;
        Ok(d)
    }

    fn host_lock(&self) -> Result<Flock<fs::File>, String> {
        let p = self.root.join(".host-lock");
        let f = io(
            "open",
            &p,
            fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&p),
        )?;
        Flock::lock(f, FlockArg::LockExclusive)
            .map_err(|(_, e)| format!("flock {}: {e}", p.display()))
    }

    /// A copy of this install at `to` (`cp -a`: modes and owners kept), for a test that
    /// changes its files (an upgrade, a file made writable): the copy's driver.
    pub fn copy_to(&self, to: &Path) -> Result<FakeDriver, String> {
        let _lock = self.host_lock()?;
        let _ = fs::remove_dir_all(to);
        mkdirs(to)?;
        run(Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", self.root.display()))
            .arg(to))?;
        Ok(FakeDriver {
            root: to.to_path_buf(),
            version: self.version.clone(),
        })
    }

    /// `nvidia-persistenced --user NAME`, as the NVIDIA and distribution packages run it:
    /// ROOT/run/nvidia-persistenced/ (0755) and a new socket in it (0777, listening: the
    /// listener is returned) owned by account `name` of uid `uid`, which ROOT/etc/passwd
    /// names (as the package's `adduser --system` leaves it).
    pub fn persistenced_as(
        &self,
        name: &str,
        uid: u32,
    ) -> Result<std::os::unix::net::UnixListener, String> {
        let sock = under(&self.root, SOCKET);
        let dir = sock.parent().ok_or("socket has no parent")?;
        mkdirs(dir)?;
        io(
            "chmod",
            dir,
            fs::set_permissions(dir, PermissionsExt::from_mode(0o755)),
        )?;
        let _ = fs::remove_file(&sock);
        let l = listen(&sock)?;
        io(
            "chmod",
            &sock,
            fs::set_permissions(&sock, PermissionsExt::from_mode(0o777)),
        )?;
        io(
            "chown",
            &sock,
            std::os::unix::fs::lchown(&sock, Some(uid), Some(uid)),
        )?;
        io(
            "chown",
            dir,
            std::os::unix::fs::chown(dir, Some(uid), Some(uid)),
        )?;
        let etc = self.root.join("etc");
        mkdirs(&etc)?;
        write(
            &etc.join("passwd"),
            &format!(
                "root:x:0:0:root:/root:/bin/bash\n{name}:x:{uid}:{uid}:NVIDIA Persistence Daemon,,,:/nonexistent:/usr/sbin/nologin\n"
            ),
        )?;
        Ok(l)
    }

    /// This driver's ICD and config files (what `driver="host"` takes besides libraries,
    /// firmware, programs and sockets): the EGL vendor file, the Vulkan ICD, the OpenCL ICD
    /// and an EGL external platform file, written under the root.
    pub fn config_files(&self) -> Result<Vec<&'static str>, String> {
        for (p, text) in CONFIG_FILES {
            let at = under(&self.root, p);
            let dir = at.parent().ok_or("config file has no parent")?;
            mkdirs(dir)?;
            let tmp = dir.join(".gpuhook-testbed.new");
            write(&tmp, text)?;
            io("rename", &at, fs::rename(&tmp, &at))?;
        }
        Ok(CONFIG_FILES.iter().map(|(p, _)| *p).collect())
    }

    fn build(&self, build: &Path) -> Result<(), String> {
        let (root, ver) = (&self.root, &self.version);
        let libdir = under(root, LIBDIR);
        let bindir = under(root, "/usr/bin");
        mkdirs(&libdir)?;
        mkdirs(&bindir)?;
        let define = format!("-DDRIVER_VERSION=\"{ver}\"");
        for (stem, so) in LIBS {
            let file = format!("{stem}.so.{ver}");
            let soname = match so {
                Some(s) => format!("{stem}.so.{s}"),
                None => file.clone(),
            };
            let body = match *stem {
                "libcuda" => format!("{SCAN_C}{LIBCUDA_C}"),
                "libnvidia-ml" => format!("{SCAN_C}{LIBNVML_C}"),
                _ => format!(
                    "int gpuhook_fake_{}(void) {{ return 0; }}\n",
                    stem.replace('-', "_")
                ),
            };
            let src = build.join(format!("{stem}.c"));
            write(&src, &body)?;
            run(Command::new("cc")
                .args(["-shared", "-fPIC", "-O1", &define])
                .arg(format!("-Wl,-soname,{soname}"))
                .arg("-o")
                .arg(libdir.join(&file))
                .arg(&src))?;
            if soname != file {
                relink(&file, &libdir.join(&soname))?;
            }
        }
        relink("libcuda.so.1", &libdir.join("libcuda.so"))?;
        // nvidia-smi links against libnvidia-ml.so.1 through a dev symlink outside the root.
        relink(
            &libdir
                .join(format!("libnvidia-ml.so.{ver}"))
                .to_string_lossy(),
            &build.join("libnvidia-ml.so"),
        )?;
        let smi = build.join("nvidia-smi.c");
        write(&smi, &format!("{SCAN_C}{SMI_C}"))?;
        // (Built beside, renamed into place: a new inode, as a package manager installs.)
        run(Command::new("cc")
            .args(["-O1", &define, "-o"])
            .arg(build.join("nvidia-smi"))
            .arg(&smi)
            .arg(format!("-L{}", build.display()))
            .arg("-lnvidia-ml"))?;
        let to = bindir.join("nvidia-smi");
        io("rename", &to, fs::rename(build.join("nvidia-smi"), &to))?;
        let tool = build.join("tool.c");
        write(&tool, TOOL_C)?;
        let tool_bin = build.join("tool");
        run(Command::new("cc")
            .args(["-O1", &define, "-o"])
            .arg(&tool_bin)
            .arg(&tool))?;
        // Each installed file a new inode (a temporary name renamed over the old), as a
        // package manager unpacks: a container that has the old one mounted keeps it.
        for b in BINARIES.iter().filter(|b| **b != "nvidia-smi") {
            let to = bindir.join(b);
            let tmp = bindir.join(format!(".{b}.new"));
            io("copy", &tmp, fs::copy(&tool_bin, &tmp))?;
            io("rename", &to, fs::rename(&tmp, &to))?;
        }
        let fw = under(root, &format!("/lib/firmware/nvidia/{ver}"));
        mkdirs(&fw)?;
        for f in FIRMWARE {
            let p = fw.join(f);
            io("write", &p, fs::write(&p, b"GSP\x7fELF fake firmware\n"))?;
        }
        let sock = under(root, SOCKET);
        mkdirs(sock.parent().ok_or("socket has no parent")?)?;
        let _ = fs::remove_file(&sock);
        make_socket(&sock)
    }

    /// The spec's mounts in the generator's order (sorted by depth, then container path).
    fn mounts(&self) -> Vec<MountEntry> {
        let mut m = Vec::new();
        for (stem, _) in LIBS {
            let c = format!("{LIBDIR}/{stem}.so.{}", self.version);
            m.push(MountEntry {
                host: under(&self.root, &c),
                container: c,
                ipc: false,
            });
        }
        m.push(MountEntry {
            host: under(&self.root, SOCKET),
            container: SOCKET.into(),
            ipc: true,
        });
        for f in FIRMWARE {
            let c = format!("/lib/firmware/nvidia/{}/{f}", self.version);
            m.push(MountEntry {
                host: under(&self.root, &c),
                container: c,
                ipc: false,
            });
        }
        for b in BINARIES {
            let c = format!("/usr/bin/{b}");
            m.push(MountEntry {
                host: under(&self.root, &c),
                container: c,
                ipc: false,
            });
        }
        m.sort_by_key(|e| depth_key(&e.container));
        m
    }

    /// Absolute host paths of what the spec mounts (for tests to check): libraries, the
    /// persistenced socket, firmware and programs, in the spec's order.
    pub fn libraries(&self) -> Vec<PathBuf> {
        self.mounts().into_iter().map(|m| m.host).collect()
    }

    /// The `--link` arguments of the generator's driver `create-symlinks` hook
    /// (`internal/discover/symlinks.go`): per library in discovery order, `libcuda.so`, then
    /// SONAME -> file (when the SONAME differs and the link exists on the host).
    fn so_links(&self) -> Vec<String> {
        let mut links = Vec::new();
        for (stem, so) in LIBS {
            let file = format!("{stem}.so.{}", self.version);
            if *stem == "libcuda" {
                links.push(format!("libcuda.so.1::{LIBDIR}/libcuda.so"));
            }
            if let Some(s) = so {
                links.push(format!("{file}::{LIBDIR}/{stem}.so.{s}"));
            }
        }
        links
    }

    /// The CDI spec (YAML text) shaped EXACTLY like `nvidia-ctk cdi generate --driver-root=ROOT`
    /// output (nvidia-container-toolkit main, mid 2026: cdiVersion 0.5.0, the default
    /// device name strategies `index` and `uuid`, the default hooks) for this fake host:
    /// kind `nvidia.com/gpu`; devices `"0"`, `"1"`… (NVIDIA GPUs in PCI address order),
    /// their UUIDs, and `all`, sorted by name as the generator's sorter does; each device's
    /// node `/dev/nvidia<minor>` with hostPath under `paths.dev`; top-level env, control
    /// nodes (those that exist under `paths.dev`), hooks and mounts (libraries, firmware,
    /// programs `ro,nosuid,nodev,rbind,rprivate`; the socket `nosuid,nodev,rbind,rprivate,noexec`).
    /// MIG layouts are not modeled: every NVIDIA GPU is listed whole.
    pub fn nvidia_spec(&self, host: &FakeHost, paths: &HostPaths) -> String {
        let dev = |name: &str| paths.dev.join(name).to_string_lossy().into_owned();
        let mut gpus: Vec<(&str, u32, &str)> = host
            .devices
            .iter()
            .filter_map(|d| match &d.driver {
                Driver::Nvidia { minor, uuid, .. } => Some((d.pci.as_str(), *minor, uuid.as_str())),
                _ => None,
            })
            .collect();
        gpus.sort_by(|a, b| a.0.cmp(b.0));
        let mut devices: Vec<(String, Vec<u32>)> = Vec::new();
        for (i, (_, minor, uuid)) in gpus.iter().enumerate() {
            devices.push((i.to_string(), vec![*minor]));
            devices.push((uuid.to_string(), vec![*minor]));
        }
        if !gpus.is_empty() {
            devices.push(("all".into(), gpus.iter().map(|g| g.1).collect()));
        }
        devices.sort_by(|a, b| a.0.cmp(&b.0));

        let mut y = String::from("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\n");
        if devices.is_empty() {
            y.push_str("devices: []\n");
        } else {
            y.push_str("devices:\n");
        }
        for (name, minors) in &devices {
            y.push_str(&format!(
                "    - name: {}\n      containerEdits:\n        deviceNodes:\n",
                yq(name)
            ));
            let mut nodes: Vec<String> = minors.iter().map(|m| format!("/dev/nvidia{m}")).collect();
            nodes.sort_by_key(|p| depth_key(p));
            for p in nodes {
                let h = dev(&p["/dev/".len()..]);
                y.push_str(&format!(
                    "            - path: {}\n              hostPath: {}\n",
                    yq(&p),
                    yq(&h)
                ));
            }
        }
        y.push_str("containerEdits:\n    env:\n");
        y.push_str(&format!(
            "        - {}\n        - NVIDIA_VISIBLE_DEVICES=void\n",
            yq(&format!("NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}"))
        ));
        let mut controls: Vec<String> = [
            "nvidia-modeset",
            "nvidia-uvm-tools",
            "nvidia-uvm",
            "nvidiactl",
        ]
        .iter()
        .filter(|n| fs::symlink_metadata(paths.dev.join(n)).is_ok())
        .map(|n| format!("/dev/{n}"))
        .collect();
        controls.sort_by_key(|p| depth_key(p));
        if !controls.is_empty() {
            y.push_str("    deviceNodes:\n");
            for p in controls {
                let h = dev(&p["/dev/".len()..]);
                y.push_str(&format!(
                    "        - path: {}\n          hostPath: {}\n",
                    yq(&p),
                    yq(&h)
                ));
            }
        }
        let mut hooks: Vec<Vec<String>> = vec![
            vec![
                "create-symlinks".into(),
                "--link".into(),
                format!("../libnvidia-allocator.so.1::{LIBDIR}/gbm/nvidia-drm_gbm.so"),
            ],
            {
                let mut a = vec!["create-symlinks".to_string()];
                for l in self.so_links() {
                    a.push("--link".into());
                    a.push(l);
                }
                a
            },
            vec![
                "enable-cuda-compat".into(),
                format!("--host-driver-version={}", self.version),
            ],
            vec!["update-ldcache".into(), "--folder".into(), LIBDIR.into()],
            vec!["disable-device-node-modification".into()],
            vec!["update-application-profile".into()],
        ];
        y.push_str("    hooks:\n");
        for args in hooks.iter_mut() {
            y.push_str(&format!(
                "        - hookName: createContainer\n          path: {}\n          args:\n            - nvidia-cdi-hook\n",
                self.root.join(CDI_HOOK).display()
            ));
            for a in args.iter() {
                y.push_str(&format!("            - {}\n", yq(a)));
            }
            y.push_str("          env:\n            - NVIDIA_CTK_DEBUG=false\n");
        }
        y.push_str("    mounts:\n");
        for m in self.mounts() {
            y.push_str(&format!(
                "        - hostPath: {}\n          containerPath: {}\n          options:\n",
                yq(&m.host.to_string_lossy()),
                yq(&m.container)
            ));
            let opts: &[&str] = if m.ipc {
                &["nosuid", "nodev", "rbind", "rprivate", "noexec"]
            } else {
                &["ro", "nosuid", "nodev", "rbind", "rprivate"]
            };
            for o in opts {
                y.push_str(&format!("            - {o}\n"));
            }
        }
        y
    }
}

/// One device node as `amd-ctk` describes it (from `stat` of the node).
fn amd_node(paths: &HostPaths, rel: &str) -> Option<String> {
    let host = paths.dev.join(rel);
    let md = fs::symlink_metadata(&host).ok()?;
    let rdev = md.rdev();
    let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    let mut f = vec![
        format!("\"path\": {}", jq(&format!("/dev/{rel}"))),
        format!("\"hostPath\": {}", jq(&host.to_string_lossy())),
        "\"type\": \"c\"".to_string(),
    ];
    if major != 0 {
        f.push(format!("\"major\": {major}"));
    }
    if minor != 0 {
        f.push(format!("\"minor\": {minor}"));
    }
    f.push(format!("\"fileMode\": {}", md.permissions().mode() & 0o777));
    f.push("\"permissions\": \"rwm\"".into());
    f.push("\"uid\": 0".into());
    f.push(format!("\"gid\": {}", md.gid()));
    Some(f.join(",\n            "))
}

/// A CDI spec (JSON text) shaped like `amd-ctk cdi generate` output (ROCm/container-toolkit)
/// for the AMD GPUs of the host: cdiVersion 0.6.0, kind amd.com/gpu, device N (AMD GPUs
/// bound to a driver, in PCI address order) = its /dev/dri/cardX + /dev/dri/renderDY +
/// /dev/kfd, then `all` (every card and render node, then kfd); each node with type,
/// major, minor (omitted when 0, as Go's omitempty does), fileMode (decimal), permissions
/// `rwm`, uid 0 and gid from `stat` of the fake node. Unlike the real tool (which writes the
/// host's own paths and no hostPath), each node has `path` /dev/… and `hostPath` under the
/// fake dev root. /dev/kfd is left out when the host has none (the real tool fails there).
/// Ends with a newline, as the file `amd-ctk` writes (json.Encoder) does.
pub fn amd_spec(host: &FakeHost, paths: &HostPaths) -> String {
    let mut gpus: Vec<(&str, u32, u32)> = host
        .devices
        .iter()
        .filter(|d| d.vendor == 0x1002)
        .filter_map(|d| match d.driver {
            Driver::Drm { card, render } => Some((d.pci.as_str(), card, render)),
            _ => None,
        })
        .collect();
    gpus.sort_by(|a, b| a.0.cmp(b.0));
    let kfd = amd_node(paths, "kfd");
    let mut devices: Vec<(String, Vec<String>)> = Vec::new();
    let mut all = Vec::new();
    for (i, (_, card, render)) in gpus.iter().enumerate() {
        let mut nodes: Vec<String> = [format!("dri/card{card}"), format!("dri/renderD{render}")]
            .iter()
            .filter_map(|r| amd_node(paths, r))
            .collect();
        all.extend(nodes.iter().cloned());
        nodes.extend(kfd.iter().cloned());
        devices.push((i.to_string(), nodes));
    }
    all.extend(kfd.iter().cloned());
    devices.push(("all".into(), all));
    let mut s = String::from(
        "{\n  \"cdiVersion\": \"0.6.0\",\n  \"kind\": \"amd.com/gpu\",\n  \"devices\": [",
    );
    for (k, (name, nodes)) in devices.iter().enumerate() {
        s.push_str(if k == 0 { "\n" } else { ",\n" });
        s.push_str(&format!(
            "    {{\n      \"name\": {},\n      \"containerEdits\": {{\n        \"deviceNodes\": [",
            jq(name)
        ));
        for (j, n) in nodes.iter().enumerate() {
            s.push_str(if j == 0 { "\n" } else { ",\n" });
            s.push_str(&format!("          {{\n            {n}\n          }}"));
        }
        s.push_str("\n        ]\n      }\n    }");
    }
    s.push_str("\n  ],\n  \"containerEdits\": {}\n}\n");
    s
}

/// A root filesystem for a container with its own root, built in `dir` (created; returned):
/// busybox-static at /usr/bin/busybox with sh, ls, cat, grep, sleep, true, readlink, test
/// links in /bin; the host's glibc loader and libc (+ libm, libdl, libpthread where the
/// host has them) copied as real files to the same paths; the host's static /sbin/ldconfig;
/// /etc/ld.so.conf (`include /etc/ld.so.conf.d/*.conf`) and an empty /etc/ld.so.conf.d;
/// empty dev proc sys tmp run etc usr/lib/x86_64-linux-gnu usr/bin var/cache/ldconfig; and
/// /usr/bin/cuda-probe: a dynamically linked program (not linked to libcuda) that
/// `dlopen`s libcuda.so.1, prints `dlopen libcuda.so.1: ok` (or the dlerror), calls cuInit(0)
/// and cuDeviceGetCount, prints `devices: N`, exit 0 on success, 1 on failure.
pub fn rootfs(dir: &Path) -> Result<PathBuf, String> {
    for d in [
        "bin",
        "sbin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "etc/ld.so.conf.d",
        "lib64",
        "lib/x86_64-linux-gnu",
        "usr/lib/x86_64-linux-gnu",
        "usr/bin",
        "var/cache/ldconfig",
    ] {
        mkdirs(&dir.join(d))?;
    }
    let tmp = dir.join("tmp");
    io(
        "chmod",
        &tmp,
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777)),
    )?;
    let busybox = ["/usr/bin/busybox", "/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or("busybox not found (apt-get install busybox-static)")?;
    let copy = |from: &str, to: &str| -> Result<(), String> {
        let dest = under(dir, to);
        let _ = fs::remove_file(&dest);
        io(&format!("copy {from} to"), &dest, fs::copy(from, &dest)).map(drop)
    };
    copy(busybox, "/usr/bin/busybox")?;
    for app in [
        "sh", "ls", "cat", "grep", "sleep", "true", "readlink", "test",
    ] {
        relink("/usr/bin/busybox", &dir.join("bin").join(app))?;
    }
    copy("/lib64/ld-linux-x86-64.so.2", "/lib64/ld-linux-x86-64.so.2")?;
    copy(
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/libc.so.6",
    )?;
    for lib in ["libm.so.6", "libdl.so.2", "libpthread.so.0"] {
        let p = format!("/lib/x86_64-linux-gnu/{lib}");
        if Path::new(&p).exists() {
            copy(&p, &p)?;
        }
    }
    copy("/sbin/ldconfig", "/sbin/ldconfig")?;
    write(
        &dir.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )?;
    let src = dir.join("tmp/cuda-probe.c");
    write(&src, PROBE_C)?;
    let r = run(Command::new("cc")
        .args(["-O1", "-o"])
        .arg(dir.join("usr/bin/cuda-probe"))
        .arg(&src)
        .arg("-ldl"));
    let _ = fs::remove_file(&src);
    r?;
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh scratch directory (removed on drop).
    struct Scratch(PathBuf);
    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let p = std::env::temp_dir().join(format!(
                "gpuhook-driver-{tag}-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    const VER: &str = "535.129.03";

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    fn readelf_d(p: &Path) -> String {
        let out = Command::new("readelf").arg("-d").arg(p).output().unwrap();
        assert!(out.status.success(), "readelf -d {}", p.display());
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn driver_install_builds_real_elves() {
        let s = Scratch::new("install");
        let d = FakeDriver::install(&s.0.join("root"), VER).unwrap();
        let lib = d
            .root
            .join("usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03");
        let head = fs::read(&lib).unwrap();
        assert_eq!(&head[..4], b"\x7fELF");
        let dynamic = readelf_d(&lib);
        assert!(
            dynamic.contains("Library soname: [libcuda.so.1]"),
            "{dynamic}"
        );
        let nvvm = readelf_d(
            &d.root
                .join("usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.535.129.03"),
        );
        assert!(nvvm.contains("[libnvidia-nvvm.so.4]"), "{nvvm}");
        let smi = d.root.join("usr/bin/nvidia-smi");
        let sd = readelf_d(&smi);
        assert!(sd.contains("Shared library: [libnvidia-ml.so.1]"), "{sd}");
        assert!(!sd.contains("RPATH") && !sd.contains("RUNPATH"), "{sd}");
        // Runs against the root's libnvidia-ml: no GPU nodes reachable in a fresh /dev view
        // is not guaranteed here, so only the shape of the output is checked.
        let out = Command::new(&smi)
            .env("LD_LIBRARY_PATH", d.root.join("usr/lib/x86_64-linux-gnu"))
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.trim_end().ends_with(" GPUs"), "{text}");
        for p in d.libraries() {
            assert!(fs::symlink_metadata(&p).is_ok(), "{} missing", p.display());
        }
        use std::os::unix::fs::FileTypeExt;
        let sock = fs::symlink_metadata(d.root.join("run/nvidia-persistenced/socket")).unwrap();
        assert!(sock.file_type().is_socket());
        assert!(d
            .root
            .join(format!(".built-{BUILD_REVISION}-535.129.03"))
            .exists());
        // Cached: a second install reuses the build.
        let before = fs::metadata(&lib).unwrap().modified().unwrap();
        FakeDriver::install(&d.root, VER).unwrap();
        assert_eq!(fs::metadata(&lib).unwrap().modified().unwrap(), before);
    }

    #[test]
    fn driver_nvidia_spec_shape() {
        if !is_root() {
            eprintln!("skipped: FakeHost::create needs root");
            return;
        }
        let s = Scratch::new("spec");
        let d = FakeDriver::install(&s.0.join("root"), VER).unwrap();
        let host = FakeHost::dgx8();
        let paths = host.create(&s.0.join("host")).unwrap();
        let y = d.nvidia_spec(&host, &paths);
        let dev = paths.dev.display().to_string();
        assert!(y.starts_with(
            "---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n    - name: \"0\"\n"
        ));
        // Index 0 is the first GPU in PCI order (0000:18:00.0, device minor 2).
        assert!(y.contains(&format!(
            "    - name: \"0\"\n      containerEdits:\n        deviceNodes:\n            - path: /dev/nvidia2\n              hostPath: {dev}/nvidia2\n"
        )));
        assert!(y.contains("    - name: all\n"));
        assert!(y.contains("    - name: GPU-"));
        assert!(y.contains(&format!(
            "        - path: /dev/nvidiactl\n          hostPath: {dev}/nvidiactl\n"
        )));
        assert!(y.contains("            - libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so\n"));
        assert!(y.contains("            - --host-driver-version=535.129.03\n"));
        assert!(y.contains(&format!(
            "        - hostPath: {}/usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03\n          containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03\n          options:\n            - ro\n",
            d.root.display()
        )));
        assert!(y.contains("          containerPath: /run/nvidia-persistenced/socket\n          options:\n            - nosuid\n            - nodev\n            - rbind\n            - rprivate\n            - noexec\n"));
        // Structure by text: every line is indented by a multiple of 2 and no tabs.
        for l in y.lines() {
            assert!(!l.contains('\t'));
            assert_eq!((l.len() - l.trim_start().len()) % 2, 0, "{l}");
        }
        // And by a real YAML parser, when python3-yaml is there.
        let has_yaml = Command::new("python3")
            .args(["-c", "import yaml"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if has_yaml {
            use std::io::Write;
            let script = "import yaml,sys\nd=yaml.safe_load(sys.stdin)\nassert d['kind']=='nvidia.com/gpu'\nassert d['cdiVersion']=='0.5.0'\nn=[x['name'] for x in d['devices']]\nassert n==sorted(n) and len(n)==17 and n[0]=='0' and n[-1]=='all', n\nassert all(m['options'] for m in d['containerEdits']['mounts'])\nprint(len(d['containerEdits']['mounts']))\n";
            let mut c = Command::new("python3")
                .args(["-c", script])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            c.stdin.take().unwrap().write_all(y.as_bytes()).unwrap();
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "python yaml: {}\n{y}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                d.libraries().len().to_string()
            );
        } else {
            eprintln!("python3-yaml missing: YAML parser check skipped");
        }
    }

    #[test]
    fn driver_amd_spec_is_json() {
        if !is_root() {
            eprintln!("skipped: FakeHost::create needs root");
            return;
        }
        let s = Scratch::new("amd");
        let host = FakeHost::mi300();
        let paths = host.create(&s.0.join("host")).unwrap();
        let j: serde_json::Value = serde_json::from_str(&amd_spec(&host, &paths)).unwrap();
        assert_eq!(j["kind"], "amd.com/gpu");
        let devs = j["devices"].as_array().unwrap();
        assert_eq!(devs.len(), 4, "three AMD GPUs and all");
        let n0 = devs[0]["containerEdits"]["deviceNodes"].as_array().unwrap();
        assert_eq!(n0[0]["path"], "/dev/dri/card1");
        assert_eq!(n0[1]["path"], "/dev/dri/renderD129");
        assert_eq!(n0[1]["major"], 226);
        assert_eq!(n0[2]["path"], "/dev/kfd");
        assert_eq!(
            n0[2]["hostPath"],
            paths.dev.join("kfd").to_string_lossy().as_ref()
        );
        assert_eq!(devs[3]["name"], "all");
        assert_eq!(
            devs[3]["containerEdits"]["deviceNodes"]
                .as_array()
                .unwrap()
                .len(),
            7
        );
    }

    #[test]
    fn driver_rootfs_probe_dlopens_libcuda() {
        if !is_root() {
            eprintln!("skipped: chroot needs root");
            return;
        }
        let s = Scratch::new("rootfs");
        let d = FakeDriver::install(&s.0.join("root"), VER).unwrap();
        let r = rootfs(&s.0.join("rootfs")).unwrap();
        let probe = |r: &Path| {
            Command::new("chroot")
                .arg(r)
                .arg("/usr/bin/cuda-probe")
                .output()
                .unwrap()
        };
        // Without the driver the probe fails cleanly.
        let out = probe(&r);
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("dlopen libcuda.so.1: "));
        let lib = format!("libcuda.so.{VER}");
        fs::copy(
            d.root.join("usr/lib/x86_64-linux-gnu").join(&lib),
            r.join("usr/lib/x86_64-linux-gnu").join(&lib),
        )
        .unwrap();
        symlink(&lib, r.join("usr/lib/x86_64-linux-gnu/libcuda.so.1")).unwrap();
        let ld = Command::new("chroot")
            .arg(&r)
            .arg("/sbin/ldconfig")
            .output()
            .unwrap();
        assert!(
            ld.status.success(),
            "{}",
            String::from_utf8_lossy(&ld.stderr)
        );
        let out = probe(&r);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("dlopen libcuda.so.1: ok\n"), "{text}");
        assert!(text.contains("devices: 0\n"), "{text}");
        let sh = Command::new("chroot")
            .arg(&r)
            .args([
                "/bin/sh",
                "-c",
                "readlink /bin/ls && test -x /usr/bin/cuda-probe && true",
            ])
            .output()
            .unwrap();
        assert!(sh.status.success());
        assert_eq!(
            String::from_utf8_lossy(&sh.stdout).trim(),
            "/usr/bin/busybox"
        );
    }
}

//! gpuhook-runtime and hotplug under a real systemd: Debian 12's systemd 252 booted as PID 1
//! by `systemd-nspawn -b` (root from scripts/systemd-root.sh, cgroup2 only), and in it runc
//! 1.1.5 and crun (the host's, bind-mounted) with their systemd cgroup drivers, on a fake GPU
//! host. With `GPUHOOK_TEST_HOST_SYSTEMD=1` on a machine booted with systemd on cgroup v2 (the
//! Debian 13 bed: systemd 257, runc 1.1.15, crun 1.21) the same scenarios run under that
//! machine's own systemd instead.
//!
//! runc's systemd driver hands systemd the container's device rules as `DeviceAllow=`
//! entries, and drops every rule whose `/dev/char/MAJ:MIN` entry is missing ("skipping device
//! /dev/char/195:40 for systemd"). runc's own device program allows the GPU at start;
//! `systemctl daemon-reload` re-applies systemd's, without it. gpuhook-runtime makes the
//! entry: the GPU it handed in opens before and after a daemon-reload. `gpuhook attach` and
//! `detach` change the scope's `DeviceAllow=` too: an attached GPU opens after a reload, a
//! detached one (attached, or given at create) stays refused, and hotplug goes on working
//! with systemd's program beside the runtime's.
//!
//! Root only; it fails (never skips) when something cannot run.

mod common;

use common::{assert_ok, stderr, Host};
use serde_json::{json, Value};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Where the booted systemd finds the host's runc and crun.
const RUNC_IN: &str = "/usr/local/sbin/runc";
const RUNC: &str = "/usr/sbin/runc";
const CRUN_IN: &str = "/usr/local/bin/crun";
const CRUN: &str = "/usr/bin/crun";

/// One booted systemd at a time (two would share this machine's two cores).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The debootstrapped root (made once, reused: scripts/systemd-root.sh).
fn systemd_root() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/systemd-root.sh");
    let o = Command::new(&script)
        .output()
        .expect("scripts/systemd-root.sh");
    assert_ok(&o);
    let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string());
    assert!(
        p.join("usr/lib/systemd/systemd").exists(),
        "{}",
        p.display()
    );
    p
}

/// A booted systemd in a container of its own; powered off (SIGTERM to nspawn) on drop.
struct Booted {
    nspawn: Child,
    leader: u32,
    log: PathBuf,
}

impl Drop for Booted {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.nspawn.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(15) {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Not powered off in time: the whole group, nspawn with it (its container dies with it).
        let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.nspawn.wait();
    }
}

impl Booted {
    /// `systemd-nspawn -b` of `root` with `binds` (`--bind=…` arguments), the whole container
    /// under cgroup2 alone (a private mount namespace with a cgroup2 `/sys/fs/cgroup` where the
    /// host has v1 or hybrid). Waits for systemd to be up.
    fn boot(root: &Path, binds: &[String], log: PathBuf) -> Booted {
        let unified = Command::new("stat")
            .args(["-fc", "%T", "/sys/fs/cgroup"])
            .output()
            .expect("stat");
        let unified = String::from_utf8_lossy(&unified.stdout).trim() == "cgroup2fs";
        let mut nspawn = vec![
            "/usr/bin/systemd-nspawn".to_string(),
            "-q".into(),
            "-b".into(),
            "--register=no".into(),
            "--keep-unit".into(),
            "--system-call-filter=@keyring bpf".into(),
            "--capability=all".into(),
            "-D".into(),
            root.to_string_lossy().into_owned(),
        ];
        nspawn.extend(binds.iter().cloned());
        // nspawn in a cgroup of its own (it makes `payload` and `supervisor` in the one it
        // is in, and a tree left in a shared one by an earlier boot makes it fail with
        // EBUSY), removed after it (and those of boots killed before they could); SIGTERM is
        // passed on to it.
        let script = format!(
            "{}for d in /sys/fs/cgroup/gpuhook-systemd-test-*; do [ -d $d ] && find $d -depth -type d -exec rmdir {{}} + 2>/dev/null; done; \
             cg=/sys/fs/cgroup/gpuhook-systemd-test-$$; mkdir $cg && echo $$ >$cg/cgroup.procs || exit 1; \
             \"$@\" & p=$!; trap 'kill -TERM $p' TERM; wait $p; wait $p; rc=$?; \
             echo $$ >/sys/fs/cgroup/cgroup.procs; find $cg -depth -type d -exec rmdir {{}} +; exit $rc",
            if unified {
                ""
            } else {
                "umount -R /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup || exit 1; "
            }
        );
        let mut c = Command::new("unshare");
        c.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ])
        .args(&nspawn);
        let out = std::fs::File::create(&log).unwrap();
        use std::os::unix::process::CommandExt;
        let child = c
            .process_group(0)
            .env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("systemd-nspawn (systemd-container)");
        let mut b = Booted {
            nspawn: child,
            leader: 0,
            log,
        };
        let pid = b.nspawn.id();
        let t = Instant::now();
        // The shell's child is nspawn, nspawn's the container's PID 1, systemd.
        let children = |pid: u32| -> Vec<u32> {
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|k| k.parse().ok())
                .collect()
        };
        while b.leader == 0 {
            if let Ok(Some(s)) = b.nspawn.try_wait() {
                panic!("systemd-nspawn exited {s}: {}", b.log_text());
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "no systemd under nspawn: {}",
                b.log_text()
            );
            for n in children(pid) {
                for k in children(n) {
                    let comm =
                        std::fs::read_to_string(format!("/proc/{k}/comm")).unwrap_or_default();
                    if comm.trim() == "systemd" {
                        b.leader = k;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Until systemd listens on its bus, systemctl cannot ask; until it has made
        // /run/systemd/system, systemctl says `offline` (not booted with systemd): a slow
        // boot (CI, a loaded machine) meets both.
        let o = b
            .sh("for i in $(seq 600); do s=$(timeout 60 systemctl is-system-running --wait 2>&1) && break; case $s in *'Failed to connect to bus'*|offline*) sleep 0.1;; *) break;; esac; done; echo \"$s\"")
            .output()
            .unwrap();
        let state = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert!(
            state == "running" || state == "degraded",
            "systemd is {state:?}: {} {}",
            stderr(&o),
            b.log_text()
        );
        b
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `sh -c script` in all of the booted container's namespaces.
    fn sh(&self, script: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.args(["-t", &self.leader.to_string(), "-a", "sh", "-c", script]);
        c
    }
}

/// Says for each `major:minor` whether the container may open such a node (`open`: ENXIO,
/// no driver behind a fake major) or not (`denied`: EPERM), through a node it makes.
fn probe(numbers: &[String]) -> String {
    let mut s = String::new();
    for (i, mm) in numbers.iter().enumerate() {
        let (ma, mi) = mm.split_once(':').unwrap();
        s.push_str(&format!(
            "rm -f /tmp/p{i}; mknod /tmp/p{i} c {ma} {mi}; if cat /tmp/p{i} 2>&1 | grep -q 'No such device or address'; then echo 'dev {mm} open'; else echo 'dev {mm} denied'; fi; "
        ));
    }
    s
}

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn busybox_rootfs(root: &Path) -> PathBuf {
    let r = root.join("rootfs");
    for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "run"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::copy("/usr/bin/busybox", r.join("bin/busybox")).expect("busybox-static");
    for a in ["sh", "cat", "mknod", "echo", "sleep", "grep", "rm", "ls"] {
        std::os::unix::fs::symlink("busybox", r.join("bin").join(a)).unwrap();
    }
    r
}

/// The runtime a scenario runs: runc or crun, with its systemd cgroup driver.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Runtime {
    Runc,
    Crun,
}

/// Where a scenario's systemd is: booted under nspawn here, or the machine's own.
enum Systemd {
    Booted(Booted),
    Host { _links: HostLinks },
}

impl Systemd {
    fn sh(&self, script: &str) -> Command {
        match self {
            Systemd::Booted(b) => b.sh(script),
            Systemd::Host { .. } => {
                let mut c = Command::new("sh");
                c.args(["-c", script]);
                c
            }
        }
    }
}

/// On the machine's own systemd: `/dev/char` entries made for the fake host's nodes (where
/// runc looks before it hands a rule to systemd), removed again on drop.
struct HostLinks(Vec<PathBuf>);

impl Drop for HostLinks {
    fn drop(&mut self) {
        for l in &self.0 {
            let _ = std::fs::remove_file(l);
        }
    }
}

/// Whether to run under this machine's own systemd (`GPUHOOK_TEST_HOST_SYSTEMD=1`): it must
/// be booted with systemd, on cgroup v2 alone.
fn on_host_systemd() -> bool {
    if std::env::var_os("GPUHOOK_TEST_HOST_SYSTEMD").is_none_or(|v| v != "1") {
        return false;
    }
    assert!(
        Path::new("/run/systemd/system").is_dir(),
        "GPUHOOK_TEST_HOST_SYSTEMD=1 on a machine not booted with systemd"
    );
    let fs = Command::new("stat")
        .args(["-fc", "%T", "/sys/fs/cgroup"])
        .output()
        .expect("stat");
    assert_eq!(
        String::from_utf8_lossy(&fs.stdout).trim(),
        "cgroup2fs",
        "GPUHOOK_TEST_HOST_SYSTEMD=1 needs cgroup v2 alone"
    );
    true
}

/// A fake GPU host with GPUs 195:40 and 195:41, gpuhook-runtime over `runtime`, a bundle of
/// a busybox root whose container asks for GPU index 0 at create and runs in the systemd scope
/// `gpuhook-test-ID.scope`, and the systemd it runs under.
struct Bed {
    host: Host,
    dir: PathBuf,
    id: String,
    /// `gpuhook-runtime …` as the scenario runs it, before its subcommand.
    rt: String,
    /// `GPUHOOK_CONFIG=… gpuhook`.
    gh: String,
    sys: Systemd,
}

impl Bed {
    /// `userns`: the container gets a user namespace of its own (its root is host uid and
    /// gid 100000), as `podman --uidmap` gives it.
    fn new(runtime: Runtime, id: &str, userns: bool) -> Bed {
        common::require_root();
        let host_sd = on_host_systemd();
        let (real, inside) = match (runtime, host_sd) {
            (Runtime::Runc, false) => (RUNC, RUNC_IN),
            (Runtime::Crun, false) => (CRUN, CRUN_IN),
            (Runtime::Runc, true) => (RUNC, RUNC),
            (Runtime::Crun, true) => (CRUN, CRUN),
        };
        let host = Host::with(common::blueprint_minors(40, 41), |c| {
            c["oci_runtime"] = json!(inside)
        });
        let dir = host.root().to_path_buf();
        let link = dir.join("gpuhook-runtime");
        std::os::unix::fs::symlink(common::bin(), &link).unwrap();
        let rootfs = busybox_rootfs(&dir);
        let devchar = host.paths.dev.join("char");
        std::fs::create_dir_all(&devchar).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();

        let b = dir.join("bundle");
        std::fs::create_dir_all(&b).unwrap();
        assert_ok(
            &Command::new(RUNC)
                .args(["spec", "--bundle"])
                .arg(&b)
                .output()
                .unwrap(),
        );
        let p = b.join("config.json");
        let mut c: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        c["root"] = json!({"path": rootfs, "readonly": false});
        c["process"]["terminal"] = json!(false);
        // PID 1 of its namespace: without a handler SIGTERM (systemd stopping the scope at
        // power-off) would not end it.
        c["process"]["args"] = json!(["sh", "-c", "trap 'exit 0' TERM; sleep 1000 & wait"]);
        for k in ["bounding", "effective", "permitted"] {
            c["process"]["capabilities"][k]
                .as_array_mut()
                .unwrap()
                .push(json!("CAP_MKNOD"));
        }
        c["linux"]["cgroupsPath"] = json!(format!("system.slice:gpuhook-test:{id}"));
        c["annotations"] = json!({"gpuhook.io/gpus": "1", "gpuhook.io/devices": "0"});
        if userns {
            c["linux"]["namespaces"]
                .as_array_mut()
                .unwrap()
                .push(json!({"type": "user"}));
            let map = json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
            c["linux"]["uidMappings"] = map.clone();
            c["linux"]["gidMappings"] = map;
            let st = Command::new("chown")
                .args(["-R", "-h", "100000:100000"])
                .arg(&rootfs)
                .status()
                .unwrap();
            assert!(st.success());
        }
        std::fs::write(&p, serde_json::to_vec_pretty(&c).unwrap()).unwrap();

        // crun in the booted Debian 12 root: libyajl (not installed there) from the host, and
        // the RLIMIT_MEMLOCK shim this machine needs (no CAP_SYS_RESOURCE; tests/oci.rs).
        let mut env = String::new();
        if runtime == Runtime::Crun && !host_sd {
            let lib = dir.join("lib");
            std::fs::create_dir_all(&lib).unwrap();
            let yajl = std::fs::canonicalize("/lib/x86_64-linux-gnu/libyajl.so.2")
                .expect("libyajl2 (crun's)");
            std::fs::copy(yajl, lib.join("libyajl.so.2")).unwrap();
            std::fs::write(lib.join("memlock.c"), MEMLOCK_C).unwrap();
            let o = Command::new("cc")
                .args(["-shared", "-fPIC", "-o"])
                .arg(lib.join("memlock.so"))
                .arg(lib.join("memlock.c"))
                .arg("-ldl")
                .output()
                .expect("cc");
            assert_ok(&o);
            env = format!(
                "LD_LIBRARY_PATH={l} LD_PRELOAD={l}/memlock.so ",
                l = lib.display()
            );
        }
        let bin = common::bin();
        let cfg = host.config.display().to_string();
        let root = format!("/run/gpuhook-{}", real.rsplit('/').next().unwrap());
        let rt = format!(
            "{env}GPUHOOK_CONFIG={cfg} {} --systemd-cgroup --root {root}",
            link.display()
        );
        let gh = format!("GPUHOOK_CONFIG={cfg} {}", bin.display());
        let sys = if host_sd {
            Systemd::Host {
                _links: host_links(&host.paths.dev),
            }
        } else {
            let binds = vec![
                format!("--bind={}", dir.display()),
                format!("--bind-ro={}", bin.display()),
                format!("--bind-ro={real}:{inside}"),
                format!("--bind={}:/dev/char", devchar.display()),
            ];
            let root = systemd_root();
            Systemd::Booted(Booted::boot(&root, &binds, dir.join("nspawn.log")))
        };
        Bed {
            host,
            dir,
            id: id.to_string(),
            rt,
            gh,
            sys,
        }
    }

    fn unit(&self) -> String {
        format!("gpuhook-test-{}.scope", self.id)
    }

    /// `gpuhook-runtime create` and `start` of the bundle.
    fn create(&self) {
        let create = self
            .sys
            .sh(&format!(
                "{rt} create --no-new-keyring --bundle {d}/bundle {id} >{d}/create.out 2>{d}/create.err </dev/null && {rt} start {id}",
                rt = self.rt,
                d = self.dir.display(),
                id = self.id,
            ))
            .output()
            .unwrap();
        let said = std::fs::read_to_string(self.dir.join("create.err")).unwrap_or_default();
        assert!(create.status.success(), "create: {} {said}", out(&create));
    }

    /// `open` or `denied` for GPU 0 (195:40) and GPU 1 (195:41), as the container finds them.
    fn look(&self, what: &str) -> (String, String) {
        let o = self
            .sys
            .sh(&format!(
                "{} exec {} sh -c \"{}\"",
                self.rt,
                self.id,
                probe(&["195:40".into(), "195:41".into()])
            ))
            .output()
            .unwrap();
        let s = out(&o);
        eprintln!("{what}: {s}");
        let of = |mm: &str| {
            if s.contains(&format!("dev {mm} open")) {
                "open".to_string()
            } else if s.contains(&format!("dev {mm} denied")) {
                "denied".to_string()
            } else {
                panic!("{what}: no word on {mm}: {s}")
            }
        };
        (of("195:40"), of("195:41"))
    }

    /// `gpuhook ARGS…`, which must succeed.
    fn gh(&self, args: &str) -> String {
        let o = self
            .sys
            .sh(&format!("{} {args}", self.gh))
            .output()
            .unwrap();
        assert!(o.status.success(), "gpuhook {args}: {}", out(&o));
        out(&o)
    }

    /// `gpuhook ARGS…` with the scope's `systemctl` failing as `mode` says (through a stand-in
    /// bound over `/usr/bin/systemctl` in a mount namespace of the command's own): `readback`,
    /// the `show` after the first `set-property` (which goes through) fails; `lost`, from then
    /// on every `show` and `set-property` fails, as when systemd can no longer be reached. Its
    /// output; it must fail.
    fn gh_failing(&self, mode: &str, args: &str) -> String {
        let d = self.dir.display();
        std::fs::write(
            self.dir.join("systemctl-standin"),
            format!(
                "#!/bin/sh\n\
                 real={d}/systemctl.real; n=$(cat {d}/sd-sets 2>/dev/null || echo 0)\n\
                 case \"$*\" in\n\
                 *set-property*) n=$((n+1)); echo $n >{d}/sd-sets\n\
                   if [ {mode} = lost ] && [ $n -ge 2 ]; then echo 'Failed to connect to bus: Connection refused' >&2; exit 1; fi;;\n\
                 *show*) if [ $n -ge 1 ] && {{ [ {mode} = lost ] || [ $n = 1 ]; }}; then echo 'Failed to get properties: Connection timed out' >&2; exit 1; fi;;\n\
                 esac\n\
                 exec $real \"$@\"\n"
            ),
        )
        .unwrap();
        let standin = self.dir.join("systemctl-standin");
        std::fs::set_permissions(&standin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let _ = std::fs::remove_file(self.dir.join("sd-sets"));
        let o = self
            .sys
            .sh(&format!(
                "touch {d}/systemctl.real && unshare -m --propagation private sh -c 'mount --bind /usr/bin/systemctl {d}/systemctl.real && mount --bind {d}/systemctl-standin /usr/bin/systemctl && {} {args}'",
                self.gh
            ))
            .output()
            .unwrap();
        assert!(!o.status.success(), "gpuhook {args} ({mode}): {}", out(&o));
        out(&o)
    }

    fn reload(&self) {
        assert_ok(&self.sys.sh("systemctl daemon-reload").output().unwrap());
    }

    /// The scope's device policy (`DevicePolicy=`) and its `DeviceAllow=` entries.
    fn policy(&self) -> (String, Vec<String>) {
        let o = self
            .sys
            .sh(&format!(
                "systemctl show -p DevicePolicy -p DeviceAllow {}",
                self.unit()
            ))
            .output()
            .unwrap();
        assert_ok(&o);
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let policy = text
            .lines()
            .find_map(|l| l.strip_prefix("DevicePolicy="))
            .unwrap_or("")
            .to_string();
        let entries = text
            .lines()
            .filter_map(|l| l.strip_prefix("DeviceAllow="))
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect();
        (policy, entries)
    }

    fn delete(self) {
        let d = self
            .sys
            .sh(&format!("{} delete --force {}", self.rt, self.id))
            .output()
            .unwrap();
        assert_ok(&d);
        drop(self.sys);
        assert!(
            self.host.list()["reservations"]
                .as_array()
                .is_none_or(|r| r.is_empty()),
            "{}",
            self.host.list()
        );
    }
}

/// `/dev/char` entries for the fake host's nodes that this machine lacks (each a link to the
/// fake node), for runc to find when it hands rules to the machine's own systemd.
fn host_links(dev: &Path) -> HostLinks {
    use std::os::unix::fs::FileTypeExt;
    let mut made = Vec::new();
    let mut todo = vec![dev.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            if md.is_dir() && e.file_name() != "char" {
                todo.push(e.path());
            } else if md.file_type().is_char_device() {
                let (ma, mi) = (libc::major(md.rdev()), libc::minor(md.rdev()));
                let l = PathBuf::from(format!("/dev/char/{ma}:{mi}"));
                if std::fs::symlink_metadata(&l).is_err() {
                    std::os::unix::fs::symlink(e.path(), &l).unwrap();
                    made.push(l);
                }
            }
        }
    }
    HostLinks(made)
}

const MEMLOCK_C: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/resource.h>
int setrlimit(__rlimit_resource_t r, const struct rlimit *l) {
    int (*real)(__rlimit_resource_t, const struct rlimit *) = dlsym(RTLD_NEXT, "setrlimit");
    int rc = real(r, l);
    if (rc != 0 && errno == EPERM && r == RLIMIT_MEMLOCK) return 0;
    return rc;
}
"#;

/// A GPU container of runc with `--systemd-cgroup` keeps the GPU gpuhook-runtime handed in
/// across `systemctl daemon-reload` (its /dev/char entry made); one `gpuhook attach` added is
/// listed in the scope's `DeviceAllow=` and opens across reloads; a detached one (attached,
/// or given at create) is taken out of it and stays refused across reloads; and attach works
/// again after a reload (systemd's program beside gpuhook's).
#[test]
fn systemd_runc_hotplug_survives_daemon_reload() {
    hotplug_across_reloads(Runtime::Runc, "gh-systemd");
}

/// The same for a container with a user namespace of its own: attach bind-mounts the node
/// into its `/dev` and lists it in the scope's policy; it opens there across a reload, and
/// once detached it is gone and refused across a reload.
#[test]
fn systemd_runc_user_namespaced_hotplug_survives_daemon_reload() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let bed = Bed::new(Runtime::Runc, "gh-systemd-ns", true);
    bed.create();
    let node = |n: &str| bed.host.paths.dev.join(n).display().to_string();
    // The kernel's verdict for a process of the container's cgroup (a shell moved into the
    // scope): the container's root can make no node to try.
    let verdict = |what: &str| {
        let scope = format!("/sys/fs/cgroup/system.slice/{}/cgroup.procs", bed.unit());
        let o = bed
            .sys
            .sh(&format!(
                "for n in {} {}; do sh -c \"echo \\$\\$ > {scope} && exec cat $n\" 2>&1 | grep -q 'No such device or address' && echo open || echo denied; done",
                node("nvidia40"),
                node("nvidia41")
            ))
            .output()
            .unwrap();
        let v: Vec<String> = out(&o).lines().map(str::to_string).collect();
        eprintln!("{what}: {v:?}");
        assert_eq!(v.len(), 2, "{what}: {}", out(&o));
        (v[0].clone(), v[1].clone())
    };
    let inside = |what: &str| {
        let o = bed
            .sys
            .sh(&format!(
                "{} exec {} sh -c 'ls /dev; cat /dev/nvidia41'",
                bed.rt, bed.id
            ))
            .output()
            .unwrap();
        let s = out(&o);
        eprintln!("{what}: {s}");
        s
    };
    let only = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(verdict("started"), only("open", "denied"));
    bed.gh(&format!("attach {} --device 0000:08:00.0", bed.id));
    let s = inside("attached");
    assert!(
        s.contains("nvidia41\n") && s.contains("No such device or address"),
        "{s}"
    );
    bed.reload();
    let s = inside("attached, after daemon-reload");
    assert!(
        s.contains("No such device or address"),
        "the attached GPU is lost at daemon-reload: {s}"
    );
    assert_eq!(
        verdict("attached, after daemon-reload"),
        only("open", "open")
    );
    bed.gh(&format!("detach {} --device 0000:08:00.0", bed.id));
    let s = inside("detached");
    assert!(!s.contains("nvidia41\n"), "{s}");
    assert_eq!(verdict("detached"), only("open", "denied"));
    bed.reload();
    assert_eq!(
        verdict("detached, after daemon-reload"),
        only("open", "denied")
    );
    bed.delete();
}

/// An attach whose `systemctl set-property` went through but whose read-back failed (issue
/// 39) puts the scope's `DeviceAllow=` back as it was before it frees the GPU: after a
/// daemon-reload the container still cannot open it (the old code freed it with the entry
/// left, and systemd let the container open a GPU that was free again). When the list cannot
/// be put back either (systemd no longer reachable), the GPU stays reserved for the container
/// and the one line says so; a detach then takes it back.
#[test]
fn systemd_runc_attach_whose_read_back_failed_restores_device_allow() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let bed = Bed::new(Runtime::Runc, "gh-systemd-rb", false);
    bed.create();
    let listed = |mm: &str| {
        bed.policy()
            .1
            .iter()
            .any(|e| e.starts_with(&format!("/dev/char/{mm} ")))
    };
    let only = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(bed.look("started"), only("open", "denied"));
    // systemd lists the entries newest first: a list set again whole comes back reversed.
    let sorted = || {
        let (policy, mut entries) = bed.policy();
        entries.sort();
        (policy, entries)
    };
    let before = sorted();
    assert!(!listed("195:41"), "{before:?}");

    let said = bed.gh_failing(
        "readback",
        &format!("attach {} --device 0000:08:00.0", bed.id),
    );
    assert!(
        said.contains(
            "systemctl show: exit status: 1: Failed to get properties: Connection timed out"
        ),
        "{said}"
    );
    assert!(!said.contains("stay reserved"), "{said}");
    assert_eq!(sorted(), before, "the scope's list is not put back");
    let holders = bed.host.holders();
    assert_eq!(holders[&bed.id], ["0000:07:00.0"], "{holders:?}");
    bed.reload();
    assert_eq!(
        bed.look("failed attach, after daemon-reload"),
        only("open", "denied"),
        "a reload gave the container the GPU a failed attach freed"
    );

    let said = bed.gh_failing("lost", &format!("attach {} --device 0000:08:00.0", bed.id));
    // One line: the failure, what could not be put back, and that the GPU stays reserved.
    let stays = format!("GPUs 0000:08:00.0 stay reserved for container '{}'", bed.id);
    assert!(
        said.lines()
            .any(|l| l.contains("systemctl show: exit status: 1")
                && l.contains(
                    "Failed to connect to bus: Connection refused (it may still list 195:41)"
                )
                && l.ends_with(&stays)),
        "{said}"
    );
    assert!(listed("195:41"), "{:?}", bed.policy());
    let holders = bed.host.holders();
    assert_eq!(
        holders[&bed.id],
        ["0000:07:00.0", "0000:08:00.0"],
        "{holders:?}"
    );
    bed.gh(&format!("detach {} --device 0000:08:00.0", bed.id));
    assert_eq!(sorted(), before);
    assert_eq!(bed.host.holders()[&bed.id], ["0000:07:00.0"]);
    bed.reload();
    assert_eq!(
        bed.look("detached, after daemon-reload"),
        only("open", "denied")
    );
    bed.delete();
}

/// The same with crun, which runs the init in `SCOPE/container`, its own program there and
/// systemd's on the scope above it (crun 1.2x gives the scope a strict policy; crun 1.8,
/// this machine's, none: given one here as crun 1.2x would). Before, attach changed crun's
/// program alone and said `attached` while every open of the GPU was refused.
#[test]
fn systemd_crun_hotplug_survives_daemon_reload() {
    hotplug_across_reloads(Runtime::Crun, "gh-systemd-crun");
}

fn hotplug_across_reloads(runtime: Runtime, id: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let t = Instant::now();
    let bed = Bed::new(runtime, id, false);
    let booted = t.elapsed();
    let t = Instant::now();
    bed.create();
    // A scope with a device policy (runc's strict one; crun 1.2x's) lists what the container
    // may open: gpuhook's entries must be there and gone as its GPUs come and go. crun 1.8
    // (this machine's) gives its scope none; crun 1.2x gives it a strict one, whose program on
    // the scope rules above crun's own on `SCOPE/container` (an attach that changed crun's
    // alone said `attached` while every open was refused): given here as crun 1.2x would,
    // the container's own devices and the GPU's nodes of its create.
    let (policy, entries) = bed.policy();
    if runtime == Runtime::Crun && policy == "auto" && entries.is_empty() {
        let mut set = format!(
            "systemctl set-property --runtime {} DevicePolicy=strict",
            bed.unit()
        );
        for e in [
            "char-* m",
            "block-* m",
            "char-pts rwm",
            "/dev/char/1:3 rwm",
            "/dev/char/1:5 rwm",
            "/dev/char/1:7 rwm",
            "/dev/char/1:8 rwm",
            "/dev/char/1:9 rwm",
            "/dev/char/5:0 rwm",
            "/dev/char/5:2 rwm",
            "/dev/char/195:40 rw",
            "/dev/char/195:255 rw",
        ] {
            set.push_str(&format!(" 'DeviceAllow={e}'"));
        }
        assert_ok(&bed.sys.sh(&set).output().unwrap());
    }
    let (policy, entries) = bed.policy();
    let managed = policy != "auto" || !entries.is_empty();
    assert!(managed, "{runtime:?}: its scope has no device policy");
    let listed = |mm: &str| {
        bed.policy()
            .1
            .iter()
            .any(|e| e.starts_with(&format!("/dev/char/{mm} ")))
    };
    let open = || ("open".to_string(), "open".to_string());
    let only = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(bed.look("started"), only("open", "denied"));

    // The second GPU, by attach: listed in the scope's policy, open across a reload, as the
    // GPU gpuhook-runtime handed in is.
    let said = bed.gh(&format!("attach {}", bed.id));
    assert!(said.contains("attached 0000:08:00.0"), "{said}");
    assert_eq!(bed.look("attached"), open());
    bed.reload();
    let (create, attached) = bed.look("attached, after daemon-reload");
    assert_eq!(
        create, "open",
        "the GPU gpuhook-runtime handed in is lost at daemon-reload"
    );
    assert_eq!(
        attached, "open",
        "the attached GPU is lost at daemon-reload"
    );
    if managed {
        assert!(listed("195:41"), "{:?}", bed.policy());
        // Its /dev/char entry, for a systemd that finds devices by it, as at create.
        let link = bed.host.paths.dev.join("char/195:41");
        assert!(
            std::fs::metadata(&link).is_ok_and(|m| m.rdev() == libc::makedev(195, 41)),
            "{}",
            link.display()
        );
    }

    // Detached: out of the policy, refused across a reload.
    bed.gh(&format!("detach {} --device 0000:08:00.0", bed.id));
    assert_eq!(bed.look("detached"), only("open", "denied"));
    if managed {
        assert!(!listed("195:41"), "{:?}", bed.policy());
        assert!(listed("195:40"), "the GPU of its create stays listed");
    }
    bed.reload();
    assert_eq!(
        bed.look("detached, after daemon-reload"),
        only("open", "denied")
    );

    // Attach works after a reload (systemd's program beside gpuhook's), and so does the
    // detach of the GPU given at create: out of the policy, refused across a reload.
    bed.gh(&format!("attach {} --device 0000:08:00.0", bed.id));
    assert_eq!(bed.look("attached again after a reload"), open());
    bed.gh(&format!("detach {} --device 0000:07:00.0", bed.id));
    assert_eq!(bed.look("create's GPU detached"), only("denied", "open"));
    if managed {
        assert!(!listed("195:40"), "{:?}", bed.policy());
        assert!(listed("195:41"));
    }
    bed.reload();
    assert_eq!(
        bed.look("create's GPU detached, after daemon-reload"),
        only("denied", "open"),
        "a reload gave back the GPU detach took"
    );
    eprintln!(
        "{runtime:?}: systemd up in {booted:?}; the container's part took {:?}",
        t.elapsed()
    );
    bed.delete();
}

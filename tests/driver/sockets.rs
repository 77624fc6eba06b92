//! The driver's sockets on fake hosts (issue 39): a service account that owns
//! `/run/nvidia-persistenced/` (stock `nvidia-persistenced --user`) puts a link to another
//! root socket (`/run/docker.sock`, a real listening socket here) where its own was; a link
//! on the way; a directory above that group may write; the account's own socket without and
//! with `driver_socket_owners`; the account swapping its socket in a loop while gpuhook
//! starts. Through `gpuhook driver`, the libvirt hook's `prepare`, and `gpuhook-runtime
//! create` editing a bundle's `config.json` (the real runtime a script that only records
//! that it ran: no engine).

use super::*;
use std::os::unix::fs::{symlink, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

/// The account of stock packaging.
const SVC: u32 = 999;
const SVC_NAME: &str = "nvidia-persistenced";
const SOCKET: &str = "/run/nvidia-persistenced/socket";

/// `gpuhook-runtime` on a host whose real runtime is a script that only records it ran.
struct Runtime {
    link: PathBuf,
    called: PathBuf,
}

fn runtime(h: &Host) -> Runtime {
    let link = h.root().join("gpuhook-runtime");
    symlink(bin(), &link).unwrap();
    let called = h.root().join("runtime-was-called");
    let fake = h.root().join("fake-runtime");
    std::fs::write(&fake, format!("#!/bin/sh\ntouch {}\n", called.display())).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    h.edit_config(|c| c["oci_runtime"] = serde_json::json!(fake));
    Runtime { link, called }
}

impl Runtime {
    /// `gpuhook-runtime create` of a bundle (runc's own `runc spec`, an empty root) asking for
    /// one GPU with the host's driver: its output and the bundle's `config.json` after.
    fn create(&self, h: &Host, id: &str) -> (std::process::Output, Value) {
        let b = h.root().join(format!("bundle-{id}"));
        std::fs::create_dir_all(b.join("rootfs")).unwrap();
        let _ = std::fs::remove_file(b.join("config.json"));
        assert_ok(
            &std::process::Command::new("/usr/sbin/runc")
                .args(["spec", "--bundle"])
                .arg(&b)
                .output()
                .unwrap(),
        );
        let p = b.join("config.json");
        let mut c: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        c["root"] = serde_json::json!({"path": b.join("rootfs"), "readonly": false});
        c["process"]["terminal"] = serde_json::json!(false);
        c["annotations"] = serde_json::json!({"gpuhook.io/gpus": "1", "gpuhook.io/driver": "host"});
        std::fs::write(&p, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
        let o = std::process::Command::new(&self.link)
            .env("GPUHOOK_CONFIG", &h.config)
            .arg("--root")
            .arg(h.root().join("runc-root"))
            .args(["create", "--bundle", b.to_str().unwrap(), id])
            .output()
            .unwrap();
        let after = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        (o, after)
    }
}

/// The mount of `config.json` at `destination`, if any.
fn mount_at<'a>(config: &'a Value, destination: &str) -> Option<&'a Value> {
    config["mounts"]
        .as_array()?
        .iter()
        .find(|m| m["destination"] == destination)
}

fn ident(p: &Path) -> (u64, u64) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.dev(), m.ino())
}

/// Which of `ls` a client connecting at `path` reaches.
fn reached(path: &Path, ls: &[&UnixListener]) -> Vec<bool> {
    let _c = UnixStream::connect(path).unwrap();
    ls.iter()
        .map(|l| {
            l.set_nonblocking(true).unwrap();
            l.accept().is_ok()
        })
        .collect()
}

/// A fake host running `nvidia-persistenced --user nvidia-persistenced` (the directory and
/// socket that account's, its passwd entry), docker's root socket listening beside it:
/// (host, driver, persistenced's listener, docker's listener).
fn service_host() -> (
    Host,
    testbed::driver::FakeDriver,
    UnixListener,
    UnixListener,
) {
    let h = Host::new(FakeHost::blueprint());
    let d = h.with_host_driver(HOST_V);
    let real = d.persistenced_as(SVC_NAME, SVC).unwrap();
    let docker = testbed::driver::listen(&d.root.join("run/docker.sock")).unwrap();
    (h, d, real, docker)
}

fn name_the_account(h: &Host) {
    h.edit_config(|c| c["driver_socket_owners"] = serde_json::json!([SVC_NAME]));
}

/// The request is refused in one line saying `said`, by each door: `gpuhook driver`, the
/// libvirt hook's `prepare` (nothing reserved), `gpuhook-runtime create` (the runtime
/// never run, the bundle untouched), `gpuhook cdi generate`.
fn refused_everywhere(h: &Host, rt: &Runtime, said: &str) {
    assert_one_line(&gh(h, &["driver", "--json"]), said);
    let xml = domain("dsock", 1, &gpus(r#"driver="host""#));
    assert_fails(&h.hook("dsock", "prepare", &xml), "dsock", said);
    assert!(h.holders().is_empty());
    let (o, after) = rt.create(h, "sock-1");
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    assert!(e.starts_with("gpuhook: container 'sock-1': "), "{e}");
    assert!(e.contains(said), "{e:?} lacks {said:?}");
    assert!(!rt.called.exists(), "the runtime ran");
    assert!(mount_at(&after, SOCKET).is_none(), "{after:#}");
    assert!(h.holders().is_empty());
    assert_one_line(&gh(h, &["cdi", "generate"]), said);
}

/// The reviewer's scenario: the account that owns `/run/nvidia-persistenced/` runs `ln -s
/// /run/docker.sock socket` there. No door ever gives docker's socket (a container's root
/// would be the host's): each refuses in one line naming the link, whether or not
/// `driver_socket_owners` names the account.
#[test]
fn a_service_accounts_link_to_dockers_socket_is_never_given() {
    let (h, d, _real, _docker) = service_host();
    let rt = runtime(&h);
    let sock = d.root.join(SOCKET.trim_start_matches('/'));
    std::fs::remove_file(&sock).unwrap();
    symlink("/run/docker.sock", &sock).unwrap();
    std::os::unix::fs::lchown(&sock, Some(SVC), Some(SVC)).unwrap();
    let said = format!(
        "driver \"host\": the socket {} is a symbolic link; a socket is never given through one: refusing to give it",
        sock.display()
    );
    refused_everywhere(&h, &rt, &said);
    name_the_account(&h);
    refused_everywhere(&h, &rt, &said);
    // The same from the cache (the first look cached it): still checked, still refused.
    assert!(!gh(&h, &["driver"]).status.success());
}

/// The account *hard-links* docker's socket where its own was (`ln /run/docker.sock
/// /run/nvidia-persistenced/socket`: the same file system, and allowed to any account on a
/// host whose `fs.protected_hardlinks` is 0, the kernel's default; made here as root, as the
/// account could there). No link to refuse: the same inode as docker's, root's. With
/// `driver_socket_owners` naming the account, every door refuses it in one line (the base
/// binary gave it, and a client of the container's socket reached docker). Then its own
/// socket again, but with a second name elsewhere (a hard link to it from `/run`): refused
/// too, it may be another socket the account linked in.
#[test]
fn a_hard_link_to_dockers_socket_in_the_accounts_directory_is_never_given() {
    let (h, d, _real, docker) = service_host();
    name_the_account(&h);
    let rt = runtime(&h);
    let sock = d.root.join(SOCKET.trim_start_matches('/'));
    std::fs::remove_file(&sock).unwrap();
    std::fs::hard_link(d.root.join("run/docker.sock"), &sock).unwrap();
    assert_eq!(std::fs::metadata(&sock).unwrap().nlink(), 2);
    let said = format!(
        "driver \"host\": the socket {} is root's, but its directory ({}) is {SVC_NAME} (uid {SVC})'s, who cannot bind a socket of root's there, only hard-link one (/run/docker.sock?): refusing to give it",
        sock.display(),
        sock.parent().unwrap().display()
    );
    refused_everywhere(&h, &rt, &said);
    let link = h
        .state
        .parent()
        .unwrap()
        .join("driver-sockets/run_nvidia-persistenced_socket");
    assert!(!link.exists(), "docker's socket was linked for containers");
    drop(docker);
    // The account's own socket, with a second name outside its directory.
    std::fs::remove_file(&sock).unwrap();
    let real = testbed::driver::listen(&sock).unwrap();
    std::os::unix::fs::lchown(&sock, Some(SVC), Some(SVC)).unwrap();
    let aside = d.root.join("run/persistenced.aside");
    std::fs::hard_link(&sock, &aside).unwrap();
    let said = format!(
        "driver \"host\": the socket {} in a directory of {SVC_NAME} (uid {SVC}) has 2 links, a name elsewhere besides its path and gpuhook's own link: a hard link the account made to another socket? refusing to give it",
        sock.display()
    );
    refused_everywhere(&h, &rt, &said);
    // Its one name again: given, through gpuhook's link (its second name from then on).
    std::fs::remove_file(&aside).unwrap();
    assert_ok(&gh(&h, &["driver"]));
    assert_eq!(ident(&link), ident(&sock));
    assert_ok(&gh(&h, &["driver"]));
    assert_eq!(reached(&link, &[&real]), [true]);
}

/// A link on the way (`/run/nvidia-fabricmanager` a link to a directory of root's holding a
/// root socket) and a directory above the socket's that its group may write: refused in one
/// line naming the directory.
#[test]
fn a_link_on_the_way_or_a_group_writable_directory_above_refuses_the_socket() {
    let h = Host::new(FakeHost::blueprint());
    let d = h.with_host_driver(HOST_V);
    let rt = runtime(&h);
    let docker_dir = d.root.join("run/docker");
    std::fs::create_dir_all(&docker_dir).unwrap();
    let _docker = testbed::driver::listen(&docker_dir.join("socket")).unwrap();
    let fm = d.root.join("run/nvidia-fabricmanager");
    symlink("/run/docker", &fm).unwrap();
    refused_everywhere(
        &h,
        &rt,
        &format!(
            "driver \"host\": a directory on the way to the socket {} ({}) is a symbolic link; a socket is never given through one: refusing to give it",
            fm.join("socket").display(),
            fm.display()
        ),
    );
    std::fs::remove_file(&fm).unwrap();
    assert_ok(&gh(&h, &["driver"]));
    let run = d.root.join("run");
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o775)).unwrap();
    refused_everywhere(
        &h,
        &rt,
        &format!(
            "driver \"host\": a directory on the way to {} ({}) has mode 0775: group or others may write it; refusing to give it",
            d.root.join(SOCKET.trim_start_matches('/')).display(),
            run.display()
        ),
    );
}

/// Stock packaging: the directory and socket are `nvidia-persistenced`'s. Without
/// `driver_socket_owners` every door refuses, saying what to set; with it, `driver="host"`
/// works and the container gets the real socket, through gpuhook's own link beside the state
/// file (the same socket: a client of it reaches persistenced, not docker); `cdi generate`
/// leaves it out, saying why.
#[test]
fn stock_persistenced_works_once_driver_socket_owners_names_its_account() {
    let (h, d, real, docker) = service_host();
    let rt = runtime(&h);
    let sock = d.root.join(SOCKET.trim_start_matches('/'));
    refused_everywhere(
        &h,
        &rt,
        &format!(
            "driver \"host\": {} is owned by {SVC_NAME} (uid {SVC}), not root: name it in driver_socket_owners to give it",
            sock.display()
        ),
    );
    name_the_account(&h);
    let o = gh(&h, &["driver", "--json"]);
    assert_ok(&o);
    let j = json_of(&o);
    let s = j["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "socket")
        .cloned()
        .unwrap_or_else(|| panic!("no socket: {j:#}"));
    let link = h
        .state
        .parent()
        .unwrap()
        .join("driver-sockets/run_nvidia-persistenced_socket");
    assert_eq!(s["path"], SOCKET);
    assert_eq!(s["source"], link.display().to_string());
    assert_eq!(ident(&link), ident(&sock));
    assert_eq!(reached(&link, &[&real, &docker]), [true, false]);
    let text = out(&gh(&h, &["driver"]));
    assert!(
        text.contains(&format!(
            "socket    fixed        {SOCKET}  (through {})",
            link.display()
        )),
        "{text}"
    );
    // The libvirt hook's prepare, and the OCI door's edit: the container gets it there.
    let xml = domain("dsock", 1, &gpus(r#"driver="host""#));
    assert_ok(&h.hook("dsock", "prepare", &xml));
    assert_ok(&h.hook("dsock", "release", &xml));
    let (o, after) = rt.create(&h, "sock-2");
    assert_ok(&o);
    assert!(rt.called.exists());
    let m = mount_at(&after, SOCKET).unwrap_or_else(|| panic!("{after:#}"));
    assert_eq!(m["source"], link.display().to_string());
    assert_eq!(
        m["options"],
        serde_json::json!(["bind", "ro", "nosuid", "nodev", "rprivate", "noexec"])
    );
    // A generated spec is mounted by the engine whenever it starts a container: left out.
    let o = gh(&h, &["cdi", "generate"]);
    assert_ok(&o);
    let spec: Value = serde_yaml_ng::from_slice(&o.stdout).unwrap();
    assert!(spec["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["containerPath"] != SOCKET));
    assert!(
        stderr(&o).contains(&format!("gpuhook: warning: {SOCKET} is left out of the spec: its directory is a service account's")),
        "{}",
        stderr(&o)
    );
    // By uid too.
    h.edit_config(|c| c["driver_socket_owners"] = serde_json::json!([SVC]));
    assert_ok(&gh(&h, &["driver"]));
}

/// The account swaps its socket for a link to docker's and back, as fast as it can, while
/// gpuhook starts again and again: each start refuses (it saw the link) or gives gpuhook's
/// link to the real socket; never docker's, whatever the account did after the check.
#[test]
fn the_account_swapping_its_socket_in_a_loop_never_gets_dockers_given() {
    let (h, d, real, docker) = service_host();
    name_the_account(&h);
    let sock = d.root.join(SOCKET.trim_start_matches('/'));
    let real_id = ident(&sock);
    let docker_id = ident(&d.root.join("run/docker.sock"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (stop, sock) = (stop.clone(), sock.clone());
        std::thread::spawn(move || {
            let aside = sock.with_file_name("socket.real");
            let link = sock.with_file_name("socket.link");
            let mut swaps = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // rename(2) of names in its own directory: all the account needs.
                std::fs::hard_link(&sock, &aside).unwrap();
                let _ = std::fs::remove_file(&link);
                symlink("/run/docker.sock", &link).unwrap();
                std::fs::rename(&link, &sock).unwrap();
                std::thread::sleep(std::time::Duration::from_micros(300));
                std::fs::rename(&aside, &sock).unwrap();
                std::thread::sleep(std::time::Duration::from_micros(300));
                swaps += 1;
            }
            swaps
        })
    };
    let (mut given, mut refused) = (0, 0);
    let link = h
        .state
        .parent()
        .unwrap()
        .join("driver-sockets/run_nvidia-persistenced_socket");
    for _ in 0..60 {
        let o = gh(&h, &["driver", "--json"]);
        if o.status.success() {
            let j = json_of(&o);
            let s = j["files"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["kind"] == "socket")
                .cloned()
                .unwrap();
            assert_eq!(s["source"], link.display().to_string(), "{j:#}");
            given += 1;
        } else {
            let e = stderr(&o);
            assert_eq!(e.trim_end().lines().count(), 1, "{e}");
            assert!(e.contains(&sock.display().to_string()), "{e}");
            refused += 1;
        }
        // Whatever the account does, the link given is the real socket.
        if link.exists() {
            assert_eq!(ident(&link), real_id);
            assert_ne!(ident(&link), docker_id);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 10, "the account swapped only {swaps} times");
    assert!(given > 0 && refused > 0, "given {given}, refused {refused}");
    assert_eq!(reached(&link, &[&real, &docker]), [true, false]);
}

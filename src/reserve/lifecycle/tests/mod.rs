//! The lifecycle steps over a fake host: an in-memory inventory, a `/proc` in a temporary
//! directory (the container's init is a `stat` file there: removing it ends the init), a
//! recording device cgroup and a recording container, the state file in a temporary
//! directory. Nothing here needs root, a libvirtd or a container: the tests run as any user.

use super::nodes::as_nodes;
use super::*;
use crate::cdi;
use crate::cgroup::{CgroupError, DeviceCgroup};
use crate::enter::container::{Container, ContainerError, ContainerMade as Made, DevTmpfs};
use crate::enter::rootfs::{Done, Mounted, Owner};
use crate::host::config::Config;
use crate::host::inventory::Inventory;
use crate::host::inventory::{InventoryError, Scan};
use crate::host::procfs::{Proc, ProcRef};
use crate::ids::Unit;
use crate::node::NodeSpec;
use crate::node::Outcome;
use crate::request::DeviceSel;
use crate::request::{Driver, IdMap, Request};
use crate::reserve::alloc::tests::{dgx, req};
use crate::reserve::error::Error;
use crate::reserve::reconcile::stale_on;
use crate::reserve::state::Store;
use crate::reserve::state::{now_rfc3339, HolderKey, Node, Phase, Reservation, State};
use crate::reserve::world::Enter;
use crate::reserve::world::World;
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;

mod activate;
mod attach;
mod detach;
mod free;
mod host_driver;
mod mps;
mod pods;
mod prepare;
mod readopt;

const ID: &str = "6f1c0a4e-1111-4222-8333-000000000001";

/// Another domain's UUID (`web2`'s).
const OTHER: &str = "6f1c0a4e-1111-4222-8333-000000000002";

const CTRL: i32 = 4200;

const INIT: ProcRef = ProcRef {
    pid: 4242,
    start_time: 777,
};

/// The fake host: what its cgroup grants, what fails, and every call the doubles got.
#[derive(Default)]
struct Fake {
    calls: RefCell<Vec<String>>,
    /// The device numbers the container's cgroup grants (by exact rules).
    allowed: RefCell<Vec<(u32, u32)>>,
    /// A wildcard rule (`c MAJOR:* rwm`) allows every minor of this major: a deny of an
    /// exact rule leaves it allowed, as v1's does.
    wildcard: Option<u32>,
    /// Granting this minor fails.
    fail_allow: Option<u32>,
    fail_revoke: bool,
    /// Taking away this minor fails.
    fail_deny: Option<u32>,
    /// The cgroup cannot be found.
    no_cgroup: bool,
    fail_create: Option<ContainerError>,
    /// Removing nodes fails.
    fail_remove: bool,
    fail_inject: bool,
    /// Taking the driver files out of the container's root fails.
    fail_uninject: bool,
    /// The init exits during this call (`create`, `inject`).
    init_exits_in: Option<&'static str>,
    /// The inventory cannot be read.
    no_inventory: bool,
    proc_root: PathBuf,
    ended: Cell<bool>,
    /// The state file as the first grant found it (read from this path): what an attach
    /// killed at its grant leaves.
    state_at_allow: Option<PathBuf>,
    seen_at_allow: RefCell<Option<Vec<u8>>>,
    /// A service manager keeps a device policy for the container's cgroup (systemd's
    /// scope): its entries. While there is one, a node is in force only if it lists it too.
    managed: RefCell<Option<Vec<(u32, u32)>>>,
    /// The manager refuses every change (systemd says so; its list as it was, read back).
    manager_fails: bool,
    /// How the manager answers its next changes, in order (then as `manager_fails` says).
    manager_script: RefCell<std::collections::VecDeque<Told>>,
    /// Runs once the manager has been told (what happens meanwhile elsewhere).
    on_told: Option<Box<dyn Fn()>>,
    /// A device program of a cgroup above refuses this minor.
    refused_above: Option<u32>,
}

impl Fake {
    fn call(&self, c: String) {
        self.calls.borrow_mut().push(c);
    }
    fn calls(&self) -> Vec<String> {
        self.calls.borrow().clone()
    }
    fn maybe_exit(&self, during: &str) {
        if self.init_exits_in == Some(during) && !self.ended.get() {
            std::fs::remove_file(self.proc_root.join(INIT.pid.to_string()).join("stat")).unwrap();
            self.ended.set(true);
        }
    }
}

/// A device cgroup in memory; its calls go to the fake host's record.
struct Cg(Rc<Fake>);

fn num(n: &Node) -> String {
    format!("{}:{}", n.major, n.minor)
}

impl DeviceCgroup for Cg {
    fn path(&self) -> &Path {
        Path::new("/fake")
    }
    fn is_allowed(&self, n: &Node) -> Result<bool, CgroupError> {
        Ok(self.0.wildcard == Some(n.major)
            || self.0.allowed.borrow().contains(&(n.major, n.minor)))
    }
    fn grants_exactly(&self, n: &Node) -> Result<bool, CgroupError> {
        Ok(self.0.allowed.borrow().contains(&(n.major, n.minor)))
    }
    fn allow(&mut self, n: &Node) -> Result<(), CgroupError> {
        self.0.call(format!("allow {}", num(n)));
        if let Some(p) = &self.0.state_at_allow {
            let mut seen = self.0.seen_at_allow.borrow_mut();
            seen.get_or_insert_with(|| std::fs::read(p).unwrap());
        }
        if self.0.fail_allow == Some(n.minor) {
            return Err(CgroupError::new(self.path(), "Operation not permitted"));
        }
        self.0.allowed.borrow_mut().push((n.major, n.minor));
        Ok(())
    }
    fn revoke(&mut self, n: &Node) -> Result<(), CgroupError> {
        self.0.call(format!("revoke {}", num(n)));
        if self.0.fail_revoke {
            return Err(CgroupError::new(self.path(), "No such file or directory"));
        }
        self.0
            .allowed
            .borrow_mut()
            .retain(|x| *x != (n.major, n.minor));
        Ok(())
    }
    fn effective(&self, n: &Node) -> Result<bool, CgroupError> {
        let listed = self
            .0
            .managed
            .borrow()
            .as_ref()
            .is_none_or(|m| m.contains(&(n.major, n.minor)));
        Ok(self.is_allowed(n)? && listed && self.0.refused_above != Some(n.minor))
    }
    fn deny(&mut self, n: &Node) -> Result<(), CgroupError> {
        self.0.call(format!("deny {}", num(n)));
        if self.0.fail_deny == Some(n.minor) {
            return Err(CgroupError::new(self.path(), "Operation not permitted"));
        }
        self.0
            .allowed
            .borrow_mut()
            .retain(|x| *x != (n.major, n.minor));
        Ok(())
    }
}

/// How a service manager answers a change of its device policy, when not as asked.
#[derive(Debug, Clone, Copy)]
enum Told {
    /// The change is made, but the call fails after it (`systemctl set-property` went through;
    /// its read-back failed or timed out): what it lists now is not known.
    Unsure(&'static str),
    /// Nothing is made, and what it lists cannot be read either (systemd cannot be reached).
    Lost(&'static str),
}

/// The manager's policy in memory (its entries are the fake host's `managed`), as it was
/// when made; whether what it lists now is known (as systemd's scope knows it: a change that
/// failed midway leaves it unknown until one goes through).
struct Mgr(Rc<Fake>, Vec<(u32, u32)>, bool);

impl Mgr {
    fn set(
        &mut self,
        what: &str,
        nodes: &[Node],
        next: Vec<(u32, u32)>,
    ) -> Result<(), CgroupError> {
        if self.2 && next == self.now() {
            return Ok(());
        }
        let ns: Vec<String> = nodes.iter().map(num).collect();
        self.0.call(format!("policy {what} {}", ns.join(" ")));
        let fail = |why: &str| Err(CgroupError::new(Path::new("/fake.scope"), why));
        let told = self.0.manager_script.borrow_mut().pop_front();
        match told {
            Some(Told::Unsure(why)) => {
                *self.0.managed.borrow_mut() = Some(next);
                self.2 = false;
                return fail(why);
            }
            Some(Told::Lost(why)) => {
                self.2 = false;
                return fail(why);
            }
            None if self.0.manager_fails => {
                return fail("Failed to connect to bus");
            }
            None => {}
        }
        *self.0.managed.borrow_mut() = Some(next);
        self.2 = true;
        if let Some(f) = &self.0.on_told {
            f();
        }
        Ok(())
    }
    fn now(&self) -> Vec<(u32, u32)> {
        self.0.managed.borrow().clone().unwrap_or_default()
    }
}

impl crate::cgroup::ManagedPolicy for Mgr {
    fn name(&self) -> String {
        "systemd unit fake.scope".into()
    }
    fn allow(&mut self, nodes: &[Node]) -> Result<(), CgroupError> {
        let mut next = self.now();
        next.extend(
            nodes
                .iter()
                .map(|n| (n.major, n.minor))
                .filter(|k| !self.now().contains(k)),
        );
        self.set("allow", nodes, next)
    }
    fn remove(&mut self, nodes: &[Node]) -> Result<(), CgroupError> {
        let mut next = self.now();
        next.retain(|k| !nodes.iter().any(|n| (n.major, n.minor) == *k));
        self.set("remove", nodes, next)
    }
    fn restore(&mut self, nodes: &[Node]) -> Result<(), CgroupError> {
        let keys: Vec<(u32, u32)> = nodes.iter().map(|n| (n.major, n.minor)).collect();
        let mut next = self.now();
        next.retain(|k| !keys.contains(k));
        next.extend(self.1.iter().filter(|k| keys.contains(k)));
        self.set("restore", nodes, next)
    }
}

fn paths(nodes: &[NodeSpec]) -> String {
    nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

impl Enter for Fake {
    fn create_nodes(&self, ct: &Container, nodes: &[NodeSpec]) -> Result<Made, ContainerError> {
        assert_eq!(ct.init, INIT);
        self.call(format!("create {}", paths(nodes)));
        self.maybe_exit("create");
        if let Some(e) = &self.fail_create {
            return Err(e.clone());
        }
        Ok(Made {
            outcomes: vec![Outcome::Created; nodes.len()],
            dirs: vec![],
            bound: vec![],
        })
    }
    fn remove_nodes(
        &self,
        _: &Container,
        nodes: &[NodeSpec],
        _: &[String],
        _: &[crate::enter::devdir::Bound],
    ) -> Result<(), ContainerError> {
        self.call(format!("remove {}", paths(nodes)));
        if self.fail_remove {
            return Err(ContainerError::Refused(
                "/dev is not libvirt's tmpfs".into(),
            ));
        }
        Ok(())
    }
    fn inject(&self, _: &Container, plan: &cdi::Plan, _: Owner) -> Result<Done, ContainerError> {
        let targets: Vec<&str> = plan.mounts.iter().map(|m| m.target.as_str()).collect();
        self.call(format!("inject {}", targets.join(" ")));
        self.maybe_exit("inject");
        if self.fail_inject {
            return Err(ContainerError::Refused(
                "mount over /usr/lib: Permission denied".into(),
            ));
        }
        Ok(Done {
            mounted: plan
                .mounts
                .iter()
                .map(|m| Mounted {
                    target: m.target.clone(),
                    dev: 9,
                    ino: 99,
                })
                .collect(),
            ..Default::default()
        })
    }
    fn uninject(
        &self,
        _: &Container,
        d: &Done,
        _: Owner,
    ) -> Result<crate::leftovers::Leftovers, ContainerError> {
        let what: Vec<String> = d
            .mounted
            .iter()
            .map(|m| format!("{} ({}:{})", m.target, m.dev, m.ino))
            .chain(d.links.iter().cloned())
            .collect();
        self.call(format!("uninject {}", what.join(" ")));
        if self.fail_uninject {
            return Err(ContainerError::Refused("/ is not the container's".into()));
        }
        Ok(Default::default())
    }
    fn check_mounts(&self, _: &Container, m: &[Mounted]) -> Result<Vec<String>, ContainerError> {
        self.call(format!("check {} mount(s)", m.len()));
        Ok(vec![])
    }
}

/// A recording MPS host: a started daemon is a live process of the fake `/proc` (pid 6000
/// on), with its directories made as the real host makes them; `quit` ends it.
impl crate::reserve::mps::Mps for Fake {
    fn start(
        &self,
        cfg: &Config,
        pci: crate::ids::Pci,
        uuid: &str,
        _: &crate::host::config::Sharing,
    ) -> Result<crate::reserve::mps::Daemon, crate::reserve::mps::MpsError> {
        self.call(format!("mps start {pci}"));
        let dir = crate::reserve::mps::dir_for(cfg, uuid);
        for d in ["pipe", "log", "shm"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let proc = ProcRef {
            pid: 6000 + self.calls().len() as i32,
            start_time: 5,
        };
        write_stat(&self.proc_root, proc, 1);
        Ok(crate::reserve::mps::Daemon {
            proc,
            uuid: uuid.into(),
            dir,
            starting: false,
            stopping: None,
        })
    }
    fn quit(
        &self,
        _: &Config,
        pci: crate::ids::Pci,
        d: &crate::reserve::mps::Daemon,
    ) -> Result<(), crate::reserve::mps::MpsError> {
        self.call(format!("mps quit {pci}"));
        std::fs::remove_file(self.proc_root.join(d.proc.pid.to_string()).join("stat")).unwrap();
        Ok(())
    }
}

/// A live process `p` (parent `ppid`) in the fake `/proc` at `root`.
fn write_stat(root: &Path, p: ProcRef, ppid: i32) {
    let dir = root.join(p.pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let mut f = vec!["0".to_string(); 20];
    f[0] = "S".into();
    f[1] = ppid.to_string();
    f[19] = p.start_time.to_string();
    std::fs::write(
        dir.join("stat"),
        format!("{} (init) {}\n", p.pid, f.join(" ")),
    )
    .unwrap();
}

/// A host in a temporary directory: its config (state file, `/proc`, CDI spec dirs) and the
/// inventory the fake scan gives.
struct FakeHost {
    _t: tempfile::TempDir,
    cfg: Config,
    proc: String,
    inv: Inventory,
    /// The NVIDIA module the fake host runs (`driver="host"`): `None`, none loaded.
    module: RefCell<Option<&'static str>>,
}

fn host() -> FakeHost {
    let t = tempfile::tempdir().unwrap();
    let proc = t.path().join("proc");
    std::fs::create_dir_all(&proc).unwrap();
    let cfg = Config {
        sysfs: t.path().join("sys"),
        proc: proc.clone(),
        dev: "/dev".into(),
        state_file: t.path().join("state/gpus.json"),
        cdi_spec_dirs: vec![t.path().join("cdi")],
        ..Config::default()
    };
    let h = FakeHost {
        cfg,
        proc: proc.to_string_lossy().into_owned(),
        inv: Inventory {
            gpus: dgx(),
            controls: vec![],
            deferred: 0,
        },
        module: RefCell::new(Some(HOST_V)),
        _t: t,
    };
    h.process(INIT, CTRL);
    h
}

impl FakeHost {
    /// A live process in the fake `/proc`.
    fn process(&self, p: ProcRef, ppid: i32) {
        write_stat(&self.cfg.proc, p, ppid);
    }

    fn fake(&self, f: Fake) -> Rc<Fake> {
        Rc::new(Fake {
            proc_root: self.cfg.proc.clone(),
            ..f
        })
    }

    /// Runs `step` on the facts of this host and `fake`.
    fn with<T>(&self, fake: &Rc<Fake>, step: impl FnOnce(&World) -> T) -> T {
        let inv = self.inv.clone();
        let no_inventory = fake.no_inventory;
        let scan = move |_: &Config, _: Scan| {
            if no_inventory {
                Err(InventoryError::CannotList {
                    path: "/sys/bus/pci/devices".into(),
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                })
            } else {
                Ok(inv.clone())
            }
        };
        let fk = fake.clone();
        let cgroup =
            move |_: &Config, _: &Container| -> Result<Box<dyn DeviceCgroup>, CgroupError> {
                if fk.no_cgroup {
                    return Err(CgroupError::new(
                        Path::new("/fake"),
                        "no devices cgroup for pid 4242",
                    ));
                }
                Ok(Box::new(Cg(fk.clone())))
            };
        let fk = fake.clone();
        let manager = move |_: &Config,
                            _: &Container|
              -> Result<
            Option<Box<dyn crate::cgroup::ManagedPolicy>>,
            CgroupError,
        > {
            let now = fk.managed.borrow().clone();
            Ok(now.map(|m| {
                Box::new(Mgr(fk.clone(), m, true)) as Box<dyn crate::cgroup::ManagedPolicy>
            }))
        };
        let specs = |_: &[PathBuf], _: &[&str]| -> Result<Vec<cdi::Loaded>, cdi::LoadError> {
            Ok(vec![cdi::Loaded {
                path: "/etc/cdi/nvidia.yaml".into(),
                dir: 0,
                spec: cdi::parse_checked(CDI_SPEC.as_bytes(), false).expect("the test spec"),
            }])
        };
        let module = *self.module.borrow();
        let host_driver = move |_: &Config| match module {
            Some(v) => Ok(host_driver_of(v)),
            None => Err(crate::host::driver::DriverError::NoModule {
                path: "/proc/driver/nvidia/version".into(),
            }),
        };
        let f = World {
            cfg: &self.cfg,
            proc: Proc { root: &self.proc },
            scan: &scan,
            cgroup: &cgroup,
            manager: &manager,
            enter: &**fake,
            cdi_specs: &specs,
            controller_running: &|name| name == "web1",
            mps: &**fake,
            host_driver: &host_driver,
            me: std::process::id() as i32,
            uid: nix::unistd::getuid().as_raw(),
        };
        step(&f)
    }

    fn state(&self) -> State {
        Store::new(&self.cfg.state_file).read().unwrap()
    }

    /// Another domain, `web2` (`other-uuid`), running with these GPUs: its init lives.
    fn other_running(&self, gpus: &[Unit]) {
        let other = ProcRef {
            pid: 5151,
            start_time: 888,
        };
        self.process(other, 5100);
        self.seed(OTHER, "web2", gpus, Phase::Running, Some(other));
    }

    /// Puts a reservation of these GPUs in the state, for `holder`.
    fn seed(&self, id: &str, name: &str, gpus: &[Unit], phase: Phase, init: Option<ProcRef>) {
        Store::new(&self.cfg.state_file)
            .update(|st| {
                st.insert(Reservation {
                    holder: crate::reserve::state::HolderId::Libvirt {
                        name: name.into(),
                        uuid: id.into(),
                    },
                    gpus: gpus.to_vec(),
                    phase,
                    request: "1 GPU".into(),
                    created: now_rfc3339(),
                    updated: now_rfc3339(),
                    prepared_by: None,
                    controller: init.map(|_| CTRL),
                    init,
                    cgroup: None,
                    namespaces: None,
                    nodes: vec![],
                    mounts: vec![],
                    rootfs: Default::default(),
                    hotplugged: false,
                    node_mounts: Vec::new(),
                    driver: None,
                    driver_version: None,
                });
                Ok::<_, Error>(())
            })
            .unwrap();
    }
}

/// An NVIDIA CDI spec whose GPU 0 is the host's `/dev/null` (1:3), GPU 1 `/dev/zero` (1:5):
/// a common node (`/dev/full`, 1:7) and one driver mount.
const CDI_SPEC: &str = r#"---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
    - name: "0"
      containerEdits:
        deviceNodes:
            - path: /dev/null
    - name: "1"
      containerEdits:
        deviceNodes:
            - path: /dev/zero
containerEdits:
    deviceNodes:
        - path: /dev/full
    mounts:
        - hostPath: /etc/hostname
          containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03
          options: [ro, nosuid, nodev, rbind, rprivate]
"#;

/// The whole GPU of index `i` of the test host.
fn pci(i: usize) -> Unit {
    format!("0000:{:02x}:00.0", 0x10 + i).parse().unwrap()
}

fn holder(idmap: &IdMap) -> Holder<'_> {
    Holder::libvirt("web1", ID, idmap)
}

/// `prepare` as the libvirt door calls it: reserved by the process that ran this one.
fn prepare_by_parent(f: &World, h: &Holder, req: &Request) -> Result<(), Error> {
    let parent = f.proc.proc_ref(std::os::unix::process::parent_id() as i32);
    prepare(f, h, req, parent).map(drop)
}

/// `prepare` as the OCI door calls it: reserved by this process, the token its hooks carry.
fn prepare_oci(f: &World, h: &Holder, req: &Request) -> Result<(Given, ProcRef), Error> {
    let me = f
        .proc
        .proc_ref(std::process::id() as i32)
        .ok_or(LifecycleError::OwnStartTime)?;
    prepare(f, h, req, Some(me)).map(|n| (n, me))
}

/// Frees what the state holds for a holder of this kind with this UUID or ID, on this host.
fn free_held(cfg: &Config, kind: HolderKind, id: &str) -> Result<Option<Reservation>, Error> {
    let key = crate::reserve::state::HolderId::for_test(kind, id, id).key();
    free_key(&World::real(cfg), &key)
}

fn container() -> Container {
    Container {
        controller: CTRL,
        init: INIT,
        dev: DevTmpfs {
            dev: 1,
            ino: 2,
            by: Default::default(),
        },
        userns: None,
        made: Default::default(),
        mnt: crate::enter::namespace::MntNs::own(),
    }
}

fn found() -> Result<Container, ContainerError> {
    Ok(container())
}

/// A host whose GPUs 0 and 1 are `/dev/null` and `/dev/zero` (what [`CDI_SPEC`] names).
fn cdi_host() -> FakeHost {
    let mut h = host();
    h.inv.gpus[0].nodes[0].1.node = Node::new("/dev/null".to_string(), 1, 3);
    h.inv.gpus[1].nodes[0].1.node = Node::new("/dev/zero".to_string(), 1, 5);
    h
}

fn cdi_req(n: u32) -> Request {
    let mut r = req(n);
    r.driver = Some(Driver::Cdi);
    r
}

impl FakeHost {
    /// Process `pid` of the fake `/proc` with descriptor 3 on `node` (a symlink to it, which
    /// `statx` follows as it follows the kernel's magic links), opened with `flags` (octal,
    /// as its `fdinfo` says them).
    fn opener(&self, pid: i32, node: &str, flags: &str) {
        self.process(
            ProcRef {
                pid,
                start_time: 900,
            },
            1,
        );
        let dir = self.cfg.proc.join(pid.to_string());
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        std::fs::create_dir_all(dir.join("fdinfo")).unwrap();
        std::os::unix::fs::symlink(node, dir.join("fd/3")).unwrap();
        std::fs::write(dir.join("fdinfo/3"), format!("pos:\t0\nflags:\t{flags}\n")).unwrap();
    }
}

fn all_of(id: &'static str) -> impl FnOnce(&State) -> Vec<(HolderKey, ())> {
    move |st| {
        st.reservations
            .keys()
            .filter(|k| k.as_str() == id)
            .map(|k| (k.clone(), ()))
            .collect()
    }
}

impl FakeHost {
    /// This test process in the fake `/proc` (the OCI `create` that reserves).
    fn this_process(&self) -> ProcRef {
        let me = ProcRef {
            pid: std::process::id() as i32,
            start_time: 31337,
        };
        self.process(me, 1);
        me
    }
}

fn oci_holder(idmap: &IdMap) -> Holder<'_> {
    Holder::oci("ctr1", idmap)
}

fn holder_with_id<'a>(idmap: &'a IdMap, id: &'a str) -> Holder<'a> {
    Holder::libvirt("web1", id, idmap)
}

impl FakeHost {
    /// `attach` of `r` for `web1`, found running, on this host and `fake`.
    fn attach(&self, fake: &Rc<Fake>, r: &Request) -> Result<Attached, Error> {
        let idmap = IdMap::default();
        self.with(fake, |f| attach(f, &holder(&idmap), r, found))
    }
}

/// `/dev/nvidiactl` and `/dev/nvidia-modeset` on the test host: one control node every NVIDIA
/// container gets, one that comes with `graphics`.
fn with_controls(h: &mut FakeHost) {
    use crate::host::inventory::{Control, DevNode};
    let dev = |path: &str, minor| DevNode {
        node: Node::new(path, 195, minor),
        mode: 0o666,
    };
    h.inv.controls = vec![
        (Control::NvidiaCtl, dev("/dev/nvidiactl", 255)),
        (Control::NvidiaModeset, dev("/dev/nvidia-modeset", 254)),
    ];
}

/// A running container of GPU 0 (activated as at `started`: its nodes recorded); the fake
/// cgroup after it grants what `started` granted.
impl FakeHost {
    /// `web1` reserved `gpus` (prepared) and `started` with `req` on a fake host that lets
    /// everything through; the fake it ran on.
    fn activated(&self, gpus: &[Unit], req: &Request) -> Rc<Fake> {
        self.seed(ID, "web1", gpus, Phase::Prepared, None);
        let fake = self.fake(Fake::default());
        let idmap = IdMap::default();
        self.with(&fake, |f| activate(f, &holder(&idmap), req, found))
            .unwrap();
        fake
    }
}

fn running_on_gpu0(h: &FakeHost, r: &Request) -> Rc<Fake> {
    let fake = h.activated(&[pci(0)], r);
    let allowed = fake.allowed.borrow().clone();
    h.fake(Fake {
        allowed: RefCell::new(allowed),
        ..Default::default()
    })
}

fn state_bytes(h: &FakeHost) -> Vec<u8> {
    std::fs::read(&h.cfg.state_file).unwrap()
}

/// A request for these GPUs of the test host by index.
fn req_of(ix: &[usize]) -> Request {
    let mut r = req(ix.len() as u32);
    r.devices = ix.iter().map(|i| DeviceSel::Index(*i as u32)).collect();
    r
}

/// The PID namespace of the container's init, and the host's.
const CT_NS: &str = "pid:[4026532001]";

const HOST_NS: &str = "pid:[4026531836]";

impl FakeHost {
    /// Puts process `pid` of the fake `/proc` in PID namespace `ns` (its `ns/pid` link).
    fn in_ns(&self, pid: i32, ns: &str) {
        let dir = self.cfg.proc.join(pid.to_string()).join("ns");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(ns, dir.join("pid")).unwrap();
    }

    /// Process `pid`, with descriptor 3 really open on `node`, in PID namespace `ns`,
    /// its command `comm`.
    fn opener_in(&self, pid: i32, node: &str, ns: &str, comm: &str) {
        self.opener(pid, node, "0100002");
        self.in_ns(pid, ns);
        std::fs::write(self.cfg.proc.join(pid.to_string()).join("comm"), comm).unwrap();
    }

    /// A running container (its init in [`CT_NS`]) that holds `gpus` through `req`, its
    /// nodes granted and made by `activate`.
    fn running_with(&self, gpus: &[Unit], req: &Request) {
        self.in_ns(INIT.pid, CT_NS);
        self.activated(gpus, req);
    }

    /// `detach` on a fake host whose cgroup grants what `activate` granted (after what
    /// `fake` allows of the container's own).
    fn detach(&self, fake: Fake, which: Which, force: bool) -> (Rc<Fake>, Result<Detached, Error>) {
        let mut allowed = fake.allowed.take();
        allowed.extend(
            self.state().reservations[ID]
                .nodes
                .iter()
                .map(|n| (n.major, n.minor)),
        );
        let fake = self.fake(Fake {
            allowed: RefCell::new(allowed),
            ..fake
        });
        let idmap = IdMap::default();
        let out = self.with(&fake, |f| detach(f, &holder(&idmap), &which, force, found));
        (fake, out)
    }
}

/// A host with NVIDIA's control nodes (`nvidiactl` 195:255, `nvidia-uvm` 510:0).
fn host_with_controls() -> FakeHost {
    use crate::host::inventory::{Control, DevNode};
    let mut h = host();
    let dev = |p: &str, ma, mi| DevNode {
        node: Node::new(p.to_string(), ma, mi),
        mode: 0o666,
    };
    h.inv.controls = vec![
        (Control::NvidiaCtl, dev("/dev/nvidiactl", 195, 255)),
        (Control::NvidiaUvm, dev("/dev/nvidia-uvm", 510, 0)),
    ];
    h
}

/// The grants the fake cgroup was asked to take away.
fn denied(fake: &Fake) -> Vec<String> {
    let mut c = fake.calls();
    c.retain(|c| c.starts_with("deny"));
    c
}

fn sel(u: Unit) -> Which {
    Which::Units(vec![DeviceSel::Pci(u.to_string())])
}

/// A container running with GPUs 0 (`/dev/null`) and 1 (`/dev/zero`), which process `pid`
/// (command `comm`, in PID namespace `ns`) has open.
fn gpu1_open_by(pid: i32, ns: &str, comm: &str) -> FakeHost {
    let h = cdi_host();
    h.running_with(&[pci(0), pci(1)], &req(2));
    h.opener_in(pid, "/dev/zero", ns, comm);
    h
}

/// [`cdi_req`] for these GPUs of the test host by index.
fn cdi_req_of(ix: &[usize]) -> Request {
    let mut r = req_of(ix);
    r.driver = Some(Driver::Cdi);
    r
}

/// [`CDI_SPEC`]'s one driver mount.
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03";

fn mount_targets(h: &FakeHost) -> Vec<String> {
    h.state().reservations[ID]
        .mounts
        .iter()
        .map(|m| format!("{} ({}:{})", m.target, m.dev, m.ino))
        .collect()
}

/// What `/etc/hostname` ([`CDI_SPEC`]'s mount source) is on this host: what a mount of it shows.
fn source_identity() -> String {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata("/etc/hostname").unwrap();
    format!("{}:{}", md.dev(), md.ino())
}

/// The test host with GPU 1 shared with MPS (2 slots).
fn mps_host() -> FakeHost {
    let mut h = host();
    h.inv.gpus[1].sharing = Some(crate::host::config::Sharing {
        mode: crate::host::config::ShareMode::Mps,
        replicas: 2,
        memory_limit_mib: None,
        active_thread_percentage: None,
    });
    h
}

fn shared(n: u32) -> Request {
    Request {
        share: true,
        ..req(n)
    }
}

fn mps_slot(n: u32) -> Unit {
    Unit::Slot {
        pci: pci(1).pci(),
        slot: n,
    }
}

/// A running container of GPU 0 whose scope systemd keeps a device policy for: the
/// container's own entries (`/dev/null`, 1:3) and GPU 0's (given at create, as runc lists it).
fn managed_on_gpu0(h: &FakeHost) -> Rc<Fake> {
    let fake = running_on_gpu0(h, &req(1));
    *fake.managed.borrow_mut() = Some(vec![(1, 3), (195, 0)]);
    fake
}

fn scrub_pending(h: &FakeHost) -> Vec<String> {
    h.state()
        .health
        .iter()
        .filter(|(_, g)| g.scrub_pending)
        .map(|(p, _)| p.clone())
        .collect()
}

/// The fake host's running NVIDIA driver.
const HOST_V: &str = "550.54.15";

/// What discovery finds for driver `v`: its libcuda (the host's `/etc/hostname` stands in)
/// with its SONAME, and a firmware file (`/etc/passwd`).
fn host_driver_of(v: &str) -> crate::reserve::driver::Discovered {
    use crate::host::driver::{DriverFile, DriverFileKind as Kind, DriverFound as Found, FoundBy};
    let lib = format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{v}");
    crate::reserve::driver::Discovered {
        found: Found {
            version: v.to_string(),
            files: vec![
                DriverFile {
                    path: lib.clone(),
                    source: "/etc/hostname".into(),
                    kind: Kind::Library,
                    found_by: FoundBy::LdCache,
                },
                DriverFile {
                    path: format!("/lib/firmware/nvidia/{v}/gsp_ga10x.bin"),
                    source: "/etc/passwd".into(),
                    kind: Kind::Firmware,
                    found_by: FoundBy::Fixed,
                },
            ],
            lib_dirs: vec!["/usr/lib/x86_64-linux-gnu".into()],
            searched: vec![],
        },
        sonames: [(lib, "libcuda.so.1".to_string())].into_iter().collect(),
        pinned: vec![],
    }
}

fn host_req_of(ix: &[usize]) -> Request {
    let mut r = req_of(ix);
    r.driver = Some(Driver::Host);
    r
}

fn host_targets(v: &str) -> String {
    format!(
        "inject /usr/lib/x86_64-linux-gnu/libcuda.so.{v} /lib/firmware/nvidia/{v}/gsp_ga10x.bin"
    )
}

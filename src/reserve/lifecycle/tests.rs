//! The lifecycle steps over a fake host: an in-memory inventory, a `/proc` in a temporary
//! directory (the container's init is a `stat` file there: removing it ends the init), a
//! recording device cgroup and a recording container, the state file in a temporary
//! directory. Nothing here needs root, a libvirtd or a container: the tests run as any user.

use super::*;
use crate::cgroup::{CgroupError, DeviceCgroup};
use crate::enter::container::{Container, ContainerError, ContainerMade as Made, DevTmpfs};
use crate::enter::rootfs::{Done, Mounted, Owner};
use crate::host::inventory::{InventoryError, Scan};
use crate::node::Outcome;
use crate::request::DeviceSel;
use crate::reserve::alloc::tests::{dgx, req};
use crate::reserve::facts::Enter;
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;

const ID: &str = "6f1c0a4e-1111-4222-8333-000000000001";
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
    /// The manager refuses every change.
    manager_fails: bool,
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

/// The manager's policy in memory (its entries are the fake host's `managed`), as it was
/// when made.
struct Mgr(Rc<Fake>, Vec<(u32, u32)>);

impl Mgr {
    fn set(&self, what: &str, nodes: &[Node], next: Vec<(u32, u32)>) -> Result<(), CgroupError> {
        let ns: Vec<String> = nodes.iter().map(num).collect();
        self.0.call(format!("policy {what} {}", ns.join(" ")));
        if self.0.manager_fails {
            return Err(CgroupError::new(
                Path::new("/fake.scope"),
                "Failed to connect to bus",
            ));
        }
        *self.0.managed.borrow_mut() = Some(next);
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
struct Host {
    _t: tempfile::TempDir,
    cfg: Config,
    proc: String,
    inv: Inventory,
    /// The NVIDIA module the fake host runs (`driver="host"`): `None`, none loaded.
    module: RefCell<Option<&'static str>>,
}

fn host() -> Host {
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
    let h = Host {
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

impl Host {
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
    fn with<T>(&self, fake: &Rc<Fake>, step: impl FnOnce(&Facts) -> T) -> T {
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
        let cgroup = move |_: &Container| -> Result<Box<dyn DeviceCgroup>, CgroupError> {
            if fk.no_cgroup {
                return Err(CgroupError::new(
                    Path::new("/fake"),
                    "no devices cgroup for pid 4242",
                ));
            }
            Ok(Box::new(Cg(fk.clone())))
        };
        let fk = fake.clone();
        let manager = move |_: &Container| -> Result<
            Option<Box<dyn crate::cgroup::ManagedPolicy>>,
            CgroupError,
        > {
            let now = fk.managed.borrow().clone();
            Ok(now.map(|m| Box::new(Mgr(fk.clone(), m)) as Box<dyn crate::cgroup::ManagedPolicy>))
        };
        let specs = |_: &[PathBuf], _: &[&str]| -> Result<Vec<cdi::Loaded>, cdi::LoadError> {
            Ok(vec![cdi::Loaded {
                path: "/etc/cdi/nvidia.yaml".into(),
                dir: 0,
                spec: cdi::parse_checked(SPEC.as_bytes(), false).expect("the test spec"),
            }])
        };
        let module = *self.module.borrow();
        let host_driver = move |_: &Config| match module {
            Some(v) => Ok(host_driver_of(v)),
            None => Err(crate::host::driver::DriverError::NoModule {
                path: "/proc/driver/nvidia/version".into(),
            }),
        };
        let f = Facts {
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
        };
        step(&f)
    }

    fn state(&self) -> State {
        store(&self.cfg).read().unwrap()
    }

    /// Another domain, `web2` (`other-uuid`), running with these GPUs: its init lives.
    fn other_running(&self, gpus: &[Unit]) {
        let other = ProcRef {
            pid: 5151,
            start_time: 888,
        };
        self.process(other, 5100);
        self.seed("other-uuid", "web2", gpus, Phase::Running, Some(other));
    }

    /// Puts a reservation of these GPUs in the state, for `holder`.
    fn seed(&self, id: &str, name: &str, gpus: &[Unit], phase: Phase, init: Option<ProcRef>) {
        store(&self.cfg)
            .update(|st| {
                st.reservations.insert(
                    id.to_string(),
                    Reservation {
                        kind: HolderKind::Libvirt,
                        domain: name.into(),
                        uuid: id.into(),
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
                    },
                );
                Ok::<_, Error>(())
            })
            .unwrap();
    }
}

/// An NVIDIA CDI spec whose GPU 0 is the host's `/dev/null` (1:3), GPU 1 `/dev/zero` (1:5):
/// a common node (`/dev/full`, 1:7) and one driver mount.
const SPEC: &str = r#"---
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
    Holder {
        kind: HolderKind::Libvirt,
        name: "web1",
        id: ID,
        idmap,
    }
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
    }
}

fn found() -> Result<Container, ContainerError> {
    Ok(container())
}

/// A host whose GPUs 0 and 1 are `/dev/null` and `/dev/zero` (what [`SPEC`] names).
fn cdi_host() -> Host {
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

// ---- activate ----

#[test]
fn activate_grants_creates_and_records_the_container() {
    let h = host();
    h.seed(ID, "web1", &[pci(0), pci(1)], Phase::Prepared, None);
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    h.with(&fake, |f| activate_with(f, &holder(&idmap), &req(2), found))
        .unwrap();
    assert_eq!(
        fake.calls(),
        [
            "allow 195:0",
            "allow 195:1",
            "create /dev/nvidia0 /dev/nvidia1"
        ]
    );
    let r = &h.state().reservations[ID];
    assert_eq!(
        (r.phase, r.init, r.controller),
        (Phase::Running, Some(INIT), Some(CTRL))
    );
    assert_eq!(r.nodes.len(), 2);
}

#[test]
fn activate_grant_failure_leaves_nothing() {
    let h = host();
    h.seed(ID, "web1", &[pci(0), pci(1)], Phase::Prepared, None);
    let fake = h.fake(Fake {
        fail_allow: Some(1),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate_with(f, &holder(&idmap), &req(2), found))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "cgroup /fake: granting /dev/nvidia1 (195:1): Operation not permitted"
    );
    assert_eq!(fake.calls(), ["allow 195:0", "allow 195:1", "revoke 195:0"]);
    assert!(fake.allowed.borrow().is_empty());
    assert_eq!(h.state().reservations[ID].phase, Phase::Prepared);
}

#[test]
fn activate_node_failure_revokes_the_grants() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused(
            "/dev/nvidia0: a symlink is in the way".into(),
        )),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate_with(f, &holder(&idmap), &req(1), found))
        .unwrap_err();
    assert_eq!(e.to_string(), "/dev/nvidia0: a symlink is in the way");
    assert_eq!(
        fake.calls(),
        ["allow 195:0", "create /dev/nvidia0", "revoke 195:0"]
    );
    assert!(fake.allowed.borrow().is_empty());
    let r = &h.state().reservations[ID];
    assert_eq!((r.phase, r.init), (Phase::Prepared, None));
}

#[test]
fn activate_says_what_a_failed_rollback_left() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused("no space".into())),
        fail_revoke: true,
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate_with(f, &holder(&idmap), &req(1), found))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "no space; rollback incomplete: cgroup /fake: No such file or directory"
    );
    assert!(matches!(e, Error::RollbackIncomplete { .. }), "{e:?}");
}

#[test]
fn activate_cdi_inject_failure_removes_nodes_and_revokes() {
    let h = cdi_host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let fake = h.fake(Fake {
        fail_inject: true,
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| {
            activate_with(f, &holder(&idmap), &cdi_req(1), found)
        })
        .unwrap_err();
    assert_eq!(e.to_string(), "mount over /usr/lib: Permission denied");
    assert_eq!(
        fake.calls(),
        [
            "allow 1:3",
            "allow 1:7",
            "create /dev/null /dev/full",
            "inject /usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03",
            "remove /dev/null /dev/full",
            "revoke 1:7",
            "revoke 1:3",
        ]
    );
    assert!(fake.allowed.borrow().is_empty());
    assert_eq!(h.state().reservations[ID].phase, Phase::Prepared);
}

#[test]
fn activate_cdi_records_the_driver_mounts() {
    let h = cdi_host();
    h.activated(&[pci(0)], &cdi_req(1));
    let r = &h.state().reservations[ID];
    assert_eq!(r.phase, Phase::Running);
    assert_eq!(
        r.mounts
            .iter()
            .map(|m| m.target.as_str())
            .collect::<Vec<_>>(),
        ["/usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03"]
    );
    assert_eq!(r.nodes.iter().map(num).collect::<Vec<_>>(), ["1:3", "1:7"]);
}

#[test]
fn activate_init_gone_says_so_without_a_rollback_note() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    // The helper found the init gone, and its cgroup went with it (the revoke fails).
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::InitGone {
            pid: INIT.pid,
            cause: Some("setns: No such process".into()),
        }),
        fail_revoke: true,
        init_exits_in: Some("create"),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate_with(f, &holder(&idmap), &req(1), found))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "container init 4242 exited during started (setns: No such process)"
    );
    assert_eq!(
        fake.calls(),
        ["allow 195:0", "create /dev/nvidia0", "revoke 195:0"]
    );
}

#[test]
fn activate_init_exit_seen_from_proc_is_said_first() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    // Not said by the helper: the init is looked at (gone from the fake /proc).
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Other("reply: broken pipe".into())),
        init_exits_in: Some("create"),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate_with(f, &holder(&idmap), &req(1), found))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "container init 4242 exited during started (reply: broken pipe)"
    );
}

#[test]
fn activate_init_gone_during_inject_leaves_no_rollback_note() {
    let h = cdi_host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let fake = h.fake(Fake {
        fail_inject: true,
        fail_revoke: true,
        init_exits_in: Some("inject"),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| {
            activate_with(f, &holder(&idmap), &cdi_req(1), found)
        })
        .unwrap_err();
    // The undo is tried, but what it could not do went with the init's cgroup and /dev.
    assert_eq!(e.to_string(), "mount over /usr/lib: Permission denied");
    assert!(fake
        .calls()
        .contains(&"remove /dev/null /dev/full".to_string()));
}

#[test]
fn activate_without_a_reservation_touches_nothing() {
    let h = host();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate_with(f, &holder(&idmap), &req(1), found))
        .unwrap_err();
    assert!(e.to_string().starts_with("holds no GPU reservation"), "{e}");
    assert!(fake.calls().is_empty());
    // Nor when the container cannot be found.
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let e = h
        .with(&fake, |f| {
            activate_with(f, &holder(&idmap), &req(1), || {
                Err(ContainerError::Other("no libvirt_lxc controller".into()))
            })
        })
        .unwrap_err();
    assert_eq!(e.to_string(), "no libvirt_lxc controller");
    assert!(fake.calls().is_empty());
}

// ---- readopt ----

#[test]
fn readopt_consistent_keeps_the_reservation_and_remakes_nodes() {
    let h = host();
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 2)]),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt_with(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    // Already granted: not granted again; the node is made again.
    assert_eq!(fake.calls(), ["create /dev/nvidia2"]);
    let r = &h.state().reservations[ID];
    assert_eq!((r.gpus.clone(), r.init), (vec![pci(2)], Some(INIT)));
}

#[test]
fn readopt_regrants_what_the_cgroup_lost() {
    let h = host();
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt_with(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    assert_eq!(fake.calls(), ["allow 195:2", "create /dev/nvidia2"]);
}

#[test]
fn readopt_readopts_from_the_cgroups_exact_grants() {
    let h = host();
    // The state lost it; the cgroup grants GPU 5 exactly.
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 5)]),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt_with(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    assert_eq!(fake.calls(), ["create /dev/nvidia5"]);
    let r = &h.state().reservations[ID];
    assert_eq!(
        (r.gpus.clone(), r.phase, r.init, r.controller),
        (vec![pci(5)], Phase::Running, Some(INIT), Some(CTRL))
    );
}

#[test]
fn readopt_takes_away_grants_beyond_the_request() {
    let h = host();
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 3), (195, 6)]),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt_with(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    assert_eq!(fake.calls(), ["deny 195:6", "create /dev/nvidia3"]);
    assert_eq!(*fake.allowed.borrow(), [(195, 3)]);
    assert_eq!(h.state().reservations[ID].gpus, [pci(3)]);
}

#[test]
fn readopt_inconsistent_when_its_gpu_is_anothers() {
    let h = host();
    h.other_running(&[pci(3)]);
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 3)]),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt_with(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Inconsistent);
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    let st = h.state();
    assert!(!st.reservations.contains_key(ID));
    assert_eq!(st.reservations["other-uuid"].gpus, [pci(3)]);
}

#[test]
fn readopt_reclaims_a_stale_holder_of_its_gpu() {
    let h = host();
    // The other domain's init is gone (not in the fake /proc): its reservation is stale.
    let gone = ProcRef {
        pid: 6161,
        start_time: 1,
    };
    h.seed("other-uuid", "web2", &[pci(3)], Phase::Running, Some(gone));
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 3)]),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt_with(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    let st = h.state();
    assert!(!st.reservations.contains_key("other-uuid"));
    assert_eq!(st.reservations[ID].gpus, [pci(3)]);
}

#[test]
fn readopt_inconsistent_when_its_dev_refuses_a_node() {
    let h = host();
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused(
            "/dev is not libvirt's tmpfs".into(),
        )),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt_with(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Inconsistent);
    assert_eq!(
        fake.calls(),
        ["allow 195:2", "create /dev/nvidia2", "revoke 195:2"]
    );
}

#[test]
fn readopt_inconsistent_when_the_container_is_not_found() {
    let h = host();
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| {
        readopt_with(f, &holder(&idmap), &req(1), || {
            Err(ContainerError::InitGone {
                pid: INIT.pid,
                cause: None,
            })
        })
    });
    assert_eq!(r, Readopted::Inconsistent);
    assert!(fake.calls().is_empty());
}

#[test]
fn readopt_leaves_it_alone_when_gpuhooks_own_files_are_broken() {
    // The inventory cannot be read.
    let h = host();
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake {
        no_inventory: true,
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt_with(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::LeftAlone);
    assert!(fake.calls().is_empty());
    // The state file is not gpuhook's JSON.
    std::fs::write(&h.cfg.state_file, "{ not json").unwrap();
    let fake = h.fake(Fake::default());
    let r = h.with(&fake, |f| readopt_with(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::LeftAlone);
    assert!(fake.calls().is_empty());
    assert_eq!(
        std::fs::read_to_string(&h.cfg.state_file).unwrap(),
        "{ not json"
    );
}

#[test]
fn readopt_checks_the_driver_mounts_it_recorded() {
    let h = cdi_host();
    h.activated(&[pci(0)], &cdi_req(1));
    let idmap = IdMap::default();
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(1, 3), (1, 7)]),
        ..Default::default()
    });
    let r = h.with(&fake, |f| {
        readopt_with(f, &holder(&idmap), &cdi_req(1), found)
    });
    assert_eq!(r, Readopted::Consistent);
    assert_eq!(
        fake.calls(),
        ["check 1 mount(s)", "create /dev/null /dev/full"]
    );
}

// ---- reserve, confirm, free ----

impl Host {
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

fn all_of(id: &'static str) -> impl FnOnce(&State) -> Vec<(String, ())> {
    move |st| {
        st.reservations
            .keys()
            .filter(|k| *k == id)
            .map(|k| (k.clone(), ()))
            .collect()
    }
}

#[test]
fn free_drains_a_unit_a_process_keeps_open() {
    // GPU 0 is /dev/null here, GPU 1 /dev/zero: process 4300 has GPU 0 really open, 4301
    // holds only an O_PATH descriptor on GPU 1 (which holds nothing).
    let h = cdi_host();
    h.opener(4300, "/dev/null", "0100002");
    h.opener(4301, "/dev/zero", "010000000");
    h.seed(ID, "web1", &[pci(0), pci(1)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake::default());
    let out = h.with(&fake, |f| free_with(f, all_of(ID), |_| {})).unwrap();
    assert_eq!(out.freed.len(), 1);
    assert_eq!(out.freed[0].0.gpus, vec![pci(0), pci(1)]);
    let st = h.state();
    assert!(st.reservations.is_empty());
    assert_eq!(crate::reserve::drain::unit_pids(&st, &pci(0)), vec![4300]);
    assert!(!st.draining.contains_key(&pci(1)), "{:?}", st.draining);
    assert_eq!(
        out.drained
            .draining
            .iter()
            .map(|(u, _)| *u)
            .collect::<Vec<_>>(),
        vec![pci(0)]
    );
    // Nothing the fake container was asked to do: a free touches no container.
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[test]
fn free_without_an_inventory_frees_and_drains_nothing() {
    let h = cdi_host();
    h.opener(4300, "/dev/null", "0100002");
    h.seed(ID, "web1", &[pci(0)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake {
        no_inventory: true,
        ..Fake::default()
    });
    let out = h.with(&fake, |f| free_with(f, all_of(ID), |_| {})).unwrap();
    assert_eq!(out.freed.len(), 1);
    let st = h.state();
    assert!(st.reservations.is_empty() && st.draining.is_empty());
}

#[test]
fn free_takes_only_what_is_chosen_and_runs_then_in_the_same_step() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Running, Some(INIT));
    h.seed("other-uuid", "web2", &[pci(1)], Phase::Running, None);
    let fake = h.fake(Fake::default());
    let seen = Cell::new(false);
    let out = h
        .with(&fake, |f| {
            free_with(
                f,
                |_| vec![(ID.to_string(), "why"), ("no-such-id".to_string(), "x")],
                |st| {
                    // Under the same lock: the freed one is out, the other still in.
                    assert!(!st.reservations.contains_key(ID));
                    assert!(st.reservations.contains_key("other-uuid"));
                    seen.set(true);
                },
            )
        })
        .unwrap();
    assert!(seen.get());
    assert_eq!(out.freed.len(), 1);
    assert_eq!(out.freed[0].1, "why");
    assert_eq!(
        h.state().reservations.keys().collect::<Vec<_>>(),
        vec!["other-uuid"]
    );
}

#[test]
fn reserve_confirm_activate_free_in_memory() {
    let h = host();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let who = holder(&idmap);
    h.with(&fake, |f| reserve_with(f, &who, &req(2))).unwrap();
    let gpus = h.state().reservations[ID].gpus.clone();
    assert_eq!(gpus.len(), 2);
    h.with(&fake, |f| confirm_with(f, &who, &req(2))).unwrap();
    h.with(&fake, |f| activate_with(f, &who, &req(2), found))
        .unwrap();
    // A reserve again with the same request keeps the GPUs.
    h.with(&fake, |f| reserve_with(f, &who, &req(2))).unwrap();
    assert_eq!(h.state().reservations[ID].gpus, gpus);
    assert!(free(&h.cfg, HolderKind::Oci, ID).unwrap().is_none());
    assert!(free(&h.cfg, HolderKind::Libvirt, ID).unwrap().is_some());
    assert!(h.state().reservations.is_empty());
}

#[test]
fn reserve_reclaims_a_stale_reservation_only_when_needed() {
    let h = host();
    let gone = ProcRef {
        pid: 6161,
        start_time: 1,
    };
    let all: Vec<Unit> = (0..8).map(pci).collect();
    h.seed("other-uuid", "web2", &all, Phase::Running, Some(gone));
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    h.with(&fake, |f| reserve_with(f, &holder(&idmap), &req(1)))
        .unwrap();
    let st = h.state();
    assert!(!st.reservations.contains_key("other-uuid"));
    assert_eq!(st.reservations[ID].gpus.len(), 1);
}

// ---- the OCI door's reserve (its token), MIG ----

impl Host {
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
    Holder {
        kind: HolderKind::Oci,
        name: "ctr1",
        id: "ctr1",
        idmap,
    }
}

#[test]
fn oci_reserve_is_held_by_the_create_that_made_it() {
    let h = host();
    let me = h.this_process();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let who = oci_holder(&idmap);
    let ((specs, _), by) = h
        .with(&fake, |f| reserve_nodes_with(f, &who, &req(1)))
        .unwrap();
    // The token its hooks carry is this process, as the fake /proc knows it.
    assert_eq!(by, me);
    let r = h.state().reservations["ctr1"].clone();
    assert_eq!(
        (r.kind, r.phase, r.prepared_by),
        (HolderKind::Oci, Phase::Prepared, Some(me))
    );
    assert_eq!(r.nodes, as_nodes(&specs));
    assert_eq!(r.gpus.len(), 1);
    // The same create again keeps its GPU; another live create of the ID is refused.
    h.with(&fake, |f| reserve_nodes_with(f, &who, &req(1)))
        .unwrap();
    assert_eq!(h.state().reservations["ctr1"].gpus, r.gpus);
    let other = ProcRef {
        pid: 4300,
        start_time: 900,
    };
    h.process(other, 1);
    store(&h.cfg)
        .update(|st| {
            st.reservations.get_mut("ctr1").unwrap().prepared_by = Some(other);
            Ok::<_, Error>(())
        })
        .unwrap();
    let e = h
        .with(&fake, |f| reserve_nodes_with(f, &who, &req(1)))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "another create of this container ID holds GPUs {} (runtime pid 4300)",
            r.gpus[0]
        )
    );
    // A libvirt domain may not take the OCI container's key.
    let e = h
        .with(&fake, |f| {
            reserve_with(f, &holder_with_id(&idmap, "ctr1"), &req(1))
        })
        .unwrap_err();
    assert!(e.to_string().contains("ctr1"), "{e}");
}

fn holder_with_id<'a>(idmap: &'a IdMap, id: &'a str) -> Holder<'a> {
    Holder {
        id,
        ..holder(idmap)
    }
}

#[test]
fn mig_reserve_and_activate_give_the_instances_capabilities() {
    use crate::reserve::alloc::tests::with_migs;
    let mut h = host();
    h.inv.gpus[0] = with_migs(h.inv.gpus[0].clone(), &[(1, 0), (2, 0), (2, 1)]);
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let mut r = req(2);
    r.mig = true;
    h.with(&fake, |f| reserve_with(f, &holder(&idmap), &r))
        .unwrap();
    let gpus = h.state().reservations[ID].gpus.clone();
    assert!(
        gpus.iter().all(|u| u.is_mig() && u.pci() == pci(0).pci()),
        "{gpus:?}"
    );
    assert_eq!(gpus.len(), 2);
    h.with(&fake, |f| activate_with(f, &holder(&idmap), &r, found))
        .unwrap();
    let calls = fake.calls();
    // The parent GPU's node and each instance's GPU-instance and compute-instance
    // capabilities are granted and made.
    for cap in gpus.iter().flat_map(|u| {
        let (gi, ci) = (u.gi().unwrap(), u.to_string());
        let ci: u32 = ci.rsplit("/ci").next().unwrap().parse().unwrap();
        [gi * 9, gi * 9 + 1 + ci]
    }) {
        assert!(
            calls.iter().any(|c| c == &format!("allow 236:{cap}")),
            "cap {cap} not granted: {calls:?}"
        );
    }
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("create ") && c.contains("nvidia-caps")),
        "{calls:?}"
    );
    // Freed, nothing of it is left reserved.
    assert!(free(&h.cfg, HolderKind::Libvirt, ID).unwrap().is_some());
    assert!(h.state().reservations.is_empty());
}

// ---- attach ----

impl Host {
    /// `attach` of `r` for `web1`, found running, on this host and `fake`.
    fn attach(&self, fake: &Rc<Fake>, r: &Request) -> Result<Attached, Error> {
        let idmap = IdMap::default();
        self.with(fake, |f| attach_with(f, &holder(&idmap), r, found))
    }
}

/// `/dev/nvidiactl` and `/dev/nvidia-modeset` on the test host: one control node every NVIDIA
/// container gets, one that comes with `graphics`.
fn with_controls(h: &mut Host) {
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
impl Host {
    /// `web1` reserved `gpus` (prepared) and `started` with `req` on a fake host that lets
    /// everything through; the fake it ran on.
    fn activated(&self, gpus: &[Unit], req: &Request) -> Rc<Fake> {
        self.seed(ID, "web1", gpus, Phase::Prepared, None);
        let fake = self.fake(Fake::default());
        let idmap = IdMap::default();
        self.with(&fake, |f| activate_with(f, &holder(&idmap), req, found))
            .unwrap();
        fake
    }
}

fn running_on_gpu0(h: &Host, r: &Request) -> Rc<Fake> {
    let fake = h.activated(&[pci(0)], r);
    let allowed = fake.allowed.borrow().clone();
    h.fake(Fake {
        allowed: RefCell::new(allowed),
        ..Default::default()
    })
}

fn state_bytes(h: &Host) -> Vec<u8> {
    std::fs::read(&h.cfg.state_file).unwrap()
}

/// A request for these GPUs of the test host by index.
fn req_of(ix: &[usize]) -> Request {
    let mut r = req(ix.len() as u32);
    r.devices = ix.iter().map(|i| DeviceSel::Index(*i as u32)).collect();
    r
}

#[test]
fn attach_adds_to_a_running_reservation_only_the_new_nodes() {
    let mut h = host();
    with_controls(&mut h);
    let fake = running_on_gpu0(&h, &req(1));
    let got = h.attach(&fake, &req(1)).unwrap();
    assert_eq!(got.units.len(), 1);
    let u = got.units[0];
    assert_ne!(u, pci(0));
    let n = h.inv.by_unit(&u).unwrap().nodes[0].1.node.clone();
    // nvidiactl: granted and made at started, neither again (nor taken back by a rollback).
    assert_eq!(
        fake.calls(),
        [format!("allow {}", num(&n)), format!("create {}", n.path)]
    );
    assert_eq!(paths(&got.nodes), n.path);
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(0), u]);
    assert_eq!(
        (r.phase, r.init, r.hotplugged),
        (Phase::Running, Some(INIT), true)
    );
    assert_eq!(
        r.nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
        ["/dev/nvidia0", "/dev/nvidiactl", n.path.as_str()]
    );
    // A second attach does not take what it holds again.
    let more = h.attach(&fake, &req(2)).unwrap();
    assert!(more.units.iter().all(|m| *m != pci(0) && *m != u));
    assert_eq!(h.state().reservations[ID].gpus.len(), 4);
}

#[test]
fn attach_to_a_container_without_a_reservation_makes_a_running_one() {
    let h = host();
    let fake = h.fake(Fake::default());
    let got = h.attach(&fake, &req_of(&[3, 4])).unwrap();
    assert_eq!(got.units, [pci(3), pci(4)]);
    assert_eq!(
        fake.calls(),
        [
            "allow 195:3",
            "allow 195:4",
            "create /dev/nvidia3 /dev/nvidia4"
        ]
    );
    let r = h.state().reservations[ID].clone();
    assert_eq!(
        (r.kind, r.phase, r.init, r.controller, r.hotplugged),
        (
            HolderKind::Libvirt,
            Phase::Running,
            Some(INIT),
            Some(CTRL),
            true
        )
    );
    assert_eq!(
        r.nodes.iter().map(num).collect::<Vec<_>>(),
        ["195:3", "195:4"]
    );
    // Its init lives: not stale; once it is gone, it is.
    let alive = |_: &str| true;
    assert_eq!(stale_on(&r, Proc { root: &h.proc }, &alive), None);
    std::fs::remove_file(h.cfg.proc.join(INIT.pid.to_string()).join("stat")).unwrap();
    assert!(stale_on(&r, Proc { root: &h.proc }, &alive).is_some());
    // A stop frees it with the rest.
    assert!(free(&h.cfg, HolderKind::Libvirt, ID).unwrap().is_some());
    assert!(h.state().reservations.is_empty());
}

#[test]
fn attach_refused_when_not_enough_units_changes_nothing() {
    let h = host();
    h.other_running(&(1..7).map(pci).collect::<Vec<_>>());
    h.seed(ID, "web1", &[pci(0)], Phase::Running, Some(INIT));
    let before = state_bytes(&h);
    let fake = h.fake(Fake::default());
    let e = h.attach(&fake, &req(2)).unwrap_err();
    assert_eq!(e.to_string(), "cannot reserve 2 GPUs: only 1 of the host's 8 matching GPUs is free: 7 held by domain 'web1', domain 'web2'");
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    assert_eq!(state_bytes(&h), before);
    // A GPU it names that another holds: that holder named.
    let e = h.attach(&fake, &req_of(&[2])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "GPU 0000:12:00.0 (index 2) is held by domain 'web2'"
    );
    assert_eq!(state_bytes(&h), before);
}

#[test]
fn attach_refused_to_a_prepared_or_other_reservation() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let before = state_bytes(&h);
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let attach = |r: &Request| h.attach(&fake, r).unwrap_err().to_string();
    assert_eq!(
        attach(&req(1)),
        "its GPU reservation is prepared but not running: attach gives GPUs to a running container"
    );
    assert_eq!(state_bytes(&h), before);
    // A reservation recording another init (the container restarted, reconnect did not run).
    let old = Some(ProcRef { pid: 4100, ..INIT });
    h.seed(ID, "web1", &[pci(0)], Phase::Running, old);
    let before_other = state_bytes(&h);
    assert_eq!(
        attach(&req(1)),
        "its GPU reservation records container init 4100, but its init now is 4242: not the running container (did reconnect run?)"
    );
    assert_eq!(state_bytes(&h), before_other);
    // Not running: what finding it said.
    let e = h
        .with(&fake, |f| {
            attach_with(f, &holder(&idmap), &req(1), || {
                Err(ContainerError::Other("domain is not running".into()))
            })
        })
        .unwrap_err();
    assert_eq!(e.to_string(), "domain is not running");
    // An OCI container's key.
    let e = h
        .with(&fake, |f| {
            let oci = Holder {
                kind: HolderKind::Oci,
                ..holder(&idmap)
            };
            attach_with(f, &oci, &req(1), found)
        })
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("its id {ID} is already the key of domain 'web1''s reservation")
    );
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[test]
fn attach_rolls_back_when_a_grant_fails() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Running, Some(INIT));
    let before = h.state().reservations[ID].nodes.clone();
    let fake = h.fake(Fake {
        fail_allow: Some(4),
        ..Default::default()
    });
    let e = h.attach(&fake, &req_of(&[3, 4])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cgroup /fake: granting /dev/nvidia4 (195:4): Operation not permitted"
    );
    assert_eq!(fake.calls(), ["allow 195:3", "allow 195:4", "revoke 195:3"]);
    assert!(fake.allowed.borrow().is_empty());
    let r = &h.state().reservations[ID];
    assert_eq!((r.gpus.clone(), r.hotplugged), (vec![pci(0)], false));
    assert_eq!(
        r.nodes, before,
        "the nodes the reserve recorded go with the units"
    );
    // A reservation the attach made is deleted.
    let h = host();
    let e = h.attach(&fake, &req_of(&[4]));
    assert!(e.is_err());
    assert!(h.state().reservations.is_empty());
}

#[test]
fn attach_rolls_back_when_a_node_cannot_be_made() {
    let h = host();
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused(
            "/dev/nvidia2: a symlink is in the way".into(),
        )),
        ..Default::default()
    });
    let e = h.attach(&fake, &req_of(&[2])).unwrap_err();
    assert_eq!(e.to_string(), "/dev/nvidia2: a symlink is in the way");
    assert_eq!(
        fake.calls(),
        ["allow 195:2", "create /dev/nvidia2", "revoke 195:2"]
    );
    assert!(h.state().reservations.is_empty());
}

#[test]
fn attach_keeps_the_units_reserved_while_a_grant_could_not_be_revoked() {
    let h = host();
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused("no space".into())),
        fail_revoke: true,
        ..Default::default()
    });
    let e = h.attach(&fake, &req_of(&[2])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "no space; rollback incomplete: cgroup /fake: No such file or directory; GPUs 0000:12:00.0 stay reserved for domain 'web1'"
    );
    assert!(matches!(e, Error::RollbackIncomplete { .. }), "{e:?}");
    // The container may still open it: no one else may get it.
    assert_eq!(h.state().reservations[ID].gpus, [pci(2)]);
}

#[test]
fn attach_killed_at_its_grant_leaves_the_grant_for_detach_to_take_back() {
    let h = host_with_controls();
    h.running_with(&[pci(0)], &req(1));
    let fake = h.fake(Fake {
        state_at_allow: Some(h.cfg.state_file.clone()),
        ..Default::default()
    });
    h.attach(&fake, &req_of(&[1])).unwrap();
    // Killed at the grant: the state as it found it, the grant made.
    std::fs::write(&h.cfg.state_file, fake.seen_at_allow.take().unwrap()).unwrap();
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(0), pci(1)]);
    assert!(r.nodes.iter().any(|n| n.path == "/dev/nvidia1"), "{r:?}");
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), false);
    assert_eq!(out.unwrap().units, [pci(1)]);
    assert_eq!(denied(&fake), ["deny 195:1"]);
    assert!(!fake.allowed.borrow().contains(&(195, 1)));
    assert_eq!(h.state().reservations[ID].gpus, [pci(0)]);
}

#[test]
fn attach_whose_grant_stays_records_it_for_detach_to_take_back() {
    let h = host();
    h.in_ns(INIT.pid, CT_NS);
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused("no space".into())),
        fail_revoke: true,
        ..Default::default()
    });
    assert!(h.attach(&fake, &req_of(&[2])).is_err());
    assert_eq!(*fake.allowed.borrow(), [(195, 2)]);
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(2)]);
    assert_eq!(r.nodes.iter().map(num).collect::<Vec<_>>(), ["195:2"]);
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    assert_eq!(out.unwrap().units, [pci(2)]);
    assert_eq!(denied(&fake), ["deny 195:2"]);
}

#[test]
fn attach_leaves_the_containers_own_nodes_to_it() {
    // The container's own `--device /dev/nvidiactl` (195:255): allowed before gpuhook.
    let h = host_with_controls();
    h.in_ns(INIT.pid, CT_NS);
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 255)]),
        state_at_allow: Some(h.cfg.state_file.clone()),
        ..Default::default()
    });
    let got = h.attach(&fake, &req_of(&[3])).unwrap();
    assert_eq!(
        fake.calls(),
        [
            "allow 195:3",
            "allow 510:0",
            "create /dev/nvidia3 /dev/nvidia-uvm"
        ]
    );
    assert_eq!(paths(&got.nodes), "/dev/nvidia3 /dev/nvidia-uvm");
    let recorded = |st: &State| {
        let r = &st.reservations[ID];
        r.nodes.iter().map(num).collect::<Vec<_>>()
    };
    assert_eq!(recorded(&h.state()), ["195:3", "510:0"]);
    // Recorded before the grant (a kill there leaves them for detach), its own not.
    let seen = State::parse(&fake.seen_at_allow.take().unwrap(), "seen").unwrap();
    assert_eq!(recorded(&seen), ["195:3", "510:0"]);
    // Detach takes back only what gpuhook granted: the container keeps its nvidiactl.
    let own = Fake {
        allowed: RefCell::new(vec![(195, 255)]),
        ..Default::default()
    };
    let (fake, out) = h.detach(own, Which::All, false);
    assert_eq!(out.unwrap().units, [pci(3)]);
    assert_eq!(
        fake.calls(),
        [
            "deny 195:3",
            "deny 510:0",
            "remove /dev/nvidia3 /dev/nvidia-uvm"
        ]
    );
    assert_eq!(*fake.allowed.borrow(), [(195, 255)]);
}

#[test]
fn attach_under_a_wildcard_rule_grants_makes_and_records_none_of_its_nodes() {
    // `c 195:* rwm` of the container's own: every NVIDIA node of major 195 is its already.
    let h = host_with_controls();
    h.in_ns(INIT.pid, CT_NS);
    let wild = || Fake {
        wildcard: Some(195),
        ..Default::default()
    };
    let fake = h.fake(wild());
    let got = h.attach(&fake, &req_of(&[3])).unwrap();
    assert_eq!(got.units, [pci(3)]);
    assert_eq!(fake.calls(), ["allow 510:0", "create /dev/nvidia-uvm"]);
    let r = &h.state().reservations[ID];
    assert_eq!(r.nodes.iter().map(num).collect::<Vec<_>>(), ["510:0"]);
    // Detach takes back only the grant gpuhook made, and frees the GPU: nothing of
    // gpuhook's lets the container open it (its own rule did before gpuhook, as any GPU).
    let (fake, out) = h.detach(wild(), Which::All, false);
    assert_eq!(out.unwrap().units, [pci(3)]);
    assert_eq!(fake.calls(), ["deny 510:0", "remove /dev/nvidia-uvm"]);
}

#[test]
fn mig_attach_gives_free_instances_and_their_capabilities() {
    use crate::reserve::alloc::tests::with_migs;
    let mut h = host();
    h.inv.gpus[0] = with_migs(h.inv.gpus[0].clone(), &[(1, 0), (2, 0)]);
    let gi = |g: u32| Unit::Mig {
        pci: pci(0).pci(),
        gi: g,
        ci: 0,
    };
    let mut r = req(1);
    r.mig = true;
    h.seed(ID, "web1", &[gi(1)], Phase::Prepared, None);
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    h.with(&fake, |f| activate_with(f, &holder(&idmap), &r, found))
        .unwrap();
    let fake = h.fake(Fake {
        allowed: RefCell::new(fake.allowed.borrow().clone()),
        ..Default::default()
    });
    let got = h.attach(&fake, &r).unwrap();
    // Its own gi1 counts as held: gi2, with its two capabilities; the GPU's node, granted
    // and made for gi1, neither again.
    assert_eq!(got.units, [gi(2)]);
    assert_eq!(
        fake.calls(),
        [
            "allow 236:18",
            "allow 236:19",
            "create /dev/nvidia-caps/nvidia-cap18 /dev/nvidia-caps/nvidia-cap19"
        ]
    );
    assert_eq!(h.state().reservations[ID].gpus, [gi(1), gi(2)]);
    // None left: refused, naming the holder.
    let e = h.attach(&fake, &r).unwrap_err();
    assert_eq!(e.to_string(), "cannot reserve 1 MIG instance: only 0 of the host's 2 MIG instances on matching GPUs are free: held by domain 'web1'");
}

#[test]
fn readopt_keeps_a_hotplugged_reservation_as_it_is() {
    let mut h = host();
    with_controls(&mut h);
    let fake = running_on_gpu0(&h, &req(1));
    let idmap = IdMap::default();
    // Attached with graphics: the GPU and /dev/nvidia-modeset, beyond what the XML asks.
    let mut gfx = req_of(&[5]);
    gfx.capabilities.graphics = true;
    h.attach(&fake, &gfx).unwrap();
    let kept = h.state().reservations[ID].clone();
    // libvirtd restarted and the cgroup lost its grants: the XML asks for 1 GPU.
    let fake = h.fake(Fake::default());
    let r = h.with(&fake, |f| readopt_with(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    assert_eq!(
        fake.calls(),
        [
            "allow 195:0",
            "allow 195:5",
            "allow 195:255",
            "allow 195:254",
            "create /dev/nvidia0 /dev/nvidia5 /dev/nvidiactl /dev/nvidia-modeset"
        ]
    );
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(0), pci(5)]);
    assert!(r.hotplugged);
    let mut want = kept.nodes.clone();
    want.sort();
    let mut got = r.nodes.clone();
    got.sort();
    assert_eq!(got, want);
}

// ---- detach ----

/// The PID namespace of the container's init, and the host's.
const CT_NS: &str = "pid:[4026532001]";
const HOST_NS: &str = "pid:[4026531836]";

impl Host {
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
        let out = self.with(&fake, |f| {
            detach_with(f, &holder(&idmap), &which, force, found)
        });
        (fake, out)
    }
}

/// A host with NVIDIA's control nodes (`nvidiactl` 195:255, `nvidia-uvm` 510:0).
fn host_with_controls() -> Host {
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

#[test]
fn detach_one_of_two_gpus_takes_back_its_own_nodes_only() {
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), false);
    let out = out.unwrap();
    assert_eq!(out.units, [pci(1)]);
    assert!(out.kept_open.is_empty() && out.draining.is_empty());
    // Its own node: the control nodes the other GPU needs stay.
    assert_eq!(fake.calls(), ["deny 195:1", "remove /dev/nvidia1"]);
    assert_eq!(*fake.allowed.borrow(), [(195, 0), (195, 255), (510, 0)]);
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(0)]);
    assert_eq!(
        r.nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
        ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    );
    assert!(r.hotplugged && r.phase == Phase::Running && r.init == Some(INIT));
}

#[test]
fn detach_all_takes_back_every_node_and_keeps_the_reservation() {
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    assert_eq!(out.unwrap().units, [pci(0), pci(1)]);
    assert_eq!(
        fake.calls(),
        [
            "deny 195:0",
            "deny 195:1",
            "deny 195:255",
            "deny 510:0",
            "remove /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl /dev/nvidia-uvm",
        ]
    );
    assert!(fake.allowed.borrow().is_empty());
    // The container keeps running: its (empty) reservation stays until it stops.
    let r = &h.state().reservations[ID];
    assert!(r.gpus.is_empty() && r.nodes.is_empty() && r.hotplugged);
    assert_eq!(r.phase, Phase::Running);
    // Nothing left to detach.
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    assert_eq!(out.unwrap_err().to_string(), "holds no GPU to detach");
    assert!(fake.calls().is_empty());
}

#[test]
fn detach_refuses_a_selector_of_a_gpu_it_does_not_hold() {
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let before = h.state();
    for (which, want) in [
        (
            Which::Units(vec![DeviceSel::Index(5)]),
            "index 5 names no GPU it holds (it holds 0000:10:00.0,0000:11:00.0)",
        ),
        (
            Which::Units(vec![
                DeviceSel::Pci(pci(0).to_string()),
                DeviceSel::Pci("0000:99:00.0".into()),
            ]),
            "pci 0000:99:00.0 names no GPU it holds (it holds 0000:10:00.0,0000:11:00.0)",
        ),
        (
            Which::Units(vec![DeviceSel::Uuid("gpu-00000003".into())]),
            "uuid gpu-00000003 names no GPU it holds (it holds 0000:10:00.0,0000:11:00.0)",
        ),
    ] {
        let (fake, out) = h.detach(Fake::default(), which, false);
        assert_eq!(out.unwrap_err().to_string(), want);
        assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    }
    assert_eq!(h.state(), before);
    // A UUID and an index of a GPU it holds are its.
    let (_, out) = h.detach(
        Fake::default(),
        Which::Units(vec![DeviceSel::Uuid("gpu-00000001".into())]),
        false,
    );
    assert_eq!(out.unwrap().units, [pci(1)]);
}

/// A container running with GPUs 0 (`/dev/null`) and 1 (`/dev/zero`), which process `pid`
/// (command `comm`, in PID namespace `ns`) has open.
fn gpu1_open_by(pid: i32, ns: &str, comm: &str) -> Host {
    let h = cdi_host();
    h.running_with(&[pci(0), pci(1)], &req(2));
    h.opener_in(pid, "/dev/zero", ns, comm);
    h
}

#[test]
fn detach_refuses_a_gpu_a_container_process_has_open() {
    let h = gpu1_open_by(4300, CT_NS, "python3");
    let before = h.state();
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "GPU 0000:11:00.0 is open in the container: process 4300 (python3); close it or detach with --force"
    );
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    assert_eq!(h.state(), before);
    // The other GPU is not open: it goes.
    let (_, out) = h.detach(Fake::default(), sel(pci(0)), false);
    assert_eq!(out.unwrap().units, [pci(0)]);
}

#[test]
fn detach_with_force_goes_ahead_and_the_open_gpu_drains() {
    let h = gpu1_open_by(4300, CT_NS, "python3");
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), true);
    let out = out.unwrap();
    let p = ProcRef {
        pid: 4300,
        start_time: 900,
    };
    assert_eq!(out.units, [pci(1)]);
    assert_eq!(out.kept_open, [(pci(1), vec![p])]);
    assert_eq!(out.draining, [pci(1)]);
    assert_eq!(fake.calls(), ["deny 1:5", "remove /dev/zero"]);
    let st = h.state();
    assert_eq!(st.reservations[ID].gpus, [pci(0)]);
    assert_eq!(crate::reserve::drain::unit_pids(&st, &pci(1)), [4300]);
    assert_eq!(st.draining[&pci(1)].holders[0].comm, "python3");
}

#[test]
fn detach_of_a_gpu_open_outside_the_container_goes_ahead_and_drains() {
    // Process 4301 of the host (another PID namespace) holds GPU 1 open (a descriptor
    // passed out of the container, say); 4302 has no namespace to read: not the container's.
    let h = gpu1_open_by(4301, HOST_NS, "sidecar");
    h.opener(4302, "/dev/zero", "0100002");
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), false);
    let out = out.unwrap();
    assert_eq!(out.units, [pci(1)]);
    assert!(out.kept_open.is_empty());
    assert_eq!(out.draining, [pci(1)]);
    assert_eq!(fake.calls(), ["deny 1:5", "remove /dev/zero"]);
    let st = h.state();
    assert_eq!(crate::reserve::drain::unit_pids(&st, &pci(1)), [4301, 4302]);
}

#[test]
fn detach_keeps_a_unit_whose_grant_cannot_be_taken_back() {
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let before = h.state();
    let fail = || Fake {
        fail_deny: Some(1),
        ..Fake::default()
    };
    let (fake, out) = h.detach(fail(), sel(pci(1)), false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "the device-cgroup grants of GPU(s) 0000:11:00.0 cannot be taken back (cgroup /fake: Operation not permitted): they stay reserved"
    );
    assert_eq!(fake.calls(), ["deny 195:1"]);
    let r = &h.state().reservations[ID];
    assert_eq!(
        (&r.gpus, &r.nodes),
        (
            &before.reservations[ID].gpus,
            &before.reservations[ID].nodes
        )
    );
    // All of them: the other goes; the control nodes the kept one needs stay granted.
    let (fake, out) = h.detach(fail(), Which::All, false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "the device-cgroup grants of GPU(s) 0000:11:00.0 cannot be taken back (cgroup /fake: Operation not permitted): they stay reserved; GPU(s) 0000:10:00.0 detached"
    );
    assert_eq!(
        fake.calls(),
        ["deny 195:0", "deny 195:1", "remove /dev/nvidia0"]
    );
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(1)]);
    assert_eq!(
        r.nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
        ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    );
}

#[test]
fn detach_keeps_a_unit_whose_node_another_rule_still_allows() {
    // Granted at started; then the container's cgroup has `c 195:* rwm` too: v1's deny of
    // `c 195:1 rw` succeeds and changes nothing.
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let before = h.state();
    let wild = || Fake {
        wildcard: Some(195),
        ..Default::default()
    };
    let (fake, out) = h.detach(wild(), sel(pci(1)), false);
    let e = out.unwrap_err();
    assert_eq!(
        e.to_string(),
        "the device-cgroup grants of GPU(s) 0000:11:00.0 cannot be taken back (cgroup /fake: /dev/nvidia1 (195:1) is still allowed by another rule of the container's cgroup): they stay reserved"
    );
    assert!(
        matches!(
            e,
            Error::Lifecycle(LifecycleError::CannotRevoke { ref detached, .. }) if detached.is_empty()
        ),
        "{e:?}"
    );
    // Not freed, its node neither unrecorded nor removed.
    assert_eq!(fake.calls(), ["deny 195:1"]);
    let r = &h.state().reservations[ID];
    let b = &before.reservations[ID];
    assert_eq!((&r.gpus, &r.nodes), (&b.gpus, &b.nodes));
    // All of them: both stay, and the control nodes they need are not denied.
    let (fake, out) = h.detach(wild(), Which::All, false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "the device-cgroup grants of GPU(s) 0000:10:00.0,0000:11:00.0 cannot be taken back (cgroup /fake: /dev/nvidia0 (195:0) is still allowed by another rule of the container's cgroup; cgroup /fake: /dev/nvidia1 (195:1) is still allowed by another rule of the container's cgroup): they stay reserved"
    );
    assert_eq!(fake.calls(), ["deny 195:0", "deny 195:1"]);
    let r = &h.state().reservations[ID];
    assert_eq!((&r.gpus, &r.nodes), (&b.gpus, &b.nodes));
}

#[test]
fn detach_of_a_mig_instance_keeps_what_its_gpu_instance_still_needs() {
    use crate::reserve::alloc::tests::with_migs;
    let mut h = host();
    h.inv.gpus[0] = with_migs(h.inv.gpus[0].clone(), &[(1, 0), (2, 0), (2, 1)]);
    let mig = |gi, ci| Unit::Mig {
        pci: pci(0).pci(),
        gi,
        ci,
    };
    let mut r = req(3);
    r.mig = true;
    h.running_with(&[mig(1, 0), mig(2, 0), mig(2, 1)], &r);
    // gi2/ci0: its compute instance's capability only (gi2 stays, through ci1).
    let (fake, out) = h.detach(Fake::default(), sel(mig(2, 0)), false);
    assert_eq!(out.unwrap().units, [mig(2, 0)]);
    assert_eq!(
        fake.calls(),
        ["deny 236:19", "remove /dev/nvidia-caps/nvidia-cap19"]
    );
    // gi2/ci1 then: now its GPU instance's capability goes too, not the GPU's node.
    let (fake, out) = h.detach(Fake::default(), sel(mig(2, 1)), false);
    assert_eq!(out.unwrap().units, [mig(2, 1)]);
    assert_eq!(denied(&fake), ["deny 236:18", "deny 236:20"]);
    // The GPU's PCI address names every instance it still holds of it.
    let (fake, out) = h.detach(Fake::default(), sel(pci(0)), false);
    assert_eq!(out.unwrap().units, [mig(1, 0)]);
    assert_eq!(denied(&fake), ["deny 195:0", "deny 236:9", "deny 236:10"]);
    assert!(h.state().reservations[ID].gpus.is_empty());
}

#[test]
fn detach_refuses_a_container_not_running_as_recorded() {
    let h = host_with_controls();
    h.in_ns(INIT.pid, CT_NS);
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let idmap = IdMap::default();
    let fake = h.fake(Fake::default());
    let run = |f: &Facts| detach_with(f, &holder(&idmap), &Which::All, false, found);
    let e = h.with(&fake, run).unwrap_err();
    assert_eq!(
        e.to_string(),
        "is not running (its GPU reservation is prepared): nothing to detach from"
    );
    let other = ProcRef {
        pid: 5151,
        start_time: 888,
    };
    h.seed(ID, "web1", &[pci(0)], Phase::Running, Some(other));
    let e = h.with(&fake, run).unwrap_err();
    assert_eq!(
        e.to_string(),
        "its GPU reservation is not for the container that runs now (init 4242): is it restarting?"
    );
    assert!(fake.calls().is_empty());
}

#[test]
fn detach_that_cannot_tell_the_containers_processes_refuses_unless_forced() {
    let h = cdi_host();
    h.running_with(&[pci(0)], &req(1));
    std::fs::remove_file(h.cfg.proc.join(INIT.pid.to_string()).join("ns/pid")).unwrap();
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "cannot tell which processes are the container's (the PID namespace of its init 4242 cannot be read), so whether its GPUs are open; detach with --force to go ahead"
    );
    assert!(fake.calls().is_empty());
    let (fake, out) = h.detach(Fake::default(), Which::All, true);
    assert_eq!(out.unwrap().units, [pci(0)]);
    assert_eq!(fake.calls(), ["deny 1:3", "remove /dev/null"]);
}

#[test]
fn detach_whose_nodes_cannot_be_removed_says_so_after_freeing() {
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let fake = Fake {
        fail_remove: true,
        ..Fake::default()
    };
    let (fake, out) = h.detach(fake, sel(pci(0)), false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "detached GPU(s) 0000:10:00.0 (their grants taken back), but their nodes could not be removed from the container's /dev: /dev is not libvirt's tmpfs"
    );
    assert_eq!(fake.calls(), ["deny 195:0", "remove /dev/nvidia0"]);
    // No longer granted: freed.
    assert_eq!(h.state().reservations[ID].gpus, [pci(1)]);
}

// ---- attach and detach with the driver's user space (CDI) ----

/// [`cdi_req`] for these GPUs of the test host by index.
fn cdi_req_of(ix: &[usize]) -> Request {
    let mut r = req_of(ix);
    r.driver = Some(Driver::Cdi);
    r
}

/// [`SPEC`]'s one driver mount.
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03";

fn mount_targets(h: &Host) -> Vec<String> {
    h.state().reservations[ID]
        .mounts
        .iter()
        .map(|m| format!("{} ({}:{})", m.target, m.dev, m.ino))
        .collect()
}

/// What `/etc/hostname` ([`SPEC`]'s mount source) is on this host: what a mount of it shows.
fn source_identity() -> String {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata("/etc/hostname").unwrap();
    format!("{}:{}", md.dev(), md.ino())
}

#[test]
fn attach_cdi_gives_the_new_gpus_driver_files_and_detach_takes_them_with_the_last() {
    let h = cdi_host();
    h.in_ns(INIT.pid, CT_NS);
    let fake = h.fake(Fake::default());
    h.attach(&fake, &cdi_req_of(&[0])).unwrap();
    // The GPU's node and the spec's common one granted and made, then its mount.
    assert_eq!(
        fake.calls(),
        [
            "allow 1:3",
            "allow 1:7",
            "create /dev/null /dev/full",
            &format!("inject {LIBCUDA}")
        ]
    );
    let r = &h.state().reservations[ID];
    assert_eq!(r.nodes.iter().map(num).collect::<Vec<_>>(), ["1:3", "1:7"]);
    // Recorded as made (the fake helper's identity).
    assert_eq!(mount_targets(&h), [format!("{LIBCUDA} (9:99)")]);
    // A second GPU: its node; the driver's mount is there already (no second mount).
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(1, 3), (1, 7)]),
        ..Default::default()
    });
    h.attach(&fake, &cdi_req_of(&[1])).unwrap();
    assert_eq!(fake.calls(), ["allow 1:5", "create /dev/zero"]);
    assert_eq!(h.state().reservations[ID].gpus, [pci(0), pci(1)]);
    assert_eq!(mount_targets(&h), [format!("{LIBCUDA} (9:99)")]);
    // Detach of one: GPU 0 keeps the driver.
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), false);
    assert_eq!(out.unwrap().units, [pci(1)]);
    assert_eq!(fake.calls(), ["deny 1:5", "remove /dev/zero"]);
    assert_eq!(mount_targets(&h), [format!("{LIBCUDA} (9:99)")]);
    // Detach of the last: every node, and the driver's mount.
    let (fake, out) = h.detach(Fake::default(), sel(pci(0)), false);
    assert_eq!(out.unwrap().units, [pci(0)]);
    assert_eq!(
        fake.calls(),
        [
            "deny 1:3",
            "deny 1:7",
            "remove /dev/null /dev/full",
            &format!("uninject {LIBCUDA} (9:99)")
        ]
    );
    let r = &h.state().reservations[ID];
    assert!(
        r.gpus.is_empty() && r.nodes.is_empty() && r.mounts.is_empty(),
        "{r:?}"
    );
}

#[test]
fn attach_cdi_to_a_container_started_with_the_driver_adds_only_the_gpus_node() {
    let h = cdi_host();
    h.in_ns(INIT.pid, CT_NS);
    h.activated(&[pci(0)], &cdi_req(1));
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(1, 3), (1, 7)]),
        ..Default::default()
    });
    h.attach(&fake, &cdi_req_of(&[1])).unwrap();
    assert_eq!(fake.calls(), ["allow 1:5", "create /dev/zero"]);
    // Detach of the GPU `started` gave: the attached one keeps the driver's mount.
    let (fake, out) = h.detach(Fake::default(), sel(pci(0)), false);
    assert_eq!(out.unwrap().units, [pci(0)]);
    assert_eq!(fake.calls(), ["deny 1:3", "remove /dev/null"]);
    assert_eq!(mount_targets(&h), [format!("{LIBCUDA} (9:99)")]);
}

#[test]
fn attach_cdi_whose_driver_files_fail_takes_everything_back() {
    let h = cdi_host();
    h.in_ns(INIT.pid, CT_NS);
    h.seed(ID, "web1", &[], Phase::Running, Some(INIT));
    let fake = h.fake(Fake {
        fail_inject: true,
        ..Default::default()
    });
    let e = h.attach(&fake, &cdi_req_of(&[0])).unwrap_err();
    assert_eq!(e.to_string(), "mount over /usr/lib: Permission denied");
    assert_eq!(
        fake.calls(),
        [
            "allow 1:3",
            "allow 1:7",
            "create /dev/null /dev/full",
            &format!("inject {LIBCUDA}"),
            "remove /dev/null /dev/full",
            "revoke 1:7",
            "revoke 1:3",
        ]
    );
    assert!(fake.allowed.borrow().is_empty());
    let r = &h.state().reservations[ID];
    assert!(
        r.gpus.is_empty() && r.nodes.is_empty() && r.mounts.is_empty(),
        "{r:?}"
    );
    assert!(!r.hotplugged);
}

#[test]
fn attach_cdi_killed_before_its_mounts_leaves_them_recorded_for_detach() {
    let h = cdi_host();
    h.in_ns(INIT.pid, CT_NS);
    let fake = h.fake(Fake {
        state_at_allow: Some(h.cfg.state_file.clone()),
        ..Default::default()
    });
    h.attach(&fake, &cdi_req_of(&[0])).unwrap();
    // Killed at the grant: the mount is recorded as planned (its source's identity), before
    // anything was granted or mounted.
    std::fs::write(&h.cfg.state_file, fake.seen_at_allow.take().unwrap()).unwrap();
    let planned = format!("{LIBCUDA} ({})", source_identity());
    assert_eq!(mount_targets(&h), std::slice::from_ref(&planned));
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    assert_eq!(out.unwrap().units, [pci(0)]);
    assert_eq!(
        fake.calls(),
        [
            "deny 1:3",
            "deny 1:7",
            "remove /dev/null /dev/full",
            &format!("uninject {planned}")
        ]
    );
    assert!(h.state().reservations[ID].mounts.is_empty());
}

#[test]
fn detach_whose_driver_files_cannot_be_taken_out_says_so_after_freeing() {
    let h = cdi_host();
    h.in_ns(INIT.pid, CT_NS);
    h.activated(&[pci(0)], &cdi_req(1));
    let (fake, out) = h.detach(
        Fake {
            fail_uninject: true,
            ..Default::default()
        },
        Which::All,
        false,
    );
    let e = out.unwrap_err().to_string();
    assert_eq!(
        e,
        "detached GPU(s) 0000:10:00.0 (their grants taken back), but the CDI driver files only they needed could not be taken out of the container's root: / is not the container's"
    );
    assert_eq!(
        fake.calls(),
        [
            "deny 1:3",
            "deny 1:7",
            "remove /dev/null /dev/full",
            &format!("uninject {LIBCUDA} (9:99)")
        ]
    );
    let r = &h.state().reservations[ID];
    assert!(r.gpus.is_empty() && r.mounts.is_empty(), "{r:?}");
}

/// `gpuhook attach --share`: a slot of another shared GPU, never a second of one it shares;
/// its GPU's nodes granted and made as a whole GPU's are; detached, the slot is free again.
#[test]
fn attach_share_takes_a_slot_of_another_gpu_only() {
    let mut h = host();
    let share = |n| Some(crate::host::config::Sharing::timeslice(n));
    h.inv.gpus[6].sharing = share(2);
    h.inv.gpus[7].sharing = share(2);
    let fake = running_on_gpu0(&h, &req(1));
    let shared = Request {
        share: true,
        ..req(1)
    };
    let got = h.attach(&fake, &shared).unwrap();
    let first = got.units[0];
    assert!(first.is_slot(), "{first:?}");
    let n = h.inv.by_unit(&first).unwrap().nodes[0].1.node.clone();
    assert_eq!(
        fake.calls(),
        [format!("allow {}", num(&n)), format!("create {}", n.path)]
    );
    let second = h.attach(&fake, &shared).unwrap().units[0];
    assert!(
        second.is_slot() && second.pci() != first.pci(),
        "{second:?}"
    );
    // Both shared GPUs have a slot of it: no third.
    let e = h.attach(&fake, &shared).unwrap_err().to_string();
    assert!(
        e.contains("only 0 of the host's 2 matching shared GPUs"),
        "{e}"
    );
    let mut named = shared.clone();
    named.devices = vec![crate::request::DeviceSel::Pci(first.pci().to_string())];
    let e = h.attach(&fake, &named).unwrap_err().to_string();
    assert!(e.contains("holds a slot of it already"), "{e}");
    assert_eq!(h.state().reservations[ID].gpus, [pci(0), first, second]);
}

/// A slot of a GPU another domain still shares: detaching it is refused while a process of
/// the container has the GPU open, as for a whole GPU (review F2); it does not drain (the
/// other sharer has the GPU open by design), and with `--force` the opener is reported.
#[test]
fn detach_of_a_slot_waits_for_the_containers_own_openers() {
    let mut h = cdi_host();
    h.inv.gpus[1].sharing = Some(crate::host::config::Sharing::timeslice(2));
    let slot = |n| Unit::Slot {
        pci: pci(1).pci(),
        slot: n,
    };
    let shared = Request {
        share: true,
        ..req(1)
    };
    h.running_with(&[slot(0)], &shared);
    h.seed("other", "other", &[slot(1)], Phase::Running, None);
    h.opener_in(4300, "/dev/zero", CT_NS, "python3");
    let before = h.state();
    let (fake, out) = h.detach(Fake::default(), sel(slot(0)), false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "GPU 0000:11:00.0/slot0 is open in the container: process 4300 (python3); close it or detach with --force"
    );
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    assert_eq!(h.state(), before);
    let (_, out) = h.detach(Fake::default(), sel(slot(0)), true);
    let out = out.unwrap();
    assert_eq!(out.units, [slot(0)]);
    assert_eq!(out.kept_open.len(), 1);
    assert!(out.draining.is_empty(), "{:?}", out.draining);
    assert!(h.state().draining.is_empty());
}

// ---- MPS: the daemon's directories in a sharer's container ----

/// The test host with GPU 1 shared with MPS (2 slots).
fn mps_host() -> Host {
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

/// `prepare` then `started` of a sharer: the first slot starts the GPU's daemon, and the
/// container gets its `pipe` at /tmp/nvidia-mps and `shm` at /dev/shm, recorded with the
/// mounts; `detach` of the slot takes them out again and the daemon, left without sharers,
/// is told to quit.
#[test]
fn mps_sharer_gets_the_daemons_directories_and_loses_them_at_detach() {
    let h = mps_host();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    h.with(&fake, |f| reserve_with(f, &holder(&idmap), &shared(1)))
        .unwrap();
    assert_eq!(fake.calls(), ["mps start 0000:11:00.0"]);
    h.with(&fake, |f| {
        activate_with(f, &holder(&idmap), &shared(1), found)
    })
    .unwrap();
    assert_eq!(
        fake.calls()[1..],
        [
            "allow 195:1",
            "create /dev/nvidia1",
            "inject /tmp/nvidia-mps /dev/shm"
        ]
    );
    let st = h.state();
    let r = &st.reservations[ID];
    assert_eq!(r.gpus, [mps_slot(0)]);
    let targets: Vec<&str> = r.mounts.iter().map(|m| m.target.as_str()).collect();
    assert_eq!(targets, ["/tmp/nvidia-mps", "/dev/shm"]);
    let d = &st.mps[&pci(1).pci()];
    assert!(d
        .dir
        .starts_with(h.cfg.state_file.parent().unwrap().join("mps")));
    h.in_ns(INIT.pid, CT_NS);
    let (fake, out) = h.detach(Fake::default(), sel(mps_slot(0)), false);
    assert_eq!(out.unwrap().units, [mps_slot(0)]);
    assert_eq!(
        fake.calls(),
        [
            "deny 195:1",
            "mps quit 0000:11:00.0",
            "remove /dev/nvidia1",
            "uninject /tmp/nvidia-mps (9:99) /dev/shm (9:99)"
        ]
    );
    assert!(h.state().mps.is_empty());
}

/// A timeslice sharer, a whole GPU, and a sharer of an MPS GPU whose daemon is not recorded
/// get no MPS directories.
#[test]
fn only_a_slot_with_a_daemon_gets_mps_directories() {
    let mut h = mps_host();
    h.inv.gpus[2].sharing = Some(crate::host::config::Sharing::timeslice(2));
    let ts = Unit::Slot {
        pci: pci(2).pci(),
        slot: 0,
    };
    let fake = h.activated(&[pci(0), ts, mps_slot(0)], &shared(3));
    assert!(
        !fake.calls().iter().any(|c| c.starts_with("inject")),
        "{:?}",
        fake.calls()
    );
    assert!(h.state().reservations[ID].mounts.is_empty());
}

/// `attach --share` of an MPS GPU's slot to a running container: its daemon is started and
/// its directories mounted, recorded before they are made; a container with them already
/// gets no second set.
#[test]
fn attach_of_an_mps_slot_mounts_its_daemons_directories_once() {
    let mut h = mps_host();
    h.inv.gpus[2].sharing = h.inv.gpus[1].sharing;
    let fake = running_on_gpu0(&h, &req(1));
    let got = h.attach(&fake, &shared(1)).unwrap();
    assert_eq!(got.units, [mps_slot(0)]);
    let calls = fake.calls();
    assert_eq!(calls[0], "mps start 0000:11:00.0");
    assert_eq!(calls.last().unwrap(), "inject /tmp/nvidia-mps /dev/shm");
    let targets = |h: &Host| -> Vec<String> {
        h.state().reservations[ID]
            .mounts
            .iter()
            .map(|m| m.target.clone())
            .collect()
    };
    assert_eq!(targets(&h), ["/tmp/nvidia-mps", "/dev/shm"]);
    let fake2 = h.fake(Fake {
        allowed: RefCell::new(fake.allowed.borrow().clone()),
        ..Default::default()
    });
    let got = h.attach(&fake2, &shared(1)).unwrap();
    assert_eq!(got.units[0].pci(), pci(2).pci());
    assert_eq!(fake2.calls()[0], "mps start 0000:12:00.0");
    assert!(
        !fake2.calls().iter().any(|c| c.starts_with("inject")),
        "{:?}",
        fake2.calls()
    );
    assert_eq!(targets(&h), ["/tmp/nvidia-mps", "/dev/shm"]);
}

/// A container holding an MPS slot and a whole GPU, without CDI files: detaching the slot
/// takes the MPS directories out (review finding 4: they stayed when the CDI specs could
/// not be read, or a directory made for them was taken for CDI's).
#[test]
fn detach_of_the_mps_slot_beside_a_whole_gpu_takes_the_mps_directories() {
    let h = mps_host();
    let mut r = shared(1);
    r.devices = vec![DeviceSel::Index(1)];
    let fake = running_on_gpu0(&h, &req(1));
    let got = h.attach(&fake, &r).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got.units, [mps_slot(0)]);
    h.in_ns(INIT.pid, CT_NS);
    let (fake, out) = h.detach(Fake::default(), sel(mps_slot(0)), false);
    assert_eq!(out.unwrap().units, [mps_slot(0)]);
    let calls = fake.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("uninject /tmp/nvidia-mps")),
        "{calls:?}"
    );
    let st = h.state();
    let kept = &st.reservations[ID];
    assert_eq!(kept.gpus, [pci(0)]);
    assert!(kept.mounts.is_empty(), "{:?}", kept.mounts);
}

/// An OCI container's create: its MPS directories (mounted by its runtime from config.json)
/// are recorded with the reservation, so a detach takes them back and an attach of another
/// MPS slot mounts no second set (review finding 7).
#[test]
fn oci_create_of_an_mps_sharer_records_its_directories() {
    let h = mps_host();
    h.this_process();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let who = oci_holder(&idmap);
    h.with(&fake, |f| reserve_nodes_with(f, &who, &shared(1)))
        .unwrap();
    let st = h.state();
    let r = &st.reservations["ctr1"];
    let targets: Vec<&str> = r.mounts.iter().map(|m| m.target.as_str()).collect();
    assert_eq!(targets, ["/tmp/nvidia-mps", "/dev/shm"]);
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(st.mps[&pci(1).pci()].pipe()).unwrap();
    assert_eq!((r.mounts[0].dev, r.mounts[0].ino), (md.dev(), md.ino()));
}

/// An attach of an MPS slot that fails (its grant) gives the slot back and stops the daemon
/// it started (review finding 9: it ran on without sharers).
#[test]
fn failed_attach_of_an_mps_slot_stops_the_daemon_it_started() {
    let h = mps_host();
    let ok = running_on_gpu0(&h, &req(1));
    let fake = h.fake(Fake {
        allowed: RefCell::new(ok.allowed.borrow().clone()),
        fail_allow: Some(1),
        ..Default::default()
    });
    h.attach(&fake, &shared(1)).unwrap_err();
    let calls = fake.calls();
    assert_eq!(
        calls.first().map(String::as_str),
        Some("mps start 0000:11:00.0")
    );
    assert_eq!(
        calls.last().map(String::as_str),
        Some("mps quit 0000:11:00.0"),
        "{calls:?}"
    );
    let st = h.state();
    assert!(st.mps.is_empty());
    assert_eq!(st.reservations[ID].gpus, [pci(0)]);
    assert!(st.reservations[ID].mounts.is_empty());
}

/// A running container of GPU 0 whose scope systemd keeps a device policy for: the
/// container's own entries (`/dev/null`, 1:3) and GPU 0's (given at create, as runc lists it).
fn managed_on_gpu0(h: &Host) -> Rc<Fake> {
    let fake = running_on_gpu0(h, &req(1));
    *fake.managed.borrow_mut() = Some(vec![(1, 3), (195, 0)]);
    fake
}

/// Under systemd's cgroup manager, attach lists the new nodes in the scope's policy before it
/// grants them, and says `attached` only once every rule in force lets them through.
#[test]
fn attach_tells_the_scopes_manager_before_it_grants() {
    let h = host();
    let fake = managed_on_gpu0(&h);
    let got = h.attach(&fake, &req_of(&[1])).unwrap();
    assert_eq!(got.units, [pci(1)]);
    assert_eq!(
        fake.calls(),
        ["policy allow 195:1", "allow 195:1", "create /dev/nvidia1"]
    );
    assert_eq!(
        fake.managed.borrow().clone().unwrap(),
        [(1, 3), (195, 0), (195, 1)]
    );
    // Without a manager's policy: nothing of it.
    let fake = running_on_gpu0(&h, &req(1));
    h.attach(&fake, &req_of(&[2])).unwrap();
    assert!(
        fake.calls().iter().all(|c| !c.starts_with("policy")),
        "{:?}",
        fake.calls()
    );
}

/// A manager that cannot be told refuses the attach: nothing granted, made or reserved.
#[test]
fn attach_refused_when_the_manager_cannot_be_told() {
    let h = host();
    let fake = managed_on_gpu0(&h);
    let fake = h.fake(Fake {
        allowed: RefCell::new(fake.allowed.borrow().clone()),
        managed: RefCell::new(fake.managed.borrow().clone()),
        manager_fails: true,
        ..Default::default()
    });
    let before = h.state().reservations[ID].gpus.clone();
    let e = h.attach(&fake, &req_of(&[1])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cgroup /fake.scope: Failed to connect to bus"
    );
    assert_eq!(fake.calls(), ["policy allow 195:1"]);
    assert_eq!(h.state().reservations[ID].gpus, before);
    assert_eq!(h.state().reservations[ID].nodes.len(), 1);
}

/// A node a rule in force still refuses after the grant (a program of a cgroup above): not
/// attached; grant, node and the manager's entry taken back, the unit free again.
#[test]
fn attach_that_a_rule_in_force_still_refuses_is_taken_back() {
    let h = host();
    let fake = managed_on_gpu0(&h);
    let fake = h.fake(Fake {
        allowed: RefCell::new(fake.allowed.borrow().clone()),
        managed: RefCell::new(fake.managed.borrow().clone()),
        refused_above: Some(1),
        ..Default::default()
    });
    let e = h.attach(&fake, &req_of(&[1])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cgroup /fake: /dev/nvidia1 (195:1) is still refused by a device rule in force for the container after the grant (its systemd unit fake.scope was told)"
    );
    assert_eq!(
        fake.calls(),
        [
            "policy allow 195:1",
            "allow 195:1",
            "create /dev/nvidia1",
            "remove /dev/nvidia1",
            "revoke 195:1",
            "policy restore 195:1"
        ]
    );
    assert_eq!(fake.managed.borrow().clone().unwrap(), [(1, 3), (195, 0)]);
    assert_eq!(h.state().reservations[ID].gpus, [pci(0)]);
    // Without a manager the rules are read once, and the same holds.
    let fake = h.fake(Fake {
        allowed: RefCell::new(fake.allowed.borrow().clone()),
        refused_above: Some(1),
        ..Default::default()
    });
    let e = h.attach(&fake, &req_of(&[1])).unwrap_err();
    assert!(e.to_string().ends_with("after the grant"), "{e}");
    assert_eq!(h.state().reservations[ID].gpus, [pci(0)]);
}

/// Detach takes the entries of exactly the nodes it takes back out of the scope's policy,
/// before it frees them (a reload then gives nothing back): GPU 0's, listed at create, too;
/// the container's own entry stays.
#[test]
fn detach_takes_its_nodes_out_of_the_scopes_policy_first() {
    let h = host();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let (fake, out) = h.detach(
        Fake {
            managed: RefCell::new(Some(vec![(1, 3), (195, 0), (195, 1)])),
            ..Default::default()
        },
        sel(pci(0)),
        false,
    );
    assert_eq!(out.unwrap().units, [pci(0)]);
    assert_eq!(
        fake.calls(),
        ["policy remove 195:0", "deny 195:0", "remove /dev/nvidia0"]
    );
    assert_eq!(fake.managed.borrow().clone().unwrap(), [(1, 3), (195, 1)]);
}

/// A unit whose grant could not be taken back stays reserved, and its entry goes back into
/// the scope's policy; a detach refused under the lock puts every entry back.
#[test]
fn detach_puts_back_the_entries_of_what_it_keeps() {
    let h = host();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let (fake, out) = h.detach(
        Fake {
            managed: RefCell::new(Some(vec![(1, 3), (195, 0), (195, 1)])),
            fail_deny: Some(1),
            ..Default::default()
        },
        Which::All,
        false,
    );
    assert!(out.is_err());
    assert_eq!(
        fake.calls()[..3],
        ["policy remove 195:0 195:1", "deny 195:0", "deny 195:1"]
    );
    assert!(
        fake.calls().contains(&"policy restore 195:1".to_string()),
        "{:?}",
        fake.calls()
    );
    assert_eq!(fake.managed.borrow().clone().unwrap(), [(1, 3), (195, 1)]);
    assert_eq!(h.state().reservations[ID].gpus, [pci(1)]);
    // The cgroup cannot be found after the entries went: they come back, nothing freed.
    let (fake, out) = h.detach(
        Fake {
            managed: RefCell::new(Some(vec![(1, 3), (195, 1)])),
            no_cgroup: true,
            ..Default::default()
        },
        Which::All,
        false,
    );
    assert!(out.is_err());
    assert_eq!(
        fake.calls(),
        ["policy remove 195:1", "policy restore 195:1"]
    );
    assert_eq!(fake.managed.borrow().clone().unwrap(), [(1, 3), (195, 1)]);
    assert_eq!(h.state().reservations[ID].gpus, [pci(1)]);
}

// ---- reset_on_release: every free path marks a freed GPU scrub pending ----

fn scrub_pending(h: &Host) -> Vec<String> {
    h.state()
        .health
        .iter()
        .filter(|(_, g)| g.scrub_pending)
        .map(|(p, _)| p.clone())
        .collect()
}

/// The one free path (`free_with`: the stop hooks, `release`, `reconcile`, the OCI door's
/// `poststop` and `delete`), with and without an inventory; a detach; a stale reservation
/// reclaimed for a request (which then does not get the reclaimed GPU): each marks the GPUs
/// no one holds any more scrub pending. Off by default.
#[test]
fn reset_on_release_marks_what_every_free_path_frees() {
    let mut h = host();
    h.seed(ID, "web1", &[pci(0), pci(1)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake::default());
    h.with(&fake, |f| free_with(f, all_of(ID), |_| {})).unwrap();
    assert!(scrub_pending(&h).is_empty(), "off by default");
    h.cfg.reset_on_release = true;
    h.seed(ID, "web1", &[pci(0), pci(1)], Phase::Running, Some(INIT));
    h.with(&fake, |f| free_with(f, all_of(ID), |_| {})).unwrap();
    assert_eq!(scrub_pending(&h), ["0000:10:00.0", "0000:11:00.0"]);
    // Without an inventory (no draining look): marked all the same.
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let blind = h.fake(Fake {
        no_inventory: true,
        ..Fake::default()
    });
    h.with(&blind, |f| free_with(f, all_of(ID), |_| {}))
        .unwrap();
    assert!(scrub_pending(&h).contains(&"0000:12:00.0".to_string()));
    // A detach of one of two GPUs.
    let mut h = host_with_controls();
    h.cfg.reset_on_release = true;
    h.running_with(&[pci(0), pci(1)], &req(2));
    let (_, out) = h.detach(Fake::default(), sel(pci(1)), false);
    assert_eq!(out.unwrap().units, [pci(1)]);
    assert_eq!(scrub_pending(&h), ["0000:11:00.0"]);
    // A stale reservation reclaimed by a request: the reclaimed GPUs are scrub pending, the
    // request does not fit; the reclaim is kept all the same (else it would be rolled back
    // with each refusal, and its GPUs never scrubbed).
    let mut h = host();
    h.cfg.reset_on_release = true;
    let gone = ProcRef {
        pid: 6161,
        start_time: 1,
    };
    let all: Vec<Unit> = (0..8).map(pci).collect();
    h.seed("other-uuid", "web2", &all, Phase::Running, Some(gone));
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| reserve_with(f, &holder(&idmap), &req(1)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("scrub pending"), "{e}");
    let st = h.state();
    assert!(!st.reservations.contains_key("other-uuid"));
    assert_eq!(scrub_pending(&h).len(), 8);
}

// ---- the driver found on the host (`driver="host"`) ----

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
            notes: vec![],
        },
        sonames: [(lib, "libcuda.so.1".to_string())].into_iter().collect(),
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

#[test]
fn host_driver_at_started_is_mounted_and_recorded_with_its_version() {
    let h = host();
    let fake = h.activated(&[pci(0)], &host_req_of(&[0]));
    assert_eq!(
        fake.calls(),
        [
            "allow 195:0".to_string(),
            "create /dev/nvidia0".to_string(),
            host_targets(HOST_V)
        ]
    );
    let r = &h.state().reservations[ID];
    assert_eq!(r.driver, Some(Driver::Host));
    assert_eq!(r.driver_version.as_deref(), Some(HOST_V));
    assert_eq!(r.mounts.len(), 2);
}

#[test]
fn host_driver_without_a_module_reserves_nothing() {
    let h = host();
    *h.module.borrow_mut() = None;
    h.this_process();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let who = oci_holder(&idmap);
    let e = h
        .with(&fake, |f| reserve_nodes_with(f, &who, &host_req_of(&[0])))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "driver \"host\": no NVIDIA kernel module is loaded (/proc/driver/nvidia/version does not exist)"
    );
    assert!(h.state().reservations.is_empty());
    // Without the driver (nodes only) the same request is met.
    h.with(&fake, |f| reserve_nodes_with(f, &who, &req_of(&[0])))
        .unwrap();
}

#[test]
fn host_driver_for_an_oci_create_is_its_plan_and_recorded() {
    let h = host();
    h.this_process();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let who = oci_holder(&idmap);
    let ((_, plan), _) = h
        .with(&fake, |f| reserve_nodes_with(f, &who, &host_req_of(&[0])))
        .unwrap();
    let plan = plan.expect("a plan");
    assert_eq!(plan.nvidia_version.as_deref(), Some(HOST_V));
    assert!(plan.mounts.iter().all(|m| !m.rw));
    assert_eq!(
        plan.links,
        [
            cdi::Link {
                target: format!("libcuda.so.{HOST_V}"),
                link: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into()
            },
            cdi::Link {
                target: "libcuda.so.1".into(),
                link: "/usr/lib/x86_64-linux-gnu/libcuda.so".into()
            }
        ]
    );
    assert_eq!(plan.ld_folders, ["/usr/lib/x86_64-linux-gnu"]);
    let r = &h.state().reservations["ctr1"];
    assert_eq!(
        (r.driver, r.driver_version.as_deref()),
        (Some(Driver::Host), Some(HOST_V))
    );
}

#[test]
fn host_driver_gives_amd_gpus_their_nodes_only() {
    let mut h = host();
    h.inv.gpus[7].vendor = crate::ids::Vendor::Amd;
    *h.module.borrow_mut() = None;
    let fake = h.activated(&[pci(7)], &host_req_of(&[7]));
    assert!(
        fake.calls().iter().all(|c| !c.starts_with("inject")),
        "{:?}",
        fake.calls()
    );
    let r = &h.state().reservations[ID];
    assert_eq!((r.driver, r.driver_version.clone()), (None, None));
}

#[test]
fn host_driver_attach_after_an_upgrade_is_refused_and_detach_keeps_the_files_it_needs() {
    let h = host();
    h.in_ns(INIT.pid, CT_NS);
    let started = h.activated(&[pci(0)], &host_req_of(&[0]));
    let allowed = started.allowed.borrow().clone();
    // The same driver: the new GPU's node only (its files are there).
    let fake = h.fake(Fake {
        allowed: RefCell::new(allowed.clone()),
        ..Default::default()
    });
    h.attach(&fake, &host_req_of(&[1])).unwrap();
    assert_eq!(fake.calls()[..2], ["allow 195:1", "create /dev/nvidia1"]);
    assert!(
        fake.calls().iter().all(|c| c != &host_targets(HOST_V)),
        "{:?}",
        fake.calls()
    );
    // The driver upgraded under it: another GPU with the new driver's files is refused.
    *h.module.borrow_mut() = Some("560.28.03");
    let before = state_bytes(&h);
    let fake = h.fake(Fake::default());
    let e = h.attach(&fake, &host_req_of(&[2])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "its driver files are of NVIDIA driver 550.54.15, the host runs 560.28.03 now: attaching would mix two drivers' files; restart the container to get 560.28.03"
    );
    assert!(fake.calls().is_empty());
    assert_eq!(state_bytes(&h), before);
    // Another source of driver files is refused too.
    let e = h.attach(&fake, &cdi_req_of(&[2])).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("its driver files came from host; attach --driver cdi would mix"),
        "{e}"
    );
    // Nodes only: fine.
    h.attach(&fake, &req_of(&[2])).unwrap();
    // Detach of GPU 0: GPUs 1 and 2 are NVIDIA's, the files stay (whatever the host runs).
    let (fake, out) = h.detach(Fake::default(), sel(pci(0)), false);
    out.unwrap();
    assert!(
        fake.calls().iter().all(|c| !c.starts_with("uninject")),
        "{:?}",
        fake.calls()
    );
    assert_eq!(
        h.state().reservations[ID].driver_version.as_deref(),
        Some(HOST_V)
    );
    // The last NVIDIA GPUs: the files go, and nothing of a driver is recorded.
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    out.unwrap();
    assert!(
        fake.calls().iter().any(|c| c.starts_with(&format!(
            "uninject /usr/lib/x86_64-linux-gnu/libcuda.so.{HOST_V}"
        ))),
        "{:?}",
        fake.calls()
    );
    let r = &h.state().reservations[ID];
    assert_eq!((r.driver, r.driver_version.clone()), (None, None));
    assert!(r.mounts.is_empty());
}

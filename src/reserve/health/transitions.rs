//! Each transition of GPU health (docs/guides/health.md), over
//! a host in a temporary directory: its kernel log a file of records as `/dev/kmsg` hands
//! them out, its boot id, an in-memory inventory, the state file; the reset and the probes
//! doubles that say what they were asked. The real `/proc` (this process, nothing that has
//! the fake GPUs' numbers open). Runs as any user.

use super::catalog::Action;
use super::reset::{self, Ended, Failure, Recover, ResetFailure, Why};
use super::*;
use crate::host::inventory::{Inventory, InventoryError, ProbeFailure, Scan};
use crate::host::procfs::ProcRef;
use crate::reserve::alloc::tests::{gpu, unit};
use crate::reserve::state::{HolderKind, Reservation, Resetting};
use std::cell::RefCell;
use std::time::Duration;

struct Bed {
    _dir: tempfile::TempDir,
    cfg: Config,
    inv: Inventory,
}

const BOOT: &str = "0f4a9a4e-5a4c-4b61-9d3b-2b1c0f5e8a71";

impl Bed {
    fn new(edit: impl FnOnce(&mut Config)) -> Bed {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let root = dir.path();
        for d in [
            "proc/sys/kernel/random",
            "dev",
            "sys/bus/pci/devices",
            "run",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let mut cfg = Config {
            sysfs: root.join("sys"),
            proc: root.join("proc"),
            dev: root.join("dev"),
            state_file: root.join("run/state.json"),
            ..Config::default()
        };
        edit(&mut cfg);
        let b = Bed {
            inv: Inventory {
                gpus: (0..4)
                    .map(|i| gpu(i, Some(0), "sw0", crate::ids::Vendor::Nvidia, "hopper"))
                    .collect(),
                ..Default::default()
            },
            _dir: dir,
            cfg,
        };
        b.boot(BOOT);
        b.kmsg("");
        b
    }

    fn boot(&self, id: &str) {
        std::fs::write(
            self.cfg.proc.join("sys/kernel/random/boot_id"),
            format!("{id}\n"),
        )
        .unwrap();
    }

    fn kmsg(&self, text: &str) {
        std::fs::write(self.cfg.dev.join("kmsg"), text).unwrap();
    }

    fn with<T>(&self, step: impl FnOnce(&World) -> T) -> T {
        let inv = self.inv.clone();
        let scan =
            move |_: &Config, _: Scan| -> Result<Inventory, InventoryError> { Ok(inv.clone()) };
        let f = World {
            scan: &scan,
            ..World::real(&self.cfg)
        };
        step(&f)
    }

    fn scan(&self, r: &dyn Recover) -> ScanReport {
        self.with(|f| scan(f, r)).unwrap()
    }

    fn reset(&self, r: &dyn Recover, pci: &str) -> Result<reset::Reset, Error> {
        self.with(|f| reset::reset(f, r, pci, Why::Operator))
    }

    fn store(&self) -> Store {
        Store::new(&self.cfg.state_file)
    }

    fn state(&self) -> State {
        self.store().read().unwrap()
    }

    fn bytes(&self) -> Option<Vec<u8>> {
        std::fs::read(&self.cfg.state_file).ok()
    }

    fn hold(&self, name: &str, units: &[&str]) {
        self.store()
            .update(|st| {
                let r = Reservation::for_test(HolderKind::Libvirt, name, name, units);
                st.insert(r);
                Ok::<_, Error>(())
            })
            .unwrap();
    }

    /// The problem `apply` gives the GPU at `pci` now.
    fn problem(&self, pci: &str) -> Option<String> {
        let mut inv = self.inv.clone();
        apply(&mut inv, &self.state());
        inv.by_pci(pci).unwrap().problem.clone()
    }
}

/// An Xid record as the driver writes it (driver 535), at sequence number `seq`.
fn rec(seq: u64, bus: &str, xid: u32, text: &str) -> String {
    format!("4,{seq},{},-;NVRM: Xid (PCI:{bus}): {xid}, pid=2811, name=python3, {text}\n SUBSYSTEM=pci\n DEVICE=+pci:{bus}.0\n", seq * 1000)
}

/// The reset and the probes, as told; what they were asked, and what the state file and
/// its lock were like during the reset.
#[derive(Default)]
struct Fake {
    reset_fails: bool,
    probe_fails: Option<ProbeFailure>,
    calls: RefCell<Vec<String>>,
    /// The state file during the reset (read without the lock), and whether the lock was
    /// free then.
    during: RefCell<Option<(State, bool)>>,
    state_file: Option<std::path::PathBuf>,
    /// What the GPU's own state says of every Xid class it can confirm (default: confirmed),
    /// and whether the state lock was free when it was asked.
    says: Option<Confirmation>,
    confirmed: RefCell<Vec<(String, Check, bool)>>,
    /// The configured reset cannot run (a configuration fault).
    unrunnable: Option<reset::Unrunnable>,
}

impl Recover for Fake {
    fn runnable(&self, _: &Config, _: Pci) -> Result<(), reset::Unrunnable> {
        self.unrunnable.clone().map_or(Ok(()), Err)
    }
    fn reset(&self, _: &Config, pci: Pci) -> Result<(), ResetFailure> {
        self.calls.borrow_mut().push(format!("reset {pci}"));
        if let Some(p) = &self.state_file {
            let st = Store::new(p).read().unwrap();
            *self.during.borrow_mut() = Some((st, lock_is_free(p)));
        }
        if self.reset_fails {
            return Err(ResetFailure {
                what: "'/usr/bin/nvidia-smi --gpu-reset -i 0000:10:00.0'".into(),
                how: Ended::Status {
                    code: 255,
                    said: "Unable to reset GPU".into(),
                },
            });
        }
        Ok(())
    }
    fn probe(&self, _: &Config, pci: Pci) -> Result<(), ProbeFailure> {
        self.calls.borrow_mut().push(format!("probe {pci}"));
        self.probe_fails.clone().map_or(Ok(()), Err)
    }
    fn confirm(&self, cfg: &Config, pci: Pci, check: Check) -> Confirmation {
        let p = &cfg.state_file;
        let lock = p.with_file_name(format!("{}.lock", p.file_name().unwrap().to_string_lossy()));
        let free = !lock.exists() || lock_is_free(p);
        self.confirmed
            .borrow_mut()
            .push((pci.to_string(), check, free));
        self.says
            .clone()
            .unwrap_or(Confirmation::Confirmed(match check {
                Check::ConfigSpace => GpuState::ConfigAllOnes,
                Check::MemoryCounters => GpuState::Counters(confirm::MemoryCounters {
                    uncorrected_volatile: Some(1),
                    ..Default::default()
                }),
            }))
    }
}

/// Whether nobody holds the state lock of the state file at `p` (a non-blocking `flock`).
fn lock_is_free(p: &Path) -> bool {
    use std::os::fd::AsFd;
    let lock = p.with_file_name(format!("{}.lock", p.file_name().unwrap().to_string_lossy()));
    let f = std::fs::File::open(lock).unwrap();
    crate::host::sys::flock(f.as_fd(), libc::LOCK_EX | libc::LOCK_NB).is_ok()
}

const G0: &str = "0000:10:00.0";
const G1: &str = "0000:11:00.0";
const G2: &str = "0000:12:00.0";
const G3: &str = "0000:13:00.0";

/// Each class of Xid through the scan: ignore and unknown counted only, restart a warning
/// naming the holder, reset and reboot quarantined (with their action and the boot), 154
/// as its text says; all counted with their action.
#[test]
fn the_scan_acts_by_the_catalog() {
    let b = Bed::new(|_| {});
    b.hold("web1", &[G1]);
    b.kmsg(&[
        rec(10, "0000:10:00", 63, "Row Remapper: New row marked for remapping, reset gpu to activate."),
        rec(11, "0000:11:00", 13, "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"),
        rec(12, "0000:12:00", 48, "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."),
        rec(13, "0000:13:00", 79, "GPU has fallen off the bus."),
        rec(14, "0000:10:00", 999, "something new"),
        rec(15, "0000:11:00", 154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"),
    ].concat());
    let r = b.scan(&Fake::default());
    assert_eq!(r.new_records, 6);
    let q: Vec<(&str, Option<u32>, Option<Action>)> = r
        .quarantined
        .iter()
        .map(|(p, q)| (p.as_str(), q.xid, q.action))
        .collect();
    assert_eq!(
        q,
        [
            (G2, Some(48), Some(Action::Reset)),
            (G3, Some(79), Some(Action::Reboot)),
            (G1, Some(154), Some(Action::Reset)),
        ]
    );
    // The GPU web1 holds keeps running; it is named.
    assert_eq!(r.holders[G1], ["domain 'web1'"]);
    let st = b.state();
    assert_eq!(st.quarantine[G3].boot_id.as_deref(), Some(BOOT));
    assert_eq!(st.quarantine[G1].reason, "GPU Reset Required");
    assert!(!st.quarantine.contains_key(G0));
    // The restart warning names the holder.
    assert_eq!(r.restart.len(), 1);
    assert_eq!((r.restart[0].pci.as_str(), r.restart[0].xid), (G1, 13));
    assert_eq!(r.restart[0].holders, ["domain 'web1'"]);
    let ignored: Vec<(u32, bool)> = r
        .ignored
        .iter()
        .map(|s| (s.xid, s.verdict.unknown))
        .collect();
    assert_eq!(ignored, [(63, false), (999, true)]);
    // Counted, each with its action.
    let counts = |pci: &str| -> Vec<(u32, Action, u64)> {
        st.health[pci]
            .xids
            .iter()
            .map(|c| (c.xid, c.action, c.count))
            .collect()
    };
    assert_eq!(
        counts(G0),
        [(63, Action::Ignore, 1), (999, Action::Ignore, 1)]
    );
    assert_eq!(
        counts(G1),
        [(13, Action::Restart, 1), (154, Action::Reset, 1)]
    );
    // Unusable with their reason and what returns them.
    assert_eq!(
        b.problem(G2).unwrap(),
        format!(
            "quarantined after Xid 48 (double-bit ECC error) at {}; `gpuhook health reset {G2}` returns it",
            st.quarantine[G2].since
        )
    );
    assert!(b
        .problem(G3)
        .unwrap()
        .ends_with("; a reboot returns it (or `gpuhook health clear 0000:13:00.0`)"));
    assert_eq!(b.problem(G0), None);
    // The same records again: nothing new.
    let r = b.scan(&Fake::default());
    assert_eq!((r.new_records, r.quarantined.len()), (0, 0));
}

/// One fault logs several Xids: a GPU already quarantined is not counted again; a reboot
/// Xid after a reset one makes the quarantine a reboot one.
#[test]
fn one_fault_is_one_quarantine() {
    let b = Bed::new(|_| {});
    b.kmsg(
        &[
            rec(1, "0000:10:00", 62, "223b6a66 00002100 00000000 20662342"),
            rec(
                2,
                "0000:10:00",
                154,
                "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            ),
        ]
        .concat(),
    );
    let r = b.scan(&Fake::default());
    assert_eq!(r.quarantined.len(), 1);
    assert_eq!(count_24h(&b.state(), G0, &now_rfc3339()), 1);
    b.kmsg(&[
        rec(1, "0000:10:00", 62, "x"),
        rec(2, "0000:10:00", 154, "x to 0x1 (GPU Reset Required)"),
        rec(3, "0000:10:00", 154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x2 (Node Reboot Required)"),
    ].concat());
    let r = b.scan(&Fake::default());
    assert_eq!(r.quarantined.len(), 1);
    let st = b.state();
    assert_eq!(st.quarantine[G0].action, Some(Action::Reboot));
    assert_eq!(st.quarantine[G0].xid, Some(154));
    assert_eq!(count_24h(&st, G0, &now_rfc3339()), 1);
}

/// A reboot quarantine ends when the boot id changes; a reset one does not.
#[test]
fn a_new_boot_ends_a_reboot_quarantine() {
    let b = Bed::new(|_| {});
    b.kmsg(
        &[
            rec(1, "0000:10:00", 79, "GPU has fallen off the bus."),
            rec(
                2,
                "0000:11:00",
                95,
                "Uncontained: FBHUB. RST: Yes, D-RST: No",
            ),
        ]
        .concat(),
    );
    b.scan(&Fake::default());
    assert_eq!(b.state().quarantine.len(), 2);
    // The same boot: it stays.
    let r = b.scan(&Fake::default());
    assert!(r.rebooted.is_empty());
    b.boot("7b1c3f0e-2d4a-4c55-8e61-90a1b2c3d4e5");
    b.kmsg(&rec(1, "0000:12:00", 13, "after the reboot"));
    let r = b.scan(&Fake::default());
    assert_eq!(r.rebooted.len(), 1);
    assert_eq!(r.rebooted[0].0, G0);
    let st = b.state();
    assert!(!st.quarantine.contains_key(G0));
    assert_eq!(st.quarantine[G1].action, Some(Action::Reset));
    assert_eq!(b.problem(G0), None);
}

/// `health reset`: the reset, then the probes, without the state lock and with the GPU
/// marked resetting (unusable) meanwhile; every probe passes: a reset quarantine is lifted,
/// counted ok.
#[test]
fn a_reset_whose_probes_pass_lifts_a_reset_quarantine() {
    let b = Bed::new(|_| {});
    b.kmsg(&rec(1, "0000:10:00", 48, "DBE"));
    b.scan(&Fake::default());
    let fake = Fake {
        state_file: Some(b.cfg.state_file.clone()),
        ..Default::default()
    };
    let r = b.reset(&fake, "0000:10:00.0").unwrap();
    assert_eq!(
        *fake.calls.borrow(),
        [format!("reset {G0}"), format!("probe {G0}")]
    );
    let (during, free) = fake.during.borrow().clone().unwrap();
    assert!(free, "the reset ran under the state lock");
    let mark = during.health[G0].resetting.clone().unwrap();
    assert_eq!(mark.by.pid, std::process::id() as i32);
    assert_eq!(mark.boot_id.as_deref(), Some(BOOT));
    let mut inv = b.inv.clone();
    apply(&mut inv, &during);
    assert!(!inv.by_pci(G0).unwrap().usable());
    assert!(r.failure.is_none());
    assert_eq!(r.lifted.unwrap().xid, Some(48));
    let st = b.state();
    assert!(st.quarantine.is_empty());
    assert_eq!(st.health[G0].resets_ok, 1);
    assert!(st.health[G0].resetting.is_none());
    assert_eq!(b.problem(G0), None);
    // A free GPU that was not quarantined: reset all the same.
    let r = b.reset(&Fake::default(), G1).unwrap();
    assert!(r.failure.is_none() && r.lifted.is_none() && r.kept.is_none());
}

/// A reset that cannot run at all (its program missing, not root's, not executable; a
/// function without a sysfs `reset`) is the config's fault: refused before anything is
/// marked, by an operator and by the scan's `auto_reset` alike: no `resetting` mark, no
/// quarantine made or counted, the reset never run; the state file byte for byte as it was.
#[test]
fn a_reset_that_cannot_run_changes_nothing() {
    let b = Bed::new(|c| c.auto_reset = true);
    b.kmsg(&rec(1, "0000:10:00", 48, "DBE"));
    let missing = Fake {
        unrunnable: Some(reset::Unrunnable::Program(
            crate::host::program::ProgramError::Missing {
                path: "/usr/bin/nvidia-smi".into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound).into(),
            },
        )),
        ..Default::default()
    };
    // The scan quarantines (once) and does not reset: said, nothing counted.
    let r = b.scan(&missing);
    assert_eq!(r.quarantined.len(), 1);
    let e = r.resets[0].1.as_ref().unwrap_err().to_string();
    assert!(
        e.starts_with("GPU 0000:10:00.0 not reset: the config's reset_command cannot run: no /usr/bin/nvidia-smi: "),
        "{e}"
    );
    assert!(missing.calls.borrow().is_empty(), "the reset ran");
    let before = b.bytes();
    for pci in [G0, G1] {
        let e = b.reset(&missing, pci).unwrap_err().to_string();
        assert!(e.ends_with("a configuration fault, so nothing was marked and the GPU keeps its state: install the program as root's, or name another in reset_command (\"pci\" is the kernel's function-level reset)"), "{e}");
        assert_eq!(b.bytes(), before, "{pci}: the state changed");
    }
    assert!(missing.calls.borrow().is_empty(), "the reset ran");
    let st = b.state();
    assert_eq!(st.quarantine[G0].xid, Some(48));
    assert!(!st.quarantine[G0].needs_inspection);
    assert!(st.health.get(G1).is_none_or(|h| h.resetting.is_none()));
    // Once it can run, the reset lifts the quarantine as ever.
    let r = b.reset(&Fake::default(), G0).unwrap();
    assert_eq!(r.lifted.unwrap().xid, Some(48));
}

/// Only a reset quarantine is lifted by a reset: a reboot one, an escalated one and one
/// written by an earlier gpuhook (no action: `health clear` ends it) stay.
#[test]
fn a_reset_lifts_only_a_reset_quarantine() {
    let b = Bed::new(|_| {});
    b.kmsg(&rec(1, "0000:10:00", 79, "GPU has fallen off the bus."));
    b.scan(&Fake::default());
    let r = b.reset(&Fake::default(), G0).unwrap();
    assert!(r.failure.is_none());
    assert!(r.lifted.is_none());
    assert_eq!(r.kept.unwrap().action, Some(Action::Reboot));
    // Written before: no action.
    b.store()
        .update(|st| {
            st.quarantine.insert(
                G1.into(),
                Quarantine {
                    xid: Some(48),
                    reason: "double-bit ECC error".into(),
                    message: "m".into(),
                    since: "2026-12-01T00:00:00Z".into(),
                    action: None,
                    boot_id: None,
                    needs_inspection: false,
                },
            );
            Ok::<_, Error>(())
        })
        .unwrap();
    let r = b.reset(&Fake::default(), G1).unwrap();
    assert!(r.lifted.is_none() && r.kept.is_some());
    assert!(b
        .problem(G1)
        .unwrap()
        .ends_with("; `gpuhook health clear 0000:11:00.0` returns it"));
    // It is not lifted by a new boot either (whose kernel log starts anew).
    b.boot("7b1c3f0e-2d4a-4c55-8e61-90a1b2c3d4e5");
    b.kmsg("");
    b.scan(&Fake::default());
    assert!(b.state().quarantine.contains_key(G1));
    assert!(!b.state().quarantine.contains_key(G0));
    let q = b.with(|f| clear(f, G1)).unwrap();
    assert_eq!(q.xid, Some(48));
}

/// A failed reset, or a probe that fails after it: the GPU stays quarantined (a free GPU
/// that was not becomes so) with the failure as its reason, counted failed.
#[test]
fn a_failed_reset_or_probe_keeps_the_gpu_quarantined() {
    let b = Bed::new(|_| {});
    b.kmsg(&rec(1, "0000:10:00", 48, "DBE"));
    b.scan(&Fake::default());
    let fake = Fake {
        probe_fails: Some(ProbeFailure::ConfigAllOnes),
        ..Default::default()
    };
    let r = b.reset(&fake, G0).unwrap();
    assert!(matches!(
        r.failure,
        Some(Failure::Probe(ProbeFailure::ConfigAllOnes))
    ));
    let st = b.state();
    let q = &st.quarantine[G0];
    assert_eq!(
        q.reason,
        "reset failed: its PCI config space reads as all ones: fallen off the bus"
    );
    assert_eq!((q.xid, q.action), (Some(48), Some(Action::Reset)));
    assert_eq!(st.health[G0].resets_failed, 1);
    assert!(st.health[G0].resetting.is_none());
    assert!(b.problem(G0).unwrap().starts_with(
        "quarantined after Xid 48 (reset failed: its PCI config space reads as all ones: fallen off the bus) at "
    ));
    // The reset program failed on a free GPU: quarantined, no Xid.
    let fake = Fake {
        reset_fails: true,
        ..Default::default()
    };
    let r = b.reset(&fake, G1).unwrap();
    assert!(matches!(r.failure, Some(Failure::Reset(_))));
    assert_eq!(*fake.calls.borrow(), [format!("reset {G1}")], "no probe");
    let q = &b.state().quarantine[G1];
    assert_eq!(q.xid, None);
    assert_eq!(q.reason, "reset failed: '/usr/bin/nvidia-smi --gpu-reset -i 0000:10:00.0': exited with status 255: Unable to reset GPU");
    assert!(b
        .problem(G1)
        .unwrap()
        .starts_with("quarantined (reset failed: "));
    // Then a reset that works returns both.
    for p in [G0, G1] {
        assert!(
            b.reset(&Fake::default(), p).unwrap().lifted.is_some(),
            "{p}"
        );
    }
    assert!(b.state().quarantine.is_empty());
}

/// Refused in one line, and nothing written: a GPU held (whole, by a MIG instance or a
/// slot), draining, being reset by a live process, not a GPU, not a PCI address.
#[test]
fn refusals_change_nothing() {
    let b = Bed::new(|_| {});
    b.kmsg(&rec(1, "0000:10:00", 48, "DBE"));
    b.scan(&Fake::default());
    b.hold("web1", &[G0]);
    b.hold("m1", &["0000:11:00.0/gi1/ci0"]);
    b.hold("s1", &["0000:12:00.0/slot1"]);
    let before = b.bytes();
    let fake = Fake::default();
    for (pci, says) in [
        (
            G0,
            "GPU 0000:10:00.0 is held by domain 'web1': it is reset only when nothing holds it",
        ),
        (G1, "GPU 0000:11:00.0 is held by domain 'm1'"),
        (G2, "GPU 0000:12:00.0 is held by domain 's1'"),
        ("0000:7f:00.0", "0000:7f:00.0 is not a GPU this host lists"),
        (
            "../x",
            "'../x' is neither a PCI address (0000:3b:00.0), a GPU UUID (GPU-…) nor an index",
        ),
    ] {
        let e = b.reset(&fake, pci).unwrap_err().to_string();
        assert!(e.starts_with(says), "{e}");
        assert_eq!(b.bytes(), before, "{pci}");
    }
    // Draining: looked at again; the processes that still keep it open are named (this
    // test process, with /dev/null open here).
    let _null = std::fs::File::open("/dev/null").unwrap();
    let me = ProcRef::of(std::process::id() as i32).unwrap();
    let draining = |holder: ProcRef, node: crate::node::Node| {
        b.store()
            .update(|st| {
                st.draining.insert(
                    unit(G3),
                    crate::reserve::state::Draining {
                        nodes: vec![node],
                        holders: vec![crate::reserve::state::Opener {
                            proc: holder,
                            comm: "sleep".into(),
                        }],
                        unread: vec![],
                        unread_total: 0,
                        after: "domain 'web9'".into(),
                        since: "2026-12-01T00:00:00Z".into(),
                    },
                );
                Ok::<_, Error>(())
            })
            .unwrap()
    };
    draining(me, crate::node::Node::new("/dev/null", 1, 3));
    let before = b.bytes();
    let e = b.reset(&fake, G3).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "pid {} (sleep), which still has 0000:13:00.0 open after domain 'web9' (draining)",
            me.pid
        )),
        "{e}"
    );
    assert_eq!(b.bytes(), before);
    assert!(fake.calls.borrow().is_empty());
    // Its holder gone, and nothing else has its node (195:250) open: free, reset.
    draining(
        ProcRef {
            pid: i32::MAX - 9,
            start_time: 1,
        },
        crate::node::Node::new("/dev/nvidia250", 195, 250),
    );
    let r = b.reset(&fake, G3).unwrap();
    assert!(r.failure.is_none());
    assert!(b.state().draining.is_empty());
    fake.calls.borrow_mut().clear();
    // Being reset by a process that runs (this one): refused; nothing ran.
    b.store()
        .update(|st| {
            st.health.entry(G3.into()).or_default().resetting = Some(Resetting {
                by: ProcRef::of(std::process::id() as i32).unwrap(),
                since: "2026-12-01T00:00:00Z".into(),
                boot_id: Some(BOOT.into()),
            });
            Ok::<_, Error>(())
        })
        .unwrap();
    let before = b.bytes();
    let e = b.reset(&fake, G3).unwrap_err().to_string();
    assert!(
        e.starts_with("GPU 0000:13:00.0 is being reset (pid "),
        "{e}"
    );
    assert_eq!(b.bytes(), before);
    assert!(fake.calls.borrow().is_empty());
}

/// A reset whose process was killed leaves the GPU resetting: unusable, listed so; the
/// next reset takes it over (as one of another boot), and `health clear` drops it.
#[test]
fn a_killed_reset_leaves_the_gpu_resetting_until_a_reset_runs_again() {
    let b = Bed::new(|_| {});
    let gone = ProcRef {
        pid: i32::MAX - 7,
        start_time: 1,
    };
    b.store()
        .update(|st| {
            st.health.entry(G0.into()).or_default().resetting = Some(Resetting {
                by: gone,
                since: "2026-12-01T00:00:00Z".into(),
                boot_id: Some(BOOT.into()),
            });
            Ok::<_, Error>(())
        })
        .unwrap();
    assert!(b
        .problem(G0)
        .unwrap()
        .starts_with("being reset since 2026-12-01T00:00:00Z (pid 2147483640)"));
    let r = b.reset(&Fake::default(), G0).unwrap();
    assert_eq!(r.took_over.unwrap().by, gone);
    assert!(r.failure.is_none());
    assert_eq!(b.problem(G0), None);
    assert!(!b.state().health.contains_key(G0) || b.state().health[G0].resetting.is_none());
    // A mark of this very process, but of another boot, is stale too.
    b.store()
        .update(|st| {
            st.health.entry(G1.into()).or_default().resetting = Some(Resetting {
                by: ProcRef::of(std::process::id() as i32).unwrap(),
                since: "2026-12-01T00:00:00Z".into(),
                boot_id: Some("another boot".into()),
            });
            Ok::<_, Error>(())
        })
        .unwrap();
    assert!(b.reset(&Fake::default(), G1).unwrap().took_over.is_some());
}

/// `max_quarantines` quarantines within 24 hours: needs inspection; a reset that passes
/// does not lift it, `auto_reset` leaves it; `health clear` does, and counts anew.
#[test]
fn escalation_needs_inspection_until_clear() {
    let b = Bed::new(|c| c.auto_reset = true);
    let mut text = String::new();
    for i in 0..3u64 {
        text.push_str(&rec(10 + i, "0000:10:00", 48, "DBE"));
        b.kmsg(&text);
        let r = b.scan(&Fake::default());
        assert_eq!(r.quarantined.len(), 1, "round {i}");
        let st = b.state();
        assert_eq!(count_24h(&st, G0, &now_rfc3339()), i as usize + 1);
        if i < 2 {
            // auto_reset returned it.
            assert_eq!(r.resets.len(), 1);
            assert!(
                r.resets[0].1.as_ref().unwrap().lifted.is_some(),
                "round {i}"
            );
            assert!(st.quarantine.is_empty());
        } else {
            assert_eq!(r.escalated, [G0]);
            assert!(r.resets.is_empty(), "auto_reset leaves an escalated GPU");
            assert!(st.quarantine[G0].needs_inspection);
        }
    }
    assert!(b.problem(G0).unwrap().ends_with(
        "; quarantined 3 times within 24 hours: needs inspection; `gpuhook health clear 0000:10:00.0` returns it"
    ));
    let r = b.reset(&Fake::default(), G0).unwrap();
    assert!(r.failure.is_none() && r.lifted.is_none());
    assert!(r.kept.unwrap().needs_inspection);
    b.with(|f| clear(f, G0)).unwrap();
    let st = b.state();
    assert!(st.quarantine.is_empty());
    assert_eq!(count_24h(&st, G0, &now_rfc3339()), 0);
    // Counted anew: one more is one.
    text.push_str(&rec(20, "0000:10:00", 48, "DBE"));
    b.kmsg(&text);
    let r = b.scan(&Fake::default());
    assert!(r.resets[0].1.as_ref().unwrap().lifted.is_some());
    assert_eq!(count_24h(&b.state(), G0, &now_rfc3339()), 1);
    // Quarantines older than 24 hours do not count.
    b.store()
        .update(|st| {
            st.health.get_mut(G0).unwrap().quarantined =
                vec!["2020-01-01T00:00:00Z".into(), "2020-01-01T00:00:01Z".into()];
            Ok::<_, Error>(())
        })
        .unwrap();
    text.push_str(&rec(21, "0000:10:00", 48, "DBE"));
    b.kmsg(&text);
    let r = b.scan(&Fake::default());
    assert!(r.escalated.is_empty());
    assert_eq!(
        b.state().health[G0].quarantined.len(),
        1,
        "the old ones pruned"
    );
}

/// `auto_reset`: the scan resets every GPU quarantined with the reset action that is free
/// (not a held one, not a reboot one); without it, none.
#[test]
fn auto_reset_resets_free_reset_quarantines() {
    let records = [
        rec(1, "0000:10:00", 48, "DBE"),
        rec(2, "0000:11:00", 64, "row remapping failure"),
        rec(3, "0000:12:00", 79, "GPU has fallen off the bus."),
    ]
    .concat();
    let b = Bed::new(|_| {});
    b.kmsg(&records);
    let r = b.scan(&Fake::default());
    assert_eq!(r.quarantined.len(), 3);
    assert!(r.resets.is_empty(), "auto_reset is off");
    let b = Bed::new(|c| c.auto_reset = true);
    b.hold("web1", &[G1]);
    b.kmsg(&records);
    let fake = Fake::default();
    let r = b.scan(&fake);
    let done: Vec<(Pci, Why)> = r
        .resets
        .iter()
        .map(|(p, x)| (*p, x.as_ref().unwrap().why))
        .collect();
    assert_eq!(done, [(G0.parse().unwrap(), Why::AutoReset)]);
    let st = b.state();
    assert_eq!(
        st.quarantine.keys().collect::<Vec<_>>(),
        [G1, G2],
        "held, and reboot"
    );
}

/// `reset_on_release`: a free of the last holder of a GPU marks it scrub pending (unusable);
/// not while another holder still has a unit of it; the scan resets it; a failed scrub
/// quarantines it.
#[test]
fn reset_on_release_scrubs_before_anyone_else() {
    let b = Bed::new(|c| c.reset_on_release = true);
    let r1 = Reservation::for_test(HolderKind::Libvirt, "a", "a", &[G0, "0000:11:00.0/gi1/ci0"]);
    let r2 = Reservation::for_test(HolderKind::Oci, "c", "c", &["0000:11:00.0/gi2/ci0"]);
    let marked = b
        .store()
        .update(|st| {
            st.insert(r2.clone());
            let mut inv = b.inv.clone();
            let m = scrub_freed(&b.cfg, st, Some(&mut inv), std::slice::from_ref(&r1));
            assert!(!inv.by_pci(G0).unwrap().usable());
            assert!(
                inv.by_pci(G1).unwrap().usable(),
                "c still holds an instance"
            );
            Ok::<_, Error>(m)
        })
        .unwrap();
    assert_eq!(marked, [G0.parse::<Pci>().unwrap()]);
    assert!(b.problem(G0).unwrap().starts_with("scrub pending: "));
    // The scan resets it (with or without auto_reset).
    let r = b.scan(&Fake::default());
    assert_eq!(r.resets.len(), 1);
    let x = r.resets[0].1.as_ref().unwrap();
    assert!(x.scrubbed && x.why == Why::Scrub && x.failure.is_none());
    assert_eq!(b.problem(G0), None);
    // A failed scrub: quarantined, no longer scrub pending (no reset loop at each scan).
    b.store()
        .update(|st| {
            st.reservations.remove("c");
            scrub_freed(&b.cfg, st, None, std::slice::from_ref(&r2));
            Ok::<_, Error>(())
        })
        .unwrap();
    assert!(scrub_pending(&b.state(), G1));
    let fake = Fake {
        probe_fails: Some(ProbeFailure::Excluded),
        ..Default::default()
    };
    let r = b.scan(&fake);
    assert!(r.resets[0].1.as_ref().unwrap().failure.is_some());
    let st = b.state();
    assert!(!scrub_pending(&st, G1));
    assert_eq!(
        st.quarantine[G1].reason,
        "reset failed: excluded by the NVIDIA driver (GPU Excluded: Yes)"
    );
    // Freed while still open: it drains; once closed, the scan lets go of it and scrubs it.
    b.store()
        .update(|st| {
            st.health.entry(G2.into()).or_default().scrub_pending = true;
            st.draining.insert(
                unit(G2),
                crate::reserve::state::Draining {
                    nodes: vec![crate::node::Node::new("/dev/nvidia251", 195, 251)],
                    holders: vec![crate::reserve::state::Opener {
                        proc: ProcRef {
                            pid: i32::MAX - 11,
                            start_time: 1,
                        },
                        comm: "python3".into(),
                    }],
                    unread: vec![],
                    unread_total: 0,
                    after: "container 'c'".into(),
                    since: "2026-12-01T00:00:00Z".into(),
                },
            );
            Ok::<_, Error>(())
        })
        .unwrap();
    let r = b.scan(&Fake::default());
    assert_eq!(r.resets.len(), 1, "{:?}", r.resets);
    assert!(r.resets[0].1.as_ref().unwrap().scrubbed);
    let st = b.state();
    assert!(st.draining.is_empty() && !scrub_pending(&st, G2));
    // Off: nothing marked.
    let off = Bed::new(|_| {});
    off.store()
        .update(|st| {
            assert!(scrub_freed(&off.cfg, st, None, std::slice::from_ref(&r1)).is_empty());
            Ok::<_, Error>(())
        })
        .unwrap();
    assert!(off.bytes().is_none());
}

/// The real reset runner: the configured program as gpuhook runs every child (no
/// descriptor but the output pipe, a fixed environment, `/dev/null` for input), `{pci}`
/// replaced; its exit status and last words; killed at the deadline (its process group
/// too); the sysfs reset file written with `1`.
#[test]
fn the_reset_runs_as_every_child() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let seen = d.path().join("seen");
    let prog = d.path().join("reset");
    std::fs::write(
        &prog,
        format!(
            "#!/bin/sh\nout={}\necho \"args $*\" > $out\n[ -e /proc/$$/fd/779 ] && echo 'fd 779 leaked' >> $out\nreadlink /proc/$$/fd/0 >> $out\nenv >> $out\necho working\n[ \"$2\" = 0000:10:00.0 ] && exit 0\necho 'Unable to reset GPU' >&2\nexit 3\n",
            seen.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cfg = Config {
        sysfs: d.path().join("sys"),
        reset_command: crate::host::config::ResetCommand::Argv(vec![
            prog.display().to_string(),
            "-i".into(),
            "{pci}".into(),
        ]),
        ..Config::default()
    };
    // Open here, and inherited by an exec (dup2 clears close-on-exec): never seen there.
    let keep = std::fs::File::open("/dev/null").unwrap();
    // dup2 onto a descriptor number this test owns; closed below.
    let dup = crate::host::sys::dup_onto(std::os::fd::AsFd::as_fd(&keep), 779).unwrap();
    assert_eq!(std::os::fd::AsRawFd::as_raw_fd(&dup), 779);
    let ran = reset::run_reset(&cfg, G0.parse().unwrap(), Duration::from_secs(10));
    drop(dup);
    ran.unwrap();
    let text = std::fs::read_to_string(&seen).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "args -i 0000:10:00.0");
    assert!(!text.contains("leaked"), "{text}");
    assert_eq!(lines[1], "/dev/null", "{text}");
    // The environment: PATH (and what the shell sets itself), nothing of ours.
    assert!(
        lines.contains(&"PATH=/usr/sbin:/usr/bin:/sbin:/bin"),
        "{text}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("HOME=") || l.starts_with("CARGO")),
        "{text}"
    );
    let e = reset::run_reset(&cfg, G1.parse().unwrap(), Duration::from_secs(10)).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "'{} -i 0000:11:00.0': exited with status 3: Unable to reset GPU",
            prog.display()
        )
    );
    // Past the deadline: killed, with what it started.
    let pidfile = d.path().join("pid");
    std::fs::write(
        &prog,
        format!(
            "#!/bin/sh\nsleep 60 &\necho $! > {}\nwait\n",
            pidfile.display()
        ),
    )
    .unwrap();
    let t = std::time::Instant::now();
    let e = reset::run_reset(&cfg, G0.parse().unwrap(), Duration::from_millis(500)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(
        e.to_string()
            .ends_with(": it did not end within 500ms (killed)"),
        "{e}"
    );
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let runs = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.contains("(sleep)") && !s.contains(") Z "))
    };
    for _ in 0..200 {
        if !runs() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!runs(), "the reset's own child still runs");
    // A program that is not there.
    cfg.reset_command =
        crate::host::config::ResetCommand::Argv(vec!["/nonexistent/nvidia-smi".into()]);
    let e = reset::run_reset(&cfg, G0.parse().unwrap(), Duration::from_secs(5)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "'/nonexistent/nvidia-smi': no /nonexistent/nvidia-smi: No such file or directory (os error 2)"
    );
    assert!(reset::runnable(&cfg, G0.parse().unwrap()).is_err());
    // "pci": 1 written to the function's reset file.
    cfg.reset_command = crate::host::config::ResetCommand::Pci;
    let dev = cfg.sysfs.join("bus/pci/devices").join(G0);
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("reset"), "").unwrap();
    reset::run_reset(&cfg, G0.parse().unwrap(), Duration::from_secs(5)).unwrap();
    assert_eq!(std::fs::read_to_string(dev.join("reset")).unwrap(), "1");
    // A function without one (the kernel offers none for it): the error says so.
    let e = reset::run_reset(&cfg, G1.parse().unwrap(), Duration::from_secs(5)).unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "writing 1 to {}: exited with status 1: No such file or directory",
            cfg.sysfs
                .join("bus/pci/devices")
                .join(G1)
                .join("reset")
                .display()
        )),
        "{e}"
    );
}

#[path = "transitions/forged.rs"]
mod forged;

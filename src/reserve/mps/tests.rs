//! The plan, the two-step start and the PID file, on fakes.

use super::daemon::{dir_for, limit_commands, Daemon, PID_FILE};
use super::error::MpsError;
use super::nvidia::{in_namespace, read_pid, NvidiaMps};
use super::plan::{finish_stops, plan, stop_unused, DaemonPlan};
use super::start::{bring_up, claim};
use super::work::Mps;
use crate::host::config::{Config, ShareMode, Sharing};
use crate::host::inventory::Inventory;
use crate::host::procfs::ProcRef;
use crate::ids::Pci;
use crate::reserve::state::{HolderKind, Reservation, State, Store};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn pci(s: &str) -> Pci {
    s.parse().expect("a PCI address")
}

fn daemon(pid: i32) -> Daemon {
    Daemon {
        proc: ProcRef { pid, start_time: 7 },
        uuid: "GPU-1".into(),
        dir: "/run/gpuhook/mps/GPU-1".into(),
        starting: false,
        stopping: None,
    }
}

fn state(slots: &[(&str, &str)]) -> State {
    let mut st = State::default();
    for (id, unit) in slots {
        st.insert(Reservation::for_test(HolderKind::Oci, id, id, &[unit]));
    }
    st
}

const A: &str = "0000:04:00.0";
const B: &str = "0000:05:00.0";

#[test]
fn first_slot_starts_later_ones_do_not() {
    let mps: BTreeSet<Pci> = [pci(A)].into();
    let mut st = state(&[("c1", "0000:04:00.0/slot0")]);
    assert_eq!(plan(&st, &mps, &|_| true).start, vec![pci(A)]);
    st.mps.insert(pci(A), daemon(10));
    st.insert(Reservation::for_test(
        HolderKind::Oci,
        "c2",
        "c2",
        &["0000:04:00.0/slot1"],
    ));
    assert_eq!(plan(&st, &mps, &|_| true), DaemonPlan::default());
}

#[test]
fn a_dead_daemon_is_started_again() {
    let mps: BTreeSet<Pci> = [pci(A)].into();
    let mut st = state(&[("c1", "0000:04:00.0/slot0")]);
    st.mps.insert(pci(A), daemon(10));
    assert_eq!(plan(&st, &mps, &|_| false).start, vec![pci(A)]);
}

#[test]
fn timeslice_and_whole_gpus_start_nothing() {
    let mps: BTreeSet<Pci> = [pci(A)].into();
    let st = state(&[("c1", "0000:05:00.0/slot0"), ("c2", A)]);
    assert_eq!(plan(&st, &mps, &|_| true), DaemonPlan::default());
}

#[test]
fn a_daemon_without_sharers_is_stopped() {
    let mps: BTreeSet<Pci> = [pci(A), pci(B)].into();
    let mut st = state(&[("c1", "0000:05:00.0/slot1")]);
    st.mps.insert(pci(A), daemon(10));
    st.mps.insert(pci(B), daemon(11));
    let p = plan(&st, &mps, &|_| true);
    assert_eq!(p.stop, vec![pci(A)]);
    assert!(p.start.is_empty());
}

#[test]
fn limits_become_client_commands() {
    let s = Sharing {
        mode: ShareMode::Mps,
        replicas: 2,
        memory_limit_mib: Some(2048),
        active_thread_percentage: Some(50),
    };
    assert_eq!(
        limit_commands(&s),
        vec![
            "set_default_device_pinned_mem_limit 0 2048M",
            "set_default_active_thread_percentage 50"
        ]
    );
    assert!(limit_commands(&Sharing {
        mode: ShareMode::Mps,
        ..Sharing::timeslice(2)
    })
    .is_empty());
}

#[test]
fn dir_is_beside_the_state_file() {
    let cfg = Config::default();
    assert_eq!(
        dir_for(&cfg, "GPU-1"),
        cfg.state_file.parent().expect("a dir").join("mps/GPU-1")
    );
}

/// Stops what plan says, forgets a dead one, keeps one that cannot be told; starts (or
/// fails to, `fail`) after checking that its start was marked in the state file.
struct Fake(std::cell::RefCell<Vec<String>>, bool);
impl Fake {
    fn calls(&self) -> Vec<String> {
        self.0.borrow().clone()
    }
}
impl Mps for Fake {
    fn dirs(&self, cfg: &Config, pci: Pci, uuid: &str) -> Result<PathBuf, MpsError> {
        self.0.borrow_mut().push(format!("dirs {pci} {uuid}"));
        Ok(dir_for(cfg, uuid))
    }
    fn start(&self, cfg: &Config, pci: Pci, uuid: &str, _: &Sharing) -> Result<Daemon, MpsError> {
        self.0.borrow_mut().push(format!("start {pci} {uuid}"));
        // Outside the lock, after the mark is written.
        if let Ok(st) = Store::new(&cfg.state_file).read() {
            if st.mps.get(&pci).is_some_and(|d| d.starting) {
                self.0.borrow_mut().push(format!("marked {pci}"));
            }
        }
        if !self.1 {
            return Err(MpsError::Failed {
                pci,
                uuid: uuid.into(),
                what: "no start".into(),
            });
        }
        Ok(Daemon {
            uuid: uuid.into(),
            dir: dir_for(cfg, uuid),
            ..daemon(99)
        })
    }
    fn quit(&self, _: &Config, pci: Pci, _: &Daemon) -> Result<(), MpsError> {
        self.0.borrow_mut().push(format!("quit {pci}"));
        if self.1 {
            Ok(())
        } else {
            Err(MpsError::Failed {
                pci,
                uuid: "GPU-1".into(),
                what: "no answer".into(),
            })
        }
    }
    fn sweep(&self, _: &Config, pci: Pci, d: &Daemon) -> super::Swept {
        self.0
            .borrow_mut()
            .push(format!("sweep {pci} {}", d.proc.pid));
        super::Swept::default()
    }
}

/// A daemon process for the stop tests: a live child (`sleep`), as `/proc` sees it.
fn live_daemon() -> (std::process::Child, Daemon) {
    let ch = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let proc = crate::host::procfs::REAL
        .proc_ref(ch.id() as i32)
        .expect("its start time");
    (ch, Daemon { proc, ..daemon(1) })
}

/// Stops as the real host's do, on a live child: `quit` ends it (or, told to fail, leaves it
/// running), `kill` ends it (or, `stuck`, leaves it); each checks that the stop was marked in
/// the state file before it (written: the lock is not held while they run).
struct Stopper {
    cfg: Config,
    child: std::cell::RefCell<std::process::Child>,
    quits: bool,
    stuck: bool,
    calls: std::cell::RefCell<Vec<String>>,
}
impl Stopper {
    fn marked(&self, pci: Pci) -> bool {
        let st = Store::new(&self.cfg.state_file).read().unwrap();
        st.mps.get(&pci).is_some_and(|d| d.stopping.is_some())
    }
    fn end(&self) {
        let mut ch = self.child.borrow_mut();
        let _ = ch.kill();
        let _ = ch.wait();
    }
}
impl Mps for Stopper {
    fn start(&self, _: &Config, _: Pci, _: &str, _: &Sharing) -> Result<Daemon, MpsError> {
        unreachable!("no start")
    }
    fn quit(&self, _: &Config, pci: Pci, _: &Daemon) -> Result<(), MpsError> {
        self.calls
            .borrow_mut()
            .push(format!("quit {}", self.marked(pci)));
        if !self.quits {
            return Err(MpsError::Failed {
                pci,
                uuid: "GPU-1".into(),
                what: "pid 1 still runs 10s after quit".into(),
            });
        }
        self.end();
        Ok(())
    }
    fn kill(&self, _: &Config, pci: Pci, d: &Daemon, _: std::time::Duration) -> super::Swept {
        self.calls
            .borrow_mut()
            .push(format!("kill {}", self.marked(pci)));
        if !self.stuck {
            self.end();
        }
        super::Swept {
            killed: vec![d.proc.pid],
            left: if self.stuck { vec![d.proc.pid] } else { vec![] },
        }
    }
}

/// Issue 39's hostile review: a daemon without sharers is only *marked* `stopping` in the
/// locked step (nothing is told to quit under the lock); after it, it is told to quit (or,
/// when it does not go, killed), and a second locked step forgets it once it is gone. While
/// marked, no daemon is planned beside it, though a sharer came. One that does not die
/// stays marked, and a later locked step forgets it once it is gone.
#[test]
fn a_stop_is_marked_under_the_lock_and_told_after_it() {
    let proc = crate::host::procfs::REAL;
    let me = super::plan::own_ref(proc).unwrap();
    for (quits, stuck) in [(true, false), (false, false), (false, true)] {
        let (_t, cfg) = stored(&[]);
        let (ch, d) = live_daemon();
        let store = Store::new(&cfg.state_file);
        store
            .update(|st| -> Result<(), crate::reserve::state::StateError> {
                st.mps.insert(pci(A), d.clone());
                Ok(())
            })
            .unwrap();
        let m = Stopper {
            cfg: cfg.clone(),
            child: ch.into(),
            quits,
            stuck,
            calls: Default::default(),
        };
        let stops = store
            .update(|st| -> Result<_, crate::reserve::state::StateError> {
                Ok(stop_unused(&cfg, &m, proc, st))
            })
            .unwrap();
        assert!(m.calls.borrow().is_empty(), "nothing told under the lock");
        assert_eq!(stops.marked.len(), 1);
        let st = store.read().unwrap();
        assert_eq!(st.mps[&pci(A)].stopping, Some(me));
        // A sharer now: no daemon beside the one being stopped.
        let mut with = st.clone();
        with.reservations = state(&[("c1", "0000:04:00.0/slot0")]).reservations;
        let mps: BTreeSet<Pci> = [pci(A)].into();
        assert!(plan(&with, &mps, &|_| true).start.is_empty());
        assert!(plan(&with, &mps, &|_| false).start.is_empty());
        let notes = finish_stops(&cfg, &m, proc, stops.marked);
        let want: Vec<&str> = match (quits, stuck) {
            (true, _) => vec!["quit true"],
            _ => vec!["quit true", "kill true"],
        };
        assert_eq!(*m.calls.borrow(), want, "{notes:?}");
        let st = store.read().unwrap();
        assert_eq!(st.mps.contains_key(&pci(A)), stuck, "{notes:?}");
        if stuck {
            assert!(notes[0].contains("killed, not gone yet"), "{notes:?}");
            // Gone later: the next locked step forgets it.
            m.end();
            let mut st = store.read().unwrap();
            let notes = super::plan::sweep_dead(&cfg, &m, proc, &mut st);
            assert!(st.mps.is_empty(), "{notes:?}");
        } else if !quits {
            assert!(notes[0].ends_with(&format!("after quit; killed: [{}]", d.proc.pid)));
        } else {
            assert!(notes[0].starts_with("stopped MPS daemon pid"), "{notes:?}");
        }
    }
    // A dead one is forgotten without a stop.
    let cfg = Config::default();
    let mut st = State::default();
    st.mps.insert(pci(A), daemon(i32::MAX));
    let f = Fake(Default::default(), true);
    let stops = stop_unused(&cfg, &f, proc, &mut st);
    assert!(f.0.borrow().is_empty() && stops.marked.is_empty());
    assert!(st.mps.is_empty());
}

/// A stop whose stopper is gone (killed between its steps) with the daemon still running is
/// taken over by the next locked step: killed (it may have been told to quit already), not
/// told to quit again; a stop in progress by a live process is left to it.
#[test]
fn a_stop_whose_stopper_is_gone_is_taken_over() {
    let proc = crate::host::procfs::REAL;
    let me = super::plan::own_ref(proc).unwrap();
    let (_t, cfg) = stored(&[("c1", "0000:04:00.0/slot0")]);
    let (ch, d) = live_daemon();
    let gone = ProcRef {
        pid: i32::MAX,
        start_time: 1,
    };
    let store = Store::new(&cfg.state_file);
    let m = Stopper {
        cfg: cfg.clone(),
        child: ch.into(),
        quits: true,
        stuck: false,
        calls: Default::default(),
    };
    let mut st = store.read().unwrap();
    // By a live process (this one): left alone, though a sharer holds a slot now.
    st.mps.insert(
        pci(A),
        Daemon {
            stopping: Some(me),
            ..d.clone()
        },
    );
    assert!(stop_unused(&cfg, &m, proc, &mut st).marked.is_empty());
    st.mps.get_mut(&pci(A)).unwrap().stopping = Some(gone);
    let stops = store
        .update(|s| -> Result<_, crate::reserve::state::StateError> {
            *s = st;
            Ok(stop_unused(&cfg, &m, proc, s))
        })
        .unwrap();
    assert!(stops.notes[0].ends_with("did not finish (the process is gone): taken over"));
    assert!(stops.marked[0].taken_over);
    assert_eq!(store.read().unwrap().mps[&pci(A)].stopping, Some(me));
    finish_stops(&cfg, &m, proc, stops.marked);
    assert_eq!(*m.calls.borrow(), ["kill true"]);
    assert!(store.read().unwrap().mps.is_empty());
}

fn mps_inv(no_uuid_b: bool) -> Inventory {
    let mps = Sharing {
        mode: ShareMode::Mps,
        replicas: 2,
        memory_limit_mib: None,
        active_thread_percentage: None,
    };
    let mut gpus = crate::reserve::alloc::tests::dgx();
    for (g, p) in gpus.iter_mut().zip([A, B]) {
        g.pci = pci(p);
        g.sharing = Some(mps);
    }
    if no_uuid_b {
        gpus[1].uuid = None;
    }
    Inventory {
        gpus,
        controls: vec![],
        deferred: 0,
    }
}

fn units(us: &[&str]) -> Vec<crate::ids::Unit> {
    us.iter().map(|u| u.parse().expect("a unit")).collect()
}

/// A GPU without a UUID fails the claim (the caller's step, whose state is not written):
/// nothing is started.
#[test]
fn a_gpu_without_uuid_fails_the_claim() {
    let cfg = Config::default();
    let inv = mps_inv(true);
    let mut st = state(&[("c1", "0000:04:00.0/slot0"), ("c2", "0000:05:00.0/slot0")]);
    let f = Fake(Default::default(), true);
    let us = units(&["0000:04:00.0/slot0", "0000:05:00.0/slot0"]);
    let e = claim(&cfg, &f, crate::host::procfs::REAL, &mut st, &inv, &us).unwrap_err();
    assert!(e.to_string().contains("has no UUID"), "{e}");
    assert!(!f.calls().iter().any(|c| c.starts_with("start")));
}

/// The test's state file, with reservations holding these slots.
fn stored(slots: &[(&str, &str)]) -> (tempfile::TempDir, Config) {
    let t = tempfile::tempdir().unwrap();
    let cfg = Config {
        state_file: t.path().join("state.json"),
        ..Config::default()
    };
    let st0 = state(slots);
    Store::new(&cfg.state_file)
        .update(|st| -> Result<(), crate::reserve::state::StateError> {
            *st = st0;
            Ok(())
        })
        .unwrap();
    (t, cfg)
}

/// The claim marks the start in the caller's locked step; the daemon starts after it, with
/// the mark written, and a second locked step records it; another holder's unrelated
/// units neither mark nor wait.
#[test]
fn a_start_is_marked_then_run_outside_the_lock_then_recorded() {
    let (_t, cfg) = stored(&[("c1", "0000:04:00.0/slot0")]);
    let inv = mps_inv(false);
    let proc = crate::host::procfs::REAL;
    let f = Fake(Default::default(), true);
    let us = units(&["0000:04:00.0/slot0"]);
    let store = Store::new(&cfg.state_file);
    store
        .update(|st| claim(&cfg, &f, proc, st, &inv, &us))
        .unwrap();
    let st = store.read().unwrap();
    assert!(st.mps[&pci(A)].starting);
    let up = bring_up(&cfg, &f, proc, &inv, &us, &|_| {}).unwrap();
    assert_eq!(
        f.calls(),
        vec![
            format!("dirs {A} GPU-00000000"),
            format!("start {A} GPU-00000000"),
            format!("marked {A}")
        ]
    );
    let st = store.read().unwrap();
    assert!(!st.mps[&pci(A)].starting);
    assert_eq!(st.mps[&pci(A)].proc.pid, 99);
    assert_eq!(up.daemons[&pci(A)].proc.pid, 99);
    assert!(up.notes[0].starts_with("started MPS daemon pid 99 for GPU"));
    // Whole GPUs: nothing to bring up, and no lock taken.
    let whole = units(&[B]);
    let up = bring_up(&cfg, &f, proc, &inv, &whole, &|_| panic!("no undo")).unwrap();
    assert!(up.notes.is_empty() && up.daemons.is_empty());
}

/// A failed start forgets its mark and undoes the caller's step in the same locked step.
#[test]
fn a_failed_start_forgets_the_mark_and_undoes_the_step() {
    let (_t, cfg) = stored(&[("c1", "0000:04:00.0/slot0")]);
    let inv = mps_inv(false);
    let proc = crate::host::procfs::REAL;
    let f = Fake(Default::default(), false);
    let us = units(&["0000:04:00.0/slot0"]);
    let store = Store::new(&cfg.state_file);
    store
        .update(|st| claim(&cfg, &f, proc, st, &inv, &us))
        .unwrap();
    let undo = |st: &mut State| {
        st.reservations.remove("c1");
    };
    let e = bring_up(&cfg, &f, proc, &inv, &us, &undo).unwrap_err();
    assert!(e.to_string().contains("no start"), "{e}");
    let st = store.read().unwrap();
    assert!(st.mps.is_empty());
    assert!(st.reservations.is_empty());
}

/// A mark whose starter is gone is swept by the next claim, which marks the start again.
#[test]
fn a_dead_starters_mark_is_swept() {
    let cfg = Config::default();
    let inv = mps_inv(false);
    let proc = crate::host::procfs::REAL;
    let mut st = state(&[("c1", "0000:04:00.0/slot0")]);
    st.mps.insert(
        pci(A),
        Daemon {
            starting: true,
            stopping: None,
            ..daemon(i32::MAX)
        },
    );
    let f = Fake(Default::default(), true);
    let us = units(&["0000:04:00.0/slot0"]);
    let notes = claim(&cfg, &f, proc, &mut st, &inv, &us).unwrap();
    assert_eq!(f.calls()[0], format!("sweep {A} {}", i32::MAX));
    assert!(notes[0].contains("did not finish"), "{notes:?}");
    let d = &st.mps[&pci(A)];
    assert!(d.starting);
    assert_eq!(d.proc.pid, std::process::id() as i32);
    // A live starter's mark is neither swept nor stopped.
    let f = Fake(Default::default(), true);
    st.reservations.clear();
    let _ = stop_unused(&cfg, &f, proc, &mut st);
    assert!(f.calls().is_empty());
    assert!(st.mps[&pci(A)].starting);
}

/// Leftovers of a dead start that are slow to die (each pass kills them, they are still
/// there at its end) keep the mark: nothing is started beside them, and the mark is
/// forgotten (and the start marked anew) by the first pass that finds none.
struct Dying(std::cell::Cell<u32>, std::cell::RefCell<Vec<String>>);
impl Mps for Dying {
    fn dirs(&self, cfg: &Config, pci: Pci, uuid: &str) -> Result<PathBuf, MpsError> {
        self.1.borrow_mut().push(format!("dirs {pci}"));
        Ok(dir_for(cfg, uuid))
    }
    fn start(&self, _: &Config, _: Pci, _: &str, _: &Sharing) -> Result<Daemon, MpsError> {
        unreachable!("claim starts nothing")
    }
    fn quit(&self, _: &Config, _: Pci, _: &Daemon) -> Result<(), MpsError> {
        unreachable!("nothing to quit")
    }
    fn sweep(&self, _: &Config, pci: Pci, _: &Daemon) -> super::Swept {
        self.1.borrow_mut().push(format!("sweep {pci}"));
        let left = self.0.get();
        self.0.set(left.saturating_sub(1));
        super::Swept {
            killed: vec![4242],
            left: if left > 0 { vec![4242] } else { vec![] },
        }
    }
}

#[test]
fn a_dead_starts_leftovers_slow_to_die_keep_the_mark_and_start_nothing() {
    let cfg = Config::default();
    let inv = mps_inv(false);
    let proc = crate::host::procfs::REAL;
    let mut st = state(&[("c1", "0000:04:00.0/slot0")]);
    let dead = Daemon {
        starting: true,
        stopping: None,
        ..daemon(i32::MAX)
    };
    st.mps.insert(pci(A), dead.clone());
    // A plan never starts over a mark, dead or alive.
    let gpus = [pci(A)].into_iter().collect();
    assert!(plan(&st, &gpus, &|_| false).start.is_empty());
    let m = Dying(std::cell::Cell::new(2), Default::default());
    let us = units(&["0000:04:00.0/slot0"]);
    for _ in 0..2 {
        let notes = claim(&cfg, &m, proc, &mut st, &inv, &us).unwrap();
        assert_eq!(st.mps[&pci(A)], dead, "{notes:?}");
        assert!(notes[0].contains("not gone yet: [4242]"), "{notes:?}");
    }
    assert_eq!(*m.1.borrow(), ["sweep 0000:04:00.0", "sweep 0000:04:00.0"]);
    let notes = claim(&cfg, &m, proc, &mut st, &inv, &us).unwrap();
    assert!(
        notes[0].ends_with("stopped what it left: [4242]"),
        "{notes:?}"
    );
    let d = &st.mps[&pci(A)];
    assert!(d.starting);
    assert_eq!(d.proc.pid, std::process::id() as i32);
    assert_eq!(m.1.borrow().last().unwrap(), "dirs 0000:04:00.0");
}

/// The state file: `starting` is written only while true, `stopping` only while set (a
/// record without them, as an older gpuhook wrote it, loads).
#[test]
fn starting_and_stopping_are_optional_fields() {
    let text = r#"{"proc":{"pid":5,"start_time":7},"uuid":"GPU-1","dir":"/run/gpuhook/mps/GPU-1"}"#;
    assert_eq!(serde_json::from_str::<Daemon>(text).unwrap(), daemon(5));
    let by = ProcRef {
        pid: 6,
        start_time: 8,
    };
    let m = Daemon {
        stopping: Some(by),
        ..daemon(5)
    };
    let t = serde_json::to_string(&m).unwrap();
    assert!(t.contains(r#""stopping":{"pid":6,"start_time":8}"#), "{t}");
    assert_eq!(serde_json::from_str::<Daemon>(&t).unwrap(), m);
    let d = daemon(5);
    let text = serde_json::to_string(&d).unwrap();
    assert!(!text.contains("starting"), "{text}");
    let s: Daemon = serde_json::from_str(&text).unwrap();
    assert_eq!(s, d);
    let m = Daemon {
        starting: true,
        stopping: None,
        ..daemon(5)
    };
    assert!(serde_json::to_string(&m)
        .unwrap()
        .contains("\"starting\":true"));
}

/// The PID file is read only as a small regular file: a FIFO planted at its name does not
/// block, a link is not followed, PID 1 and junk are no PID.
#[test]
fn pid_file_read_neither_blocks_nor_follows() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join(PID_FILE);
    std::fs::write(&p, "4242\n").unwrap();
    assert_eq!(read_pid(&p), Some(4242));
    for junk in ["1\n", "x", ""] {
        std::fs::write(&p, junk).unwrap();
        assert_eq!(read_pid(&p), None, "{junk:?}");
    }
    std::fs::remove_file(&p).unwrap();
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    assert_eq!(read_pid(&p), None, "a FIFO");
    std::fs::remove_file(&p).unwrap();
    std::fs::write(t.path().join("real"), "4242").unwrap();
    std::os::unix::fs::symlink("real", &p).unwrap();
    assert_eq!(read_pid(&p), None, "a link");
    let me = std::process::id() as i32;
    let ours = nix::sys::stat::stat("/proc/self/ns/mnt").unwrap().st_ino as u64;
    assert!(in_namespace(me, ours));
    assert!(!in_namespace(me, ours + 1));
}

/// The sweep of a dead starter's daemon looks only at processes in a mount namespace of their
/// own (the daemon's): an operator's process on the host that exported the same pipe
/// directory is not the daemon's, and is never killed.
#[test]
fn the_sweep_passes_over_a_host_process_with_the_daemons_environment() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("needs root (a mount namespace of its own)");
        return;
    }
    let pipe = tempfile::tempdir().unwrap();
    let spawn = |argv: &[&str]| {
        std::process::Command::new(argv[0])
            .args(&argv[1..])
            .env("CUDA_MPS_PIPE_DIRECTORY", pipe.path())
            .spawn()
            .unwrap()
    };
    let mut host = spawn(&["sleep", "30"]);
    let mut own = spawn(&["unshare", "-m", "--propagation", "private", "sleep", "30"]);
    // `unshare` execs `sleep` in its new namespace: wait for the exec.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::fs::read_to_string(format!("/proc/{}/comm", own.id()))
        .is_ok_and(|c| c.trim() != "sleep")
        && std::time::Instant::now() < end
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let host_seen = super::nvidia::is_started_for(host.id() as i32, pipe.path());
    let own_seen = super::nvidia::is_started_for(own.id() as i32, pipe.path());
    let found = super::nvidia::started_for(pipe.path());
    for c in [&mut host, &mut own] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(
        !host_seen,
        "a host process in gpuhook's own mount namespace"
    );
    assert!(own_seen, "a process in a mount namespace of its own");
    assert_eq!(found, vec![own.id() as i32]);
}

/// One pass of the real sweep is bounded (it runs under the state lock): a process of the
/// daemon's that is slow to die (held at its exit by the test bed's `hold-at-exit`, as a
/// daemon stuck in the driver is) is killed and reported left within a fraction of a
/// second; a pass once it is gone finds nothing left.
#[test]
fn a_sweep_pass_is_bounded_when_what_it_kills_is_slow_to_die() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("needs root (a mount namespace of its own, ptrace)");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let pipe = t.path().join("pipe");
    std::fs::create_dir(&pipe).unwrap();
    let mut own = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sleep", "30"])
        .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
        .spawn()
        .unwrap();
    let pid = own.id() as i32;
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !super::nvidia::is_started_for(pid, &pipe) {
        assert!(std::time::Instant::now() < end, "never in its namespace");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (dying, attached) = (t.path().join("dying"), t.path().join("attached"));
    let hold = Path::new(env!("CARGO_MANIFEST_DIR")).join("testbed/scripts/hold-at-exit");
    let mut holder = std::process::Command::new(hold)
        .arg(pid.to_string())
        .arg("1.5")
        .args([&dying, &attached])
        .env_clear()
        .spawn()
        .unwrap();
    while !attached.exists() {
        assert!(
            std::time::Instant::now() < end,
            "hold-at-exit never attached"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let d = Daemon {
        dir: t.path().into(),
        starting: true,
        stopping: None,
        ..daemon(i32::MAX)
    };
    let cfg = Config::default();
    let t0 = std::time::Instant::now();
    let swept = NvidiaMps.sweep(&cfg, pci(A), &d);
    let took = t0.elapsed();
    assert!(dying.exists(), "not killed");
    assert_eq!(
        (swept.killed.clone(), swept.left.clone()),
        (vec![pid], vec![pid])
    );
    assert!(took < std::time::Duration::from_millis(500), "{took:?}");
    let _ = own.wait();
    let _ = holder.wait();
    let again = NvidiaMps.sweep(&cfg, pci(A), &d);
    assert_eq!(again, super::Swept::default());
}

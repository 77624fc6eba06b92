//! Draining (SPEC "MIG and GPU health"): a GPU, or MIG instance, freed while a process still
//! has one of its own nodes open is given to no one until none has.
//!
//! An open descriptor outlives the container it was opened in: it can be passed over a unix
//! socket to a process outside the container's PID namespace (a sibling container, a domain
//! on the host's network), which keeps the GPU after the holder stopped. So every free looks
//! for the freed units' own nodes by **device number** in every `/proc/PID/fd` (one pass
//! over `/proc` per free, whatever the number of GPUs), and records what it finds in the
//! state. An allocation that does not fit otherwise looks again: the recorded processes
//! first (still alive, still holding one of those numbers?), then, when they all let go, one
//! full pass (the descriptor may have been passed on) before a unit is free again.
//!
//! Own nodes: a whole GPU's (`/dev/nvidiaN`, its DRM render and card nodes); a MIG
//! instance's compute-instance capability, and its GPU instance's unless another
//! reservation still holds an instance of that GPU instance. Never the shared control
//! nodes (`nvidiactl`, `nvidia-uvm`, `/dev/kfd`), nor a MIG GPU's `/dev/nvidiaN`, which every
//! instance of it uses.

use crate::host::config::Config;
use crate::host::inventory::{self, Inventory, Scan};
use crate::host::procfs::{Proc, ProcRef};
use crate::log;
use crate::reserve::state::{Draining, Node, Opener, Reservation, State};
use std::collections::BTreeSet;

/// A unit just freed: its id, its own nodes, whose reservation it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freed {
    pub unit: String,
    pub nodes: Vec<Node>,
    pub after: String,
}

fn number(n: &Node) -> u64 {
    libc::makedev(n.major, n.minor)
}

fn numbers(nodes: &[Node]) -> BTreeSet<u64> {
    nodes.iter().map(number).collect()
}

/// The units of reservations just taken out of `st`, with their own nodes (see the module
/// comment). A unit the inventory does not know (its GPU is gone) has none.
pub fn freed_units(inv: &Inventory, st: &State, freed: &[Reservation]) -> Vec<Freed> {
    let mut out = Vec::new();
    for r in freed {
        for unit in &r.gpus {
            let nodes = match inv.mig(unit) {
                Some((g, m)) => {
                    let gi = format!("{}/gi{}/", g.pci, m.gi);
                    let shared = st
                        .reservations
                        .values()
                        .flat_map(|o| &o.gpus)
                        .any(|u| u.starts_with(&gi));
                    let mut v = vec![m.ci_cap.node.clone()];
                    if !shared {
                        v.insert(0, m.gi_cap.node.clone());
                    }
                    v
                }
                None if unit.contains('/') => Vec::new(),
                None => inv
                    .by_pci(unit)
                    .map(|g| g.nodes.iter().map(|(_, n)| n.node.clone()).collect())
                    .unwrap_or_default(),
            };
            if !nodes.is_empty() {
                out.push(Freed {
                    unit: unit.clone(),
                    nodes,
                    after: r.who(),
                });
            }
        }
    }
    out
}

/// What [`settle`] changed, for the log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Settled {
    /// Units now draining: (unit, its record).
    pub draining: Vec<(String, Draining)>,
    /// Draining units nothing has open any more: free again.
    pub released: Vec<String>,
}

/// Records the `fresh` units (just freed) that a process other than this one has open as
/// draining; with `recheck`, lets go of the draining units that nothing has open any more
/// (their recorded processes looked at first; a full look only for units all of whose
/// recorded processes let go). At most one pass over `/proc`. Called under the state lock.
pub fn settle(st: &mut State, fresh: Vec<Freed>, recheck: bool, proc: Proc, now: &str) -> Settled {
    let mut rescan = Vec::new();
    if recheck {
        for (unit, d) in st.draining.iter_mut() {
            let nums = numbers(&d.nodes);
            d.holders
                .retain(|o| proc.alive(&o.proc) && proc.holds_any(o.proc.pid, &nums));
            if d.holders.is_empty() {
                rescan.push(unit.clone());
            }
        }
    }
    let mut wanted: BTreeSet<u64> = fresh.iter().flat_map(|f| numbers(&f.nodes)).collect();
    for u in &rescan {
        wanted.extend(numbers(&st.draining[u].nodes));
    }
    let mut out = Settled::default();
    if wanted.is_empty() {
        return out;
    }
    let found = proc.openers(&wanted, std::process::id() as i32);
    let holders = |nodes: &[Node]| -> Vec<Opener> {
        let procs: BTreeSet<ProcRef> = nodes
            .iter()
            .filter_map(|n| found.get(&number(n)))
            .flatten()
            .copied()
            .collect();
        procs
            .into_iter()
            .map(|p| Opener {
                proc: p,
                comm: proc.comm(p.pid).unwrap_or_else(|| "?".into()),
            })
            .collect()
    };
    for u in rescan {
        let Some(d) = st.draining.get_mut(&u) else {
            continue;
        };
        d.holders = holders(&d.nodes);
        if d.holders.is_empty() {
            st.draining.remove(&u);
            out.released.push(u);
        }
    }
    for f in fresh {
        let h = holders(&f.nodes);
        if h.is_empty() {
            continue;
        }
        let d = Draining {
            nodes: f.nodes,
            holders: h,
            after: f.after,
            since: now.to_string(),
        };
        st.draining.insert(f.unit.clone(), d.clone());
        out.draining.push((f.unit, d));
    }
    out
}

/// One line for the log about each change.
pub fn notes(s: &Settled) -> Vec<String> {
    let mut out = Vec::new();
    for (unit, d) in &s.draining {
        out.push(format!(
            "{} freed {unit}, but {} still {} {} open: draining, given to no one until it is closed",
            d.after,
            Opener::describe(&d.holders),
            if d.holders.len() == 1 { "has" } else { "have" },
            d.nodes
                .iter()
                .map(|n| n.path.as_str())
                .collect::<Vec<_>>()
                .join(" "),
        ));
    }
    for unit in &s.released {
        out.push(format!("{unit} is no longer open anywhere: free again"));
    }
    out
}

/// Logs [`notes`]: a unit draining as a warning.
pub fn log_settled(s: &Settled) {
    for (i, n) in notes(s).iter().enumerate() {
        if i < s.draining.len() {
            log::warn(n);
        } else {
            log::info(n);
        }
    }
}

/// After `freed` left the state (under its lock): their units that a process still has open
/// become draining. The nodes' numbers come from the host's inventory, read here (lazily:
/// the driver's details of the freed GPUs only); when it cannot be read that is said, and
/// the units are free as before.
pub fn after_free(cfg: &Config, st: &mut State, freed: &[Reservation]) -> Settled {
    if freed.iter().all(|r| r.gpus.is_empty()) {
        return Settled::default();
    }
    let lazy = Scan {
        caps: None,
        lazy: true,
    };
    let mut inv = match inventory::scan_with(cfg, lazy) {
        Ok(i) => i,
        Err(e) => {
            log::warn(&format!(
                "cannot look for processes that keep freed GPUs open ({e}): they are free"
            ));
            return Settled::default();
        }
    };
    after_free_on(&mut inv, cfg, st, freed)
}

/// [`after_free`] on an inventory at hand (settled here for the freed GPUs).
pub fn after_free_on(
    inv: &mut Inventory,
    cfg: &Config,
    st: &mut State,
    freed: &[Reservation],
) -> Settled {
    after_free_in(inv, cfg, st, freed, crate::host::procfs::HOST)
}

/// [`after_free_on`], the openers looked for in this `/proc`.
pub fn after_free_in(
    inv: &mut Inventory,
    cfg: &Config,
    st: &mut State,
    freed: &[Reservation],
    proc: crate::host::procfs::Proc,
) -> Settled {
    let units: Vec<String> = freed.iter().flat_map(|r| r.gpus.clone()).collect();
    if units.is_empty() {
        return Settled::default();
    }
    inv.settle(cfg, &units);
    let fresh = freed_units(inv, st, freed);
    let s = settle(
        st,
        fresh,
        false,
        proc,
        &crate::reserve::state::now_rfc3339(),
    );
    log_settled(&s);
    s
}

/// Looks again at the draining units (see [`settle`]), logging those free again: for
/// `reconcile` (under the lock, written back), and for the views that read the state
/// without the lock (`list`, `check`, metrics, Placement: nothing written; the next
/// allocation that needs such a unit finds it free the same way).
pub fn recheck(st: &mut State) -> Settled {
    if st.draining.is_empty() {
        return Settled::default();
    }
    settle(
        st,
        Vec::new(),
        true,
        crate::host::procfs::HOST,
        &crate::reserve::state::now_rfc3339(),
    )
}

/// The PIDs that keep a GPU (or any of its MIG instances) draining; empty when it is not.
pub fn pids_of(st: &State, pci: &str) -> Vec<i32> {
    let mut v: Vec<i32> = st
        .draining
        .iter()
        .filter(|(u, _)| crate::host::inventory::unit_pci(u) == pci)
        .flat_map(|(_, d)| d.holders.iter().map(|o| o.proc.pid))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The PIDs that keep this unit draining; empty when it is not.
pub fn unit_pids(st: &State, unit: &str) -> Vec<i32> {
    st.draining
        .get(unit)
        .map(|d| d.holders.iter().map(|o| o.proc.pid).collect())
        .unwrap_or_default()
}

/// Marks the GPUs that are draining whole unusable, with their holders as the reason: for
/// the counts of Placement and metrics, as [`crate::reserve::health::apply`] does for quarantine.
pub fn apply(inv: &mut Inventory, st: &State) {
    if st.draining.is_empty() {
        return;
    }
    for g in &mut inv.gpus {
        if let Some(d) = st.draining.get(&g.pci) {
            if g.problem.is_none() {
                g.problem = Some(format!("draining: {}", d.holder(&g.pci)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Vendor;
    use crate::reserve::alloc::tests::{gpu, req, with_migs};
    use crate::reserve::state::{Phase, Reservation};
    use std::os::unix::process::CommandExt;
    use std::path::Path;

    /// A real char node with a real number but no driver behind it (a normal open gives
    /// ENXIO; an `O_PATH` descriptor still has its number).
    fn mknod(dir: &Path, name: &str, major: u32, minor: u32) -> std::path::PathBuf {
        let p = dir.join(name);
        nix::sys::stat::mknod(
            &p,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            libc::makedev(major, minor),
        )
        .expect("mknod (run the tests as root)");
        p
    }

    /// `sleep 30` holding an `O_PATH` descriptor on `node`, opened in the child between fork
    /// and exec (so that no other test's child inherits it).
    fn holder(node: &Path) -> std::process::Child {
        let c = std::ffi::CString::new(node.as_os_str().as_encoded_bytes()).unwrap();
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        // SAFETY: between fork and exec the closure calls only open(2), which is
        // async-signal-safe, on a path allocated before the fork; the descriptor is left
        // open (no O_CLOEXEC) for `sleep` to keep.
        unsafe {
            cmd.pre_exec(move || {
                if libc::open(c.as_ptr(), libc::O_PATH) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("sleep");
        // Until it has exec'd, the child is a copy of us (a test process, not `sleep`).
        for _ in 0..200 {
            if crate::host::procfs::comm(child.id() as i32).as_deref() == Some("sleep") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child
    }

    fn reservation(gpus: &[&str]) -> Reservation {
        Reservation {
            kind: Default::default(),
            domain: "web1".into(),
            uuid: "11111111-1111-1111-1111-111111111111".into(),
            gpus: gpus.iter().map(|s| s.to_string()).collect(),
            phase: Phase::Running,
            request: "1 GPU".into(),
            created: "2026-12-01T00:00:00Z".into(),
            updated: "2026-12-01T00:00:00Z".into(),
            prepared_by: None,
            controller: None,
            init: None,
            nodes: vec![],
            mounts: vec![],
        }
    }

    /// One GPU whose node is 195:`minor` (a number no other test uses).
    fn inv_with(minor: u32) -> Inventory {
        let mut g = gpu(0, Some(0), "sw0", Vendor::Nvidia, "hopper");
        g.nodes[0].1.node = Node::new(format!("/dev/nvidia{minor}"), 195, minor);
        Inventory {
            gpus: vec![g],
            ..Default::default()
        }
    }

    /// Over the real `/proc`: a process holding an `O_PATH` descriptor on the node is found
    /// by the node's number (`stat` of `/proc/PID/fd/N`), with its command name; our own
    /// descriptor on it is not; a process holding none is not.
    #[test]
    fn scan_finds_a_real_holder_by_number() {
        let d = tempfile::tempdir().unwrap();
        let node = mknod(d.path(), "nvidia211", 195, 211);
        let _own = nix::fcntl::open(
            &node,
            nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap();
        let mut child = holder(&node);
        let pid = child.id() as i32;
        let wanted: BTreeSet<u64> = [libc::makedev(195, 211)].into();
        let me = std::process::id() as i32;
        let found = crate::host::procfs::HOST.openers(&wanted, me);
        let procs = &found[&libc::makedev(195, 211)];
        assert_eq!(procs.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![pid]);
        assert!(crate::host::procfs::HOST.holds_any(pid, &wanted));
        assert!(!crate::host::procfs::HOST.holds_any(me, &[libc::makedev(195, 212)].into()));
        // Through `settle`: the freed GPU is draining, held by `sleep`.
        let mut st = State::default();
        let inv = inv_with(211);
        let fresh = freed_units(&inv, &st, &[reservation(&["0000:10:00.0"])]);
        assert_eq!(fresh[0].nodes, vec![Node::new("/dev/nvidia211", 195, 211)]);
        let s = settle(&mut st, fresh, false, crate::host::procfs::HOST, "now");
        assert_eq!(s.draining.len(), 1);
        let dr = &st.draining["0000:10:00.0"];
        assert_eq!(dr.holders[0].proc.pid, pid);
        assert_eq!(dr.holders[0].comm, "sleep");
        assert_eq!(dr.after, "domain 'web1'");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// The allocation decision: a draining GPU is given to no one, the refusal names the
    /// process (PID and command); once the holder exits the next check frees it.
    #[test]
    fn draining_gpu_skipped_refused_then_freed() {
        let d = tempfile::tempdir().unwrap();
        let node = mknod(d.path(), "nvidia213", 195, 213);
        let mut child = holder(&node);
        let pid = child.id() as i32;
        let mut st = State::default();
        let mut inv = inv_with(213);
        let mut other = gpu(1, Some(0), "sw0", Vendor::Nvidia, "hopper");
        other.nodes[0].1.node = Node::new("/dev/nvidia214", 195, 214);
        inv.gpus.push(other);
        let fresh = freed_units(&inv, &st, &[reservation(&["0000:10:00.0"])]);
        settle(&mut st, fresh, false, crate::host::procfs::HOST, "now");
        // Skipped: a request for one GPU gets the other.
        assert_eq!(
            crate::reserve::alloc::allocate(&inv.gpus, &st.held(None), &req(1)).unwrap(),
            vec!["0000:11:00.0"]
        );
        let e = crate::reserve::alloc::allocate(&inv.gpus, &st.held(None), &req(2))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "1 held by pid {pid} (sleep), which still has 0000:10:00.0 open after domain 'web1' (draining)"
            )),
            "{e}"
        );
        let mut exact = req(1);
        exact.devices = vec![crate::request::DeviceSel::Index(0)];
        let e = crate::reserve::alloc::allocate(&inv.gpus, &st.held(None), &exact)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "GPU 0000:10:00.0 (index 0) is held by pid {pid} (sleep)"
            )),
            "{e}"
        );
        assert!(!e.contains('\n'));
        // Still held: a re-check keeps it (the cheap look at the recorded process suffices).
        let s = settle(&mut st, vec![], true, crate::host::procfs::HOST, "now");
        assert!(s.released.is_empty());
        assert!(st.draining.contains_key("0000:10:00.0"));
        child.kill().unwrap();
        child.wait().unwrap();
        let s = settle(&mut st, vec![], true, crate::host::procfs::HOST, "now");
        assert_eq!(s.released, vec!["0000:10:00.0"]);
        assert!(st.draining.is_empty());
        assert_eq!(
            crate::reserve::alloc::allocate(&inv.gpus, &st.held(None), &req(2)).unwrap(),
            vec!["0000:10:00.0", "0000:11:00.0"]
        );
    }

    /// A written-out `/proc`: `PID/stat`, `PID/comm`, `PID/fd/N` links to real nodes.
    struct FakeProc {
        dir: tempfile::TempDir,
    }

    impl FakeProc {
        fn new() -> FakeProc {
            FakeProc {
                dir: tempfile::tempdir().unwrap(),
            }
        }
        fn root(&self) -> &str {
            self.dir.path().to_str().unwrap()
        }
        fn process(&self, pid: i32, comm: &str, start: u64) {
            let p = self.dir.path().join(pid.to_string());
            std::fs::create_dir_all(p.join("fd")).unwrap();
            let mut f = vec!["0"; 50];
            let s = start.to_string();
            f[0] = "S";
            f[19] = &s;
            std::fs::write(p.join("stat"), format!("{pid} ({comm}) {}\n", f.join(" "))).unwrap();
            std::fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
        }
        fn open(&self, pid: i32, fd: u32, target: &Path) {
            std::os::unix::fs::symlink(target, self.dir.path().join(format!("{pid}/fd/{fd}")))
                .unwrap();
        }
        fn close(&self, pid: i32, fd: u32) {
            std::fs::remove_file(self.dir.path().join(format!("{pid}/fd/{fd}"))).unwrap();
        }
    }

    /// A MIG instance: its two capabilities are looked for (the GPU instance's only when no
    /// other reservation holds an instance of it), never the parent's `/dev/nvidiaN` or a
    /// control node. A descriptor passed on (the recorded holder closed it, another process
    /// has it) keeps the unit draining; a reused PID (another start time) is not the holder.
    #[test]
    fn mig_units_passed_on_descriptors_and_pid_reuse() {
        let nodes = tempfile::tempdir().unwrap();
        let parent = mknod(nodes.path(), "nvidia215", 195, 215);
        let gi = mknod(nodes.path(), "cap1", 236, 901);
        let ci = mknod(nodes.path(), "cap2", 236, 902);
        let ci2 = mknod(nodes.path(), "cap3", 236, 903);
        let ctl = mknod(nodes.path(), "ctl", 195, 255);
        let mut g = with_migs(
            gpu(0, Some(0), "sw0", Vendor::Nvidia, "hopper"),
            &[(1, 0), (1, 1)],
        );
        g.nodes[0].1.node = Node::new("/dev/nvidia215", 195, 215);
        for (m, (gm, cm)) in g.migs.iter_mut().zip([(901, 902), (901, 903)]) {
            m.gi_cap.node = Node::new(format!("/dev/nvidia-caps/nvidia-cap{gm}"), 236, gm);
            m.ci_cap.node = Node::new(format!("/dev/nvidia-caps/nvidia-cap{cm}"), 236, cm);
        }
        let inv = Inventory {
            gpus: vec![g],
            ..Default::default()
        };
        let fp = FakeProc::new();
        let proc = Proc { root: fp.root() };
        fp.process(100, "python3", 5000);
        fp.open(100, 3, &parent);
        fp.open(100, 4, &ctl);
        fp.open(100, 5, &gi);
        fp.process(200, "worker", 6000);
        fp.open(200, 7, &ci2);
        let mut st = State::default();
        // ci1 of the same GPU instance is still held: its capability of the GPU instance is
        // not this unit's own.
        let mut keep = reservation(&["0000:10:00.0/gi1/ci1"]);
        keep.uuid = "22222222-2222-2222-2222-222222222222".into();
        st.reservations.insert(keep.uuid.clone(), keep);
        let fresh = freed_units(&inv, &st, &[reservation(&["0000:10:00.0/gi1/ci0"])]);
        assert_eq!(
            fresh[0].nodes,
            vec![Node::new("/dev/nvidia-caps/nvidia-cap902", 236, 902)]
        );
        let s = settle(&mut st, fresh, false, proc, "now");
        assert!(
            s.draining.is_empty(),
            "the parent, a control node, a shared capability: {s:?}"
        );
        // Alone on its GPU instance, the instance's own nodes are both capabilities.
        st.reservations.clear();
        let fresh = freed_units(&inv, &st, &[reservation(&["0000:10:00.0/gi1/ci0"])]);
        assert_eq!(fresh[0].nodes.len(), 2);
        settle(&mut st, fresh, false, proc, "now");
        let d = &st.draining["0000:10:00.0/gi1/ci0"];
        assert_eq!(d.holders.len(), 1);
        assert_eq!(
            (d.holders[0].proc.pid, d.holders[0].comm.as_str()),
            (100, "python3")
        );
        assert_eq!(unit_pids(&st, "0000:10:00.0/gi1/ci0"), vec![100]);
        assert_eq!(pids_of(&st, "0000:10:00.0"), vec![100]);
        // The GPU whole is busy while one of its instances drains.
        assert!(crate::reserve::alloc::busy(&st.held(None), "0000:10:00.0").is_some());
        // Passed on: 100 closes it, 300 has it now.
        fp.close(100, 5);
        fp.process(300, "thief", 7000);
        fp.open(300, 9, &ci);
        let s = settle(&mut st, vec![], true, proc, "now");
        assert!(s.released.is_empty());
        let d = &st.draining["0000:10:00.0/gi1/ci0"];
        assert_eq!(
            d.holders.iter().map(|o| o.proc.pid).collect::<Vec<_>>(),
            vec![300]
        );
        // PID 300 reused by another process (another start time) that has it open too: the
        // cheap look does not take it for the recorded one, the full look finds it anew.
        fp.process(300, "other", 9999);
        let s = settle(&mut st, vec![], true, proc, "now");
        assert!(s.released.is_empty());
        assert_eq!(
            st.draining["0000:10:00.0/gi1/ci0"].holders[0]
                .proc
                .start_time,
            9999
        );
        fp.close(300, 9);
        let s = settle(&mut st, vec![], true, proc, "now");
        assert_eq!(s.released, vec!["0000:10:00.0/gi1/ci0"]);
        assert!(st.draining.is_empty());
    }

    /// The cost of one pass over the real `/proc` (docs/BENCHMARKS.md): as the machine is,
    /// then with 500 more processes and with one process holding 19,000 descriptors.
    /// `cargo test --release --lib drain::tests::scan_cost -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn scan_cost() {
        let wanted: BTreeSet<u64> = [libc::makedev(195, 250)].into();
        let me = std::process::id() as i32;
        let pass = |label: &str| {
            let (pids, mut fds) = (crate::host::procfs::HOST.pids(), 0usize);
            for p in &pids {
                crate::host::procfs::HOST.open_chr(*p, |_| ());
                fds += std::fs::read_dir(format!("/proc/{p}/fd")).map_or(0, |d| d.count());
            }
            let mut t: Vec<u128> = (0..31)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    let f = crate::host::procfs::HOST.openers(&wanted, me);
                    assert!(f.is_empty());
                    t0.elapsed().as_micros()
                })
                .collect();
            t.sort_unstable();
            println!(
                "{label}: {} processes, {fds} descriptors: median {} us, p90 {} us",
                pids.len(),
                t[15],
                t[27]
            );
        };
        pass("as is");
        let mut kids: Vec<_> = (0..500)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("60")
                    .spawn()
                    .unwrap()
            })
            .collect();
        pass("+500 sleep");
        for k in &mut kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        let mut many = std::process::Command::new("python3")
            .args([
                "-c",
                "import os,time; fds=[os.open('/dev/null', os.O_RDONLY) for _ in range(19000)]; time.sleep(60)",
            ])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        pass("+1 process with 19000 descriptors");
        let _ = many.kill();
        let _ = many.wait();
    }

    /// The state keeps draining units across a write and a read; a file written before
    /// (without them) still loads, and one without draining units keeps its old bytes.
    #[test]
    fn state_roundtrip_and_old_files() {
        let mut st = State::default();
        st.draining.insert(
            "0000:10:00.0".into(),
            Draining {
                nodes: vec![Node::new("/dev/nvidia0", 195, 0)],
                holders: vec![Opener {
                    proc: ProcRef {
                        pid: 42,
                        start_time: 7,
                    },
                    comm: "sleep".into(),
                }],
                after: "domain 'web1'".into(),
                since: "2026-12-01T00:00:00Z".into(),
            },
        );
        let bytes = st.to_bytes();
        assert_eq!(State::parse(&bytes, "x").unwrap(), st);
        let old = b"{\"version\":1,\"reservations\":{\n}}\n";
        assert!(State::parse(old, "x").unwrap().draining.is_empty());
        assert_eq!(State::default().to_bytes(), old);
        let mut inv = inv_with(0);
        apply(&mut inv, &st);
        assert!(inv.gpus[0]
            .problem
            .as_deref()
            .unwrap()
            .starts_with("draining: pid 42 (sleep)"));
    }
}

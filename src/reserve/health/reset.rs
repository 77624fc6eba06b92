//! `gpuhook health reset PCI` (and `health scan`'s resets: `auto_reset`, `reset_on_release`):
//! reset a GPU nothing holds or has open, re-probe it, and lift its quarantine only when
//! every probe passes (docs/guides/health.md).
//!
//! Never under the state lock for the reset itself: one locked step marks the GPU
//! `resetting` (unusable for every door), the reset and the probes run without the lock,
//! another locked step records the outcome. A process killed between them leaves the GPU
//! `resetting` (its process gone: unusable until a reset runs again), never free and
//! unprobed. A refusal changes nothing.

use super::catalog::{Action, Check};
use super::confirm::Confirmation;
pub use super::error::Unrunnable;
use super::{boot_id, escalate, HealthError};
use crate::host::config::Config;
use crate::host::inventory::{self, ProbeFailure, Scan};
use crate::host::procfs::{Budget, ProcRef};
use crate::host::program::{self, TrustedProgram};
use crate::ids::Pci;
use crate::node::Node;
use crate::reserve::error::Error;
use crate::reserve::state::{now_rfc3339, Quarantine, Resetting, State, Store};
use crate::reserve::world::World;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a reset may run (the command, or the write to the sysfs `reset` file).
pub const DEADLINE: Duration = Duration::from_secs(30);

/// What a reset did not do: the command (or the write) and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {how}")]
pub struct ResetFailure {
    /// `'/usr/bin/nvidia-smi --gpu-reset -i 0000:3b:00.0'`, `writing 1 to PATH`.
    pub what: String,
    pub how: Ended,
}

/// How a reset that failed ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ended {
    #[error("exited with status {code}{}", note(.said))]
    Status { code: i32, said: String },
    #[error("killed by {signal}{}", note(.said))]
    Signal { signal: String, said: String },
    #[error("{0}")]
    Run(#[from] crate::enter::sandbox::RunError),
    /// It could not run at all (its program changed since the check before the mark).
    #[error("{0}")]
    Unrunnable(Unrunnable),
}

fn note(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!(": {}", crate::log::one_line(s, 300))
    }
}

/// Why a reset did not bring the GPU back: the reset failed, or a probe after it did.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("{0}")]
    Reset(#[from] ResetFailure),
    #[error("{0}")]
    Probe(#[from] ProbeFailure),
}

/// The reset and the probes, and the look at a GPU's own state that confirms an Xid: the
/// host's ([`HostReset`]), or the unit tests' doubles.
pub trait Recover {
    /// Resets the GPU as the config says, within [`DEADLINE`].
    fn reset(&self, cfg: &Config, pci: Pci) -> Result<(), ResetFailure>;
    /// Every probe, the first that fails.
    fn probe(&self, cfg: &Config, pci: Pci) -> Result<(), ProbeFailure>;
    /// What the GPU's own state says of an Xid's class ([`super::confirm`]).
    fn confirm(&self, cfg: &Config, pci: Pci, check: Check) -> Confirmation;
    /// Told where a reset is (an operator's command says it on stderr): nothing by default.
    fn progress(&self, _step: &Progress) {}
    /// Whether the configured reset can run at all for this GPU (a configuration fault
    /// otherwise: refused before anything is marked). The doubles' resets always can.
    fn runnable(&self, _cfg: &Config, _pci: Pci) -> Result<(), Unrunnable> {
        Ok(())
    }
}

/// The configured reset program, trusted to run as root ([`program::trusted_program`]) and
/// executable: its descriptor, which the reset runs (never its path again).
fn reset_program(path: &Path) -> Result<TrustedProgram, Unrunnable> {
    let p = program::trusted_program(path)?;
    let mode = nix::sys::stat::fstat(&p.fd)
        .map(|st| st.st_mode & 0o7777)
        .unwrap_or(0);
    if mode & 0o111 == 0 {
        return Err(Unrunnable::NotExecutable { path: p.path, mode });
    }
    Ok(p)
}

/// Whether the configured reset can run for the GPU at `pci`: its program trusted and
/// executable, or (`"pci"`) the function's sysfs `reset` file there.
pub fn runnable(cfg: &Config, pci: Pci) -> Result<(), Unrunnable> {
    match cfg.reset_command.argv(pci.as_str()) {
        Some(argv) => reset_program(Path::new(&argv[0])).map(drop),
        None => {
            let path = sysfs_reset(cfg, pci);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_file() => Ok(()),
                Ok(_) => Err(Unrunnable::NoSysfsReset {
                    path,
                    source: std::io::Error::from(std::io::ErrorKind::InvalidInput).into(),
                }),
                Err(e) => Err(Unrunnable::NoSysfsReset {
                    path,
                    source: e.into(),
                }),
            }
        }
    }
}

/// Where a reset is, while it runs: the reset may take up to [`DEADLINE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The GPU is marked `resetting`; the reset runs now (`what`: the command, or the write
    /// to sysfs).
    Resetting { pci: Pci, what: String },
    /// The reset ended well after `took`; the probes run now.
    Probing { pci: Pci, took: Duration },
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Progress::Resetting { pci, what } => write!(
                f,
                "GPU {pci}: resetting: {what} ({} s at most)",
                DEADLINE.as_secs()
            ),
            Progress::Probing { pci, took } => write!(
                f,
                "GPU {pci}: reset ran in {:.2} s; probing it (config space, driver, not excluded)",
                took.as_secs_f64()
            ),
        }
    }
}

/// What a reset of `pci` runs, as messages say it: `'/usr/bin/nvidia-smi --gpu-reset -i
/// PCI'`, or `writing 1 to <sys>/bus/pci/devices/PCI/reset`.
pub fn reset_what(cfg: &Config, pci: Pci) -> String {
    match cfg.reset_command.argv(pci.as_str()) {
        Some(argv) => format!("'{}'", argv.join(" ")),
        None => format!("writing 1 to {}", sysfs_reset(cfg, pci).display()),
    }
}

/// The sysfs file of a function-level reset.
fn sysfs_reset(cfg: &Config, pci: Pci) -> std::path::PathBuf {
    cfg.sysfs
        .join("bus/pci/devices")
        .join(pci.as_str())
        .join("reset")
}

/// This host: the configured `reset_command`, as gpuhook runs every child
/// ([`crate::enter::sandbox::run_program`]), or the sysfs function-level reset in a child
/// of its own; then [`inventory::probe`]; [`super::confirm::on_host`] for an Xid.
pub struct HostReset;

impl Recover for HostReset {
    fn reset(&self, cfg: &Config, pci: Pci) -> Result<(), ResetFailure> {
        run_reset(cfg, pci, DEADLINE)
    }
    fn probe(&self, cfg: &Config, pci: Pci) -> Result<(), ProbeFailure> {
        inventory::probe(cfg, pci)
    }
    fn confirm(&self, cfg: &Config, pci: Pci, check: Check) -> Confirmation {
        super::confirm::on_host(cfg, pci, check)
    }
    fn runnable(&self, cfg: &Config, pci: Pci) -> Result<(), Unrunnable> {
        runnable(cfg, pci)
    }
}

/// Runs the configured reset of the GPU at `pci`, killed past `limit`.
pub fn run_reset(cfg: &Config, pci: Pci, limit: Duration) -> Result<(), ResetFailure> {
    use crate::enter::sandbox::{run_child, run_program_fd, Waited};
    let what = reset_what(cfg, pci);
    let fail = |how: Ended| ResetFailure {
        what: what.clone(),
        how,
    };
    let ran = match cfg.reset_command.argv(pci.as_str()) {
        // The program checked, and run from the descriptor checked.
        Some(argv) => match reset_program(Path::new(&argv[0])) {
            Ok(p) => run_program_fd(&p.fd, &argv, limit, 64 * 1024),
            Err(e) => return Err(fail(Ended::Unrunnable(e))),
        },
        None => {
            let path = sysfs_reset(cfg, pci);
            let write = move || -> Result<(), String> {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&path)
                    .and_then(|mut f| f.write_all(b"1"))
                    .map_err(|e| e.to_string())
            };
            run_child(limit, write)
        }
    };
    let ran = ran.map_err(|e| fail(e.into()))?;
    if ran.ok() {
        return Ok(());
    }
    let said = ran.last_line();
    Err(fail(match ran.status {
        Waited::Exited { code, .. } => Ended::Status { code, said },
        Waited::Signaled { signal, .. } => Ended::Signal {
            signal: nix::sys::signal::Signal::try_from(signal)
                .map_or_else(|_| signal.to_string(), |s| format!("{s:?}")),
            said,
        },
        other => Ended::Status {
            code: -1,
            said: format!("{other}{}", note(&said)),
        },
    }))
}

/// Why a reset was asked for (for messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Why {
    /// `gpuhook health reset`.
    Operator,
    /// `health scan` with `auto_reset`: quarantined with the reset action.
    AutoReset,
    /// `health scan`: freed with `reset_on_release`.
    Scrub,
}

/// How a reset ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reset {
    pub pci: Pci,
    pub why: Why,
    /// `None`: every probe passed.
    pub failure: Option<Failure>,
    /// The quarantine it lifted.
    pub lifted: Option<Quarantine>,
    /// The quarantine it left (kept, or made by a failure).
    pub kept: Option<Quarantine>,
    /// A reset before whose process was gone: taken over.
    pub took_over: Option<Resetting>,
    /// It was scrub pending (`reset_on_release`).
    pub scrubbed: bool,
    /// How long the reset and the probes took.
    pub took: Duration,
}

/// Whether a reset mark is of a process that runs now, in this boot.
pub fn live(f: &World, r: &Resetting, boot: Option<&str>) -> bool {
    r.boot_id.as_deref() == boot && f.proc.alive(&r.by)
}

/// The GPU's own nodes: what the inventory lists (its MIG instances' capabilities too) and
/// what its driver names without a look at its config space.
fn nodes_of(f: &World, pci: Pci) -> Result<Vec<Node>, Error> {
    let mut inv = (f.scan)(
        f.cfg,
        Scan {
            caps: None,
            lazy: true,
        },
    )?;
    inv.settle(f.cfg, &[pci]);
    let g = inv.by_pci(&pci).ok_or(HealthError::NotAGpu { pci })?;
    let mut nodes = g.own_nodes();
    for m in &g.migs {
        nodes.push(m.gi_cap.node.clone());
        nodes.push(m.ci_cap.node.clone());
    }
    for n in inventory::own_nodes_of(f.cfg, pci) {
        if !nodes.contains(&n) {
            nodes.push(n);
        }
    }
    Ok(nodes)
}

/// The refusal for a GPU someone holds (whole, by an instance or a slot) or that drains.
fn held(st: &State, pci: Pci) -> Option<String> {
    let who: Vec<String> = st
        .held(None)
        .into_iter()
        .filter(|(u, _)| u.pci() == pci)
        .map(|(_, w)| w)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    (!who.is_empty()).then(|| who.join(", "))
}

/// Resets the GPU `gpu` (as the operator named it: [`named_gpu`]): refused while it is held,
/// draining, open or being reset; else marked `resetting`, reset, probed, and the outcome
/// recorded.
pub fn reset(f: &World, r: &dyn Recover, gpu: &str, why: Why) -> Result<Reset, Error> {
    reset_pci(f, r, named_gpu(f, gpu)?, why)
}

/// The GPU an operator names, as `attach` and `detach` take one: its PCI address (any case,
/// the domain optional), or its index or UUID among the GPUs this host lists now.
pub fn named_gpu(f: &World, gpu: &str) -> Result<Pci, Error> {
    if let Some(p) = Pci::normalize(gpu) {
        return Ok(p);
    }
    let not = || HealthError::NotPci {
        pci: gpu.to_string(),
    };
    let sel = match crate::request::oci::devices(gpu) {
        Ok(mut v) if v.len() == 1 => v.remove(0),
        _ => return Err(not().into()),
    };
    let inv = (f.scan)(
        f.cfg,
        Scan {
            caps: None,
            lazy: false,
        },
    )?;
    crate::reserve::alloc::resolve(&inv.gpus, &sel)
        .map(|g| g.pci)
        .ok_or_else(|| HealthError::NoSuchGpu { sel }.into())
}

/// A GPU someone holds is refused as such before the reset program is looked at (it would
/// not run either way): a reservation (looked at again under the lock, where draining is
/// settled first: not looked at here), or a running VM that passes it through without one
/// (libvirt's status XML: QEMU holds its VFIO group, none of its nodes).
fn refuse_held(f: &World, store: &Store, pci: Pci) -> Result<(), Error> {
    let mut now = store.read()?;
    now.draining.clear();
    if let Some(who) = held(&now, pci) {
        return Err(HealthError::Held { pci, who }.into());
    }
    if let Some((_, vm)) = crate::reserve::vm::passed_through(f.cfg, f.proc).of_gpu(pci, None) {
        return Err(HealthError::Held { pci, who: vm.who() }.into());
    }
    Ok(())
}

/// [`reset`] of a PCI address.
pub fn reset_pci(f: &World, r: &dyn Recover, pci: Pci, why: Why) -> Result<Reset, Error> {
    let cfg = f.cfg;
    let store = Store::new(&cfg.state_file);
    let nodes = nodes_of(f, pci)?;
    refuse_held(f, &store, pci)?;
    // A reset that cannot run at all is the config's fault: refused before anything is
    // marked (no `resetting`, no quarantine, nothing counted).
    r.runnable(cfg, pci)
        .map_err(|source| HealthError::Unrunnable { pci, source })?;
    let me = f
        .proc
        .proc_ref(std::process::id() as i32)
        .ok_or(HealthError::OwnStartTime)?;
    let boot = boot_id(cfg);
    let started = now_rfc3339();
    let key = pci.to_string();
    // One locked step: refused (nothing written), or marked resetting.
    let took_over = store.update(|st| -> Result<Option<Resetting>, Error> {
        // A GPU that drains: looked at again (closed since, it is free).
        if st.draining.keys().any(|u| u.pci() == pci) {
            let s = crate::reserve::drain::settle(
                st,
                Vec::new(),
                true,
                f.proc,
                &started,
                crate::reserve::drain::BUDGET,
            );
            crate::reserve::drain::log_settled(&s);
        }
        if let Some(who) = held(st, pci) {
            return Err(HealthError::Held { pci, who }.into());
        }
        if let Some(r) = st.health.get(&key).and_then(|h| h.resetting.as_ref()) {
            if live(f, r, boot.as_deref()) {
                return Err(HealthError::Resetting {
                    pci,
                    pid: r.by.pid,
                    since: r.since.clone(),
                }
                .into());
            }
        }
        none_open(f, pci, &nodes, me.pid)?;
        let h = st.health.entry(key.clone()).or_default();
        Ok(h.resetting.replace(Resetting {
            by: me,
            since: started.clone(),
            boot_id: boot.clone(),
        }))
    })?;
    // Without the lock: the reset, then the probes.
    r.progress(&Progress::Resetting {
        pci,
        what: reset_what(cfg, pci),
    });
    let t = Instant::now();
    let failure = match r.reset(cfg, pci) {
        Err(e) => Some(Failure::Reset(e)),
        Ok(()) => {
            r.progress(&Progress::Probing {
                pci,
                took: t.elapsed(),
            });
            r.probe(cfg, pci).err().map(Failure::Probe)
        }
    };
    let took = t.elapsed();
    // Another locked step: the outcome.
    let now = now_rfc3339();
    store.update(|st| -> Result<Reset, Error> {
        let mut out = Reset {
            pci,
            why,
            failure: failure.clone(),
            lifted: None,
            kept: None,
            took_over: took_over.clone(),
            scrubbed: false,
            took,
        };
        record(
            st,
            cfg,
            &key,
            me,
            &started,
            &now,
            failure.as_ref(),
            &mut out,
        );
        Ok(out)
    })
}

/// Refused while a process other than this one (`me`) has one of the GPU's nodes open, or a
/// process could not be read.
fn none_open(f: &World, pci: Pci, nodes: &[Node], me: i32) -> Result<(), Error> {
    let wanted: BTreeSet<u64> = nodes
        .iter()
        .map(|n| libc::makedev(n.major, n.minor))
        .collect();
    let found = f.proc.openers(
        &wanted,
        |p| p != me,
        &Budget::new(crate::reserve::drain::BUDGET),
    );
    if !found.openers.is_empty() {
        let mut who = Vec::new();
        for n in nodes {
            let procs = found
                .openers
                .get(&libc::makedev(n.major, n.minor))
                .cloned()
                .unwrap_or_default();
            for p in procs {
                let comm = f.proc.comm(p.pid).unwrap_or_else(|| "?".into());
                who.push(format!("pid {} ({comm}) has {} open", p.pid, n.path));
            }
        }
        return Err(HealthError::Open {
            pci,
            who: who.join(", "),
        }
        .into());
    }
    if !found.complete() {
        let who = found
            .unread
            .iter()
            .map(|p| p.pid.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(HealthError::Unread {
            pci,
            who,
            total: found.unread_total,
        }
        .into());
    }
    Ok(())
}

/// The outcome step: the mark taken off, the counters, the quarantine lifted (a `reset`
/// one from before the reset, not escalated, when every probe passed) or kept; a failure
/// quarantines the GPU (again: it counts towards `max_quarantines`) with the failure as
/// its reason.
#[allow(clippy::too_many_arguments)]
fn record(
    st: &mut State,
    cfg: &Config,
    key: &str,
    me: ProcRef,
    started: &str,
    now: &str,
    failure: Option<&Failure>,
    out: &mut Reset,
) {
    let h = st.health.entry(key.to_string()).or_default();
    if h.resetting.as_ref().is_some_and(|r| r.by == me) {
        h.resetting = None;
    }
    out.scrubbed = std::mem::take(&mut h.scrub_pending);
    match failure {
        None => {
            h.resets_ok += 1;
            let lift = st.quarantine.get(key).is_some_and(|q| {
                q.action == Some(Action::Reset)
                    && !q.needs_inspection
                    && q.since.as_str() <= started
            });
            if lift {
                out.lifted = st.quarantine.remove(key);
            } else {
                out.kept = st.quarantine.get(key).cloned();
            }
        }
        Some(fail) => {
            h.resets_failed += 1;
            let reason = format!("reset failed: {fail}");
            let q = st.quarantine.entry(key.to_string()).or_insert(Quarantine {
                xid: None,
                reason: reason.clone(),
                message: String::new(),
                since: now.to_string(),
                action: Some(Action::Reset),
                boot_id: None,
                needs_inspection: false,
            });
            q.reason = reason;
            escalate(st, cfg, key, now);
            out.kept = st.quarantine.get(key).cloned();
        }
    }
    super::prune(st, key, now);
}

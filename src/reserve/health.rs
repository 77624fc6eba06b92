//! GPU health from the kernel log, by NVIDIA's Xid catalog, with recovery (SPEC "Health by
//! NVIDIA's Xid catalog, with recovery"). `gpuhook health scan` (run by
//! `gpuhook-health.timer`) reads the records the last scan did not, takes as Xids only the
//! NVIDIA driver's own ([`xid`]: a kernel record in the driver's whole shape, never one
//! with netfilter's packet log fields), lets a reset or reboot Xid wait for the GPU's own
//! state where it can show the fault ([`confirm`]), and acts on each Xid as
//! [`catalog`] says: counted and logged (`ignore`, and Xids it does not know), a warning
//! naming the GPU's holder (`restart`), or a quarantine in the state (`reset`, `reboot`).
//! A reset quarantine ends with a reset whose probes all pass ([`reset`]: `gpuhook health
//! reset PCI`, or the scan's own with `auto_reset`), a reboot quarantine with a new boot id;
//! a GPU quarantined `max_quarantines` times within 24 hours needs inspection and stays
//! until `gpuhook health clear PCI`, which lifts any quarantine. With `reset_on_release`,
//! every free marks a GPU its last holder let go of `scrub pending` ([`scrub_freed`]) until
//! the scan resets it. A quarantined, resetting or scrub-pending GPU is unusable for every
//! front door ([`apply`]), with its reason.
//!
//! The PCI-level checks (config space that reads as all ones, a driver that no longer lists
//! a GPU bound to it, the driver's `GPU Excluded`) and the link shown in `list` are the
//! inventory's: they are read where the GPU is looked at, and again after a reset.

pub mod catalog;
pub mod confirm;
pub mod error;
pub mod reset;
pub mod scrub;
#[cfg(test)]
mod transitions;
pub mod xid;

use crate::host::config::Config;
use crate::host::inventory::{Inventory, Scan};
use crate::ids::{normalize_pci, Pci};
use crate::log::one_line;
use crate::reserve::error::Error;
use crate::reserve::state::{
    now_rfc3339, parse_rfc3339, KmsgMark, Quarantine, State, Store, XidCount,
};
use crate::reserve::world::World;
use catalog::{Action, Check, XidVerdict};
use confirm::{Confirmation, GpuState, Unreadable};
use error::HealthError;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
#[cfg(test)]
use scrub::scrub_freed;
use scrub::scrub_text;
use std::path::Path;
pub use xid::{parse_xid, Xid};
use xid::{Imitation, Shape};

/// At most this much of new kernel log records is taken per scan (records beyond are left
/// for the next scan); records the last scan read are passed over without counting, up to
/// [`MAX_SKIP`].
pub const MAX_READ: usize = 32 << 20;
/// A bound on all that one scan reads (`log_buf_len` can be set above 32 MiB).
pub const MAX_SKIP: usize = 1 << 30;

/// One kernel log record as `/dev/kmsg` hands it out: `PRIO,SEQ,USEC,FLAGS[,…];MESSAGE`,
/// then continuation lines that start with a space (`SUBSYSTEM=pci`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `facility << 3 | level`: the kernel's own records have facility 0; a record written
    /// to `/dev/kmsg` from userspace gets facility `user` (1) or another one, never 0
    /// (`devkmsg_write`), so an `NVRM:` line from userspace is told apart.
    pub prio: u32,
    pub seq: u64,
    pub msg: String,
}

impl Record {
    /// Logged by the kernel (facility 0), not written into the log from userspace.
    pub fn from_kernel(&self) -> bool {
        self.prio >> 3 == 0
    }

    /// What the scan makes of it: the driver's Xid only when the kernel logged it and its
    /// whole text is the driver's ([`xid::shape`]).
    pub fn kind(&self) -> RecordKind {
        match xid::shape(&self.msg) {
            Shape::Other => RecordKind::Other,
            _ if !self.from_kernel() => RecordKind::Userspace,
            Shape::Imitation(why) => RecordKind::Imitation(why),
            Shape::Driver(x) => RecordKind::Xid(x),
        }
    }
}

/// What one kernel log record is to the scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKind {
    /// It does not begin `NVRM: Xid`.
    Other,
    /// It begins so, but was written into the log from userspace (facility not 0).
    Userspace,
    /// A kernel record that begins so but is not the driver's (why).
    Imitation(Imitation),
    /// The driver's Xid.
    Xid(Xid),
}

/// The records in `text` (one read of `/dev/kmsg` each, or a file of them); continuation
/// and malformed lines are skipped.
pub fn parse_records(text: &str) -> Vec<Record> {
    text.lines()
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| {
            let (head, msg) = l.split_once(';')?;
            let mut f = head.split(',');
            let prio: u32 = f.next()?.parse().ok()?;
            let seq: u64 = f.next()?.parse().ok()?;
            Some(Record {
                prio,
                seq,
                msg: msg.to_owned(),
            })
        })
        .collect()
}

/// Reads the kernel log's records after sequence number `after` (all with `None`), without
/// blocking: from a `/dev/kmsg`-like device (one record per read, `EAGAIN` at the end,
/// `EPIPE` when records were overwritten while we read) or a regular file (the tests'
/// fixtures, split into lines here). New records up to [`MAX_READ`] bytes.
pub fn read_kmsg(path: &Path, after: Option<u64>) -> Result<Vec<Record>, Error> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| HealthError::kmsg(path, e))?;
    let mut out = Vec::new();
    let (mut taken, mut total) = (0usize, 0usize);
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    while taken < MAX_READ && total < MAX_SKIP {
        let n = match nix::unistd::read(&fd, &mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(Errno::EAGAIN) => break,
            Err(Errno::EPIPE) | Err(Errno::EINTR) => continue,
            Err(e) => return Err(HealthError::kmsg(path, e).into()),
        };
        total += n;
        pending.extend_from_slice(&buf[..n]);
        // Whole lines only (a file's read may end inside one).
        let Some(end) = pending.iter().rposition(|&c| c == b'\n') else {
            continue;
        };
        let lines: Vec<u8> = pending.drain(..=end).collect();
        for r in parse_records(&String::from_utf8_lossy(&lines)) {
            if after.is_none_or(|a| r.seq > a) {
                taken += r.msg.len();
                out.push(r);
            }
        }
    }
    Ok(out)
}

/// What a scan did.
#[derive(Debug, Default)]
pub struct ScanReport {
    /// Records read that the last scan had not seen.
    pub new_records: usize,
    /// GPUs quarantined by this scan (a quarantine made stronger, reset → reboot, too).
    pub quarantined: Vec<(String, Quarantine)>,
    /// Of those, the ones quarantined `max_quarantines` times within 24 hours now: they need
    /// inspection.
    pub escalated: Vec<String>,
    /// Of those, addresses this host does not list as a GPU now (unbound, being reset,
    /// removed): quarantined all the same, in effect when it is a GPU again.
    pub unlisted: Vec<String>,
    /// Xid lines written into the log from userspace (not the driver's): ignored.
    pub forged: Vec<String>,
    /// Kernel records that begin like an Xid but are not the driver's (a netfilter LOG
    /// rule's prefix, another shape): why, and the record. Ignored.
    pub imitations: Vec<(Imitation, String)>,
    /// Reset and reboot Xids that the GPU's own state refuted (what it showed): counted with
    /// the action `ignore` and logged, not quarantined.
    pub unconfirmed: Vec<(Seen, GpuState)>,
    /// Reset and reboot Xids that the GPU's own state confirmed (what it showed).
    pub confirmed: Vec<(Seen, GpuState)>,
    /// Reset and reboot Xids whose class the GPU's state confirms but could not be read
    /// (why): the driver's record is trusted.
    pub trusted: Vec<(Seen, Unreadable)>,
    /// Who holds each GPU quarantined by this scan (whole, by its MIG instances, or every
    /// sharer of a shared GPU), as messages name them: they keep it until they stop.
    pub holders: std::collections::BTreeMap<String, Vec<String>>,
    /// Xids whose action is `restart`: the GPU, the Xid, what it means, the record, and who
    /// holds the GPU (the program that must restart is theirs).
    pub restart: Vec<Seen>,
    /// Xids counted and logged only (`ignore`, and those not in the catalog).
    pub ignored: Vec<Seen>,
    /// Reboot quarantines of an earlier boot: lifted.
    pub rebooted: Vec<(String, Quarantine)>,
    /// What the scan's resets did (`auto_reset`, scrub pending GPUs): each, or why it did
    /// not run.
    pub resets: Vec<(Pci, Result<reset::Reset, Error>)>,
}

/// An Xid the scan acted on without quarantining.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub pci: String,
    pub xid: u32,
    pub verdict: XidVerdict,
    pub message: String,
    pub holders: Vec<String>,
}

/// Everyone who holds any unit of GPU `pci`, each once, in the state's order.
pub fn holders_of(st: &State, pci: &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for r in st.reservations.values() {
        if r.gpus.iter().any(|u| u.pci() == *pci) && !v.contains(&r.who()) {
            v.push(r.who());
        }
    }
    v
}

/// The kernel's boot id (`<proc>/sys/kernel/random/boot_id`): sequence numbers of the kernel
/// log restart at each boot, and a reboot quarantine ends in another boot. `None` when it
/// cannot be read.
pub fn boot_id(cfg: &Config) -> Option<String> {
    std::fs::read_to_string(cfg.proc.join("sys/kernel/random/boot_id"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The 24 hours escalation counts quarantines in.
pub const WINDOW_SECS: i64 = 24 * 3600;

/// Drops the quarantine times of GPU `key` older than 24 hours (before `now`), and its
/// health record when nothing is left in it.
pub(crate) fn prune(st: &mut State, key: &str, now: &str) {
    let Some(h) = st.health.get_mut(key) else {
        return;
    };
    let now = parse_rfc3339(now).unwrap_or(0);
    h.quarantined
        .retain(|t| parse_rfc3339(t).is_some_and(|t| now - t < WINDOW_SECS));
    if h.is_empty() {
        st.health.remove(key);
    }
}

/// How many times GPU `key` was quarantined within the 24 hours before `now`.
pub fn count_24h(st: &State, key: &str, now: &str) -> usize {
    let now = parse_rfc3339(now).unwrap_or(0);
    st.health.get(key).map_or(0, |h| {
        h.quarantined
            .iter()
            .filter(|t| parse_rfc3339(t).is_some_and(|t| now - t < WINDOW_SECS))
            .count()
    })
}

/// GPU `key` was quarantined (again) at `now`: counted; quarantined `max_quarantines` times
/// within 24 hours, it needs inspection. Whether it does now.
pub(crate) fn escalate(st: &mut State, cfg: &Config, key: &str, now: &str) -> bool {
    st.health
        .entry(key.to_string())
        .or_default()
        .quarantined
        .push(now.to_string());
    prune(st, key, now);
    let n = count_24h(st, key, now);
    match st.quarantine.get_mut(key) {
        Some(q) if n >= cfg.max_quarantines as usize => {
            let first = !q.needs_inspection;
            q.needs_inspection = true;
            first
        }
        _ => false,
    }
}

/// Counts an Xid of GPU `key` with the action it was given.
fn count_xid(st: &mut State, key: &str, xid: u32, action: Action) {
    let h = st.health.entry(key.to_string()).or_default();
    match h
        .xids
        .iter_mut()
        .find(|c| c.xid == xid && c.action == action)
    {
        Some(c) => c.count += 1,
        None => {
            h.xids.push(XidCount {
                xid,
                action,
                count: 1,
            });
            h.xids.sort_by_key(|c| (c.xid, c.action));
        }
    }
}

/// Reads the kernel log (`<dev>/kmsg`) from where the last scan stopped and acts on its Xid
/// errors; then resets what it should (`auto_reset`, scrub pending GPUs) with `r`
/// ([`reset::HostReset`] on this host).
pub fn scan(f: &World, r: &dyn reset::Recover) -> Result<ScanReport, Error> {
    let cfg = f.cfg;
    let store = Store::new(&cfg.state_file);
    let boot = boot_id(cfg);
    let boot_text = boot.clone().unwrap_or_default();
    let mark = |st: &State| match &st.kmsg {
        Some(m) if m.boot_id == boot_text => Some(m.seq),
        _ => None,
    };
    // The records after the last scan's mark (read again under the lock below).
    let records = read_kmsg(&cfg.dev.join("kmsg"), mark(&store.read()?))?;
    let inv = (f.scan)(
        cfg,
        Scan {
            caps: Some(Default::default()),
            lazy: true,
        },
    )?;
    let now = now_rfc3339();
    let cx = Taking {
        cfg,
        inv: &inv,
        // The GPUs' own state, read without the lock (nvidia-smi is a child of its own).
        looked: look_at_gpus(cfg, r, &records),
        now: &now,
        boot: boot.as_ref(),
    };
    let mut rep = store.update(|st| -> Result<ScanReport, Error> {
        let mut rep = ScanReport::default();
        end_rebooted(st, boot.as_ref(), &mut rep);
        let from = mark(st);
        let mut last = from;
        for r in records.iter().filter(|r| from.is_none_or(|f| r.seq > f)) {
            rep.new_records += 1;
            last = Some(last.map_or(r.seq, |l| l.max(r.seq)));
            take(st, &cx, &mut rep, r);
        }
        let keys: Vec<String> = st.health.keys().cloned().collect();
        for k in keys {
            prune(st, &k, &now);
        }
        // Draining GPUs looked at again: one closed since is free, and can be reset below
        // (a scrub-pending GPU that drained after its free waits for this).
        if !st.draining.is_empty() {
            let s = crate::reserve::drain::settle(
                st,
                Vec::new(),
                true,
                f.proc,
                &now,
                crate::reserve::drain::BUDGET,
            );
            crate::reserve::drain::log_settled(&s);
        }
        if let Some(seq) = last {
            st.kmsg = Some(KmsgMark {
                boot_id: boot_text.clone(),
                seq,
            });
        }
        Ok(rep)
    })?;
    // The resets: each in its own locked steps, none under the lock.
    let st = store.read()?;
    for (pci, why) in reset_candidates(cfg, &st) {
        rep.resets.push((pci, reset::reset_pci(f, r, pci, why)));
    }
    Ok(rep)
}

/// What the scan acts on each record with: the config, the inventory, the GPUs' own state
/// ([`look_at_gpus`]), the time and the boot.
struct Taking<'a> {
    cfg: &'a Config,
    inv: &'a Inventory,
    looked: std::collections::BTreeMap<(String, Check), Confirmation>,
    now: &'a str,
    boot: Option<&'a String>,
}

/// One new record, under the lock: an imitation or a userspace line reported; an Xid
/// counted and acted on by the catalog, a reset or reboot one quarantining unless the GPU's
/// own state refutes it.
fn take(st: &mut State, cx: &Taking, rep: &mut ScanReport, r: &Record) {
    let x = match r.kind() {
        RecordKind::Other => return,
        RecordKind::Userspace => return rep.forged.push(one_line(&r.msg, 300)),
        RecordKind::Imitation(why) => return rep.imitations.push((why, one_line(&r.msg, 300))),
        RecordKind::Xid(x) => x,
    };
    // The GPU is function 0 of the bus and device the driver names.
    let pci = format!("{}.0", x.bus);
    let v = catalog::verdict(x.code, &r.msg);
    let seen = |st: &State| Seen {
        pci: pci.clone(),
        xid: x.code,
        verdict: v,
        message: one_line(&r.msg, 300),
        holders: holders_of(st, &pci),
    };
    match v.action {
        Action::Ignore => {
            count_xid(st, &pci, x.code, v.action);
            rep.ignored.push(seen(st));
        }
        Action::Restart => {
            count_xid(st, &pci, x.code, v.action);
            rep.restart.push(seen(st));
        }
        Action::Reset | Action::Reboot => {
            let state = catalog::check(x.code).and_then(|c| cx.looked.get(&(pci.clone(), c)));
            match state {
                Some(Confirmation::Refuted(g)) => {
                    count_xid(st, &pci, x.code, Action::Ignore);
                    return rep.unconfirmed.push((seen(st), g.clone()));
                }
                Some(Confirmation::Confirmed(g)) => rep.confirmed.push((seen(st), g.clone())),
                Some(Confirmation::Unavailable(u)) => rep.trusted.push((seen(st), u.clone())),
                None => {}
            }
            count_xid(st, &pci, x.code, v.action);
            let q = Quarantine {
                xid: Some(x.code),
                reason: v.what.into(),
                message: one_line(&r.msg, 300),
                since: cx.now.to_string(),
                action: Some(v.action),
                boot_id: cx.boot.cloned(),
                needs_inspection: false,
            };
            quarantine(st, cx.cfg, cx.inv, rep, &pci, q, cx.now);
        }
    }
}

/// The GPU's own state for each reset or reboot Xid of `records` whose class it can confirm
/// ([`catalog::check`]), read once per GPU and check with `r`.
fn look_at_gpus(
    cfg: &Config,
    r: &dyn reset::Recover,
    records: &[Record],
) -> std::collections::BTreeMap<(String, Check), Confirmation> {
    let mut out = std::collections::BTreeMap::new();
    for rec in records {
        let RecordKind::Xid(x) = rec.kind() else {
            continue;
        };
        let Some(check) = catalog::check(x.code) else {
            continue;
        };
        if !catalog::verdict(x.code, &rec.msg).action.quarantines() {
            continue;
        }
        let pci = format!("{}.0", x.bus);
        let Ok(p) = pci.parse::<Pci>() else {
            continue;
        };
        out.entry((pci, check))
            .or_insert_with(|| r.confirm(cfg, p, check));
    }
    out
}

/// A reboot quarantine of another boot (than `boot`) ends.
fn end_rebooted(st: &mut State, boot: Option<&String>, rep: &mut ScanReport) {
    let ended: Vec<String> = st
        .quarantine
        .iter()
        .filter(|(_, q)| {
            q.action == Some(Action::Reboot)
                && !q.needs_inspection
                && q.boot_id.is_some()
                && boot.is_some()
                && q.boot_id.as_ref() != boot
        })
        .map(|(k, _)| k.clone())
        .collect();
    for k in ended {
        if let Some(q) = st.quarantine.remove(&k) {
            rep.rebooted.push((k, q));
        }
    }
}

/// A reset or reboot Xid of `pci` puts it in quarantine `q` (or makes its reset quarantine a
/// reboot one), escalating past `max_quarantines`.
fn quarantine(
    st: &mut State,
    cfg: &Config,
    inv: &Inventory,
    rep: &mut ScanReport,
    pci: &str,
    q: Quarantine,
    now: &str,
) {
    match st.quarantine.get_mut(pci) {
        // One fault often logs several Xids (62, then 154 "GPU Reset Required"): counted
        // once; a reboot one makes a reset one stronger.
        Some(old) => {
            if q.action == Some(Action::Reboot) && old.action == Some(Action::Reset) {
                *old = Quarantine {
                    since: old.since.clone(),
                    needs_inspection: old.needs_inspection,
                    ..q
                };
                rep.quarantined.push((pci.to_string(), old.clone()));
            }
            return;
        }
        None => {
            st.quarantine.insert(pci.to_string(), q);
        }
    }
    if escalate(st, cfg, pci, now) {
        rep.escalated.push(pci.to_string());
    }
    if inv.by_pci(pci).is_none() {
        rep.unlisted.push(pci.to_string());
    }
    let holders = holders_of(st, pci);
    if !holders.is_empty() {
        rep.holders.insert(pci.to_string(), holders);
    }
    rep.quarantined
        .push((pci.to_string(), st.quarantine[pci].clone()));
}

/// What a scan resets: every scrub-pending GPU, and with `auto_reset` every GPU quarantined
/// with the reset action (not escalated); only those nothing holds (a reset refuses one
/// that is open).
pub fn reset_candidates(cfg: &Config, st: &State) -> Vec<(Pci, reset::Why)> {
    let held: std::collections::BTreeSet<Pci> = st.held(None).keys().map(|u| u.pci()).collect();
    let mut out: Vec<(Pci, reset::Why)> = Vec::new();
    for (k, h) in &st.health {
        if h.scrub_pending {
            if let Ok(p) = k.parse::<Pci>() {
                out.push((p, reset::Why::Scrub));
            }
        }
    }
    if cfg.auto_reset {
        for (k, q) in &st.quarantine {
            if q.action == Some(Action::Reset) && !q.needs_inspection {
                if let Ok(p) = k.parse::<Pci>() {
                    if !out.iter().any(|(x, _)| *x == p) {
                        out.push((p, reset::Why::AutoReset));
                    }
                }
            }
        }
    }
    out.retain(|(p, _)| !held.contains(p));
    out.sort();
    out
}

/// Lifts any quarantine of the GPU at `pci` (an escalated one too), starts its 24-hour
/// count again, and drops a reset mark whose process is gone.
pub fn clear(f: &World, pci: &str) -> Result<Quarantine, Error> {
    let p = normalize_pci(pci).ok_or_else(|| HealthError::NotPci {
        pci: pci.to_string(),
    })?;
    let boot = boot_id(f.cfg);
    Store::new(&f.cfg.state_file).update(|st| {
        let q = st
            .quarantine
            .remove(&p)
            .ok_or_else(|| HealthError::NotQuarantined { pci: p.clone() })?;
        if let Some(h) = st.health.get_mut(&p) {
            h.quarantined.clear();
            if h.resetting
                .as_ref()
                .is_some_and(|r| !reset::live(f, r, boot.as_deref()))
            {
                h.resetting = None;
            }
            if h.is_empty() {
                st.health.remove(&p);
            }
        }
        Ok::<_, Error>(q)
    })
}

/// Why a quarantine makes a GPU unusable, and what returns it: a refusal's and `list`'s
/// words.
pub fn quarantine_text(pci: &str, q: &Quarantine, count: usize) -> String {
    let after = match q.xid {
        Some(x) => format!(" after Xid {x}"),
        None => String::new(),
    };
    let ends = if q.needs_inspection {
        format!("quarantined {count} times within 24 hours: needs inspection; `gpuhook health clear {pci}` returns it")
    } else {
        match q.action {
            Some(Action::Reset) => format!("`gpuhook health reset {pci}` returns it"),
            Some(Action::Reboot) => {
                format!("a reboot returns it (or `gpuhook health clear {pci}`)")
            }
            _ => format!("`gpuhook health clear {pci}` returns it"),
        }
    };
    format!("quarantined{after} ({}) at {}; {ends}", q.reason, q.since)
}

/// Marks the GPUs of `inv` that are quarantined, being reset (or whose reset was killed)
/// or scrub pending unusable, with the reason.
pub fn apply(inv: &mut Inventory, st: &State) {
    if st.quarantine.is_empty() && st.health.is_empty() {
        return;
    }
    let now = now_rfc3339();
    for g in &mut inv.gpus {
        if let Some(p) = unusable_at(st, g.pci, &now) {
            g.problem = Some(p);
            g.pending = false;
        }
    }
}

/// Why the state says GPU `pci` is given to no one (quarantined, being reset, scrub
/// pending), if it does: what [`apply`] marks, for a door that reads no inventory (a VM's
/// hostdevs).
pub fn unusable(st: &State, pci: Pci) -> Option<String> {
    if st.quarantine.is_empty() && st.health.is_empty() {
        return None;
    }
    unusable_at(st, pci, &now_rfc3339())
}

fn unusable_at(st: &State, pci: Pci, now: &str) -> Option<String> {
    let key = pci.as_str();
    let h = st.health.get(key);
    if let Some(q) = st.quarantine.get(key) {
        Some(quarantine_text(key, q, count_24h(st, key, now)))
    } else if let Some(r) = h.and_then(|h| h.resetting.as_ref()) {
        Some(format!(
            "being reset since {} (pid {}); if that process is gone, `gpuhook health reset {}` runs it again",
            r.since, r.by.pid, pci
        ))
    } else if h.is_some_and(|h| h.scrub_pending) {
        Some(scrub_text(pci))
    } else {
        None
    }
}

/// `quarantine` in `list --json`: the record, with `action` (`null` for a quarantine written
/// by an earlier gpuhook: `health clear` ends it), `count_24h` and `needs_inspection`.
pub fn quarantine_json(st: &State, pci: &str) -> serde_json::Value {
    match st.quarantine.get(pci) {
        None => serde_json::Value::Null,
        Some(q) => serde_json::json!({
            "xid": q.xid, "reason": q.reason, "message": q.message, "since": q.since,
            "action": q.action,
            "count_24h": count_24h(st, pci, &now_rfc3339()),
            "needs_inspection": q.needs_inspection,
        }),
    }
}

/// Whether GPU `pci` is scrub pending.
pub fn scrub_pending(st: &State, pci: &str) -> bool {
    st.health.get(pci).is_some_and(|h| h.scrub_pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records as /dev/kmsg hands them out on a host with an H100 that fell off the bus
    /// (driver 535), with the continuation lines the kernel adds for device messages.
    const KMSG: &str = "6,1520,4213561000,-;nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  535.129.03\n\
4,1523,4213563121,-;NVRM: Xid (PCI:0000:1a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:1a:00.0\n\
4,1524,4213563200,-;NVRM: GPU 0000:1a:00.0: GPU has fallen off the bus.\n\
3,1530,4213999000,-;NVRM: Xid (PCI:0000:40:00): 13, pid=2811, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address\n\
4,1531,4214000100,c;NVRM: Xid (0000:42:00): 48, pid=2811, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n\
garbage line\n";

    /// A log larger than one scan takes: records the last scan read are passed over without
    /// counting, so the newest are reached.
    #[test]
    fn big_logs_reach_the_newest_records() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("kmsg");
        let mut text = String::with_capacity(46 << 20);
        let mut seq = 0u64;
        while text.len() < 44 << 20 {
            seq += 1;
            text.push_str(&format!(
                "6,{seq},{},-;mlx5_core 0000:41:00.0 eth0: Link up, 100000 Mbps, full duplex, flow control off, FEC RS-FEC (544,514), autoneg on\n",
                seq * 1000
            ));
        }
        text.push_str(&format!(
            "4,{},999999999,-;NVRM: Xid (PCI:0000:1a:00): 79, pid=0, GPU has fallen off the bus.\n",
            seq + 1
        ));
        std::fs::write(&p, &text).unwrap();
        // The first scan takes what it can; a scan after the mark just before the Xid gets it.
        let first = read_kmsg(&p, None).unwrap();
        assert!(first.len() < seq as usize, "{} of {seq}", first.len());
        let r = read_kmsg(&p, Some(seq)).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(parse_xid(&r[0].msg).unwrap().code, 79);
        // From the first scan's mark, scans move forward until the Xid.
        let mut mark = first.last().unwrap().seq;
        let mut found = false;
        for _ in 0..4 {
            let r = read_kmsg(&p, Some(mark)).unwrap();
            found |= r.iter().any(|x| parse_xid(&x.msg).is_some());
            mark = r.last().map_or(mark, |x| x.seq);
        }
        assert!(found);
    }

    #[test]
    fn records_and_xids() {
        let r = parse_records(KMSG);
        assert_eq!(
            r.iter().map(|r| r.seq).collect::<Vec<_>>(),
            [1520, 1523, 1524, 1530, 1531]
        );
        assert!(r.iter().all(Record::from_kernel));
        // A kernel message that echoes a user's string is not the driver's.
        let echoed = parse_records(
            "3,346,5000,-;tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:18:00): 79'\n",
        );
        assert!(echoed[0].from_kernel() && parse_xid(&echoed[0].msg).is_none());
        // What `echo '<4>NVRM: Xid …' > /dev/kmsg` leaves: facility user (12 = 1 << 3 | 4).
        let forged = parse_records("12,1600,4215000000,-;NVRM: Xid (PCI:0000:1a:00): 79, x\n");
        assert!(!forged[0].from_kernel());
        let x: Vec<Xid> = r.iter().filter_map(|r| parse_xid(&r.msg)).collect();
        assert_eq!(
            x,
            [
                Xid {
                    bus: "0000:1a:00".into(),
                    code: 79
                },
                Xid {
                    bus: "0000:40:00".into(),
                    code: 13
                },
                Xid {
                    bus: "0000:42:00".into(),
                    code: 48
                },
            ]
        );
        assert_eq!(catalog::verdict(79, "").action, Action::Reboot);
        assert_eq!(catalog::verdict(79, "").what, "GPU has fallen off the bus");
        assert_eq!(
            catalog::verdict(13, "").action,
            Action::Restart,
            "an application's fault"
        );
        assert_eq!(catalog::verdict(31, "").action, Action::Restart);
        assert_eq!(
            parse_xid("NVRM: Xid (PCI:3b:00): 94, pid=1, Contained"),
            Some(Xid {
                bus: "0000:3b:00".into(),
                code: 94
            })
        );
        for bad in [
            "NVRM: Xid (PCI:zz:00): 79, x",
            "NVRM: Xid (PCI:0000:3b:00): x79",
            "NVRM: Xid (PCI:0000:3b:00) 79",
            "NVRM: Xid",
            "Xid (PCI:0000:3b:00): 79",
        ] {
            assert_eq!(parse_xid(bad), None, "{bad}");
        }
    }
}

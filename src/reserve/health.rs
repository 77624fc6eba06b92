//! GPU health from the kernel log: NVIDIA Xid errors that mean a GPU must not be handed out
//! again (fallen off the bus, uncorrectable ECC, NVLink, GSP failures) quarantine it in the
//! state; `gpuhook health scan` (run by `gpuhook-health.timer`) reads the records the last
//! scan did not, `gpuhook health clear PCI` lifts a quarantine. A quarantined GPU is
//! unusable for every front door ([`apply`]), with the Xid as its reason.
//!
//! The PCI-level checks (config space that reads as all ones, a driver that no longer lists
//! a GPU bound to it, the driver's `GPU Excluded`) and the link shown in `list` are the
//! inventory's: they are read where the GPU is looked at.

use crate::host::config::Config;
use crate::host::inventory::{self, Inventory, Scan};
use crate::ids::normalize_pci;
use crate::log::one_line;
use crate::reserve::error::Error;
use crate::reserve::state::{now_rfc3339, KmsgMark, Quarantine, State, Store};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use std::path::{Path, PathBuf};

/// Why a health step failed: one line naming the file or the GPU.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("{}: {source}", path.display())]
    Kmsg {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("'{pci}' is not a PCI address like 0000:3b:00.0")]
    NotPci { pci: String },
    #[error("GPU {pci} is not quarantined")]
    NotQuarantined { pci: String },
}

impl HealthError {
    fn kmsg(path: &Path, e: Errno) -> HealthError {
        HealthError::Kmsg {
            path: path.to_path_buf(),
            source: e.into(),
        }
    }
}

/// The Xids that take a GPU out of service (NVIDIA's Xid catalogue: hardware faults that
/// need a reset or a field look, not an application's error), with what they mean.
pub const QUARANTINE_XIDS: [(u32, &str); 10] = [
    (48, "double-bit ECC error"),
    (63, "ECC page retirement or row remapping recorded"),
    (64, "ECC page retirement or row remapping failed"),
    (74, "NVLink error"),
    (79, "GPU has fallen off the bus"),
    (92, "high single-bit ECC error rate"),
    (94, "contained ECC error"),
    (95, "uncontained ECC error"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
];

/// What an Xid means, when it is one that quarantines.
pub fn quarantining(xid: u32) -> Option<&'static str> {
    QUARANTINE_XIDS
        .iter()
        .find(|(x, _)| *x == xid)
        .map(|(_, w)| *w)
}

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

/// An NVIDIA Xid event: `NVRM: Xid (PCI:0000:3b:00): 79, pid=…, name=…, GPU has fallen off
/// the bus.` (older drivers: `NVRM: Xid (0000:3b:00): 79, …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xid {
    /// Domain, bus and device of the GPU, as `0000:3b:00`: the GPU is function 0 of it.
    pub bus: String,
    pub code: u32,
}

/// Only a message that *starts* so: the driver's own printk does, while a kernel message
/// that echoes a string a user chose (`tmpfs: Unknown parameter 'NVRM: Xid …'`, from an
/// unprivileged `mount` in a user namespace) does not.
pub fn parse_xid(msg: &str) -> Option<Xid> {
    let rest = msg.strip_prefix("NVRM: Xid (")?;
    let (inside, after) = rest.split_once(')')?;
    let addr = inside.strip_prefix("PCI:").unwrap_or(inside);
    // With the function or without it, with the domain or without it.
    let bdf = if addr.matches(':').count() == 1 {
        format!("0000:{addr}")
    } else {
        addr.to_owned()
    };
    let pci = if bdf.contains('.') {
        bdf
    } else {
        format!("{bdf}.0")
    };
    let pci = normalize_pci(&pci)?;
    let code = after.strip_prefix(':')?.trim_start();
    let digits: String = code.chars().take_while(char::is_ascii_digit).collect();
    Some(Xid {
        bus: pci[..pci.len() - 2].to_owned(),
        code: digits.parse().ok()?,
    })
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
    /// GPUs quarantined by this scan.
    pub quarantined: Vec<(String, Quarantine)>,
    /// Of those, addresses this host does not list as a GPU now (unbound, being reset,
    /// removed): quarantined all the same, in effect when it is a GPU again.
    pub unlisted: Vec<String>,
    /// Xid lines written into the log from userspace (not the driver's): ignored.
    pub forged: Vec<String>,
    /// Who holds each GPU quarantined by this scan (whole, by its MIG instances, or every
    /// sharer of a shared GPU), as messages name them: they keep it until they stop.
    pub holders: std::collections::BTreeMap<String, Vec<String>>,
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
/// log restart at each boot.
fn boot_id(cfg: &Config) -> String {
    std::fs::read_to_string(cfg.proc.join("sys/kernel/random/boot_id"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Reads the kernel log (`<dev>/kmsg`) from where the last scan stopped and quarantines the
/// GPUs its Xid errors name.
pub fn scan(cfg: &Config) -> Result<ScanReport, Error> {
    let store = Store::new(&cfg.state_file);
    let boot = boot_id(cfg);
    let mark = |st: &State| match &st.kmsg {
        Some(m) if m.boot_id == boot => Some(m.seq),
        _ => None,
    };
    // The records after the last scan's mark (read again under the lock below).
    let records = read_kmsg(&cfg.dev.join("kmsg"), mark(&store.read()?))?;
    let inv = inventory::scan_with(
        cfg,
        Scan {
            caps: Some(Default::default()),
            lazy: true,
        },
    )?;
    let now = now_rfc3339();
    store.update(|st| -> Result<ScanReport, Error> {
        let from = mark(st);
        let mut rep = ScanReport::default();
        let mut last = from;
        for r in records.iter().filter(|r| from.is_none_or(|f| r.seq > f)) {
            rep.new_records += 1;
            last = Some(last.map_or(r.seq, |l| l.max(r.seq)));
            let Some(x) = parse_xid(&r.msg) else {
                continue;
            };
            if !r.from_kernel() {
                rep.forged.push(one_line(&r.msg, 300));
                continue;
            }
            let Some(reason) = quarantining(x.code) else {
                continue;
            };
            // The GPU is function 0 of the bus and device the driver names.
            let pci = format!("{}.0", x.bus);
            if st.quarantine.contains_key(&pci) {
                continue;
            }
            if inv.by_pci(&pci).is_none() {
                rep.unlisted.push(pci.clone());
            }
            let q = Quarantine {
                xid: x.code,
                reason: reason.into(),
                message: one_line(&r.msg, 300),
                since: now.clone(),
            };
            st.quarantine.insert(pci.clone(), q.clone());
            let holders = holders_of(st, &pci);
            if !holders.is_empty() {
                rep.holders.insert(pci.clone(), holders);
            }
            rep.quarantined.push((pci, q));
        }
        if let Some(seq) = last {
            st.kmsg = Some(KmsgMark {
                boot_id: boot.clone(),
                seq,
            });
        }
        Ok(rep)
    })
}

/// Lifts the quarantine of the GPU at `pci`.
pub fn clear(cfg: &Config, pci: &str) -> Result<Quarantine, Error> {
    let p = normalize_pci(pci).ok_or_else(|| HealthError::NotPci {
        pci: pci.to_string(),
    })?;
    Store::new(&cfg.state_file).update(|st| {
        st.quarantine
            .remove(&p)
            .ok_or_else(|| HealthError::NotQuarantined { pci: p.clone() }.into())
    })
}

/// Marks the quarantined GPUs of `inv` unusable, with the Xid as the reason.
pub fn apply(inv: &mut Inventory, st: &State) {
    if st.quarantine.is_empty() {
        return;
    }
    for g in &mut inv.gpus {
        if let Some(q) = st.quarantine.get(g.pci.as_str()) {
            g.problem = Some(format!(
                "quarantined after Xid {} ({}) at {}; `gpuhook health clear {}` returns it",
                q.xid, q.reason, q.since, g.pci
            ));
            g.pending = false;
        }
    }
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
        assert_eq!(quarantining(79), Some("GPU has fallen off the bus"));
        assert_eq!(quarantining(13), None, "an application's fault");
        assert_eq!(quarantining(31), None);
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

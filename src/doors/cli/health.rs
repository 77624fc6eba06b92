//! `gpuhook health scan`, `health reset` and `health clear`: what each did, said in the log
//! and on stdout.

use crate::host::config::Config;
use crate::host::inventory::ProbeFailure;
use crate::ids::Pci;
use crate::log;
use crate::reserve::error::Error;
use crate::reserve::health::catalog::Check;
use crate::reserve::health::confirm::Confirmation;
use crate::reserve::health::{self, reset};
use crate::reserve::state::Quarantine;
use crate::reserve::world::World;
use clap::Subcommand;
use serde_json::{json, Value};

#[derive(Debug, Subcommand)]
pub enum HealthAction {
    /// Act on the NVIDIA Xids of the kernel log as NVIDIA's Xid catalog says
    /// (gpuhook-health.timer runs it)
    ///
    /// Reads the kernel log records (<dev>/kmsg) the last scan did not: ignore (counted,
    /// logged), restart (a warning naming the GPU's holder), reset or reboot (quarantined
    /// until a reset, or until the host reboots). Only the NVIDIA driver's own records count
    /// (a kernel record in the driver's whole shape, without netfilter's packet log fields);
    /// a reboot or reset Xid that the GPU's own state refutes (79: its config space reads; a
    /// memory error: nvidia-smi's ECC and row-remapping counters are clear) is counted and
    /// logged only. Then resets the scrub-pending GPUs (reset_on_release) and, with
    /// auto_reset, the GPUs quarantined with the reset action that are free and not open.
    Scan {
        /// Print what the scan did as JSON: records, quarantined, escalated, unlisted,
        /// rebooted, restart, ignored, unconfirmed, doubtful, imitations, forged, resets
        #[arg(long)]
        json: bool,
    },
    /// Reset a GPU nothing holds or has open, probe it, lift its reset quarantine
    ///
    /// Runs the config's reset_command (or with "pci" the function-level reset through
    /// sysfs; 30 s at most; what it runs is said on stderr as it starts), then probes the
    /// GPU (config space, the driver's list, GPU Excluded: No): a reset quarantine is lifted
    /// only when every probe passes, else the GPU stays quarantined with the failed probe as
    /// its reason. A reset program that is missing, not executable or not root's is refused
    /// before anything is marked: the GPU keeps its state.
    Reset {
        /// The GPU: its PCI address (0000:3b:00.0), index (as gpuhook list shows it) or UUID
        #[arg(value_name = "PCI|INDEX|UUID")]
        gpu: String,
        /// Print what the reset did as JSON: pci, why, ok, failure, took_s, lifted, kept,
        /// scrubbed, took_over
        #[arg(long)]
        json: bool,
    },
    /// Lift any quarantine of a GPU (a reboot or an escalated one too), start its 24-hour
    /// count again
    Clear {
        /// The GPU: its PCI address (0000:3b:00.0), index (as gpuhook list shows it) or UUID
        #[arg(value_name = "PCI|INDEX|UUID")]
        gpu: String,
        /// Print the quarantine lifted as JSON: pci, lifted
        #[arg(long)]
        json: bool,
    },
}

/// The host's reset, each step said on stderr as it begins (a reset may take 30 s).
struct Told;

impl reset::Recover for Told {
    fn reset(&self, cfg: &Config, pci: Pci) -> Result<(), reset::ResetFailure> {
        reset::HostReset.reset(cfg, pci)
    }
    fn probe(&self, cfg: &Config, pci: Pci) -> Result<(), ProbeFailure> {
        reset::HostReset.probe(cfg, pci)
    }
    fn confirm(&self, cfg: &Config, pci: Pci, check: Check) -> Confirmation {
        reset::HostReset.confirm(cfg, pci, check)
    }
    fn progress(&self, step: &reset::Progress) {
        eprintln!("gpuhook: {step}");
    }
    fn runnable(&self, cfg: &Config, pci: Pci) -> Result<(), reset::Unrunnable> {
        reset::HostReset.runnable(cfg, pci)
    }
}

pub(super) fn health(action: HealthAction) -> Result<i32, Error> {
    let cfg = Config::load()?;
    let f = World::real(&cfg);
    match action {
        HealthAction::Scan { json } => health_scan(&f, json)?,
        HealthAction::Reset { gpu, json } => {
            let r = reset::reset(&f, &Told, &gpu, reset::Why::Operator)?;
            let line = reset_line(&r);
            if json {
                println!("{}", pretty(&reset_json(&r)));
            }
            if r.failure.is_some() {
                log::error(&line);
                return Ok(1);
            }
            log::info(&format!("operator: {line}"));
            if !json {
                println!("{line}");
            }
        }
        HealthAction::Clear { gpu, json } => {
            let pci = reset::named_gpu(&f, &gpu)?;
            let q = health::clear(&f, pci.as_str())?;
            let xid = q
                .xid
                .map(|x| format!("Xid {x}"))
                .unwrap_or_else(|| "a failed reset".into());
            log::info(&format!(
                "GPU {pci}: quarantine lifted (it was for {xid}, {}, since {})",
                q.reason, q.since
            ));
            if json {
                println!(
                    "{}",
                    pretty(&json!({"pci": pci, "lifted": quarantine_json(&q)}))
                );
            } else {
                println!(
                    "GPU {pci} is back in service (quarantined since {} for {xid})",
                    q.since
                );
            }
        }
    }
    Ok(0)
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).expect("json")
}

/// A quarantine, as `--json` gives it.
fn quarantine_json(q: &Quarantine) -> Value {
    json!({
        "xid": q.xid, "action": q.action.map(|a| a.as_str()), "reason": q.reason,
        "message": q.message, "since": q.since, "needs_inspection": q.needs_inspection,
    })
}

/// What a reset did, as `--json` gives it.
fn reset_json(r: &reset::Reset) -> Value {
    json!({
        "pci": r.pci,
        "why": match r.why {
            reset::Why::Operator => "operator",
            reset::Why::AutoReset => "auto_reset",
            reset::Why::Scrub => "scrub",
        },
        "ok": r.failure.is_none(),
        "failure": r.failure.as_ref().map(|f| f.to_string()),
        "took_s": r.took.as_secs_f64(),
        "lifted": r.lifted.as_ref().map(quarantine_json),
        "kept": r.kept.as_ref().map(quarantine_json),
        "scrubbed": r.scrubbed,
        "took_over": r.took_over.as_ref().map(|o| json!({"pid": o.by.pid, "since": o.since})),
    })
}

/// An Xid the scan acted on without quarantining, as `--json` gives it.
fn seen_json(x: &health::Seen) -> Value {
    json!({
        "pci": x.pci, "xid": x.xid, "action": x.verdict.action.as_str(), "what": x.verdict.what,
        "unknown": x.verdict.unknown, "holders": x.holders, "message": x.message,
    })
}

/// What a scan did, as `--json` gives it.
fn scan_json(r: &health::ScanReport) -> Value {
    let with = |v: &[(health::Seen, String)], key: &str| -> Vec<Value> {
        v.iter()
            .map(|(x, s)| {
                let mut j = seen_json(x);
                j[key] = json!(s);
                j
            })
            .collect()
    };
    let states = |v: &[(health::Seen, crate::reserve::health::confirm::GpuState)]| {
        v.iter()
            .map(|(x, s)| (x.clone(), s.to_string()))
            .collect::<Vec<_>>()
    };
    json!({
        "records": r.new_records,
        "quarantined": r.quarantined.iter().map(|(pci, q)| {
            let mut j = quarantine_json(q);
            j["pci"] = json!(pci);
            j["holders"] = json!(r.holders.get(pci).cloned().unwrap_or_default());
            j
        }).collect::<Vec<_>>(),
        "escalated": r.escalated,
        "unlisted": r.unlisted,
        "rebooted": r.rebooted.iter().map(|(pci, q)| json!({"pci": pci, "xid": q.xid})).collect::<Vec<_>>(),
        "restart": r.restart.iter().map(seen_json).collect::<Vec<_>>(),
        "ignored": r.ignored.iter().map(seen_json).collect::<Vec<_>>(),
        "doubtful": r.doubtful.iter().map(seen_json).collect::<Vec<_>>(),
        "unconfirmed": with(&states(&r.unconfirmed), "state"),
        "confirmed": with(&states(&r.confirmed), "state"),
        "trusted": with(&r.trusted.iter().map(|(x, w)| (x.clone(), w.to_string())).collect::<Vec<_>>(), "unconfirmable"),
        "imitations": r.imitations.iter().map(|(why, m)| json!({"why": why.to_string(), "message": m})).collect::<Vec<_>>(),
        "forged": r.forged,
        "resets": r.resets.iter().map(|(pci, res)| match res {
            Ok(x) => reset_json(x),
            Err(e) => json!({"pci": pci, "ok": false, "not_run": e.to_string()}),
        }).collect::<Vec<_>>(),
    })
}

/// `gpuhook health scan`: what the scan did, said.
fn health_scan(f: &World, as_json: bool) -> Result<(), Error> {
    let r = health::scan(f, &Told)?;
    for (pci, q) in &r.rebooted {
        log::info(&format!(
            "GPU {pci}: its quarantine{} ended: the host rebooted",
            q.xid.map(|x| format!(" after Xid {x}")).unwrap_or_default()
        ));
    }
    for x in &r.ignored {
        log::info(&format!(
            "GPU {}: Xid {} ({}), action {}: counted{}: {}",
            x.pci,
            x.xid,
            x.verdict.what,
            x.verdict.action,
            if x.verdict.unknown {
                " and logged only"
            } else {
                ", nothing else"
            },
            x.message
        ));
    }
    for x in &r.restart {
        let who = if x.holders.is_empty() {
            "no one holds it now".to_string()
        } else {
            format!("held by {}", x.holders.join(", "))
        };
        log::warn(&format!(
            "GPU {}: Xid {} ({}), action restart: the program that got it must restart; {who}; not quarantined: {}",
            x.pci, x.xid, x.verdict.what, x.message
        ));
    }
    for (pci, q) in &r.quarantined {
        let held = match r.holders.get(pci) {
            Some(h) => format!(
                "; still held by {} (no new holder or sharer gets it)",
                h.join(", ")
            ),
            None => String::new(),
        };
        log::warn(&format!(
            "GPU {pci} quarantined: Xid {} ({}), action {}: {}{held}",
            q.xid.map(|x| x.to_string()).unwrap_or_default(),
            q.reason,
            q.action.map_or("clear", |a| a.as_str()),
            q.message
        ));
    }
    for pci in &r.escalated {
        log::warn(&format!(
            "GPU {pci} was quarantined {} times within 24 hours: it needs inspection, and stays quarantined until `gpuhook health clear {pci}`",
            f.cfg.max_quarantines
        ));
    }
    for p in &r.unlisted {
        log::warn(&format!(
            "{p} is not a GPU this host lists now (unbound, being reset, removed?): its quarantine holds when it is one again"
        ));
    }
    for m in &r.forged {
        log::warn(&format!(
            "an Xid line written into the kernel log from userspace, ignored: {m}"
        ));
    }
    log_not_taken(&r);
    if as_json {
        for (pci, res) in &r.resets {
            match res {
                Ok(x) if x.failure.is_none() => log::info(&reset_line(x)),
                Ok(x) => log::warn(&reset_line(x)),
                Err(e) => not_reset(*pci, e),
            }
        }
        println!("{}", pretty(&scan_json(&r)));
        return Ok(());
    }
    println!(
        "{} new kernel log record{} read, {} GPU{} quarantined",
        r.new_records,
        if r.new_records == 1 { "" } else { "s" },
        r.quarantined.len(),
        if r.quarantined.len() == 1 { "" } else { "s" },
    );
    for (pci, res) in &r.resets {
        match res {
            Ok(x) if x.failure.is_none() => println!("{}", reset_line(x)),
            Ok(x) => log::warn(&reset_line(x)),
            Err(e) => not_reset(*pci, e),
        }
    }
    Ok(())
}

/// A scan's reset that did not run: held or open (logged), or a configuration fault
/// (warned: every scan will say it until the config is fixed).
fn not_reset(pci: Pci, e: &Error) {
    match e {
        Error::Health(health::error::HealthError::Unrunnable { .. }) => log::warn(&e.to_string()),
        e => log::info(&format!("GPU {pci} not reset now: {e}")),
    }
}

/// The records the scan did not take as the driver's word: imitations, Xids the GPU's own
/// state refuted; and what it confirmed or could not.
fn log_not_taken(r: &crate::reserve::health::ScanReport) {
    for (why, m) in &r.imitations {
        log::warn(&format!(
            "a kernel log record that begins like an NVIDIA Xid is not the driver's ({why}), ignored: {m}"
        ));
    }
    for x in &r.doubtful {
        let who = if x.holders.is_empty() {
            String::new()
        } else {
            format!(" (held by {})", x.holders.join(", "))
        };
        log::warn(&format!(
            "GPU {}{who}: a kernel log record in the NVIDIA driver's shape, Xid {} ({}), has netfilter's packet log fields IN= and OUT= in its process name: a LOG rule's prefix (iptables -j LOG, nft log) or the driver's record of a process named so; not taken as an Xid (nothing counted or quarantined): look at the GPU if it misbehaves: {}",
            x.pci, x.xid, x.verdict.what, x.message
        ));
    }
    for (x, state) in &r.unconfirmed {
        log::warn(&format!(
            "GPU {}: Xid {} ({}), action {}: unconfirmed: {state}; counted and logged only, not quarantined: {}",
            x.pci, x.xid, x.verdict.what, x.verdict.action, x.message
        ));
    }
    for (x, state) in &r.confirmed {
        log::info(&format!(
            "GPU {}: Xid {} confirmed by the GPU's own state: {state}",
            x.pci, x.xid
        ));
    }
    for (x, why) in &r.trusted {
        log::info(&format!(
            "GPU {}: Xid {} could not be confirmed by the GPU's own state ({why}): the NVIDIA driver's record is trusted",
            x.pci, x.xid
        ));
    }
}

/// One line of what a reset did.
fn reset_line(r: &crate::reserve::health::reset::Reset) -> String {
    use crate::reserve::health::reset::Why;
    let pci = r.pci;
    let took = r.took.as_secs_f64();
    let why = match r.why {
        Why::Operator => "",
        Why::AutoReset => " (auto_reset)",
        Why::Scrub => " (scrub after release)",
    };
    let over = match &r.took_over {
        Some(o) => format!(
            "; the reset pid {} began at {} did not finish: taken over",
            o.by.pid, o.since
        ),
        None => String::new(),
    };
    if let Some(f) = &r.failure {
        let kept = match &r.kept {
            Some(q) if q.needs_inspection => format!(
                "quarantined, and needs inspection (quarantined too often within 24 hours): `gpuhook health clear {pci}` returns it"
            ),
            _ => format!("quarantined: `gpuhook health reset {pci}` tries again"),
        };
        return format!("GPU {pci}: reset{why} failed after {took:.2} s: {f}; {kept}{over}");
    }
    let mut line = format!(
        "GPU {pci} reset{why} in {took:.2} s: every probe passes (config space, driver, not excluded)"
    );
    if let Some(q) = &r.lifted {
        line.push_str(&format!(
            "; back in service (its quarantine{} is lifted)",
            q.xid.map(|x| format!(" after Xid {x}")).unwrap_or_default()
        ));
    } else if let Some(q) = &r.kept {
        let why = if q.needs_inspection {
            format!("it needs inspection: `gpuhook health clear {pci}` returns it")
        } else if q.action == Some(crate::reserve::health::catalog::Action::Reboot) {
            "a reboot ends it".to_string()
        } else {
            format!("`gpuhook health clear {pci}` ends it")
        };
        line.push_str(&format!(
            "; still quarantined{} ({why})",
            q.xid.map(|x| format!(" after Xid {x}")).unwrap_or_default()
        ));
    } else if r.scrubbed {
        line.push_str("; scrubbed, free again");
    }
    line.push_str(&over);
    line
}

//! The MIG profile of each compute instance, as the driver names it (`1g.10gb`,
//! `1c.4g.40gb`): the driver's files under `/proc` give the instances, not their profiles,
//! so the profiles come from NVIDIA's `nvidia-smi mig -lci -i PCI` (config `nvidia_smi`),
//! whose table names each compute instance (`MIG 1g.10gb`) by its GPU instance and compute
//! instance IDs. Read once per GPU and layout: a MIG layout changes only when an operator
//! makes instances anew.

use crate::enter::sandbox::run_program_fd;
use crate::host::config::Config;
use crate::host::inventory::Gpu;
use crate::ids::{Pci, Unit};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long `nvidia-smi mig -lci` may take.
const DEADLINE: Duration = Duration::from_secs(10);

/// Each compute instance's profile, by (GPU instance, compute instance).
pub type Names = BTreeMap<(u32, u32), String>;

/// The profiles known, by GPU: the layout they were read for, and each instance's profile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profiles {
    by_gpu: BTreeMap<Pci, (Vec<(u32, u32)>, Names)>,
}

/// Why a GPU's profiles could not be read (one line, for the log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MIG profiles of GPU {pci} unknown (its instances are not advertised): {why}")]
pub struct Unknown {
    pub pci: Pci,
    pub why: String,
}

impl Profiles {
    /// The profile of a MIG unit, if known.
    pub fn of(&self, unit: &Unit) -> Option<&str> {
        let Unit::Mig { pci, gi, ci } = *unit else {
            return None;
        };
        self.by_gpu
            .get(&pci)
            .and_then(|(_, m)| m.get(&(gi, ci)))
            .map(String::as_str)
    }

    /// Known profiles for GPU `pci` (tests, and what a reader found).
    pub fn set(&mut self, pci: Pci, layout: Vec<(u32, u32)>, names: Names) {
        self.by_gpu.insert(pci, (layout, names));
    }

    /// Reads the profiles of every GPU in MIG mode whose layout is new since the last read
    /// (`read`: [`read_gpu`] on a real host); forgets GPUs no longer in MIG mode. Returns
    /// what could not be read, for the log.
    pub fn refresh(
        &mut self,
        gpus: &[Gpu],
        read: &dyn Fn(Pci) -> Result<Names, String>,
    ) -> Vec<Unknown> {
        let mut unknown = Vec::new();
        self.by_gpu
            .retain(|p, _| gpus.iter().any(|g| g.pci == *p && !g.migs.is_empty()));
        for g in gpus.iter().filter(|g| !g.migs.is_empty()) {
            let layout: Vec<(u32, u32)> = g.migs.iter().map(|m| (m.gi, m.ci)).collect();
            if self.by_gpu.get(&g.pci).is_some_and(|(l, _)| *l == layout) {
                continue;
            }
            match read(g.pci) {
                Ok(names) => {
                    self.by_gpu.insert(g.pci, (layout, names));
                }
                Err(why) => {
                    // Read again next time (the program may be fixed, or installed).
                    self.by_gpu.remove(&g.pci);
                    unknown.push(Unknown { pci: g.pci, why });
                }
            }
        }
        unknown
    }
}

/// `nvidia-smi mig -lci -i PCI` at the configured path (root's, not writable by others, as
/// `health scan`'s), parsed.
pub fn read_gpu(cfg: &Config, pci: Pci) -> Result<Names, String> {
    let program = crate::reserve::health::confirm::trusted_program(&cfg.nvidia_smi)
        .map_err(|e| e.to_string())?;
    let argv = vec![
        program.path.display().to_string(),
        "mig".into(),
        "-lci".into(),
        "-i".into(),
        pci.to_string(),
    ];
    let ran = run_program_fd(&program.fd, &argv, DEADLINE, 256 * 1024)
        .map_err(|e| format!("{}: {e}", argv.join(" ")))?;
    if !ran.ok() {
        return Err(format!(
            "{}: {}: {}",
            argv.join(" "),
            ran.status,
            crate::log::one_line(&ran.last_line(), 200)
        ));
    }
    Ok(parse_lci(&String::from_utf8_lossy(&ran.output)))
}

/// The compute instances of `nvidia-smi mig -lci`'s table: rows `| GPU GI NAME PROFILE-ID CI
/// START:SIZE |` whose name is `MIG PROFILE`, by (GPU instance, compute instance).
pub fn parse_lci(text: &str) -> Names {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split_whitespace().collect();
        // GPU, GPU instance, "MIG", name, profile id, compute instance, placement.
        let [gpu, gi, mig, name, profile, ci, placement] = cells[..] else {
            continue;
        };
        let num = |s: &str| s.parse::<u32>().ok();
        if mig != "MIG"
            || num(gpu).is_none()
            || num(profile).is_none()
            || !placement.contains(':')
            || !profile_ok(name)
        {
            continue;
        }
        if let (Some(gi), Some(ci)) = (num(gi), num(ci)) {
            out.insert((gi, ci), name.to_string());
        }
    }
    out
}

/// Whether a MIG profile as the driver names it can be part of a resource name (kubelet's
/// resource names are DNS-label-like: letters, digits, `.`, `-`; at most 40 here).
pub fn profile_ok(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 40
        && p.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
}

//! The GPU's own state, read before an Xid quarantines it: a record that passed the
//! driver's whole shape still waits for the GPU to show the fault where it can
//! ([`super::catalog::check`]). Xid 79: the PCI config space reads as all ones (or the
//! function is gone from the bus). A reset-class memory error: the driver's ECC and
//! row-remapping counters, read with the configured `nvidia-smi` (config `nvidia_smi`) as
//! gpuhook runs every child: root's program only, in a directory chain of root's from `/`,
//! run from the descriptor checked; a fixed environment, no descriptor but its output,
//! killed past [`SMI_DEADLINE`]; never under the state lock.
//!
//! The GPU's state refutes the record (config space reads, counters all clear): counted and
//! logged, not quarantined. It cannot be read (no `nvidia-smi`, or it fails, or the GPU
//! reports none of the counters): the driver's record is trusted, as for the classes the
//! GPU's state cannot confirm.

use super::catalog::Check;
use crate::enter::sandbox::{run_program_fd, RunError, Waited};
use crate::host::config::Config;
use crate::host::inventory::{config_probe, ProbeFailure};
use crate::host::program::{self, ProgramError, TrustedProgram};
use crate::ids::Pci;
use std::path::Path;
use std::time::Duration;

/// How long `nvidia-smi` may take to answer for one GPU.
pub const SMI_DEADLINE: Duration = Duration::from_secs(10);

/// What `health scan` asks `nvidia-smi` for (`--query-gpu`), in this order.
pub const SMI_FIELDS: [&str; 5] = [
    "pci.bus_id",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
];

/// What the GPU's own state says of an Xid's class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    /// It shows the fault (what it showed): the record quarantines.
    Confirmed(GpuState),
    /// It shows no such fault (what it showed instead): counted and logged only.
    Refuted(GpuState),
    /// It could not be read (why): the driver's record is trusted.
    Unavailable(Unreadable),
}

/// What was read of the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuState {
    /// Its PCI config space reads as all ones.
    ConfigAllOnes,
    /// The function is gone from the bus (not under `<sys>/bus/pci/devices`).
    Gone,
    /// Its PCI config space reads, not as all ones.
    ConfigReads,
    /// `nvidia-smi`'s memory counters.
    Counters(MemoryCounters),
}

impl std::fmt::Display for GpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            GpuState::ConfigAllOnes => f.write_str("its PCI config space reads as all ones"),
            GpuState::Gone => f.write_str("it is gone from the PCI bus"),
            GpuState::ConfigReads => f.write_str("its PCI config space reads, not as all ones"),
            GpuState::Counters(c) => write!(f, "nvidia-smi shows {c}"),
        }
    }
}

/// One GPU's memory error counters as `nvidia-smi --query-gpu` gives them; `None` where it
/// says `[N/A]` (or anything but a number, `Yes`, `No`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryCounters {
    pub uncorrected_volatile: Option<u64>,
    pub retired_pages_pending: Option<bool>,
    pub remapped_rows_pending: Option<bool>,
    pub remapped_rows_failure: Option<bool>,
}

impl MemoryCounters {
    /// An uncorrected error since the driver loaded, a row remapping pending or failed, or a
    /// page retirement pending.
    pub fn show_a_fault(&self) -> bool {
        self.uncorrected_volatile.is_some_and(|n| n > 0)
            || [
                self.retired_pages_pending,
                self.remapped_rows_pending,
                self.remapped_rows_failure,
            ]
            .contains(&Some(true))
    }

    /// At least one counter was reported.
    pub fn any(&self) -> bool {
        self.uncorrected_volatile.is_some()
            || self.retired_pages_pending.is_some()
            || self.remapped_rows_pending.is_some()
            || self.remapped_rows_failure.is_some()
    }
}

impl std::fmt::Display for MemoryCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let n = |v: Option<u64>| v.map_or("[N/A]".to_string(), |n| n.to_string());
        let b = |v: Option<bool>| match v {
            Some(true) => "Yes",
            Some(false) => "No",
            None => "[N/A]",
        };
        write!(
            f,
            "{} {}, {} {}, {} {}, {} {}",
            SMI_FIELDS[1],
            n(self.uncorrected_volatile),
            SMI_FIELDS[2],
            b(self.retired_pages_pending),
            SMI_FIELDS[3],
            b(self.remapped_rows_pending),
            SMI_FIELDS[4],
            b(self.remapped_rows_failure)
        )
    }
}

/// Why the GPU's state could not be read: one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("{0}")]
    Config(ProbeFailure),
    #[error(transparent)]
    Program(#[from] ProgramError),
    #[error("'{what}': {cause}")]
    Run { what: String, cause: RunError },
    #[error("'{what}': {status}{}", if said.is_empty() { String::new() } else { format!(": {said}") })]
    Failed {
        what: String,
        status: String,
        said: String,
    },
    #[error("'{what}' gave no line for it")]
    NoLine { what: String },
    #[error("'{what}' reports none of its memory error counters ([N/A]: ECC off, or not kept on this GPU)")]
    NotReported { what: String },
}

/// The GPU's own state for `check`, on this host.
pub fn on_host(cfg: &Config, pci: Pci, check: Check) -> Confirmation {
    match check {
        Check::ConfigSpace => match config_probe(cfg, pci) {
            Err(ProbeFailure::ConfigAllOnes) => Confirmation::Confirmed(GpuState::ConfigAllOnes),
            Err(ProbeFailure::Gone { .. }) => Confirmation::Confirmed(GpuState::Gone),
            Err(e) => Confirmation::Unavailable(Unreadable::Config(e)),
            Ok(()) => Confirmation::Refuted(GpuState::ConfigReads),
        },
        Check::MemoryCounters => match smi_counters(cfg, pci) {
            Ok(c) if c.show_a_fault() => Confirmation::Confirmed(GpuState::Counters(c)),
            Ok(c) => Confirmation::Refuted(GpuState::Counters(c)),
            Err(e) => Confirmation::Unavailable(e),
        },
    }
}

/// The program at `path` if it may be run as root ([`program::trusted_program`]: every
/// directory from `/` to it root's and closed to group and others, its links each read from
/// such a directory, the program a regular file of root's closed to them too), opened: the
/// descriptor is what runs.
pub fn trusted_program(path: &Path) -> Result<TrustedProgram, Unreadable> {
    Ok(program::trusted_program(path)?)
}

/// The argument list that asks `nvidia-smi` (at `program`) for the counters of `pci`.
pub fn smi_argv(program: &Path, pci: Pci) -> Vec<String> {
    vec![
        program.display().to_string(),
        format!("--query-gpu={}", SMI_FIELDS.join(",")),
        "--format=csv,noheader,nounits".into(),
        "-i".into(),
        pci.to_string(),
    ]
}

/// The memory error counters of the GPU at `pci`, from the configured `nvidia-smi`.
pub fn smi_counters(cfg: &Config, pci: Pci) -> Result<MemoryCounters, Unreadable> {
    let program = trusted_program(&cfg.nvidia_smi)?;
    let argv = smi_argv(&program.path, pci);
    let what = argv.join(" ");
    let ran = run_program_fd(&program.fd, &argv, SMI_DEADLINE, 64 * 1024).map_err(|cause| {
        Unreadable::Run {
            what: what.clone(),
            cause,
        }
    })?;
    if !ran.ok() {
        let status = match ran.status {
            Waited::Exited { code, .. } => format!("exited with status {code}"),
            other => other.to_string(),
        };
        return Err(Unreadable::Failed {
            what,
            status,
            said: crate::log::one_line(&ran.last_line(), 300),
        });
    }
    let text = String::from_utf8_lossy(&ran.output);
    let c = parse_counters(&text, pci).ok_or_else(|| Unreadable::NoLine { what: what.clone() })?;
    if !c.any() {
        return Err(Unreadable::NotReported { what });
    }
    Ok(c)
}

/// The counters on the line of `nvidia-smi`'s CSV output (`--format=csv,noheader,nounits`,
/// the fields of [`SMI_FIELDS`]) whose bus id (`00000000:3B:00.0`) is `pci`.
pub fn parse_counters(text: &str, pci: Pci) -> Option<MemoryCounters> {
    let number = |s: &str| s.parse::<u64>().ok();
    let yes = |s: &str| match s {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    };
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        if f.len() != SMI_FIELDS.len() || smi_bus_id(f[0]) != Some(pci) {
            return None;
        }
        Some(MemoryCounters {
            uncorrected_volatile: number(f[1]),
            retired_pages_pending: yes(f[2]),
            remapped_rows_pending: yes(f[3]),
            remapped_rows_failure: yes(f[4]),
        })
    })
}

/// A bus id as `nvidia-smi` writes it (`00000000:3B:00.0`: an 8-digit domain, upper case).
fn smi_bus_id(s: &str) -> Option<Pci> {
    let (dom, rest) = s.split_once(':')?;
    let dom = u32::from_str_radix(dom, 16).ok()?;
    if dom > 0xffff {
        return None;
    }
    format!("{dom:04x}:{}", rest.to_ascii_lowercase())
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: &str = "0000:3b:00.0";

    /// nvidia-smi's CSV, as it prints it for an H100 with ECC on (a DBE since the driver
    /// loaded, a row remapping pending) and for one without ECC counters.
    #[test]
    fn counters_from_nvidia_smis_csv() {
        let pci: Pci = G.parse().unwrap();
        let c = parse_counters("00000000:3B:00.0, 2, [N/A], Yes, No\n", pci).unwrap();
        assert_eq!(
            c,
            MemoryCounters {
                uncorrected_volatile: Some(2),
                retired_pages_pending: None,
                remapped_rows_pending: Some(true),
                remapped_rows_failure: Some(false),
            }
        );
        assert!(c.show_a_fault() && c.any());
        assert_eq!(c.to_string(), "ecc.errors.uncorrected.volatile.total 2, retired_pages.pending [N/A], remapped_rows.pending Yes, remapped_rows.failure No");
        let clear = parse_counters("00000000:3B:00.0, 0, No, No, No\n", pci).unwrap();
        assert!(!clear.show_a_fault() && clear.any());
        for one in [
            "00000000:3B:00.0, 0, Yes, No, No",
            "00000000:3B:00.0, 0, No, No, Yes",
            "00000000:3B:00.0, 1, No, No, No",
        ] {
            assert!(parse_counters(one, pci).unwrap().show_a_fault(), "{one}");
        }
        let none = parse_counters(
            "00000000:3B:00.0, [N/A], [N/A], [Not Supported], [N/A]\n",
            pci,
        )
        .unwrap();
        assert!(!none.any() && !none.show_a_fault());
        // Another GPU's line, a line of another shape, an error: not this GPU's.
        assert_eq!(
            parse_counters("00000000:3C:00.0, 5, No, Yes, No\n", pci),
            None
        );
        assert_eq!(parse_counters("00000000:3B:00.0, 5\n", pci), None);
        assert_eq!(
            parse_counters(
                "Field \"remapped_rows.pending\" is not a valid field to query.\n",
                pci
            ),
            None
        );
        assert_eq!(smi_bus_id("00000000:3B:00.0"), Some(pci));
        assert_eq!(smi_bus_id("0000:3b:00.0"), Some(pci));
        assert_eq!(smi_bus_id("100000000:3B:00.0"), None);
        assert_eq!(
            smi_argv(Path::new("/usr/bin/nvidia-smi"), pci),
            [
                "/usr/bin/nvidia-smi",
                "--query-gpu=pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure",
                "--format=csv,noheader,nounits",
                "-i",
                G
            ]
        );
    }

    /// The query the real-GPU check shows on a real host is this one.
    #[test]
    fn the_real_gpu_check_asks_the_same() {
        let script = include_str!("../../../scripts/real-gpu-check.sh");
        assert!(
            script.contains(&format!("--query-gpu={}", SMI_FIELDS.join(","))),
            "scripts/real-gpu-check.sh asks nvidia-smi for other fields"
        );
    }

    /// Only a program that is root's and that no one else may write (nor any directory on
    /// its way from `/`) is run; a missing one says so.
    #[test]
    fn only_roots_nvidia_smi_runs() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = d.path().join("nvidia-smi");
        let e = trusted_program(&p).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!("no {}: ", p.display())),
            "{e}"
        );
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o775)).unwrap();
        let mine = nix::unistd::geteuid().is_root();
        let e = trusted_program(&p).unwrap_err();
        if mine {
            assert_eq!(
                e.to_string(),
                format!(
                    "{} may be written by group or others (mode 775): not run",
                    p.display()
                )
            );
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            assert_eq!(trusted_program(&p).unwrap().path, p);
            // Its directory writable by others: not run.
            std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
            assert!(matches!(
                trusted_program(&p),
                Err(Unreadable::Program(ProgramError::DirWritable { .. }))
            ));
            // Another user's.
            std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
            assert_eq!(
                trusted_program(&p).unwrap_err().to_string(),
                format!("{} is owned by uid 65534, not root: not run", p.display())
            );
        } else {
            assert!(
                matches!(e, Unreadable::Program(ProgramError::DirNotRoots { .. })),
                "{e}"
            );
        }
    }

    /// The reviewer's case: `nvidia_smi` below a directory an account owns (`opt-nvidia`,
    /// above a root-owned `bin/nvidia-smi`): the account could swap `bin` between the check
    /// and the exec. Refused (the check before looked at the program and its parent only).
    #[test]
    fn nvidia_smi_below_an_accounts_directory_is_not_run() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (chown): skipped");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = d.path().join("opt-nvidia/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let p = bin.join("nvidia-smi");
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(d.path().join("opt-nvidia"), Some(65534), Some(65534)).unwrap();
        assert!(trusted_program(&p).is_err());
    }

    /// What runs is the file checked: a program swapped in at its path after the check (a
    /// rename over it) is not what runs; its descriptor is.
    #[test]
    fn the_program_run_is_the_one_checked_whatever_is_put_at_its_path_after() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (a program of root's): skipped");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = d.path().join("nvidia-smi");
        std::fs::write(&p, "#!/bin/sh\necho checked\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let prog = trusted_program(&p).unwrap();
        let other = d.path().join("swapped");
        std::fs::write(&other, "#!/bin/sh\necho swapped\n").unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&other, &p).unwrap();
        let argv = smi_argv(&prog.path, G.parse().unwrap());
        let ran = run_program_fd(&prog.fd, &argv, SMI_DEADLINE, 1024).unwrap();
        assert!(ran.ok(), "{ran:?}");
        assert_eq!(String::from_utf8_lossy(&ran.output), "checked\n");
        let by_path = crate::enter::sandbox::run_program(&argv, SMI_DEADLINE, 1024).unwrap();
        assert_eq!(String::from_utf8_lossy(&by_path.output), "swapped\n");
    }
}

//! The runtime command line the wrapper reads (runc's and crun's options): the command,
//! the container ID, the bundle and config, the log.

use crate::log;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

/// What the wrapper needs from a runtime command line: the command, the container ID and
/// where its config is. Options are runc's and crun's; an unknown `--opt` is taken for a
/// flag (`--opt=value` carries its value).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    pub command: Option<String>,
    pub id: Option<String>,
    pub bundle: Option<PathBuf>,
    /// crun's `--config FILE` (`-f`): the config instead of `BUNDLE/config.json`.
    pub config: Option<PathBuf>,
    /// The global `--log FILE` and `--log-format` (`text`, `json`): where engines read the
    /// runtime's error from (containerd's shim reads nothing else).
    pub log: Option<PathBuf>,
    pub log_format: Option<String>,
}

/// Global options that take a value (runc, crun).
const GLOBAL_VALUED: [&str; 7] = [
    "--root",
    "--log",
    "--log-format",
    "--log-level",
    "--criu",
    "--cgroup-manager",
    "--rootless",
];
/// `create`/`run`/`delete` options that take a value.
const COMMAND_VALUED: [&str; 8] = [
    "-b",
    "--bundle",
    "--console-socket",
    "--pid-file",
    "--preserve-fds",
    "-f",
    "--config",
    "--criu",
];

impl Invocation {
    pub fn parse(args: &[OsString]) -> Invocation {
        let mut inv = Invocation::default();
        let mut it = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .peekable();
        // Global options, up to the command.
        while let Some(a) = it.next() {
            let (name, inline) = match a.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (a.as_str(), None),
            };
            if matches!(name, "--log" | "--log-format") {
                let v = if inline.is_some() { inline } else { it.next() };
                if name == "--log" {
                    inv.log = v.map(PathBuf::from);
                } else {
                    inv.log_format = v;
                }
            } else if a == "--rootless" {
                // runc: `--rootless VALUE`; crun: `--rootless[=VALUE]`.
                if it
                    .peek()
                    .is_some_and(|v| matches!(v.as_str(), "true" | "false" | "auto"))
                {
                    it.next();
                }
            } else if GLOBAL_VALUED.contains(&a.as_str()) {
                it.next();
            } else if !a.starts_with('-') {
                inv.command = Some(a);
                break;
            }
        }
        let creates = matches!(inv.command.as_deref(), Some("create" | "run"));
        let mut positional_only = false;
        while let Some(a) = it.next() {
            // Go's flag parsing (runc) takes `-bundle` for `--bundle`.
            let a = if !positional_only && a.len() > 2 && a.starts_with('-') && !a.starts_with("--")
            {
                format!("-{a}")
            } else {
                a
            };
            if positional_only || !a.starts_with('-') || a == "-" {
                if inv.id.is_none() {
                    inv.id = Some(a);
                }
                continue;
            }
            if a == "--" {
                positional_only = true;
                continue;
            }
            let (name, inline) = match a.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
                _ => (a.clone(), None),
            };
            // `-f` is crun's `--config` for create/run, `--force` elsewhere.
            let valued = COMMAND_VALUED.contains(&name.as_str())
                && (creates || !matches!(name.as_str(), "-f" | "--config"));
            if !valued {
                continue;
            }
            let value = inline.or_else(|| it.next());
            match name.as_str() {
                "-b" | "--bundle" => inv.bundle = value.map(PathBuf::from),
                "-f" | "--config" => inv.config = value.map(PathBuf::from),
                _ => {}
            }
        }
        inv
    }

    /// Says `msg` (syslog, stderr, the runtime's `--log`); returns `code`, the exit status.
    pub(super) fn fail(&self, msg: &str, code: i32) -> i32 {
        log::error(msg);
        self.log_error(msg);
        code
    }

    /// Appends the refusal to the runtime's `--log` as runc writes its own errors there
    /// (logrus JSON or text lines): docker and containerd show the last error of that file.
    pub fn log_error(&self, msg: &str) {
        let Some(path) = &self.log else { return };
        let msg = format!("gpuhook: {}", crate::log::one_line(msg, 2000));
        let time = crate::reserve::state::now_rfc3339();
        let line = if self.log_format.as_deref() == Some("json") {
            serde_json::json!({"level": "error", "msg": msg, "time": time}).to_string()
        } else {
            format!(
                "time=\"{time}\" level=error msg={}",
                serde_json::Value::from(msg)
            )
        };
        let _ = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .and_then(|mut f| writeln!(f, "{line}"));
    }

    /// The bundle's `config.json` (relative paths are the runtime's working directory's).
    pub fn config_path(&self) -> PathBuf {
        match (&self.config, &self.bundle) {
            (Some(c), Some(b)) if c.is_relative() => b.join(c),
            (Some(c), _) => c.clone(),
            (None, Some(b)) => b.join("config.json"),
            (None, None) => PathBuf::from("config.json"),
        }
    }
}

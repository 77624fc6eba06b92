//! What the operator's commands share: the host as `list` and `driver` read it, and how
//! a command writes its output (stdout, or a file replaced atomically).

use crate::doors::error::CliError;
use crate::host::config::Config;
use crate::host::inventory::{self, Inventory};
use crate::reserve::error::Error;
use crate::reserve::state::{State, Store};
use crate::reserve::vm::PassedThrough;

/// The config, the inventory (quarantined GPUs marked) and the state, as every command that
/// reports on the pool reads them (`list`, `check`, `metrics`, `placement`): a state file
/// that cannot be read (corrupt, of another version, unsafe) fails the command here, in one
/// line naming the file, before anything is printed or written (no GPU is ever reported free,
/// nor an inventory published, from a state that could not be read). Nothing is written.
pub(crate) fn load() -> Result<(Config, Inventory, State), Error> {
    load_with_vms().map(|(cfg, inv, st, _)| (cfg, inv, st))
}

/// [`load`], and the GPUs running VMs pass through without a reservation (libvirt's status
/// XML): marked unusable in the inventory (a container would be refused them, naming the
/// VM), and returned for the commands that name their VM.
pub(crate) fn load_with_vms() -> Result<(Config, Inventory, State, PassedThrough), Error> {
    let cfg = Config::load()?;
    let mut inv = inventory::scan(&cfg)?;
    let mut st = Store::new(&cfg.state_file).read()?;
    let passed = crate::reserve::vm::passed_through(&cfg, crate::host::procfs::REAL);
    crate::reserve::vm::mark_passed_through(&mut inv, &st, &passed);
    crate::reserve::health::apply(&mut inv, &st);
    // What still holds draining GPUs now (the file is not written).
    crate::reserve::drain::recheck(&mut st);
    Ok((cfg, inv, st, passed))
}

/// Prints `text`, or replaces `output` with it atomically.
pub(crate) fn emit(text: &str, output: Option<&std::path::Path>) -> Result<i32, CliError> {
    let Some(path) = output else {
        print!("{text}");
        return Ok(0);
    };
    // Readers (node_exporter, nova-compute) may read at any moment: a temp file beside it,
    // then a rename.
    let io = |source: std::io::Error| CliError::Output {
        path: path.to_path_buf(),
        source,
    };
    let name = path.file_name().ok_or_else(|| CliError::OutputNoFile {
        path: path.to_path_buf(),
    })?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let r = crate::host::atomic::AtomicWrite {
        dir: nix::fcntl::AT_FDCWD,
        tmp: &tmp,
        name: path,
        mode: 0o644,
        chmod: None,
        owner: None,
        clear_stale: true,
        durable: false,
    };
    crate::host::atomic::replace(&r, text.as_bytes()).map_err(|(_, e)| io(e.into()))?;
    Ok(0)
}

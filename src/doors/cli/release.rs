//! `gpuhook release NAME [--json]`: the reservation of a holder that no longer runs, freed.

use crate::doors::error::CliError;
use crate::host::config::Config;
use crate::log;
use crate::reserve::error::Error;
use crate::reserve::lifecycle::{self, Pick};
use crate::reserve::state::{HolderId, Opener, Store};
use crate::reserve::world::World;
use serde_json::json;

/// Frees the reservation of the one holder `name` names ([`lifecycle::resolve`] among the
/// state's reservations; `pick` from `--domain`, `--container`, `--vm`), unless its
/// container still runs ([`lifecycle::release`]). A name that no holder, or more than one,
/// answers to is refused in one line; so is a state that cannot be read.
pub(super) fn release(name: &str, pick: Pick, as_json: bool) -> Result<i32, CliError> {
    let cfg = Config::load().map_err(Error::from)?;
    let st = Store::new(&cfg.state_file).read().map_err(Error::from)?;
    let holders = st.reservations.values().map(|r| r.holder.clone());
    let Some(id) = lifecycle::resolve(name, pick, holders)? else {
        return Err(CliError::NothingToRelease {
            name: name.to_string(),
            kinds: pick.words(),
        });
    };
    let lifecycle::Released { freed, drained } = lifecycle::release(&World::real(&cfg), &id.key())?;
    let mut lines = Vec::new();
    if freed.is_empty() {
        // Freed meanwhile, by its stop or another release.
        lines.push(format!(
            "{} holds no GPUs any more; nothing to release",
            id.who()
        ));
    }
    let mut units = Vec::new();
    for (r, ()) in &freed {
        let line = match r.gpus.is_empty() {
            true => format!("released {} (it held no GPU)", r.holder.who_exactly()),
            false => format!(
                "released {} of {}",
                crate::ids::Unit::join(&r.gpus, ","),
                r.holder.who_exactly()
            ),
        };
        log::info(&format!("operator {line}"));
        lines.push(line);
        units.extend(r.gpus.iter().cloned());
    }
    for (unit, d) in &drained.draining {
        lines.push(if d.holders.is_empty() {
            format!(
                "{unit} is draining: the look for processes that keep it open did not finish in time ({} not read); it is given to no one until a look reads them all",
                d.unread_who()
            )
        } else {
            format!(
                "{unit} is draining: {} still {} it open; it is given to no one until closed",
                Opener::describe(&d.holders),
                if d.holders.len() == 1 { "has" } else { "have" }
            )
        });
    }
    if !as_json {
        lines.iter().for_each(|l| println!("{l}"));
        return Ok(0);
    }
    let pids = |v: &[Opener]| v.iter().map(|o| o.proc.pid).collect::<Vec<_>>();
    let j = json!({
        "holder": holder_json(&id),
        "released": units,
        "draining": drained.draining.iter().map(|(u, d)| json!({
            "unit": u, "pids": pids(&d.holders), "unread": pids(&d.unread),
        })).collect::<Vec<_>>(),
    });
    println!("{}", serde_json::to_string_pretty(&j).expect("json"));
    Ok(0)
}

/// A holder as the operator's commands give it in JSON: `kind`, `name`, `uuid` (`null` for
/// a container).
pub(super) fn holder_json(id: &HolderId) -> serde_json::Value {
    json!({"kind": id.kind(), "name": id.name(), "uuid": id.uuid()})
}

//! `gpuhook show NAME [--json]`: one holder's whole story, from the state and the host: its
//! units and their GPUs, its phase, its container (init, controller, cgroup), its driver
//! files, and when and through which door it reserved them. Any kind of holder the state
//! keeps is shown by the same code: what a kind has not (a VM's init, a container's
//! controller) is left out.

use super::common::load;
use super::release::holder_json;
use crate::doors::error::CliError;
use crate::host::inventory::Inventory;
use crate::reserve::lifecycle::{self, Pick};
use crate::reserve::state::Reservation;
use serde_json::{json, Value};

pub(super) fn show(name: &str, pick: Pick, as_json: bool) -> Result<i32, CliError> {
    let (cfg, inv, st) = load()?;
    let holders = st.reservations.values().map(|r| r.holder.clone());
    let Some(id) = lifecycle::resolve(name, pick, holders)? else {
        return Err(CliError::NothingToShow {
            name: name.to_string(),
            kinds: pick.words(),
        });
    };
    let Some(r) = st.reservations.get(&id.key()) else {
        return Err(CliError::NothingToShow {
            name: name.to_string(),
            kinds: pick.words(),
        });
    };
    let story = Story {
        r,
        inv: &inv,
        stale: crate::reserve::reconcile::stale_reason(r),
        host_driver: crate::host::driver::module_version(&cfg.proc).ok(),
    };
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&story.json()).expect("json")
        );
    } else {
        print!("{}", story.text());
    }
    Ok(0)
}

/// One reservation, and what the host says of it now.
struct Story<'a> {
    r: &'a Reservation,
    inv: &'a Inventory,
    /// Why its holder is gone, if it is.
    stale: Option<String>,
    /// The NVIDIA driver the host runs now.
    host_driver: Option<String>,
}

impl Story<'_> {
    /// The door it came through: its kind's, or `gpuhook attach` for a reservation attach
    /// made (a container that held none: no reserving process recorded).
    fn door(&self) -> (&'static str, &'static str) {
        if self.r.hotplugged && self.r.prepared_by.is_none() {
            return ("attach", "gpuhook attach (it held no GPU before)");
        }
        self.r.kind().door()
    }

    /// Its container got another driver's files than the host runs now: (had, now).
    fn outdated(&self) -> Option<(&str, &str)> {
        let had = self.r.driver_version.as_deref()?;
        let now = self.host_driver.as_deref()?;
        (had != now).then_some((had, now))
    }

    fn phase(&self) -> String {
        serde_json::to_value(self.r.phase)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    fn json(&self) -> Value {
        let r = self.r;
        json!({
            "holder": holder_json(&r.holder),
            "door": self.door().0,
            "hotplugged": r.hotplugged,
            "phase": r.phase,
            "stale": self.stale,
            "request": r.request,
            "created": r.created,
            "updated": r.updated,
            "gpus": r.gpus.iter().map(|u| {
                let g = self.inv.by_unit(u);
                json!({
                    "unit": u, "pci": u.pci(), "index": g.map(|g| g.index),
                    "model": g.map(|g| &g.model), "arch": g.and_then(|g| g.arch.as_deref()),
                })
            }).collect::<Vec<_>>(),
            "nodes": r.nodes,
            "init": r.init,
            "controller": r.controller,
            "prepared_by": r.prepared_by,
            "cgroup": r.cgroup,
            "driver": r.driver.map(|d| d.as_str()),
            "driver_version": r.driver_version,
            "driver_outdated": self.outdated().is_some(),
            "mounts": r.mounts.iter().map(|m| &m.target).collect::<Vec<_>>(),
        })
    }

    fn text(&self) -> String {
        let r = self.r;
        let mut t = format!("{}\n", r.holder.who_exactly());
        let mut line = |k: &str, v: String| t.push_str(&format!("  {k:<9} {v}\n"));
        let changed = match r.hotplugged {
            true => "; its GPUs changed since by gpuhook attach/detach",
            false => "",
        };
        line(
            "reserved",
            format!("{} through {}{changed}", r.created, self.door().1),
        );
        line(
            "phase",
            format!("{} (last changed {})", self.phase(), r.updated),
        );
        if let Some(why) = &self.stale {
            line(
                "stale",
                format!("{why}: the next request that needs its GPUs reclaims them; `gpuhook release {}` frees them now", r.holder.name()),
            );
        }
        line("request", r.request.clone());
        for (i, u) in r.gpus.iter().enumerate() {
            let what = match self.inv.by_unit(u) {
                Some(g) => format!(
                    "{u} (index {}, {}, {})",
                    g.index,
                    g.model,
                    g.arch.as_deref().unwrap_or("unknown arch")
                ),
                None => format!("{u} (not a GPU this host lists now)"),
            };
            line(if i == 0 { "gpus" } else { "" }, what);
        }
        if r.gpus.is_empty() {
            line("gpus", "none".into());
        }
        if !r.nodes.is_empty() {
            let nodes: Vec<String> = r
                .nodes
                .iter()
                .map(|n| format!("{} ({}:{})", n.path, n.major, n.minor))
                .collect();
            line("nodes", nodes.join(" "));
        }
        if let Some(i) = r.init {
            line(
                "init",
                format!("pid {} (start time {})", i.pid, i.start_time),
            );
        }
        if let Some(c) = r.controller {
            line("controller", format!("pid {c}"));
        }
        if let Some(p) = r.prepared_by {
            line("by", format!("pid {} (the process that reserved)", p.pid));
        }
        if let Some(c) = &r.cgroup {
            let parts: Vec<String> = [("devices", &c.devices), ("unified", &c.unified)]
                .into_iter()
                .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} {v}")))
                .collect();
            line("cgroup", parts.join("; "));
        }
        let driver = match (r.driver, &r.driver_version, self.outdated()) {
            (None, _, _) => "none (device nodes only)".to_string(),
            (Some(d), _, Some((had, now))) => {
                format!("{}, NVIDIA {had} (the host runs {now} now)", d.as_str())
            }
            (Some(d), Some(v), None) => format!("{}, NVIDIA {v}", d.as_str()),
            (Some(d), None, None) => d.as_str().to_string(),
        };
        line("driver", driver);
        if !r.mounts.is_empty() {
            line(
                "mounts",
                format!(
                    "{} ({})",
                    r.mounts.len(),
                    r.mounts
                        .iter()
                        .map(|m| m.target.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
            );
        }
        t
    }
}

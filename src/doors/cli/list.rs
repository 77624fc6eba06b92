//! `gpuhook list`: the GPUs and who holds them, as a table or as JSON.

use super::load;
use crate::host::inventory::{Gpu, Inventory};
use crate::ids::Unit;
use crate::reserve::error::Error;
use crate::reserve::state::State;
use serde_json::json;

fn holder_json(st: &State, g: &Gpu) -> serde_json::Value {
    match st.holder_of(&Unit::Gpu(g.pci)) {
        Some(r) => json!({"kind": r.kind, "domain": r.domain, "uuid": r.uuid, "phase": r.phase}),
        None => serde_json::Value::Null,
    }
}

/// The stable JSON form of `list`.
pub fn list_json(inv: &Inventory, st: &State) -> serde_json::Value {
    let gpus: Vec<_> = inv
        .gpus
        .iter()
        .map(|g| {
            json!({
                "index": g.index,
                "pci": g.pci,
                "vendor": g.vendor.as_str(),
                "model": g.model,
                "arch": g.arch,
                "uuid": g.uuid,
                "numa_node": g.numa_node,
                "devices": g.paths(),
                "excluded": g.excluded,
                "holder": holder_json(st, g),
                "vendor_id": format!("{:04x}", g.vendor_id),
                "device_id": format!("{:04x}", g.device_id),
                "parent": g.parent,
                "nodes": g.nodes.iter().map(|(_, n)| n).collect::<Vec<_>>(),
                "problem": g.problem,
                "driver": g.driver,
                "migs": g.migs.iter().map(|m| {
                    let id = m.id(g.pci);
                    json!({
                        "gi": m.gi, "ci": m.ci, "id": id,
                        "nodes": [&m.gi_cap.node, &m.ci_cap.node],
                        "holder": st.holder_of(&id).map(|r| json!({
                            "kind": r.kind, "domain": r.domain, "uuid": r.uuid, "phase": r.phase,
                        })),
                        "draining": crate::reserve::drain::unit_pids(st, &id),
                    })
                }).collect::<Vec<_>>(),
                "quarantine": st.quarantine.get(g.pci.as_str()),
                "draining": crate::reserve::drain::pids_of(st, g.pci),
                "link": g.link.as_ref().map(|l| json!({
                    "speed": l.speed, "max_speed": l.max_speed,
                    "width": l.width, "max_width": l.max_width,
                    "degraded": l.degraded(),
                })),
            })
        })
        .collect();
    let controls: Vec<_> = inv.controls.iter().map(|(_, n)| n).collect();
    let reservations: Vec<_> = st
        .reservations
        .values()
        .map(|r| {
            json!({
                "kind": r.kind, "domain": r.domain, "uuid": r.uuid, "phase": r.phase, "gpus": r.gpus,
                "request": r.request, "created": r.created, "updated": r.updated,
                "init_pid": r.init.map(|i| i.pid),
                "stale": crate::reserve::lifecycle::stale_reason(r),
            })
        })
        .collect();
    json!({"gpus": gpus, "controls": controls, "reservations": reservations})
}

pub(super) fn list(as_json: bool) -> Result<i32, Error> {
    let (cfg, inv, st) = load()?;
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&list_json(&inv, &st)).expect("json")
        );
        return Ok(0);
    }
    let rows: Vec<[String; 8]> = inv
        .gpus
        .iter()
        .map(|g| {
            let unit = Unit::Gpu(g.pci);
            let holder = match (st.holder_of(&unit), st.draining.get(&unit)) {
                (Some(r), _) => format!(
                    "{}{} ({})",
                    match r.kind {
                        crate::reserve::state::HolderKind::Libvirt => "",
                        crate::reserve::state::HolderKind::Oci => "container ",
                    },
                    r.domain,
                    serde_json::to_value(r.phase)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                ),
                (None, Some(d)) => {
                    format!("draining: {}", d.who())
                }
                (None, None) if g.excluded => "excluded".into(),
                (None, None) => match &g.problem {
                    Some(p) => format!("unusable: {p}"),
                    None if !g.migs.is_empty() => mig_cell(&st, g),
                    None => "free".into(),
                },
            };
            let holder = match &g.link {
                Some(l) if l.degraded() => format!("{holder} [link {l}]"),
                _ => holder,
            };
            [
                g.index.to_string(),
                g.pci.to_string(),
                g.vendor.to_string(),
                g.model.clone(),
                g.arch.clone().unwrap_or_else(|| "-".into()),
                g.numa_node.map_or("-".into(), |n| n.to_string()),
                g.paths().join(","),
                holder,
            ]
        })
        .collect();
    print_table(
        &[
            "INDEX", "PCI", "VENDOR", "MODEL", "ARCH", "NUMA", "DEVICES", "HOLDER",
        ],
        &rows,
    );
    if inv.gpus.is_empty() {
        println!(
            "(no NVIDIA, AMD or Intel GPU found under {})",
            cfg.sysfs.display()
        );
    }
    Ok(0)
}

/// The HOLDER cell of a GPU in MIG mode: how many instances are free, who holds the others
/// (or keeps them draining).
fn mig_cell(st: &State, g: &Gpu) -> String {
    let held: Vec<String> = g
        .migs
        .iter()
        .filter_map(|m| {
            let id = m.id(g.pci);
            let name = id.instance()?;
            st.holder_of(&id)
                .map(|r| format!("{name} {}", r.domain))
                .or_else(|| {
                    st.draining
                        .get(&id)
                        .map(|d| format!("{name} draining: {}", d.who()))
                })
        })
        .collect();
    format!(
        "MIG: {} of {} instances free{}",
        g.migs.len() - held.len(),
        g.migs.len(),
        if held.is_empty() {
            String::new()
        } else {
            format!(" ({})", held.join(", "))
        }
    )
}

fn print_table(head: &[&str; 8], rows: &[[String; 8]]) {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(head.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

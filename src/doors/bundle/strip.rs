//! Taking out what earlier edits added, as gpuhook's hooks list it: a bundle used again
//! (`runc run` of the same directory) is cleaned before it is edited again, or passed on
//! without it.

use super::hooks::{is_our_hook, our_hooks, CDI_MARK, POSTSTOP};
use super::json::{allow_rule, device_number};
use serde_json::{json, Value};

/// What earlier edits added, as their hooks list it (comma-separated `n:MAJ:MIN:PATH`
/// nodes, `r:MAJ:MIN` rules, `m:0:0:PATH` mounts, `e:0:0:NAME` variables, `g:GID:0`
/// groups): what [`strip`] takes out. An entry it cannot read is skipped.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Added {
    pub(super) nodes: Vec<(u32, u32, String)>,
    pub(super) rules: Vec<(u32, u32)>,
    pub(super) binds: Vec<String>,
    pub(super) envs: Vec<String>,
    pub(super) gids: Vec<u32>,
}

impl Added {
    pub(super) fn parse(lists: &[String]) -> Added {
        let mut added = Added::default();
        for e in lists.iter().flat_map(|l| l.split(',')) {
            let mut it = e.splitn(4, ':');
            let (kind, a, b) = (it.next(), it.next(), it.next());
            let (Some(a), Some(b)) = (
                a.and_then(|x| x.parse().ok()),
                b.and_then(|x| x.parse().ok()),
            ) else {
                continue;
            };
            match (kind, it.next()) {
                (Some("n"), Some(p)) => added.nodes.push((a, b, p.to_string())),
                (Some("m"), Some(p)) => added.binds.push(p.to_string()),
                (Some("e"), Some(p)) => added.envs.push(p.to_string()),
                (Some("r"), None) => added.rules.push((a, b)),
                (Some("g"), None) => added.gids.push(a),
                _ => {}
            }
        }
        added
    }
}

/// Takes out what earlier edits added, as their hooks list it: those devices and bind mounts
/// (at that path, with that number), one instance of each of those rules (the last: gpuhook
/// appended it), and the hooks themselves. Returns whether there was anything.
pub fn strip(config: &mut Value) -> bool {
    let ours = our_hooks(config);
    if ours.is_empty() {
        return false;
    }
    // Both hooks of an edit carry the same list: one hook's lists are all of them.
    let lists: Vec<String> = ours
        .iter()
        .filter(|h| h.pointer("/args/2") == Some(&json!(POSTSTOP)))
        .filter_map(|h| h.pointer("/args/4").and_then(Value::as_str))
        .map(str::to_owned)
        .collect();
    let Added {
        nodes,
        rules,
        binds,
        envs,
        gids,
    } = Added::parse(&lists);
    let is_node = |v: &Value, key: &str| {
        let p = v.get(key).and_then(Value::as_str);
        nodes.iter().any(|(_, _, a)| Some(a.as_str()) == p)
    };
    if let Some(a) = config.pointer_mut("/mounts").and_then(Value::as_array_mut) {
        a.retain(|m| {
            let dest = m.get("destination").and_then(Value::as_str);
            let ours = is_node(m, "destination") || binds.iter().any(|b| Some(b.as_str()) == dest);
            !(ours && m.get("type") == Some(&json!("bind")))
        });
    }
    if let Some(a) = config
        .pointer_mut("/process/user/additionalGids")
        .and_then(Value::as_array_mut)
    {
        a.retain(|g| {
            !g.as_u64()
                .is_some_and(|g| gids.iter().any(|x| u64::from(*x) == g))
        });
    }
    if let Some(a) = config
        .pointer_mut("/process/env")
        .and_then(Value::as_array_mut)
    {
        for name in &envs {
            let prefix = format!("{name}=");
            if let Some(k) = a
                .iter()
                .rposition(|v| v.as_str().is_some_and(|v| v.starts_with(&prefix)))
            {
                a.remove(k);
            }
        }
    }
    if let Some(a) = config
        .pointer_mut("/linux/devices")
        .and_then(Value::as_array_mut)
    {
        a.retain(|d| {
            !nodes.iter().any(|(ma, mi, p)| {
                d.get("path").and_then(Value::as_str) == Some(p.as_str())
                    && device_number(d) == Some((*ma, *mi))
            })
        });
    }
    if let Some(a) = config
        .pointer_mut("/linux/resources/devices")
        .and_then(Value::as_array_mut)
    {
        for (ma, mi) in &rules {
            let rule = allow_rule(*ma, *mi);
            if let Some(k) = a.iter().rposition(|r| *r == rule) {
                a.remove(k);
            }
        }
    }
    for stage in crate::cdi::STAGES {
        if let Some(a) = config
            .pointer_mut(&format!("/hooks/{stage}"))
            .and_then(Value::as_array_mut)
        {
            a.retain(|h| {
                let passed = h
                    .get("env")
                    .and_then(Value::as_array)
                    .is_some_and(|e| e.contains(&json!(CDI_MARK)));
                !is_our_hook(h) && !passed
            });
        }
    }
    true
}

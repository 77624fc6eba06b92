//! Placement by topology: one NUMA node if one suffices (best fit), then one PCI parent,
//! then lowest index; or closest to a GPU the request names.

use crate::host::inventory::Gpu;
use std::collections::BTreeMap;

/// Groups GPUs by a key, keeping index order inside each group.
fn groups<'a, K: Ord + Clone>(gs: &[&'a Gpu], key: impl Fn(&Gpu) -> K) -> Vec<(K, Vec<&'a Gpu>)> {
    let mut m: BTreeMap<K, Vec<&Gpu>> = BTreeMap::new();
    for g in gs {
        m.entry(key(g)).or_default().push(g);
    }
    m.into_iter().collect()
}

/// Picks `want` GPUs from `gs` by best fit on groups of `key`; `inner` orders a group.
fn best_fit<'a, K: Ord + Clone>(
    gs: &[&'a Gpu],
    want: usize,
    key: impl Fn(&Gpu) -> K,
    inner: impl Fn(&[&'a Gpu], usize) -> Vec<&'a Gpu>,
) -> Vec<&'a Gpu> {
    let mut gr = groups(gs, key);
    // Smallest group that suffices (ties: lowest key, i.e. lowest NUMA node / parent).
    if let Some((_, g)) = gr
        .iter()
        .filter(|(_, g)| g.len() >= want)
        .min_by_key(|(k, g)| (g.len(), k.clone()))
    {
        return inner(g, want);
    }
    // None suffices: spread over the fewest groups, largest first.
    gr.sort_by(|(ka, a), (kb, b)| b.len().cmp(&a.len()).then(ka.cmp(kb)));
    let mut out = Vec::new();
    for (_, g) in gr {
        let take = (want - out.len()).min(g.len());
        out.extend(inner(&g, take));
        if out.len() == want {
            break;
        }
    }
    out
}

fn by_parent<'a>(gs: &[&'a Gpu], want: usize) -> Vec<&'a Gpu> {
    best_fit(gs, want, |x| x.parent.clone(), |h, n| h[..n].to_vec())
}

fn parents_spanned(gs: &[&Gpu]) -> usize {
    let mut p: Vec<&Option<String>> = gs.iter().map(|g| &g.parent).collect();
    p.sort();
    p.dedup();
    p.len()
}

pub(super) fn place<'a>(cands: &[&'a Gpu], want: usize) -> Vec<&'a Gpu> {
    let numa = |g: &Gpu| g.numa_node.map_or(u64::MAX, u64::from);
    // Among NUMA nodes that can hold the whole request: fewest PCI parents spanned, then
    // best fit (fewest free GPUs), then lowest node (unknown node last).
    let best = groups(cands, numa)
        .into_iter()
        .filter(|(_, g)| g.len() >= want)
        .map(|(k, g)| {
            let sel = by_parent(&g, want);
            ((parents_spanned(&sel), g.len(), k), sel)
        })
        .min_by(|a, b| a.0.cmp(&b.0));
    match best {
        Some((_, sel)) => sel,
        None => best_fit(cands, want, numa, by_parent),
    }
}

/// Extra GPUs for a request that names some devices: closest to the first named one.
pub(super) fn near<'a>(cands: &[&'a Gpu], anchor: &Gpu, want: usize) -> Vec<&'a Gpu> {
    let mut c = cands.to_vec();
    c.sort_by_key(|g| {
        (
            g.numa_node != anchor.numa_node,
            g.parent != anchor.parent,
            g.index,
        )
    });
    c.truncate(want);
    c
}

//! Scrub pending (`reset_on_release`): a GPU its last holder let go of is given to no one
//! until `gpuhook health scan` resets it.

use crate::host::config::Config;
use crate::host::inventory::Inventory;
use crate::ids::Pci;
use crate::reserve::state::{Reservation, State};

/// With `reset_on_release`: the GPUs of `freed` (reservations just taken out of `st`) that
/// no reservation holds any unit of now are `scrub pending`, and unusable in `inv` (when
/// given) for the rest of this step. The GPUs marked.
pub fn scrub_freed(
    cfg: &Config,
    st: &mut State,
    inv: Option<&mut Inventory>,
    freed: &[Reservation],
) -> Vec<Pci> {
    if !cfg.reset_on_release {
        return Vec::new();
    }
    let mut marked: Vec<Pci> = Vec::new();
    for r in freed {
        for u in &r.gpus {
            let pci = u.pci();
            if marked.contains(&pci)
                || st
                    .reservations
                    .values()
                    .any(|o| o.gpus.iter().any(|x| x.pci() == pci))
            {
                continue;
            }
            st.health.entry(pci.to_string()).or_default().scrub_pending = true;
            marked.push(pci);
            crate::log::info(&format!(
                "GPU {pci} freed by {}: scrub pending (reset_on_release) until `gpuhook health scan` resets it",
                r.who()
            ));
        }
    }
    if let Some(inv) = inv {
        for g in inv.gpus.iter_mut().filter(|g| marked.contains(&g.pci)) {
            g.problem.get_or_insert_with(|| scrub_text(g.pci));
            g.pending = false;
        }
    }
    marked
}

pub(super) fn scrub_text(pci: Pci) -> String {
    format!("scrub pending: freed with reset_on_release, given to no one until `gpuhook health scan` resets it (or `gpuhook health reset {pci}`)")
}

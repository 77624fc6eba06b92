//! `start`: the holder's reservation still stands on this host.

use super::error::LifecycleError;
use super::holder::Holder;
use super::plan::scan_for;
use super::store::reservation;
use crate::request::Request;
use crate::reserve::error::Error;
use crate::reserve::state::Store;
use crate::reserve::world::World;

/// `start`: checks that the holder's reservation still stands on this host.
pub fn confirm(f: &World, h: &Holder, req: &Request) -> Result<(), Error> {
    let st = Store::new(&f.cfg.state_file).read()?;
    let r = reservation(&st, h)?;
    let mut inv = (f.scan)(f.cfg, scan_for(f.cfg, req))?;
    crate::reserve::health::apply(&mut inv, &st);
    inv.settle(f.cfg, &r.gpus);
    for p in &r.gpus {
        let g = inv
            .by_unit(p)
            .ok_or(LifecycleError::UnitGone { unit: *p })?;
        if let Some(why) = &g.problem {
            return Err(LifecycleError::UnitUnusable {
                unit: *p,
                why: why.clone(),
            }
            .into());
        }
        if g.excluded {
            return Err(LifecycleError::UnitExcluded { unit: *p }.into());
        }
        if p.is_mig() && inv.mig(p).is_none() {
            return Err(LifecycleError::MigGone { unit: *p }.into());
        }
    }
    Ok(())
}

//! The plugin's view of the pool: every unit with its resource and health, recomputed from
//! the host and the state file whenever either may have changed, and handed to every
//! `ListAndWatch` stream through a watch channel (a stream sends only when its resource's
//! list changed).

use gpuhook::host::config::Config;
use gpuhook::host::inventory::{self, Scan};
use gpuhook::ids::Unit;
use gpuhook::log;
use gpuhook::reserve::pods::{self, Advertised, Health, Profiles, Resource};
use gpuhook::reserve::state::{State, Store};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// What kubelet is told: each resource's devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub devices: BTreeMap<Resource, Vec<Advertised>>,
}

/// The pool as the plugin sees it, shared by its servers and its loop.
pub struct Pool {
    pub cfg: Config,
    profiles: Mutex<Profiles>,
    /// Every unit advertised since the start, with its resource: one the host loses stays
    /// listed, unhealthy.
    seen: Mutex<BTreeMap<Unit, Resource>>,
    /// The last reason nothing could be read (said once, and again when it changes).
    trouble: Mutex<Option<String>>,
    tx: watch::Sender<Arc<Snapshot>>,
}

impl Pool {
    pub fn new(cfg: Config) -> Arc<Pool> {
        let (tx, _) = watch::channel(Arc::new(Snapshot::default()));
        Arc::new(Pool {
            cfg,
            profiles: Mutex::new(Profiles::default()),
            seen: Mutex::new(BTreeMap::new()),
            trouble: Mutex::new(None),
            tx,
        })
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    pub fn current(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// The MIG profiles known now.
    pub fn profiles(&self) -> Profiles {
        self.profiles.lock().expect("not poisoned").clone()
    }

    /// The resources to serve: those with devices, and always `gpuhook.io/gpu`.
    pub fn resources(&self) -> Vec<Resource> {
        let mut v: Vec<Resource> = self.current().devices.keys().cloned().collect();
        if !v.contains(&Resource::Gpu) {
            v.insert(0, Resource::Gpu);
        }
        v
    }

    /// Reads the host and the state again and tells every stream what changed. A state
    /// that cannot be read (corrupt, unsafe, another version) makes every unit unhealthy,
    /// said once on stderr and in the log: nothing is advertised as free that could not be
    /// read.
    pub fn refresh(&self) {
        let cfg = &self.cfg;
        let read = Store::new(&cfg.state_file).read();
        let inv = inventory::scan_with(cfg, Scan::FULL);
        let (st, trouble) = match (read, &inv) {
            (Ok(st), Ok(_)) => (st, None),
            (Err(e), _) => (State::default(), Some(e.to_string())),
            (Ok(st), Err(e)) => (st, Some(e.to_string())),
        };
        let mut inv = inv.unwrap_or_default();
        let mut st = st;
        gpuhook::reserve::health::apply(&mut inv, &st);
        // Draining that ended (its openers gone) shows at this look.
        gpuhook::reserve::drain::recheck(&mut st);
        let mut profiles = self.profiles.lock().expect("not poisoned");
        for u in profiles.refresh(&inv.gpus, &|pci| pods::profiles::read_gpu(cfg, pci)) {
            log::warn(&u.to_string());
        }
        let mut seen = self.seen.lock().expect("not poisoned");
        let stale =
            |r: &gpuhook::reserve::state::Reservation| gpuhook::reserve::reconcile::stale_reason(r);
        let mut devices = pods::advertise(&inv, &st, &profiles, &stale, &seen);
        drop(profiles);
        if let Some(why) = &trouble {
            for d in devices.values_mut().flatten() {
                d.health = Health::Unhealthy(why.clone());
            }
        }
        for (res, list) in &devices {
            for d in list {
                seen.insert(d.unit, res.clone());
            }
        }
        drop(seen);
        self.say_trouble(trouble);
        let snap = Snapshot { devices };
        self.tx.send_if_modified(|old| {
            if **old == snap {
                false
            } else {
                *old = Arc::new(snap);
                true
            }
        });
    }

    /// Why nothing could be read at the last look (said once, by [`Pool::refresh`]).
    pub fn trouble(&self) -> Option<String> {
        self.trouble.lock().expect("not poisoned").clone()
    }

    /// Says why nothing could be read, once per reason; and when it can be again.
    fn say_trouble(&self, now: Option<String>) {
        let mut t = self.trouble.lock().expect("not poisoned");
        if *t == now {
            return;
        }
        match &now {
            Some(why) => log::error(&format!(
                "device-plugin: every unit is advertised unhealthy: {why}"
            )),
            None => log::info("device-plugin: the state file and the host can be read again"),
        }
        *t = now;
    }
}

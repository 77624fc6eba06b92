//! kubelet's device manager bookkeeping (`pkg/kubelet/cm/devicemanager/manager.go`,
//! `pod_devices.go`), without the gRPC: the devices each resource's plugin reported last
//! (all of them, and the healthy ones), what each pod's containers hold, and the choice of
//! devices for a container (`devicesToAllocate`) as kubelet makes it with the topology
//! manager's default policy (`none`: no NUMA hint, every device "without affinity").

use super::checkpoint::{Checkpoint, DevicesPerNuma, Entry};
use kubelet_api::v1beta1 as api;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet};

/// kubelet's NUMA node for a device without topology.
pub const NO_TOPOLOGY: i64 = -1;

/// One container's allocation of one resource (`deviceAllocateInfo`).
#[derive(Debug, Clone)]
pub struct Allocation {
    pub device_ids: DevicesPerNuma,
    pub response: api::ContainerAllocateResponse,
}

impl Allocation {
    pub fn ids(&self) -> BTreeSet<String> {
        self.device_ids.values().flatten().cloned().collect()
    }
}

/// Container name → resource → its allocation.
pub type ContainerDevices = BTreeMap<String, BTreeMap<String, Allocation>>;

/// The device manager's state.
#[derive(Debug, Default)]
pub struct Devices {
    /// Resource → device ID → the device as its plugin last listed it (`allDevices`).
    pub all: BTreeMap<String, BTreeMap<String, api::Device>>,
    /// Resource → healthy device IDs (`healthyDevices`); a resource is here from its
    /// first registration (or the checkpoint's `RegisteredDevices`) on.
    pub healthy: BTreeMap<String, BTreeSet<String>>,
    /// Resource → unhealthy device IDs.
    pub unhealthy: BTreeMap<String, BTreeSet<String>>,
    /// Pod UID → its containers' allocations (`podDevices`).
    pub pods: BTreeMap<String, ContainerDevices>,
    /// Resource → device IDs that pods hold (`allocatedDevices`).
    pub allocated: BTreeMap<String, BTreeSet<String>>,
}

/// Why kubelet refuses to allocate: its own error text (the pod is rejected with it,
/// `UnexpectedAdmissionError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Devices {
    /// A `ListAndWatch` message for `resource` (`genericDeviceUpdateCallback`): the list
    /// replaces what the plugin said before.
    pub fn update(&mut self, resource: &str, devices: &[api::Device]) {
        let mut healthy = BTreeSet::new();
        let mut unhealthy = BTreeSet::new();
        let mut all = BTreeMap::new();
        for d in devices {
            if d.health == kubelet_api::HEALTHY {
                healthy.insert(d.id.clone());
            } else {
                unhealthy.insert(d.id.clone());
            }
            all.insert(d.id.clone(), d.clone());
        }
        self.healthy.insert(resource.to_string(), healthy);
        self.unhealthy.insert(resource.to_string(), unhealthy);
        self.all.insert(resource.to_string(), all);
    }

    /// The plugin went away (`markResourceUnhealthy`): its devices count as unhealthy.
    pub fn mark_unhealthy(&mut self, resource: &str) {
        let h = self.healthy.insert(resource.to_string(), BTreeSet::new());
        self.unhealthy
            .entry(resource.to_string())
            .or_default()
            .extend(h.into_iter().flatten());
    }

    /// Whether kubelet counts `resource` as a device plugin's (`isDevicePluginResource`).
    pub fn is_plugin_resource(&self, resource: &str) -> bool {
        self.healthy.contains_key(resource) || self.allocated.contains_key(resource)
    }

    /// `podDevices.devices()`: what the pods hold, per resource.
    fn held(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for c in self.pods.values() {
            for (res, a) in c.values().flatten() {
                m.entry(res.clone()).or_default().extend(a.ids());
            }
        }
        m
    }

    /// `UpdateAllocatedDevices`: forgets the pods that are not active any more.
    pub fn forget_inactive(&mut self, active: &BTreeSet<String>) {
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|u| !active.contains(*u))
            .cloned()
            .collect();
        if gone.is_empty() {
            return;
        }
        for u in gone {
            self.pods.remove(&u);
        }
        self.allocated = self.held();
    }

    /// After a failed `Allocate`: what is held is what the pods hold.
    pub fn restore_allocated(&mut self) {
        self.allocated = self.held();
    }

    /// The devices a container already holds of `resource`.
    pub fn container_devices(
        &self,
        pod: &str,
        container: &str,
        resource: &str,
    ) -> Option<BTreeSet<String>> {
        self.pods
            .get(pod)?
            .get(container)?
            .get(resource)
            .map(Allocation::ids)
    }

    /// The first half of `devicesToAllocate`: `Ok(None)` when the container holds its
    /// devices already, else the devices free for it (healthy, not held) and how many it
    /// needs. Marks nothing.
    pub fn available(
        &self,
        pod: &str,
        container: &str,
        resource: &str,
        required: usize,
    ) -> Result<Option<BTreeSet<String>>, Refusal> {
        let had = self.container_devices(pod, container, resource);
        if let Some(had) = &had {
            if had.len() != required {
                return Err(Refusal(format!(
                    "pod {pod:?} container {container:?} changed request for resource {resource:?} from {} to {required}",
                    had.len()
                )));
            }
        }
        let Some(healthy) = self.healthy.get(resource) else {
            return Err(Refusal(format!(
                "cannot allocate unregistered device {resource}"
            )));
        };
        if healthy.is_empty() {
            return Err(Refusal(format!(
                "no healthy devices present; cannot allocate unhealthy devices {resource}"
            )));
        }
        if let Some(had) = had {
            if !had.is_subset(healthy) {
                return Err(Refusal(format!(
                    "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
                )));
            }
            return Ok(None);
        }
        let in_use = self.allocated.get(resource).cloned().unwrap_or_default();
        let available: BTreeSet<String> = healthy.difference(&in_use).cloned().collect();
        if available.len() < required {
            return Err(Refusal(format!(
                "requested number of devices unavailable for {resource}. Requested: {required}, Available: {}",
                available.len()
            )));
        }
        Ok(Some(available))
    }

    /// The second half: the plugin's preferred devices first (those of them that are
    /// available), then the other available ones, until `required` are chosen; each is
    /// marked held at once (`allocatedDevices`), as kubelet marks them before it calls the
    /// plugin's `Allocate`.
    pub fn choose(
        &mut self,
        resource: &str,
        available: &BTreeSet<String>,
        preferred: &[String],
        required: usize,
    ) -> Vec<String> {
        let mut chosen: Vec<String> = Vec::new();
        for d in preferred
            .iter()
            .filter(|d| available.contains(*d))
            .chain(available.iter())
        {
            if chosen.len() == required {
                break;
            }
            if !chosen.contains(d) {
                chosen.push(d.clone());
            }
        }
        self.allocated
            .entry(resource.to_string())
            .or_default()
            .extend(chosen.iter().cloned());
        chosen
    }

    /// The devices grouped by the NUMA node each one's topology names (`-1`: none), as
    /// kubelet stores an allocation.
    pub fn by_numa(&self, resource: &str, ids: &[String]) -> DevicesPerNuma {
        let mut m = DevicesPerNuma::new();
        for id in ids {
            let nodes: Vec<i64> = self
                .all
                .get(resource)
                .and_then(|r| r.get(id))
                .and_then(|d| d.topology.as_ref())
                .map(|t| t.nodes.iter().map(|n| n.id).collect())
                .unwrap_or_default();
            if nodes.is_empty() {
                m.entry(NO_TOPOLOGY).or_default().push(id.clone());
            }
            for n in nodes {
                m.entry(n).or_default().push(id.clone());
            }
        }
        m
    }

    /// Records an allocation (`podDevices.insert`).
    pub fn insert(&mut self, pod: &str, container: &str, resource: &str, a: Allocation) {
        self.pods
            .entry(pod.to_string())
            .or_default()
            .entry(container.to_string())
            .or_default()
            .insert(resource.to_string(), a);
    }

    /// The checkpoint kubelet writes of this state (`writeCheckpoint`): every allocation,
    /// and each resource's healthy devices.
    pub fn checkpoint(&self) -> Checkpoint {
        let mut entries = Vec::new();
        for (pod, c) in &self.pods {
            for (name, res) in c {
                for (r, a) in res {
                    entries.push(Entry {
                        pod_uid: pod.clone(),
                        container: name.clone(),
                        resource: r.clone(),
                        device_ids: a.device_ids.clone(),
                        alloc_resp: a.response.encode_to_vec(),
                    });
                }
            }
        }
        Checkpoint {
            entries,
            registered: self
                .healthy
                .iter()
                .map(|(r, s)| (r.clone(), s.iter().cloned().collect()))
                .collect(),
        }
    }

    /// The state kubelet starts from after a restart (`readCheckpoint`): the allocations,
    /// and each resource it knew with no device until its plugin registers again.
    pub fn from_checkpoint(cp: &Checkpoint) -> Devices {
        let mut d = Devices::default();
        for e in &cp.entries {
            // kubelet skips an entry whose AllocResp does not decode.
            let Ok(response) = api::ContainerAllocateResponse::decode(e.alloc_resp.as_slice())
            else {
                continue;
            };
            d.insert(
                &e.pod_uid,
                &e.container,
                &e.resource,
                Allocation {
                    device_ids: e.device_ids.clone(),
                    response,
                },
            );
        }
        d.allocated = d.held();
        for r in cp.registered.keys() {
            d.healthy.insert(r.clone(), BTreeSet::new());
            d.unhealthy.insert(r.clone(), BTreeSet::new());
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(id: &str, healthy: bool, numa: Option<i64>) -> api::Device {
        api::Device {
            id: id.into(),
            health: if healthy { "Healthy" } else { "Unhealthy" }.into(),
            topology: numa.map(|n| api::TopologyInfo {
                nodes: vec![api::NumaNode { id: n }],
            }),
        }
    }

    #[test]
    fn kubelet_chooses_healthy_free_devices_preferred_first() {
        let r = "gpuhook.io/gpu";
        let mut d = Devices::default();
        let e = d.available("p", "c", r, 1).unwrap_err();
        assert_eq!(e.0, "cannot allocate unregistered device gpuhook.io/gpu");
        d.update(r, &[dev("a", false, Some(0)), dev("b", false, Some(1))]);
        let e = d.available("p", "c", r, 1).unwrap_err();
        assert!(e.0.starts_with("no healthy devices present"), "{e}");
        d.update(
            r,
            &[
                dev("a", true, Some(0)),
                dev("b", true, Some(1)),
                dev("c", true, None),
            ],
        );
        let avail = d.available("p", "c", r, 2).unwrap().unwrap();
        let chosen = d.choose(r, &avail, &["c".into(), "zz".into()], 2);
        assert_eq!(chosen, ["c", "a"]);
        let ids = d.by_numa(r, &chosen);
        assert_eq!(ids[&-1], ["c"]);
        assert_eq!(ids[&0], ["a"]);
        d.insert(
            "p",
            "c",
            r,
            Allocation {
                device_ids: ids,
                response: Default::default(),
            },
        );
        // Held: only b is left.
        let e = d.available("q", "c", r, 2).unwrap_err();
        assert_eq!(
            e.0,
            "requested number of devices unavailable for gpuhook.io/gpu. Requested: 2, Available: 1"
        );
        // The container again: nothing to do.
        assert_eq!(d.available("p", "c", r, 2).unwrap(), None);
        // The pod gone: its devices are free again.
        d.forget_inactive(&BTreeSet::new());
        assert_eq!(d.available("q", "c", r, 3).unwrap().unwrap().len(), 3);
    }

    #[test]
    fn the_checkpoint_round_trips_and_a_restart_knows_no_device_yet() {
        let r = "gpuhook.io/gpu";
        let mut d = Devices::default();
        d.update(r, &[dev("a", true, Some(0)), dev("b", false, None)]);
        let mut resp = api::ContainerAllocateResponse::default();
        resp.annotations.insert("k".into(), "v".into());
        d.insert(
            "p",
            "c",
            r,
            Allocation {
                device_ids: d.by_numa(r, &["a".into()]),
                response: resp.clone(),
            },
        );
        let cp = d.checkpoint();
        assert_eq!(cp.registered[r], ["a"]);
        let back = Checkpoint::parse(&cp.to_json()).unwrap();
        let d2 = Devices::from_checkpoint(&back);
        assert_eq!(d2.pods["p"]["c"][r].response, resp);
        assert_eq!(d2.allocated[r].len(), 1);
        assert!(d2.healthy[r].is_empty());
        assert!(d2.is_plugin_resource(r));
    }
}

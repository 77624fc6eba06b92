//! Pods as kubelet's device manager sees them: each container's `resources.limits`,
//! admission (kubelet's `Allocate` for each container, calling the plugins), and what a
//! container's kept allocations put into CRI's `ContainerConfig`.

use super::devices::{Allocation, Refusal};
use super::plugin::grpc_error;
use super::{ActivePod, Kubelet};
use crate::cri::api as cri;
use kubelet_api::v1beta1 as api;
use std::collections::{BTreeMap, BTreeSet};

/// A container of a pod manifest.
#[derive(Debug, Clone, Default)]
pub struct Container {
    pub name: String,
    /// `resources.limits` of extended resources: name → count.
    pub limits: BTreeMap<String, usize>,
    /// What it runs (`sh -c`).
    pub script: String,
}

impl Container {
    pub fn new(name: &str, script: &str) -> Container {
        Container {
            name: name.into(),
            script: script.into(),
            ..Default::default()
        }
    }

    /// `resources.limits: {resource: n}`.
    pub fn limit(mut self, resource: &str, n: usize) -> Container {
        self.limits.insert(resource.into(), n);
        self
    }
}

/// A pod manifest: the CRI's view of it (name, UID, annotations) and its containers.
#[derive(Debug, Clone)]
pub struct Pod {
    pub spec: crate::cri::pod::PodSpec,
    /// `runtimeClassName`'s handler; `None`: the runtime's default.
    pub handler: Option<String>,
    pub init: Vec<Container>,
    pub containers: Vec<Container>,
}

impl Pod {
    pub fn new(name: &str) -> Pod {
        Pod {
            spec: crate::cri::pod::PodSpec::new(name),
            handler: None,
            init: Vec::new(),
            containers: Vec::new(),
        }
    }

    pub fn uid(&self) -> &str {
        &self.spec.uid
    }

    pub fn container(mut self, c: Container) -> Pod {
        self.containers.push(c);
        self
    }

    pub fn init_container(mut self, c: Container) -> Pod {
        self.init.push(c);
        self
    }

    pub fn runtime_class(mut self, handler: &str) -> Pod {
        self.handler = Some(handler.into());
        self
    }

    fn active(&self) -> ActivePod {
        ActivePod {
            uid: self.uid().to_string(),
            name: self.spec.name.clone(),
            namespace: self.spec.namespace.clone(),
            containers: self.containers.iter().map(|c| c.name.clone()).collect(),
        }
    }
}

impl Kubelet {
    /// kubelet admits a pod bound to its node: the pod becomes active, and each container's
    /// devices are allocated (init containers first). A refusal rejects the pod (no longer
    /// active), with kubelet's words.
    pub fn admit(&self, pod: &Pod) -> Result<(), Refusal> {
        let uid = pod.uid().to_string();
        self.shared
            .with(|st| st.active.insert(uid.clone(), pod.active()));
        let mut reuse: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let steps = pod
            .init
            .iter()
            .map(|c| (c, true))
            .chain(pod.containers.iter().map(|c| (c, false)));
        for (c, init) in steps {
            if let Err(e) = self.allocate_container(&uid, c, &reuse) {
                self.shared.with(|st| st.active.remove(&uid));
                return Err(e);
            }
            let st = self.shared.lock();
            for (res, a) in st
                .devices
                .pods
                .get(&uid)
                .and_then(|p| p.get(&c.name))
                .into_iter()
                .flatten()
            {
                let set = reuse.entry(res.clone()).or_default();
                if init {
                    set.extend(a.ids());
                } else {
                    for id in a.ids() {
                        set.remove(&id);
                    }
                }
            }
        }
        Ok(())
    }

    /// `allocateContainerResources` for one container.
    fn allocate_container(
        &self,
        uid: &str,
        c: &Container,
        reuse: &BTreeMap<String, BTreeSet<String>>,
    ) -> Result<(), Refusal> {
        let mut forgot = false;
        let mut wrote = false;
        for (resource, &required) in &c.limits {
            if !self.shared.lock().devices.is_plugin_resource(resource) {
                continue;
            }
            if !forgot {
                self.shared.with(|st| {
                    let a = st.active_uids();
                    st.devices.forget_inactive(&a)
                });
                forgot = true;
            }
            let Some(chosen) = self.choose(uid, &c.name, resource, required, reuse)? else {
                continue;
            };
            wrote = true;
            let client = self
                .shared
                .lock()
                .endpoints
                .get(resource)
                .map(|e| e.client.clone());
            let Some(mut client) = client else {
                self.shared.with(|st| st.devices.restore_allocated());
                return Err(Refusal(format!("unknown Device Plugin {resource}")));
            };
            let req = api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: chosen.clone(),
                }],
            };
            let resp = self.rt.block_on(client.allocate(req));
            let resp = match resp {
                Ok(r) => r.into_inner(),
                Err(s) => {
                    self.shared.with(|st| st.devices.restore_allocated());
                    return Err(Refusal(grpc_error(&s)));
                }
            };
            let Some(first) = resp.container_responses.into_iter().next() else {
                return Err(Refusal(
                    "no containers return in allocation response".into(),
                ));
            };
            self.shared.with(|st| {
                let ids = st.devices.by_numa(resource, &chosen);
                st.devices.insert(
                    uid,
                    &c.name,
                    resource,
                    Allocation {
                        device_ids: ids,
                        response: first,
                    },
                );
            });
        }
        if wrote {
            self.shared.with(|st| self.shared.write_checkpoint(st));
        }
        Ok(())
    }

    /// `devicesToAllocate`: `None` when the container holds its devices already.
    fn choose(
        &self,
        uid: &str,
        container: &str,
        resource: &str,
        required: usize,
        reuse: &BTreeMap<String, BTreeSet<String>>,
    ) -> Result<Option<Vec<String>>, Refusal> {
        let (available, preferred_client) = {
            let st = self.shared.lock();
            let Some(avail) = st.devices.available(uid, container, resource, required)? else {
                return Ok(None);
            };
            let ep = st.endpoints.get(resource);
            let client = ep
                .filter(|e| e.options.get_preferred_allocation_available)
                .map(|e| e.client.clone());
            (avail, client)
        };
        let reused: Vec<String> = reuse
            .get(resource)
            .into_iter()
            .flatten()
            .take(required)
            .cloned()
            .collect();
        let mut preferred = reused.clone();
        if reused.len() < required {
            if let Some(mut client) = preferred_client {
                let req = api::PreferredAllocationRequest {
                    container_requests: vec![api::ContainerPreferredAllocationRequest {
                        available_device_i_ds: available
                            .union(&reused.iter().cloned().collect())
                            .cloned()
                            .collect(),
                        must_include_device_i_ds: reused.clone(),
                        allocation_size: required as i32,
                    }],
                };
                let r = self
                    .rt
                    .block_on(client.get_preferred_allocation(req))
                    .map_err(|s| {
                        Refusal(format!(
                            "device plugin GetPreferredAllocation rpc failed with err: {}",
                            grpc_error(&s)
                        ))
                    })?
                    .into_inner();
                if let Some(c) = r.container_responses.into_iter().next() {
                    preferred.extend(c.device_i_ds);
                }
            }
        }
        let mut st = self.shared.lock();
        let mut pool = available;
        pool.extend(reused);
        Ok(Some(
            st.devices.choose(resource, &pool, &preferred, required),
        ))
    }

    /// `GetDeviceRunContainerOptions` for a container about to be created: the plugin's
    /// `PreStartContainer` where it asked for it, a new allocation where the pod is active
    /// and the container holds none (kubelet's re-allocation after a restart), then the
    /// container's kept allocation responses.
    pub fn run_options(
        &self,
        pod: &Pod,
        c: &Container,
    ) -> Result<Vec<api::ContainerAllocateResponse>, Refusal> {
        let uid = pod.uid();
        let mut again = false;
        for (resource, &n) in &c.limits {
            let (plugin, prestart, held, active) = {
                let st = self.shared.lock();
                let ep = st.endpoints.get(resource);
                (
                    st.devices.is_plugin_resource(resource),
                    ep.filter(|e| e.options.pre_start_required)
                        .map(|e| e.client.clone()),
                    st.devices.container_devices(uid, &c.name, resource),
                    st.active.contains_key(uid),
                )
            };
            if !plugin || n == 0 {
                continue;
            }
            if let (Some(mut client), Some(ids)) = (prestart, &held) {
                let req = api::PreStartContainerRequest {
                    devices_ids: ids.iter().cloned().collect(),
                };
                self.rt
                    .block_on(client.pre_start_container(req))
                    .map_err(|s| {
                        Refusal(format!(
                            "device plugin PreStartContainer rpc failed with err: {}",
                            grpc_error(&s)
                        ))
                    })?;
            }
            if active && held.is_none() {
                again = true;
            }
        }
        if again {
            self.allocate_container(uid, c, &BTreeMap::new())?;
        }
        let st = self.shared.lock();
        Ok(st
            .devices
            .pods
            .get(uid)
            .and_then(|p| p.get(&c.name))
            .map(|r| r.values().map(|a| a.response.clone()).collect())
            .unwrap_or_default())
    }

    /// The pod is deleted (its containers are gone): kubelet stops counting it as active.
    /// Its allocations stay in the device manager (and the checkpoint) until kubelet next
    /// forgets inactive pods.
    pub fn delete(&self, pod: &Pod) {
        self.shared.with(|st| st.active.remove(pod.uid()));
    }
}

/// `deviceRunContainerOptions` + `generateContainerConfig`: the allocation responses put
/// into a container's CRI config (the first setting of a path or key wins among the
/// responses; kubelet's own annotations win over the plugins').
pub fn apply(config: &mut cri::ContainerConfig, responses: &[api::ContainerAllocateResponse]) {
    let mut envs: Vec<cri::KeyValue> = Vec::new();
    let mut devices: Vec<cri::Device> = Vec::new();
    let mut mounts: Vec<cri::Mount> = Vec::new();
    let mut annotations: BTreeMap<String, String> = BTreeMap::new();
    let mut cdi: Vec<cri::CdiDevice> = Vec::new();
    for r in responses {
        let mut keys: Vec<&String> = r.envs.keys().collect();
        keys.sort();
        for k in keys {
            if !envs.iter().any(|e| &e.key == k) {
                envs.push(cri::KeyValue {
                    key: k.clone(),
                    value: r.envs[k].clone(),
                });
            }
        }
        for d in &r.devices {
            if !devices.iter().any(|x| x.container_path == d.container_path) {
                devices.push(cri::Device {
                    container_path: d.container_path.clone(),
                    host_path: d.host_path.clone(),
                    permissions: d.permissions.clone(),
                });
            }
        }
        for m in &r.mounts {
            if !mounts.iter().any(|x| x.container_path == m.container_path) {
                mounts.push(cri::Mount {
                    container_path: m.container_path.clone(),
                    host_path: m.host_path.clone(),
                    readonly: m.read_only,
                    selinux_relabel: false,
                    ..Default::default()
                });
            }
        }
        for (k, v) in &r.annotations {
            annotations.entry(k.clone()).or_insert_with(|| v.clone());
        }
        for c in &r.cdi_devices {
            if !cdi.iter().any(|x| x.name == c.name) {
                cdi.push(cri::CdiDevice {
                    name: c.name.clone(),
                });
            }
        }
    }
    // The device plugins' environment first, then the manifest's.
    envs.append(&mut config.envs);
    config.envs = envs;
    config.devices.extend(devices);
    mounts.append(&mut config.mounts);
    config.mounts = mounts;
    for (k, v) in annotations {
        config.annotations.entry(k).or_insert(v);
    }
    config.cdi_devices.extend(cdi);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocation_reaches_the_container_config_as_kubelet_puts_it() {
        let mut r1 = api::ContainerAllocateResponse::default();
        r1.envs.insert("B".into(), "1".into());
        r1.envs.insert("A".into(), "1".into());
        r1.devices.push(api::DeviceSpec {
            container_path: "/dev/nvidia0".into(),
            host_path: "/host/dev/nvidia0".into(),
            permissions: "rw".into(),
        });
        r1.mounts.push(api::Mount {
            container_path: "/usr/lib/x".into(),
            host_path: "/host/x".into(),
            read_only: true,
        });
        r1.annotations
            .insert("gpuhook.io/allocation".into(), "a".into());
        r1.annotations
            .insert("io.kubernetes.container.restartCount".into(), "9".into());
        r1.cdi_devices.push(api::CdiDevice {
            name: "nvidia.com/gpu=0".into(),
        });
        let mut r2 = r1.clone();
        r2.devices[0].host_path = "/other".into();
        r2.envs.insert("A".into(), "2".into());
        r2.devices.push(api::DeviceSpec {
            container_path: "/dev/nvidiactl".into(),
            host_path: "/host/dev/nvidiactl".into(),
            permissions: "rw".into(),
        });
        let spec = crate::cri::pod::PodSpec::new("p");
        let mut c = spec.container_config("c", "img", &["sh"]);
        c.envs.push(cri::KeyValue {
            key: "MINE".into(),
            value: "x".into(),
        });
        apply(&mut c, &[r1, r2]);
        let envs: Vec<(&str, &str)> = c
            .envs
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(envs, [("A", "1"), ("B", "1"), ("MINE", "x")]);
        let devs: Vec<(&str, &str)> = c
            .devices
            .iter()
            .map(|d| (d.container_path.as_str(), d.host_path.as_str()))
            .collect();
        assert_eq!(
            devs,
            [
                ("/dev/nvidia0", "/host/dev/nvidia0"),
                ("/dev/nvidiactl", "/host/dev/nvidiactl")
            ]
        );
        assert!(c.mounts[0].readonly && !c.mounts[0].selinux_relabel);
        assert_eq!(c.annotations["gpuhook.io/allocation"], "a");
        // kubelet's own annotation wins.
        assert_eq!(c.annotations["io.kubernetes.container.restartCount"], "0");
        assert_eq!(c.cdi_devices.len(), 1);
        assert_eq!(c.cdi_devices[0].name, "nvidia.com/gpu=0");
    }
}

//! kubelet's device manager checkpoint, `<plugin dir>/kubelet_internal_checkpoint`, written
//! and read as kubelet 1.20 and later do (`pkg/kubelet/cm/devicemanager/checkpoint`):
//!
//! ```text
//! {"Data":{"PodDeviceEntries":[{"PodUID":…,"ContainerName":…,"ResourceName":…,
//!   "DeviceIDs":{"<NUMA node, -1 for none>":[ids]},"AllocResp":"<base64 of the
//!   ContainerAllocateResponse>"}],"RegisteredDevices":{"<resource>":[healthy ids]}},
//!  "Checksum":N}
//! ```
//!
//! `PodDeviceEntries` is `null` when no pod holds a device (Go marshals the nil slice kubelet
//! builds so). `Checksum` is kubelet's `checksum.New(data)`: FNV-1a (32 bits) of the data as
//! go-spew prints it with `%#v` (types in parentheses, sorted map keys, slice and map elements
//! without their types). kubelet verifies it when it reads the file back at its start and
//! ignores a file that does not match (it logs and starts empty); so does [`Checkpoint::read`].
//! The unit tests pin the checksum against two files real kubelets wrote.

use base64::Engine;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The checkpoint's file name in the plugin directory.
pub const FILE: &str = "kubelet_internal_checkpoint";

/// NUMA node → device IDs (`checkpoint.DevicesPerNUMA`); `-1` for devices without topology.
pub type DevicesPerNuma = BTreeMap<i64, Vec<String>>;

/// One container's allocation of one resource (`checkpoint.PodDevicesEntry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub pod_uid: String,
    pub container: String,
    pub resource: String,
    pub device_ids: DevicesPerNuma,
    /// The plugin's `ContainerAllocateResponse`, protobuf-encoded.
    pub alloc_resp: Vec<u8>,
}

/// What the file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// In kubelet's order (it walks Go maps: any order; the checksum follows the file's).
    pub entries: Vec<Entry>,
    /// Resource → its healthy device IDs when the file was written.
    pub registered: BTreeMap<String, Vec<String>>,
}

/// 32-bit FNV-1a, as Go's `hash/fnv.New32a`.
fn fnv32a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// `[a b c]`: a slice as go-spew prints it inside a value whose type it already printed.
fn spew_list<T: std::fmt::Display>(items: &[T]) -> String {
    let v: Vec<String> = items.iter().map(ToString::to_string).collect();
    format!("[{}]", v.join(" "))
}

impl Checkpoint {
    /// The data as go-spew prints `checkpoint.checkpointData` with `%#v`, the config of
    /// kubelet's `hashutil.DeepHashObject` (`SortKeys`, `SpewKeys`, `DisableMethods`).
    pub fn spew(&self) -> String {
        let entries = if self.entries.is_empty() {
            "<nil>".to_string()
        } else {
            let e: Vec<String> = self
                .entries
                .iter()
                .map(|e| {
                    let numa: Vec<String> = e
                        .device_ids
                        .iter()
                        .map(|(n, ids)| format!("{n}:{}", spew_list(ids)))
                        .collect();
                    format!(
                        "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} DeviceIDs:(checkpoint.DevicesPerNUMA)map[{}] AllocResp:([]uint8){}}}",
                        e.pod_uid,
                        e.container,
                        e.resource,
                        numa.join(" "),
                        spew_list(&e.alloc_resp)
                    )
                })
                .collect();
            format!("[{}]", e.join(" "))
        };
        let reg: Vec<String> = self
            .registered
            .iter()
            .map(|(r, ids)| format!("{r}:{}", spew_list(ids)))
            .collect();
        format!(
            "(checkpoint.checkpointData){{PodDeviceEntries:([]checkpoint.PodDevicesEntry){entries} RegisteredDevices:(map[string][]string)map[{}]}}",
            reg.join(" ")
        )
    }

    /// kubelet's checksum of this data.
    pub fn checksum(&self) -> u64 {
        u64::from(fnv32a(self.spew().as_bytes()))
    }

    /// The file's JSON, as kubelet's `json.Marshal` writes it.
    pub fn to_json(&self) -> String {
        let entries = if self.entries.is_empty() {
            "null".to_string()
        } else {
            // Go writes a struct's fields in their order (serde_json's map sorts them).
            let e: Vec<String> = self
                    .entries
                    .iter()
                    .map(|e| {
                        let ids: Map<String, Value> = e
                            .device_ids
                            .iter()
                            .map(|(n, v)| (n.to_string(), json!(v)))
                            .collect();
                        let s = |v: &str| serde_json::to_string(v).expect("json");
                        format!(
                            "{{\"PodUID\":{},\"ContainerName\":{},\"ResourceName\":{},\"DeviceIDs\":{},\"AllocResp\":{}}}",
                            s(&e.pod_uid),
                            s(&e.container),
                            s(&e.resource),
                            serde_json::to_string(&ids).expect("json"),
                            s(&base64::engine::general_purpose::STANDARD.encode(&e.alloc_resp))
                        )
                    })
                    .collect();
            format!("[{}]", e.join(","))
        };
        // Go's encoder escapes <, > and & in strings; IDs and names never hold them.
        format!(
            "{{\"Data\":{{\"PodDeviceEntries\":{entries},\"RegisteredDevices\":{}}},\"Checksum\":{}}}",
            serde_json::to_string(&self.registered).expect("json"),
            self.checksum()
        )
    }

    /// Parses a checkpoint file's text and verifies its checksum, as kubelet does at start.
    pub fn parse(text: &str) -> Result<Checkpoint, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let data = &v["Data"];
        let mut cp = Checkpoint::default();
        if let Some(list) = data["PodDeviceEntries"].as_array() {
            for e in list {
                let s = |k: &str| {
                    e[k].as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("an entry without {k}"))
                };
                let mut ids = DevicesPerNuma::new();
                for (n, list) in e["DeviceIDs"].as_object().into_iter().flatten() {
                    let n: i64 = n.parse().map_err(|_| format!("NUMA node {n:?}"))?;
                    let list = list
                        .as_array()
                        .ok_or("DeviceIDs of a node is no list")?
                        .iter()
                        .map(|d| d.as_str().map(str::to_string).ok_or("a device ID"))
                        .collect::<Result<Vec<_>, _>>()?;
                    ids.insert(n, list);
                }
                let resp = base64::engine::general_purpose::STANDARD
                    .decode(e["AllocResp"].as_str().unwrap_or_default())
                    .map_err(|e| format!("AllocResp: {e}"))?;
                cp.entries.push(Entry {
                    pod_uid: s("PodUID")?,
                    container: s("ContainerName")?,
                    resource: s("ResourceName")?,
                    device_ids: ids,
                    alloc_resp: resp,
                });
            }
        }
        for (r, list) in data["RegisteredDevices"].as_object().into_iter().flatten() {
            let ids = list
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| d.as_str().map(str::to_string))
                .collect();
            cp.registered.insert(r.clone(), ids);
        }
        let want = v["Checksum"].as_u64().ok_or("no Checksum")?;
        if want != cp.checksum() {
            return Err(format!(
                "checkpoint is corrupted: checksum {want}, the data's {}",
                cp.checksum()
            ));
        }
        Ok(cp)
    }

    /// Reads `dir/kubelet_internal_checkpoint`: `Ok(None)` when there is none.
    pub fn read(dir: &Path) -> Result<Option<Checkpoint>, String> {
        let p = dir.join(FILE);
        match std::fs::read_to_string(&p) {
            Ok(t) => Checkpoint::parse(&t)
                .map(Some)
                .map_err(|e| format!("{}: {e}", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", p.display())),
        }
    }

    /// Writes `dir/kubelet_internal_checkpoint` as kubelet's checkpoint manager does: a
    /// temporary file in the same directory, synced, renamed over the old one.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        use std::io::Write;
        let p = dir.join(FILE);
        let tmp = dir.join(format!(".{FILE}.tmp{}", std::process::id()));
        let mut f = std::fs::File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        f.write_all(self.to_json().as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &p).map_err(|e| format!("{}: {e}", p.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written by a kubelet with one GPU registered and no pod (a vendor's guide shows it).
    const NO_POD: &str = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},"Checksum":3952659280}"#;
    /// Written by a kubelet (kind, NVIDIA's plugin on a Jetson) with one pod holding `tegra`.
    const ONE_POD: &str = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},"Checksum":3660592824}"#;

    #[test]
    fn real_kubelet_files_parse_verify_and_are_written_back_byte_for_byte() {
        for text in [NO_POD, ONE_POD] {
            let cp = Checkpoint::parse(text).unwrap();
            assert_eq!(cp.to_json(), text);
        }
        let cp = Checkpoint::parse(ONE_POD).unwrap();
        assert_eq!(cp.entries[0].device_ids[&-1], vec!["tegra".to_string()]);
        // The AllocResp is the plugin's protobuf: envs {NVIDIA_VISIBLE_DEVICES: tegra}.
        assert!(cp.entries[0]
            .alloc_resp
            .windows(22)
            .any(|w| w == b"NVIDIA_VISIBLE_DEVICES"));
    }

    #[test]
    fn a_changed_file_fails_its_checksum() {
        let bad = ONE_POD.replace("\"check\"", "\"other\"");
        let e = Checkpoint::parse(&bad).unwrap_err();
        assert!(e.contains("checksum 3660592824"), "{e}");
        let mut cp = Checkpoint::parse(ONE_POD).unwrap();
        cp.entries[0].container = "other".into();
        assert!(Checkpoint::parse(&cp.to_json()).is_ok());
    }

    #[test]
    fn numa_nodes_sort_as_numbers() {
        let cp = Checkpoint {
            entries: vec![Entry {
                pod_uid: "u".into(),
                container: "c".into(),
                resource: "gpuhook.io/gpu".into(),
                device_ids: [(1, vec!["b".to_string()]), (-1, vec!["a".to_string()])]
                    .into_iter()
                    .collect(),
                alloc_resp: vec![1, 2],
            }],
            registered: [("gpuhook.io/gpu".to_string(), vec![])]
                .into_iter()
                .collect(),
        };
        assert!(
            cp.spew()
                .contains("map[-1:[a] 1:[b]] AllocResp:([]uint8)[1 2]}]"),
            "{}",
            cp.spew()
        );
        assert!(cp.spew().ends_with("map[gpuhook.io/gpu:[]]}"));
        assert_eq!(Checkpoint::parse(&cp.to_json()).unwrap(), cp);
    }
}

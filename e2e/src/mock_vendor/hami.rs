//! HAMi's side of a vendor plugin: the register and handshake annotations
//! it writes on the Node, and the variables it gives a container for the
//! devices of `hami.io/<x>-devices-to-allocate`.

use std::collections::BTreeMap;

use k8s_openapi::jiff::{Timestamp, tz::TimeZone};
use serde_json::json;

use super::{
    amd::AllocateState,
    enflame,
    plugin::MockPlugin,
    protocol::{Handed, cu_list},
    types::Vendor,
};

/// `Reported_<time>`, a plugin's answer to the scheduler's handshake.
fn reported(time: &k8s_openapi::jiff::Zoned) -> String {
    format!("Reported_{}", time.strftime("%Y-%m-%d %H:%M:%S"))
}

/// `<uuid>:<MiB>[:<cores>]` per device, comma-separated.
fn vdev(devices: &[Handed], cores: bool) -> String {
    let each: Vec<String> = devices
        .iter()
        .map(|d| {
            if cores {
                format!("{}:{}:{}", d.uuid, d.memory_mib, d.cores)
            } else {
                format!("{}:{}", d.uuid, d.memory_mib)
            }
        })
        .collect();
    each.join(",")
}

/// The container's sGPUs as MetaX's plugin reads them: the list in
/// `metax-tech.com/gpu-devices-allocated` whose UUIDs are `devices`', as
/// `<uuid>:<vRam>:<compute>`.
fn metax_sgpus(
    devices: &[Handed],
    annotations: &BTreeMap<String, String>,
) -> Result<String, String> {
    const KEY: &str = "metax-tech.com/gpu-devices-allocated";
    let lists: Vec<Vec<serde_json::Value>> = annotations
        .get(KEY)
        .map(|v| serde_json::from_str(v))
        .transpose()
        .map_err(|e| format!("annotation {KEY} invalid: {e}"))?
        .ok_or_else(|| format!("annotation {KEY} not set"))?;
    let wanted: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
    let list = lists
        .iter()
        .find(|list| {
            list.iter()
                .map(|d| d["uuid"].as_str().unwrap_or_default())
                .eq(wanted.iter().copied())
        })
        .ok_or_else(|| format!("annotation {KEY} lists no container with sGPUs {wanted:?}"))?;
    let each: Vec<String> = list
        .iter()
        .map(|d| {
            format!(
                "{}:{}:{}",
                d["uuid"].as_str().unwrap_or_default(),
                d["vRam"].as_u64().unwrap_or(0),
                d["compute"].as_u64().unwrap_or(0)
            )
        })
        .collect();
    Ok(each.join(","))
}

impl MockPlugin {
    /// The Node annotations one register pass writes at `now`.
    pub fn register_annotations(&self, now: Timestamp) -> BTreeMap<String, String> {
        let time = now.to_zoned(TimeZone::UTC);
        let mut out = BTreeMap::new();
        match &self.vendor {
            Vendor::Hygon => {
                out.insert("hami.io/node-dcu-register".into(), self.csv("DCU-Z100"));
                out.insert("hami.io/node-handshake-dcu".into(), reported(&time));
            }
            Vendor::Iluvatar { chip } => {
                out.insert(format!("hami.io/node-{chip}-register"), self.csv(chip));
                out.insert(format!("hami.io/node-handshake-{chip}"), reported(&time));
            }
            Vendor::Ascend { chip } => {
                let devices: Vec<_> = self
                    .devices
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        let mut device = json!({"index": i, "id": d.id, "count": d.count,
                            "devmem": d.memory_mib, "devcore": d.cores, "type": chip, "health": true});
                        if let Some(network) = d.network_id {
                            device["custominfo"] = json!({"NetworkID": network});
                        }
                        device
                    })
                    .collect();
                out.insert(
                    format!("hami.io/node-register-{chip}"),
                    serde_json::Value::from(devices).to_string(),
                );
                out.insert(
                    format!("hami.io/node-handshake-{chip}"),
                    format!("Reported_{}", time.strftime("%Y.%m.%d %H:%M:%S")),
                );
                out.insert("hami-vnpu-core".into(), "false".into());
            }
            Vendor::Amd { product } => {
                out.insert(
                    "hami.io/node-amd-register".into(),
                    self.device_info(product, "amd"),
                );
            }
            Vendor::Kunlunxin => {
                out.insert(
                    "hami.io/node-register-xpu".into(),
                    self.device_info("XPU", "XPU"),
                );
                out.insert("hami.io/node-handshake-xpu".into(), reported(&time));
            }
            Vendor::Metax => {
                // MetaX's `MetaxSDeviceInfo`, one per GPU.
                let devices: Vec<_> = self
                    .devices
                    .iter()
                    .map(|d| {
                        json!({"uuid": d.id, "totalDevCount": d.count, "totalCompute": d.cores,
                            "totalVRam": d.memory_mib, "numa": 0, "healthy": true,
                            "linkZone": 0, "qosPolicy": "best-effort"})
                    })
                    .collect();
                out.insert(
                    "metax-tech.com/node-gpu-devices".into(),
                    serde_json::Value::from(devices).to_string(),
                );
            }
            Vendor::Vastai => {
                out.insert("hami.io/node-va-register".into(), self.vastai_register());
                out.insert("hami.io/node-handshake-va".into(), reported(&time));
            }
            Vendor::Biren => {
                out.insert(
                    "hami.io/node-biren-register".into(),
                    self.device_info("Biren", "Biren"),
                );
                // The plugin's own stamp: `Reported_` and Go's layout.
                out.insert("hami.io/node-handshake-biren".into(), reported(&time));
            }
            // Report only through the Node's allocatable.
            Vendor::Cambricon
            | Vendor::EnflameGcu
            | Vendor::MetaxGpu
            | Vendor::KunlunxinXpu
            | Vendor::Mthreads
            | Vendor::Neuron { .. } => {}
            Vendor::EnflameDrs => {
                let (key, value) = enflame::capacity_annotation(&self.devices);
                out.insert(key, value);
            }
        }
        out
    }

    /// HAMi's CSV register form, one `id,count,devmem,devcore,type,numa,health,index,mode:`
    /// per device.
    fn csv(&self, device_type: &str) -> String {
        self.devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                format!(
                    "{},{},{},{},{device_type},0,true,{i},hami-core:",
                    d.id, d.count, d.memory_mib, d.cores
                )
            })
            .collect()
    }

    /// Vastai's register: `DeviceInfo` JSON, each die with
    /// `custominfo.DeviceStrategy: die` and its card as `AIC` when the
    /// devices name cards (HAMi's die mode), else whole cards.
    fn vastai_register(&self) -> String {
        let devices: Vec<_> = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut device = json!({"id": d.id, "index": i, "count": d.count,
                    "devmem": d.memory_mib, "type": "Vastai", "health": true,
                    "devicepairscore": {}});
                if let Some(card) = d.network_id {
                    device["custominfo"] =
                        json!({"DeviceStrategy": "die", "AIC": card.to_string()});
                }
                device
            })
            .collect();
        serde_json::Value::from(devices).to_string()
    }

    /// HAMi's `DeviceInfo` JSON, as `marshalNodeDevices` writes it.
    fn device_info(&self, device_type: &str, vendor: &str) -> String {
        let devices: Vec<_> = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                json!({"id": d.id, "index": i, "count": d.count, "devmem": d.memory_mib,
                    "devcore": d.cores, "type": device_type, "numa": 0, "mode": "",
                    "health": true, "devicevendor": vendor})
            })
            .collect();
        serde_json::Value::from(devices).to_string()
    }

    /// The variables a container gets for `devices` of pod `annotations`;
    /// `state` carries what one Allocate call decides across containers
    /// (AMD's compute units).
    pub fn env(
        &self,
        devices: &[Handed],
        annotations: &BTreeMap<String, String>,
        state: &mut AllocateState,
    ) -> Result<BTreeMap<String, String>, String> {
        // A plugin read through the Node's capacity knows its devices by
        // HAMi's names, `<node>-<infix>-<index>`.
        let by_capacity = matches!(self.vendor, Vendor::EnflameGcu | Vendor::MetaxGpu);
        let index = |uuid: &str| {
            let position = if by_capacity {
                uuid.strip_prefix(&format!("{}-", self.node))
                    .and_then(|rest| rest.rsplit_once('-'))
                    .and_then(|(_, i)| i.parse::<usize>().ok())
                    .filter(|i| *i < self.devices.len())
            } else {
                self.devices.iter().position(|d| d.id == uuid)
            };
            position.ok_or_else(|| format!("unknown uuid: {uuid}"))
        };
        let indexes = devices
            .iter()
            .map(|d| index(&d.uuid).map(|i| i.to_string()))
            .collect::<Result<Vec<_>, _>>()?
            .join(",");
        let mut env = BTreeMap::new();
        match &self.vendor {
            Vendor::Hygon => {
                env.insert("HIP_VISIBLE_DEVICES".into(), indexes);
                env.insert("TESSERA_MOCK_DCU_VDEV".into(), vdev(devices, true));
            }
            Vendor::Iluvatar { .. } => {
                env.insert("TESSERA_MOCK_IX_VDEV".into(), vdev(devices, true));
            }
            Vendor::Kunlunxin => {
                env.insert("XPU_VISIBLE_DEVICES".into(), indexes);
                env.insert("TESSERA_MOCK_XPU_VDEV".into(), vdev(devices, false));
            }
            Vendor::Metax => {
                env.insert(
                    "TESSERA_MOCK_SGPU".into(),
                    metax_sgpus(devices, annotations)?,
                );
            }
            Vendor::Ascend { chip } => {
                env.insert("ASCEND_VISIBLE_DEVICES".into(), indexes);
                let key = format!("huawei.com/{chip}");
                let info: Vec<serde_json::Value> = annotations
                    .get(&key)
                    .map(|v| serde_json::from_str(v))
                    .transpose()
                    .map_err(|e| format!("annotation {key} invalid: {e}"))?
                    .ok_or_else(|| format!("annotation {key} not set"))?;
                let template = info
                    .iter()
                    .filter(|i| devices.iter().any(|d| i["UUID"] == d.uuid.as_str()))
                    .find_map(|i| i["temp"].as_str().filter(|t| !t.is_empty()));
                if let Some(template) = template {
                    env.insert("ASCEND_VNPU_SPECS".into(), template.into());
                }
            }
            Vendor::EnflameGcu => {
                env.insert("ENFLAME_VISIBLE_DEVICES".into(), indexes);
            }
            Vendor::MetaxGpu => {
                env.insert("TESSERA_MOCK_METAX_GPUS".into(), indexes);
            }
            Vendor::Cambricon
            | Vendor::EnflameDrs
            | Vendor::KunlunxinXpu
            | Vendor::Mthreads
            | Vendor::Neuron { .. } => {
                return Err(format!(
                    "{}'s plugin reads no devices-to-allocate list",
                    self.vendor.family()
                ));
            }
            Vendor::Biren => {
                // biren-device-plugin's `BR_PHY_CARDS`: the cards' ids.
                let ids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
                env.insert("BR_PHY_CARDS".into(), ids.join(","));
            }
            Vendor::Vastai => {
                // Vastai's plugin is not public: the mock hands the ids.
                let ids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
                env.insert("TESSERA_MOCK_VA_DEVICES".into(), ids.join(","));
            }
            Vendor::Amd { .. } => {
                let ids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
                env.insert("ROCR_VISIBLE_DEVICES".into(), ids.join(","));
                let mut masks = Vec::new();
                for (i, d) in devices.iter().enumerate() {
                    let total = self.devices[index(&d.uuid)?].cores;
                    let cus = state.take_cus(&d.uuid, total, d.cores)?;
                    masks.push(format!("{i}:{}", cu_list(&cus)));
                }
                env.insert("HSA_CU_MASK".into(), masks.join(";"));
                if let Some(first) = devices.first() {
                    env.insert(
                        "HIP_DEVICE_MEMORY_LIMIT".into(),
                        format!("{}m", first.memory_mib),
                    );
                }
            }
        }
        Ok(env)
    }
}

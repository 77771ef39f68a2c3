//! The Node annotations in which HAMi's vendor device plugins register their
//! devices, decoded as HAMi decodes them (`pkg/device/devices.go`:
//! `DecodeNodeDevices` for the CSV form, `UnMarshalNodeDevices` for JSON).
//!
//! A Node's annotations are written by the plugin, a privileged component,
//! but anyone who may patch Nodes can write them too: every size and count
//! is bounded, and anything malformed is an error naming the rule, never a
//! panic or a guessed device.

use std::collections::BTreeMap;

use serde::Deserialize;
use tessera_api::{names::vastai, v1alpha1::QosPolicy};

/// Devices one annotation may list (a GpuNode holds at most 64).
pub const MAX_DEVICES: usize = 64;
/// Longest annotation value decoded (Kubernetes allows 256 KiB for all
/// annotations of an object together).
pub const MAX_LEN: usize = 64 * 1024;
/// Longest device id or type accepted.
const MAX_ID: usize = 128;

/// One device as its plugin registered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The device's id (its UUID).
    pub id: String,
    /// Its index on the node.
    pub index: u32,
    /// How many containers may share it (HAMi's `count`).
    pub count: u32,
    /// Device memory in MiB.
    pub memory_mib: u64,
    /// Compute as the vendor counts it (percent, or AI cores for Ascend).
    pub cores: u32,
    /// The device type (`DCU`, `Ascend910B4`).
    pub device_type: String,
    /// NUMA node.
    pub numa: Option<u32>,
    /// Whether the plugin reports it healthy.
    pub healthy: bool,
    /// Ascend's `custominfo.NetworkID`.
    pub network_id: Option<u32>,
    /// The card a die sits on, where the list is registered die by die
    /// (Vastai's `custominfo.AIC`; the view numbers the cards as networks
    /// for the sources that group dies so).
    pub card: Option<String>,
    /// The QoS policy the plugin runs the device under (MetaX sGPUs).
    pub qos_policy: Option<QosPolicy>,
}

/// Decodes the CSV form: `id,count,devmem,devcore,type,numa,health[,index,mode]:`
/// per device (Hygon's `hami.io/node-dcu-register`).
pub fn decode_csv(value: &str) -> Result<Vec<Registered>, String> {
    check_len(value)?;
    if !value.contains(':') {
        return Err(
            "has no ':' after the device list (HAMi's CSV form ends every device with ':')".into(),
        );
    }
    let mut devices = Vec::new();
    for (n, entry) in value.split(':').filter(|e| !e.is_empty()).enumerate() {
        let fields: Vec<&str> = entry.split(',').collect();
        if fields.len() != 7 && fields.len() != 9 {
            return Err(format!(
                "device {n} has {} comma-separated fields; HAMi's form has 7 (id,count,devmem,devcore,type,numa,health) or 9 (…,index,mode)",
                fields.len()
            ));
        }
        let number = |i: usize, what: &str| -> Result<u64, String> {
            fields[i].trim().parse::<u64>().map_err(|_| {
                format!(
                    "device {n}: {what} {:?} is not a non-negative whole number",
                    fields[i]
                )
            })
        };
        let health = match fields[6].trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "t" => true,
            "false" | "0" | "f" => false,
            other => return Err(format!("device {n}: health {other:?} is not true or false")),
        };
        let numa = fields[5]
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("device {n}: numa {:?} is not a whole number", fields[5]))?;
        let index = if fields.len() == 9 {
            number(7, "index")?
        } else {
            n as u64
        };
        devices.push(Registered {
            id: text(fields[0], n, "id")?,
            index: bounded(index, n, "index")?,
            count: bounded(number(1, "count")?, n, "count")?,
            memory_mib: number(2, "devmem")?,
            cores: bounded(number(3, "devcore")?, n, "devcore")?,
            device_type: type_text(fields[4], n)?,
            numa: u32::try_from(numa).ok(),
            healthy: health,
            network_id: None,
            card: None,
            qos_policy: None,
        });
        if devices.len() > MAX_DEVICES {
            return Err(format!("lists more than {MAX_DEVICES} devices"));
        }
    }
    if devices.is_empty() {
        return Err("lists no device".into());
    }
    Ok(devices)
}

/// One entry of the JSON form, with HAMi's field names.
#[derive(Deserialize)]
struct JsonDevice {
    #[serde(default)]
    id: String,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    count: i64,
    #[serde(default)]
    devmem: i64,
    #[serde(default)]
    devcore: i64,
    #[serde(default, rename = "type")]
    device_type: String,
    #[serde(default)]
    numa: Option<i64>,
    #[serde(default)]
    health: bool,
    #[serde(default)]
    custominfo: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Decodes the JSON form: a list of HAMi `DeviceInfo` objects (Ascend's
/// `hami.io/node-register-<chip>`).
///
/// A list registered die by die (the first device's
/// `custominfo.DeviceStrategy` is `die`, as HAMi's `isDieMode` reads it)
/// names each die's card (`custominfo.AIC`, 1 to 128 bytes).
pub fn decode_json(value: &str) -> Result<Vec<Registered>, String> {
    let devices = json_list::<JsonDevice>(value, "devices")?;
    let dies = devices.first().is_some_and(|d| {
        custom(d, vastai::STRATEGY_KEY).and_then(|v| v.as_str()) == Some(vastai::DIE_STRATEGY)
    });
    devices
        .into_iter()
        .enumerate()
        .map(|(n, d)| {
            let network_id = match custom(&d, "NetworkID") {
                None => None,
                Some(v) => Some(
                    v.as_f64()
                        .filter(|f| f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(f))
                        .map(|f| f as u32)
                        .ok_or_else(|| {
                            format!("device {n}: custominfo.NetworkID {v} is not a whole number")
                        })?,
                ),
            };
            let card = match custom(&d, vastai::CARD_KEY).filter(|_| dies) {
                None => None,
                Some(v) => Some(
                    v.as_str()
                        .filter(|c| !c.is_empty() && c.len() <= MAX_ID)
                        .map(str::to_owned)
                        .ok_or_else(|| {
                            format!("device {n}: custominfo.AIC {v} is not a card id (a string of 1 to {MAX_ID} bytes)")
                        })?,
                ),
            };
            Ok(Registered {
                id: text(&d.id, n, "id")?,
                index: bounded(d.index.unwrap_or(n as u64), n, "index")?,
                count: bounded(non_negative(d.count, n, "count")?, n, "count")?,
                memory_mib: non_negative(d.devmem, n, "devmem")?,
                cores: bounded(non_negative(d.devcore, n, "devcore")?, n, "devcore")?,
                device_type: type_text(&d.device_type, n)?,
                numa: d.numa.and_then(|v| u32::try_from(v).ok()),
                healthy: d.health,
                network_id,
                card,
                qos_policy: None,
            })
        })
        .collect()
}

/// The register entry's `custominfo.<key>`.
fn custom<'a>(device: &'a JsonDevice, key: &str) -> Option<&'a serde_json::Value> {
    device.custominfo.as_ref().and_then(|c| c.get(key))
}

/// One sGPU of MetaX's `metax-tech.com/node-gpu-devices` (HAMi
/// `MetaxSDeviceInfo`; Go's `omitempty`: absent fields are zero).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaxDevice {
    #[serde(default)]
    uuid: String,
    #[serde(default)]
    total_dev_count: i64,
    #[serde(default)]
    total_compute: i64,
    #[serde(default)]
    total_v_ram: i64,
    #[serde(default)]
    numa: i64,
    #[serde(default)]
    healthy: bool,
    #[serde(default)]
    link_zone: i64,
    #[serde(default)]
    qos_policy: String,
}

/// Decodes MetaX's sGPU list (`metax-tech.com/node-gpu-devices`, HAMi
/// `getMetaxSDevices`): `totalDevCount` sGPUs per GPU, `totalVRam` MiB,
/// `totalCompute` percent; a `linkZone` above 0 is the GPU's MetaLink
/// (kept as its network), 0 none. Indexes are list positions, as HAMi's.
pub fn decode_metax(value: &str, device_type: &str) -> Result<Vec<Registered>, String> {
    json_list::<MetaxDevice>(value, "sGPUs")?
        .into_iter()
        .enumerate()
        .map(|(n, d)| {
            let zone = bounded(non_negative(d.link_zone, n, "linkZone")?, n, "linkZone")?;
            Ok(Registered {
                id: text(&d.uuid, n, "uuid")?,
                index: bounded(n as u64, n, "index")?,
                count: bounded(
                    non_negative(d.total_dev_count, n, "totalDevCount")?,
                    n,
                    "totalDevCount",
                )?,
                memory_mib: non_negative(d.total_v_ram, n, "totalVRam")?,
                cores: bounded(
                    non_negative(d.total_compute, n, "totalCompute")?,
                    n,
                    "totalCompute",
                )?,
                device_type: device_type.to_owned(),
                numa: u32::try_from(d.numa).ok(),
                healthy: d.healthy,
                network_id: (zone > 0).then_some(zone),
                card: None,
                qos_policy: match d.qos_policy.as_str() {
                    "" => None,
                    named => Some(QosPolicy::parse(named).ok_or_else(|| {
                        format!(
                            "sGPU {n}: qosPolicy {named:?} is none of best-effort, fixed-share, burst-share"
                        )
                    })?),
                },
            })
        })
        .collect()
}

/// A JSON list of 1 to [`MAX_DEVICES`] entries of `what`, from a value of at
/// most [`MAX_LEN`] bytes.
/// Enflame's `enflame.com/gcu-drs-capacity` (HAMi `drsCapacitySpec`).
#[derive(Deserialize)]
struct DrsCapacity {
    #[serde(default)]
    devices: Vec<DrsDevice>,
    #[serde(default)]
    profiles: std::collections::BTreeMap<String, String>,
}

/// One device of [`DrsCapacity`]: strings for index and minor, a number or
/// a string for capacity, as HAMi accepts them.
#[derive(Deserialize)]
struct DrsDevice {
    #[serde(default)]
    index: String,
    #[serde(default)]
    minor: String,
    #[serde(default)]
    capacity: serde_json::Value,
}

/// A GCU the DRS plugin reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrsGcu {
    /// Its index.
    pub index: u32,
    /// Its minor number (the index when the plugin gives none).
    pub minor: String,
    /// How many DRS slices it has.
    pub capacity: u32,
}

/// What the DRS plugin reports on a Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrsNode {
    /// The GCUs.
    pub gcus: Vec<DrsGcu>,
    /// Profile names and the plugin's ids, sorted by name.
    pub profiles: Vec<(String, String)>,
    /// Each GCU's memory in GB: the largest profile's (its largest slice
    /// count when no profile names memory), HAMi's `maxMemGB`.
    pub memory_gb: u32,
}

/// Most DRS profiles one Node may list.
const MAX_PROFILES: usize = 32;
/// Most DRS slices one GCU may report.
const MAX_DRS_SLICES: u64 = 64;

/// Decodes `enflame.com/gcu-drs-capacity` (HAMi's enflame `GetNodeDevices`):
/// profiles named `<slices>g.<GB>gb` with the plugin's ids, and each GCU's
/// index, minor and capacity in slices.
pub fn decode_enflame_drs(value: &str) -> Result<DrsNode, String> {
    check_len(value)?;
    let spec: DrsCapacity = serde_json::from_str(value)
        .map_err(|e| format!("is not HAMi's DRS capacity object ({{devices, profiles}}): {e}"))?;
    if spec.profiles.len() > MAX_PROFILES {
        return Err(format!(
            "lists {} profiles, more than {MAX_PROFILES}",
            spec.profiles.len()
        ));
    }
    let mut profiles = Vec::new();
    let (mut largest_slices, mut largest_gb) = (0, 0);
    for (n, (name, id)) in spec.profiles.into_iter().enumerate() {
        let name = text(&name, n, "profile name")?;
        let id = if id.trim().is_empty() {
            String::new()
        } else {
            text(&id, n, "profile id")?
        };
        if let Some((slices, gb)) = tessera_scheduling::request::drs_profile(&name) {
            largest_slices = largest_slices.max(slices);
            largest_gb = largest_gb.max(gb);
        }
        profiles.push((name, id));
    }
    if largest_slices == 0 {
        return Err("names no profile HAMi can read (`<slices>g.<GB>gb`)".into());
    }
    if spec.devices.is_empty() {
        return Err("lists no device".into());
    }
    if spec.devices.len() > MAX_DEVICES {
        return Err(format!(
            "lists {} devices, more than {MAX_DEVICES}",
            spec.devices.len()
        ));
    }
    let gcus = spec
        .devices
        .into_iter()
        .enumerate()
        .map(|(n, d)| {
            let index = d
                .index
                .trim()
                .parse::<u32>()
                .unwrap_or(u32::try_from(n).unwrap_or(u32::MAX));
            let capacity = match &d.capacity {
                serde_json::Value::Number(c) => c.as_u64(),
                serde_json::Value::String(c) => c.trim().parse::<u64>().ok(),
                _ => None,
            }
            .filter(|c| (1..=MAX_DRS_SLICES).contains(c))
            .ok_or_else(|| {
                format!(
                    "device {n}: capacity {} is not 1 to {MAX_DRS_SLICES} slices",
                    d.capacity
                )
            })?;
            let minor = if d.minor.trim().is_empty() {
                index.to_string()
            } else {
                text(&d.minor, n, "minor")?
            };
            Ok(DrsGcu {
                index,
                minor,
                capacity: u32::try_from(capacity).unwrap_or(u32::MAX),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(DrsNode {
        gcus,
        profiles,
        memory_gb: if largest_gb > 0 {
            largest_gb
        } else {
            largest_slices
        },
    })
}

/// Decodes one of MetaX's per-count topology maps
/// (`metax-tech.com/gpu.topology.losses` or `scores`, HAMi
/// `parseMetaxAnnos`): a JSON object from a device count (1 to
/// [`MAX_DEVICES`]) to a whole number.
pub fn decode_count_map(value: &str) -> Result<BTreeMap<u32, i64>, String> {
    check_len(value)?;
    let map: BTreeMap<String, i64> = serde_json::from_str(value)
        .map_err(|e| format!("is not a JSON object from device counts to numbers: {e}"))?;
    map.into_iter()
        .map(|(key, value)| {
            let count = key
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|c| (1..=MAX_DEVICES as u32).contains(c))
                .ok_or_else(|| {
                    format!("has the key {key:?}, which is no device count from 1 to {MAX_DEVICES}")
                })?;
            Ok((count, value))
        })
        .collect()
}

fn json_list<T: serde::de::DeserializeOwned>(value: &str, what: &str) -> Result<Vec<T>, String> {
    check_len(value)?;
    let list: Vec<T> =
        serde_json::from_str(value).map_err(|e| format!("is not a JSON list of {what}: {e}"))?;
    if list.is_empty() {
        return Err("lists no device".into());
    }
    if list.len() > MAX_DEVICES {
        return Err(format!(
            "lists {} devices, more than {MAX_DEVICES}",
            list.len()
        ));
    }
    Ok(list)
}

fn check_len(value: &str) -> Result<(), String> {
    if value.len() > MAX_LEN {
        return Err(format!("is {} bytes, more than {MAX_LEN}", value.len()));
    }
    Ok(())
}

/// An id or type: 1 to [`MAX_ID`] printable characters without the
/// separators of HAMi's pod encoding (`,` `:` `;`) or whitespace, which Bind
/// writes back into the pod for the plugin to split.
fn text(value: &str, n: usize, what: &str) -> Result<String, String> {
    let value = value.trim();
    if value.is_empty()
        || value.len() > MAX_ID
        || value.chars().any(|c| c.is_whitespace() || forbidden(c))
    {
        return Err(format!(
            "device {n}: {what} must be 1 to {MAX_ID} printable characters without ',', ':', ';' or spaces, got {value:?}"
        ));
    }
    Ok(value.to_owned())
}

/// A device type: like [`text`], but single spaces between words are kept
/// (AMD's `AMD Instinct MI300X VF`).
fn type_text(value: &str, n: usize) -> Result<String, String> {
    let value = value.trim();
    if value.is_empty()
        || value.len() > MAX_ID
        || value.contains("  ")
        || value
            .chars()
            .any(|c| (c.is_whitespace() && c != ' ') || forbidden(c))
    {
        return Err(format!(
            "device {n}: type must be 1 to {MAX_ID} printable characters without ',', ':', ';' or runs of spaces, got {value:?}"
        ));
    }
    Ok(value.to_owned())
}

/// Characters that would break HAMi's `id,type,mem,cores:` hand-off list.
fn forbidden(c: char) -> bool {
    c.is_control() || matches!(c, ',' | ':' | ';')
}

fn non_negative(value: i64, n: usize, what: &str) -> Result<u64, String> {
    u64::try_from(value).map_err(|_| format!("device {n}: {what} {value} is negative"))
}

fn bounded(value: u64, n: usize, what: &str) -> Result<u32, String> {
    u32::try_from(value).map_err(|_| format!("device {n}: {what} {value} is too large"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever a Node's annotation holds, decoding answers (never
        /// panics), and what it accepts is bounded and splittable.
        #[test]
        fn any_annotation_decodes_to_bounded_devices_or_an_error(
            value in "[ -~]{0,300}",
            form in 0..3u8,
        ) {
            let decoded = match form {
                0 => decode_csv(&value),
                1 => decode_json(&value),
                _ => decode_metax(&value, "Metax-SGPU"),
            };
            if let Ok(devices) = decoded {
                prop_assert!(!devices.is_empty() && devices.len() <= MAX_DEVICES);
                for d in devices {
                    prop_assert!(!d.id.is_empty() && d.id.len() <= 128);
                    prop_assert!(!d.id.contains([',', ':', ';', ' ']));
                }
            }
        }

        /// Well-formed CSV with arbitrary numbers decodes exactly or names the field.
        #[test]
        fn csv_numbers_are_taken_exactly_or_refused(
            count in any::<u64>(), mem in any::<u64>(), core in any::<u64>(),
        ) {
            let value = format!("DCU-0,{count},{mem},{core},DCU,0,true:");
            match decode_csv(&value) {
                Ok(d) => prop_assert_eq!(
                    (u64::from(d[0].count), d[0].memory_mib, u64::from(d[0].cores)),
                    (count, mem, core)
                ),
                Err(e) => prop_assert!(e.contains("too large"), "{}", e),
            }
        }
    }

    #[test]
    fn hamis_csv_form_decodes_with_and_without_index_and_mode() {
        // As HAMi's EncodeNodeDevices writes it, and the older 7-field form.
        let nine = decode_csv("DCU-0,4,16384,100,DCU-Z100,0,true,0,hami-core:DCU-1,4,16384,100,DCU-Z100,1,false,1,hami-core:").unwrap();
        assert_eq!(nine.len(), 2);
        assert_eq!(
            (
                nine[1].id.as_str(),
                nine[1].index,
                nine[1].count,
                nine[1].memory_mib,
                nine[1].cores,
                nine[1].numa,
                nine[1].healthy
            ),
            ("DCU-1", 1, 4, 16384, 100, Some(1), false)
        );
        let seven = decode_csv("a,10,1024,100,DCU,0,true:").unwrap();
        assert_eq!((seven[0].index, seven[0].device_type.as_str()), (0, "DCU"));
    }

    #[test]
    fn hamis_json_form_decodes_with_network_ids() {
        // mock-device-plugin's README sample, plus custominfo as the Ascend plugin writes it.
        let devices = decode_json(r#"[{"id":"MOCK-0","count":4,"devmem":32768,"devcore":20,"type":"Ascend910B4","health":true,"custominfo":{"NetworkID":3}},{"id":"MOCK-1","index":1,"count":4,"devmem":32768,"devcore":20,"type":"Ascend910B4","health":true}]"#).unwrap();
        assert_eq!(devices[0].network_id, Some(3));
        assert_eq!(devices[1].network_id, None);
        assert_eq!(devices[0].memory_mib, 32768);
    }

    #[test]
    fn vastai_dies_name_their_card_in_die_mode_only() {
        // HAMi's die mode (`isDieMode`: the first device says `die`): each
        // die names its card (`AIC`).
        let dies = decode_json(r#"[{"id":"d0","count":1,"devmem":16384,"type":"Vastai","health":true,"custominfo":{"DeviceStrategy":"die","AIC":"7"}},{"id":"d1","count":1,"type":"Vastai","health":true,"custominfo":{"DeviceStrategy":"die","AIC":"3"}},{"id":"d2","count":1,"type":"Vastai","health":true,"custominfo":{"DeviceStrategy":"die","AIC":"7"}}]"#).unwrap();
        let cards: Vec<_> = dies.iter().map(|d| d.card.as_deref()).collect();
        assert_eq!(cards, [Some("7"), Some("3"), Some("7")]);
        // Whole cards (HAMi's Test_GetNodeDevices sample): no network, and
        // an AIC without die mode groups nothing.
        let cards = decode_json(r#"[{"id":"7-0","count":1,"devmem":32768,"type":"Vastai","health":true,"devicepairscore":{}},{"id":"7-1","type":"Vastai","health":true,"custominfo":{"AIC":"1"}}]"#).unwrap();
        assert_eq!(
            (cards[0].card.as_deref(), cards[1].card.as_deref()),
            (None, None)
        );
        assert_eq!((cards[0].count, cards[0].memory_mib), (1, 32768));
        let error = decode_json(
            r#"[{"id":"d0","type":"Vastai","custominfo":{"DeviceStrategy":"die","AIC":5}}]"#,
        )
        .unwrap_err();
        assert!(
            error.contains("custominfo.AIC 5 is not a card id"),
            "{error}"
        );
    }

    #[test]
    fn hostile_or_broken_values_are_refused_with_the_rule() {
        let cases = [
            (decode_csv("no separator"), "no ':'"),
            (decode_csv("a,1,2:"), "3 comma-separated fields"),
            (decode_csv("a,1,-5,100,DCU,0,true:"), "devmem \"-5\""),
            (decode_csv("a,1,5,100,DCU,0,maybe:"), "health \"maybe\""),
            (
                decode_csv("a,99999999999,5,100,DCU,0,true:"),
                "count 99999999999 is too large",
            ),
            (decode_csv(",1,5,100,DCU,0,true:"), "id must be"),
            (decode_csv(":"), "no device"),
            (decode_json("{}"), "not a JSON list"),
            (decode_json("[]"), "no device"),
            (
                decode_json(r#"[{"id":"x","type":"T","devmem":-1}]"#),
                "devmem -1 is negative",
            ),
            (
                decode_json(r#"[{"id":"x","type":"T","custominfo":{"NetworkID":"a"}}]"#),
                "NetworkID",
            ),
            (decode_json(&"x".repeat(MAX_LEN + 1)), "more than"),
            // An id that would break the pod encoding the plugin splits.
            (
                decode_json(r#"[{"id":"a,b;c","type":"T"}]"#),
                "without ',', ':', ';'",
            ),
            (decode_json(r#"[{"id":"a b","type":"T"}]"#), "or spaces"),
        ];
        for (result, expected) in cases {
            let error = result.expect_err(expected);
            assert!(
                error.contains(expected),
                "{error:?} should say {expected:?}"
            );
        }
        let many = format!(
            "[{}]",
            vec![r#"{"id":"x","type":"T"}"#; MAX_DEVICES + 1].join(",")
        );
        assert!(decode_json(&many).unwrap_err().contains("more than 64"));
        let many_csv = "a,1,1,1,T,0,true:".repeat(MAX_DEVICES + 1);
        assert!(decode_csv(&many_csv).unwrap_err().contains("more than 64"));
    }
}

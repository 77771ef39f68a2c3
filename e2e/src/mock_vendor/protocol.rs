//! HAMi's encodings as a vendor device plugin reads and writes them
//! (`pkg/device/devices.go`: `DecodePodDevices`, `EncodePodSingleDevice`;
//! the plugins' `popNextContainerDevices` and `PodAllocationTrySuccess`):
//! pure, so the mock plugin's side of the protocol is tested on its own.

/// One device a container gets, as `uuid,Type,mem,cores`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handed {
    /// The device's UUID.
    pub uuid: String,
    /// The device type (`DCU`, `Ascend910B4`).
    pub device_type: String,
    /// MiB.
    pub memory_mib: u64,
    /// Cores.
    pub cores: u32,
}

/// Decodes `hami.io/<x>-devices-to-allocate`: one `;`-ended entry per
/// container (empty ones kept, so positions match the pod's containers),
/// each a list of `uuid,Type,mem,cores:`.
pub fn decode(value: &str) -> Result<Vec<Vec<Handed>>, String> {
    let mut containers: Vec<Vec<Handed>> = value
        .split(';')
        .map(|entry| {
            entry
                .split(':')
                .filter(|d| d.contains(','))
                .map(|d| {
                    let fields: Vec<&str> = d.split(',').collect();
                    if fields.len() < 4 {
                        return Err(format!("device {d:?} has fewer than 4 fields"));
                    }
                    Ok(Handed {
                        uuid: fields[0].to_owned(),
                        device_type: fields[1].to_owned(),
                        memory_mib: fields[2].parse().map_err(|_| format!("memory in {d:?}"))?,
                        cores: fields[3].parse().map_err(|_| format!("cores in {d:?}"))?,
                    })
                })
                .collect::<Result<Vec<_>, String>>()
        })
        .collect::<Result<_, _>>()?;
    // `a;b;` splits into a trailing empty entry that is no container.
    if value.ends_with(';') {
        containers.pop();
    }
    Ok(containers)
}

/// Encodes the entries back, as HAMi's `EncodePodSingleDevice`.
pub fn encode(containers: &[Vec<Handed>]) -> String {
    let mut out = String::new();
    for devices in containers {
        for d in devices {
            out.push_str(&format!(
                "{},{},{},{}:",
                d.uuid, d.device_type, d.memory_mib, d.cores
            ));
        }
        out.push(';');
    }
    out
}

/// Takes the first container entry that still has devices (the kubelet
/// calls Allocate in container start order), leaving it empty; its position
/// names the container.
pub fn pop_next(containers: &mut [Vec<Handed>]) -> Option<(usize, Vec<Handed>)> {
    let (position, devices) = containers
        .iter_mut()
        .enumerate()
        .find(|(_, d)| !d.is_empty())?;
    Some((position, std::mem::take(devices)))
}

/// Whether every container of the pod has been served: the annotation no
/// longer names the device type (HAMi's `PodAllocationTrySuccess`).
pub fn all_served(value: &str, device_type: &str) -> bool {
    !value.contains(device_type)
}

/// Reads an AMD CU list as the AMD plugin writes it (`0-75,80`; `0` for
/// none is read as CU 0, as the plugin itself would).
pub fn parse_cu_list(list: &str) -> Result<std::collections::BTreeSet<u32>, String> {
    let mut cus = std::collections::BTreeSet::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let number = |s: &str| {
            s.parse::<u32>()
                .map_err(|_| format!("CU list {list:?}: {s:?} is no CU number"))
        };
        let (start, end) = match part.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => (number(part)?, number(part)?),
        };
        if end < start || end - start > 4096 {
            return Err(format!("CU list {list:?}: bad range {part:?}"));
        }
        cus.extend(start..=end);
    }
    Ok(cus)
}

/// Writes CUs as the AMD plugin's `allocationToIDList` does: ascending
/// ranges, `0` for none.
pub fn cu_list(cus: &std::collections::BTreeSet<u32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut run: Option<(u32, u32)> = None;
    for &cu in cus {
        run = match run {
            Some((start, end)) if cu == end + 1 => Some((start, cu)),
            Some((start, end)) => {
                parts.push(range(start, end));
                Some((cu, cu))
            }
            None => Some((cu, cu)),
        };
    }
    if let Some((start, end)) = run {
        parts.push(range(start, end));
    }
    if parts.is_empty() {
        "0".into()
    } else {
        parts.join(",")
    }
}

fn range(start: u32, end: u32) -> String {
    if start == end {
        start.to_string()
    } else {
        format!("{start}-{end}")
    }
}

/// The AMD plugin's `cuallocation.AllocateN`: the `n` lowest CUs below
/// `total` not in `held`, or `None` when fewer are free.
pub fn first_free_cus(
    held: &std::collections::BTreeSet<u32>,
    total: u32,
    n: u32,
) -> Option<std::collections::BTreeSet<u32>> {
    let free: std::collections::BTreeSet<u32> = (0..total)
        .filter(|cu| !held.contains(cu))
        .take(n as usize)
        .collect();
    (free.len() == n as usize).then_some(free)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_are_served_in_order_and_the_annotation_erased() {
        // Tessera's Bind for init (none), main (two DCUs) and a sidecar (one).
        let value = ";DCU-0,DCU,4096,30:DCU-1,DCU,4096,30:;DCU-1,DCU,1024,10:;";
        let mut containers = decode(value).unwrap();
        assert_eq!(containers.len(), 3);
        let (position, first) = pop_next(&mut containers).unwrap();
        assert_eq!(
            (position, first.len(), first[1].uuid.as_str()),
            (1, 2, "DCU-1")
        );
        assert_eq!(encode(&containers), ";;DCU-1,DCU,1024,10:;");
        assert!(!all_served(&encode(&containers), "DCU"));
        let (position, _) = pop_next(&mut containers).unwrap();
        assert_eq!(position, 2);
        assert!(all_served(&encode(&containers), "DCU"));
        assert_eq!(pop_next(&mut containers), None);
        assert!(decode("x,DCU,nope,1:;").is_err());
    }

    #[test]
    fn amd_cu_lists_are_read_written_and_allocated_first_fit() {
        let held = parse_cu_list("0-75,80").unwrap();
        assert_eq!(held.len(), 77);
        assert_eq!(cu_list(&held), "0-75,80");
        assert_eq!(cu_list(&Default::default()), "0");
        let next = first_free_cus(&held, 304, 6).unwrap();
        assert_eq!(cu_list(&next), "76-79,81-82");
        assert_eq!(first_free_cus(&held, 80, 5), None, "only 4 free below 80");
        for bad in ["x", "5-2", "1-99999"] {
            assert!(parse_cu_list(bad).is_err(), "{bad}");
        }
    }
}

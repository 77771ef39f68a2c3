//! One node agent's `/metrics`, read for the tuning guide: the memory its
//! containers hold against their limits, and the compute they use against
//! their compute limits, summed over the node.

use std::collections::HashMap;

/// A node's containers at one scrape, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NodeUse {
    /// Memory the containers hold, bytes (a container that made no CUDA
    /// call holds none).
    pub memory_used: f64,
    /// Their memory limits, bytes.
    pub memory_limit: f64,
    /// Compute the measured containers use, percent-points.
    pub core_used: f64,
    /// Those containers' compute limits, percent-points.
    pub core_limit: f64,
}

impl NodeUse {
    /// Adds `other` in.
    pub fn add(&mut self, other: &NodeUse) {
        self.memory_used += other.memory_used;
        self.memory_limit += other.memory_limit;
        self.core_used += other.core_used;
        self.core_limit += other.core_limit;
    }

    /// Memory held over limits, percent; `None` without limits.
    pub fn memory_percent(&self) -> Option<f64> {
        (self.memory_limit > 0.0).then(|| 100.0 * self.memory_used / self.memory_limit)
    }

    /// Compute used over limits, percent; `None` when nothing is measured.
    pub fn compute_percent(&self) -> Option<f64> {
        (self.core_limit > 0.0).then(|| 100.0 * self.core_used / self.core_limit)
    }
}

const MEMORY_USED: &str = "hami_vgpu_memory_used_bytes";
const MEMORY_LIMIT: &str = "hami_vgpu_memory_limit_bytes";
const CORE_USED: &str = "hami_vgpu_core_used_percent";
const CORE_LIMIT: &str = "hami_vgpu_core_limit_percent";

/// Sums an agent's per-container HAMi series (`text` is its `/metrics`):
/// every container's memory limit, the memory of those that hold any (at
/// most their limit), and the compute use and limit of the containers whose
/// use is measured. Lines it does not know, and values that are not finite
/// numbers, are skipped.
pub fn parse(text: &str) -> NodeUse {
    let mut series: HashMap<&str, HashMap<&str, f64>> = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, rest)) = line.split_once('{') else {
            continue;
        };
        if ![MEMORY_USED, MEMORY_LIMIT, CORE_USED, CORE_LIMIT].contains(&name) {
            continue;
        }
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Some(value) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
        else {
            continue;
        };
        series.entry(name).or_default().insert(labels, value);
    }
    let get = |name: &str| series.get(name).cloned().unwrap_or_default();
    let (memory_used, memory_limit) = (get(MEMORY_USED), get(MEMORY_LIMIT));
    let (core_used, core_limit) = (get(CORE_USED), get(CORE_LIMIT));
    let mut use_ = NodeUse::default();
    for (labels, limit) in &memory_limit {
        use_.memory_limit += limit;
        use_.memory_used += memory_used.get(labels).map_or(0.0, |u| u.min(*limit));
    }
    for (labels, used) in &core_used {
        if let Some(limit) = core_limit.get(labels) {
            use_.core_used += used.min(100.0);
            use_.core_limit += limit;
        }
    }
    use_
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP hami_vgpu_memory_used_bytes vGPU device memory usage in bytes.
# TYPE hami_vgpu_memory_used_bytes gauge
hami_vgpu_memory_used_bytes{container="cuda",device_uuid="GPU-0",namespace="default",pod="a",vdevice_index="0",zone="vGPU"} 300
hami_vgpu_memory_used_bytes{container="cuda",device_uuid="GPU-0",namespace="default",pod="b",vdevice_index="0",zone="vGPU"} 5000
hami_vgpu_memory_limit_bytes{container="cuda",device_uuid="GPU-0",namespace="default",pod="a",vdevice_index="0",zone="vGPU"} 1000
hami_vgpu_memory_limit_bytes{container="cuda",device_uuid="GPU-0",namespace="default",pod="b",vdevice_index="0",zone="vGPU"} 1000
hami_vgpu_memory_limit_bytes{container="cuda",device_uuid="GPU-0",namespace="default",pod="c",vdevice_index="0",zone="vGPU"} 2000
hami_vgpu_core_used_percent{container="cuda",device_uuid="GPU-0",namespace="default",pod="a",vdevice_index="0",zone="vGPU"} 10
hami_vgpu_core_limit_percent{container="cuda",device_uuid="GPU-0",namespace="default",pod="a",vdevice_index="0",zone="vGPU"} 40
hami_vgpu_core_limit_percent{container="cuda",device_uuid="GPU-0",namespace="default",pod="c",vdevice_index="0",zone="vGPU"} 100
tessera_gpu_healthy{node="n1",uuid="GPU-0",index="0",model="A100"} 1
hami_vgpu_memory_used_bytes{pod="d"} NaN
hami_vgpu_memory_used_bytes{pod="e"} -5
hami_vgpu_memory_used_bytes broken
# EOF
"#;

    #[test]
    fn memory_counts_every_limit_and_compute_only_measured_containers() {
        let use_ = parse(TEXT);
        // b's 5000 is clamped to its limit; c made no CUDA call.
        assert_eq!(use_.memory_used, 1300.0);
        assert_eq!(use_.memory_limit, 4000.0);
        assert_eq!(use_.memory_percent(), Some(32.5));
        // Only a is measured.
        assert_eq!((use_.core_used, use_.core_limit), (10.0, 40.0));
        assert_eq!(use_.compute_percent(), Some(25.0));
    }

    #[test]
    fn nothing_known_is_nothing() {
        let use_ = parse("garbage\n{}} 1\n");
        assert_eq!(use_, NodeUse::default());
        assert_eq!(use_.memory_percent(), None);
        assert_eq!(use_.compute_percent(), None);
    }
}

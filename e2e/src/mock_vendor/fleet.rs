//! The devices and chart values the mock plugins play in the real-node
//! tests and `make demo`.

use serde_json::json;

use super::types::MockDevice;

/// Chart values that turn on the families the mocks play, as a HAMi user
/// copies them from `hami-scheduler-device`: `hygon: {}`, `amd: {}`,
/// `kunlun: {}`, `metax: {}`, `cambricon: {}`, `enflame: {}`, `mthreads: {}`,
/// `awsneuron: {}`, `vastai: {}` and `biren: {}` (HAMi's names), an `iluvatars:` entry for
/// the MR-V100, and HAMi's `vnpus:` entry for the Ascend 910B4 with its two
/// templates.
pub fn chart_values() -> serde_json::Value {
    json!({"config": {
        "hygon": {},
        "amd": {},
        "kunlun": {},
        "metax": {},
        "cambricon": {},
        "enflame": {},
        "mthreads": {},
        "awsneuron": {},
        "vastai": {},
        "biren": {},
        "iluvatars": [{
            "chipName": "MR-V100", "commonWord": "MR-V100",
            "resourceCountName": "iluvatar.ai/MR-V100-vgpu",
            "resourceMemoryName": "iluvatar.ai/MR-V100.vMem",
            "resourceCoreName": "iluvatar.ai/MR-V100.vCore",
        }],
        "vnpus": {"hamiVnpuCore": false, "configs": [{
            "chipName": "910B4", "commonWord": "Ascend910B4",
            "resourceName": "huawei.com/Ascend910B4",
            "resourceMemoryName": "huawei.com/Ascend910B4-memory",
            "resourceCoreName": "huawei.com/Ascend910B4-core",
            "memoryAllocatable": 32768, "memoryCapacity": 32768, "aiCore": 20, "aiCPU": 7,
            "templates": [
                {"name": "vir05_1c_8g", "memory": 8192, "aiCore": 5, "aiCPU": 1},
                {"name": "vir10_3c_16g", "memory": 16384, "aiCore": 10, "aiCPU": 3},
            ],
        }]},
    }})
}

/// `n` devices `<prefix>-<i>` of `memory_mib` and `cores`, 4 shares each,
/// on `network_id`.
pub(super) fn devices(
    n: u32,
    prefix: &str,
    memory_mib: u64,
    cores: u32,
    network_id: Option<u32>,
) -> Vec<MockDevice> {
    (0..n)
        .map(|i| MockDevice {
            id: format!("{prefix}-{i}"),
            memory_mib,
            cores,
            count: 4,
            network_id,
        })
        .collect()
}

/// `n` Ascend 910B4 NPUs of 32 GiB (20 AI cores) on one network, 4 shares
/// each.
pub fn ascend_910b4(n: u32) -> Vec<MockDevice> {
    devices(n, "NPU", 32768, 20, Some(0))
}

/// `n` AMD Instinct MI300X VF GPUs of 192 GiB and 304 compute units, 4
/// shares each.
pub fn amd_mi300x(n: u32) -> Vec<MockDevice> {
    devices(n, "AMD-MI300X", 196_608, 304, None)
}

/// `n` Hygon DCUs of 16 GiB, 4 shares each.
pub fn hygon_dcus(n: u32) -> Vec<MockDevice> {
    devices(n, "DCU", 16384, 100, None)
}

/// `n` Iluvatar MR-V100 GPUs of 32 GiB, 4 shares each.
pub fn iluvatar_mr_v100(n: u32) -> Vec<MockDevice> {
    devices(n, "MR-V100", 32768, 100, None)
}

/// `n` MetaX C500 GPUs of 64 GiB, 4 sGPUs each.
pub fn metax_c500(n: u32) -> Vec<MockDevice> {
    devices(n, "MX-C500", 65_536, 100, None)
}

/// `n` Cambricon MLU370 cards of 16 GiB.
pub fn cambricon_mlu370(n: u32) -> Vec<MockDevice> {
    devices(n, "MLU370", 16384, 100, None)
}

/// `n` Enflame S60 GCUs of 48 GiB, 6 DRS slices each.
pub fn enflame_s60(n: u32) -> Vec<MockDevice> {
    devices(n, "GCU", 49152, 100, None)
}

/// `devices`, each for one container at a time (a whole card).
fn whole(mut devices: Vec<MockDevice>) -> Vec<MockDevice> {
    for d in &mut devices {
        d.count = 1;
    }
    devices
}

/// `n` whole Enflame GCUs.
pub fn enflame_gcus(n: u32) -> Vec<MockDevice> {
    whole(devices(n, "GCU", 49152, 100, None))
}

/// `n` whole MetaX GPUs of 64 GiB.
pub fn metax_gpus(n: u32) -> Vec<MockDevice> {
    whole(devices(n, "MX-GPU", 65_536, 100, None))
}

/// `n` whole Kunlunxin XPUs of 96 GiB.
pub fn kunlunxin_whole_xpus(n: u32) -> Vec<MockDevice> {
    whole(devices(n, "XPU", 98_304, 100, None))
}

/// `n` Moore Threads MTT S4000 GPUs of 48 GiB (96 units of 512 MiB), 16
/// core groups and 4 vGPUs each.
pub fn mthreads_s4000(n: u32) -> Vec<MockDevice> {
    devices(n, "MTT-S4000", 49_152, 16, None)
}

/// `n` AWS Neuron devices of 2 NeuronCores each.
pub fn neuron_devices(n: u32) -> Vec<MockDevice> {
    whole(devices(n, "NEURON", 0, 2, None))
}

/// `n` Kunlunxin P800 XPUs of 96 GiB, 4 vXPUs each.
pub fn kunlunxin_xpus(n: u32) -> Vec<MockDevice> {
    devices(n, "XPU", 98_304, 100, None)
}

/// `cards` Vastai cards of `dies` dies each, registered die by die: die
/// `VA-<i>` of 16 GiB, one container at a time, on its card's network.
pub fn vastai_dies(cards: u32, dies: u32) -> Vec<MockDevice> {
    (0..cards)
        .flat_map(|card| {
            whole(devices(dies, "VA", 16384, 100, Some(card)))
                .into_iter()
                .zip(0..)
                .map(move |(mut d, die)| {
                    d.id = format!("VA-{}", card * dies + die);
                    d
                })
        })
        .collect()
}

/// `n` whole Biren GPUs of 64 GiB (`BR-<i>`), as biren-device-plugin
/// registers them (count 1).
pub fn biren_gpus(n: u32) -> Vec<MockDevice> {
    whole(devices(n, "BR", 65_536, 0, None))
}

//! Request configurations for tests and benchmarks (also public as
//! `tessera_api::testing`).

use super::config::RequestConfig;
use super::family::{biren::config::BirenConfig, vastai::config::VastaiConfig};
use super::vendors::{
    AmdConfig, AwsNeuronConfig, CambriconConfig, EnflameConfig, HygonConfig, IluvatarConfig,
    KunlunConfig, MetaxConfig, MthreadsConfig, VnpuConfig, VnpuTemplate, VnpusConfig,
};

/// An Ascend chip as a `vnpus.configs` entry of HAMi's names it:
/// `huawei.com/<word>` with its `-memory` and `-core`, `memory` MiB
/// allocatable and capacity, and `templates` as (name, MiB).
pub fn vnpu_chip(word: &str, memory: u64, templates: &[(&str, u64)]) -> VnpuConfig {
    VnpuConfig {
        chip_name: word.trim_start_matches("Ascend").into(),
        common_word: word.into(),
        resource_name: format!("huawei.com/{word}"),
        resource_memory_name: format!("huawei.com/{word}-memory"),
        resource_core_name: format!("huawei.com/{word}-core"),
        memory_allocatable: memory,
        memory_capacity: memory,
        templates: templates
            .iter()
            .map(|(name, memory)| VnpuTemplate {
                name: (*name).into(),
                memory: *memory,
                ..VnpuTemplate::default()
            })
            .collect(),
        ..VnpuConfig::default()
    }
}

/// The vendor configuration of HAMi's `device_test.go` cases: Hygon with
/// HAMi's names; the Ascend 910A with its four templates (listed out of
/// order: they are sorted by memory when used) and the 910C in a SuperPod;
/// the Iluvatar MR-V100 with HAMi's per-chip names; every other family
/// with HAMi's names.
pub fn vendor_config() -> RequestConfig {
    let a910 = vnpu_chip(
        "Ascend910A",
        32768,
        &[
            ("vir16", 17476),
            ("vir02", 2184),
            ("vir08", 8738),
            ("vir04", 4369),
        ],
    );
    let c910 = VnpuConfig {
        super_pod: true,
        ..vnpu_chip("Ascend910C", 65536, &[])
    };
    RequestConfig {
        hygon: Some(HygonConfig::default()),
        vnpus: Some(VnpusConfig {
            hami_vnpu_core: false,
            configs: vec![a910, c910],
        }),
        cambricon: Some(CambriconConfig::default()),
        mthreads: Some(MthreadsConfig::default()),
        metax: Some(MetaxConfig::default()),
        enflame: Some(EnflameConfig::default()),
        amd: Some(AmdConfig::default()),
        kunlun: Some(KunlunConfig::default()),
        awsneuron: Some(AwsNeuronConfig::default()),
        vastai: Some(VastaiConfig::default()),
        biren: Some(BirenConfig::default()),
        iluvatars: vec![IluvatarConfig {
            chip_name: "MR-V100".into(),
            common_word: "MR-V100".into(),
            resource_count_name: "iluvatar.ai/MR-V100-vgpu".into(),
            resource_memory_name: "iluvatar.ai/MR-V100.vMem".into(),
            resource_core_name: "iluvatar.ai/MR-V100.vCore".into(),
        }],
        ..RequestConfig::default()
    }
}

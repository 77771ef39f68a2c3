//! The bounds on tenant-written list annotations (review finding H2): every
//! type and UUID list, NVIDIA's and each vendor's, is refused past
//! [`MAX_LIST_ENTRIES`] entries, [`MAX_LIST_ENTRY_BYTES`] bytes an entry or
//! [`MAX_LIST_BYTES`] bytes in all, naming the annotation and the bound; and
//! no error message repeats a long value whole.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::*;
use tessera_api::names::{self, annotations as keys};

fn pod(limits: Value, annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": [
            {"name": "a", "resources": {"limits": limits.clone()}},
            {"name": "b", "resources": {"limits": limits}},
        ]},
    }))
    .unwrap()
}

/// The error message parsing gives, or `None` when the pod is accepted.
fn refusal(limits: Value, key: &str, value: &str) -> Option<String> {
    let pod = pod(limits, json!({key: value}));
    parse_pod(&pod, &fixtures::vendor_config())
        .err()
        .map(|e| e.to_string())
}

/// `n` distinct entries of `len` bytes each.
fn entries(n: usize, len: usize) -> String {
    (0..n)
        .map(|i| format!("{i:0>len$}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn nvidia() -> Value {
    json!({"nvidia.com/gpu": "1"})
}

/// Every list annotation, with limits that make the parser read it.
fn every_list() -> Vec<(Value, String)> {
    let mut lists: Vec<(Value, String)> = [
        keys::USE_GPU_TYPE,
        keys::NOUSE_GPU_TYPE,
        keys::USE_GPU_UUID,
        keys::NOUSE_GPU_UUID,
    ]
    .into_iter()
    .map(|k| (nvidia(), k.to_owned()))
    .collect();
    let vendor = |limits: Value, list: &[&str]| {
        list.iter()
            .map(|k| (limits.clone(), (*k).to_owned()))
            .collect::<Vec<_>>()
    };
    use names::{amd, cambricon, hygon, kunlun, metax, mthreads, neuron};
    lists.extend(vendor(
        json!({"hygon.com/dcunum": "1"}),
        &[
            hygon::USE_DCU_TYPE,
            hygon::NOUSE_DCU_TYPE,
            hygon::USE_UUID,
            hygon::NOUSE_UUID,
        ],
    ));
    lists.extend(vendor(
        json!({"cambricon.com/vmlu": "1"}),
        &[
            cambricon::USE_MLU_TYPE,
            cambricon::NOUSE_MLU_TYPE,
            cambricon::USE_UUID,
            cambricon::NOUSE_UUID,
        ],
    ));
    lists.extend(vendor(
        json!({"amd.com/gpu": "1"}),
        &[
            amd::USE_TYPE,
            amd::NOUSE_TYPE,
            amd::USE_UUID,
            amd::NOUSE_UUID,
        ],
    ));
    lists.extend(vendor(
        json!({"metax-tech.com/sgpu": "1"}),
        &[metax::USE_UUID, metax::NOUSE_UUID],
    ));
    lists.extend(vendor(
        json!({"mthreads.com/vgpu": "1"}),
        &[mthreads::USE_UUID, mthreads::NOUSE_UUID],
    ));
    lists.extend(vendor(
        json!({"kunlunxin.com/xpu": "1"}),
        &[
            kunlun::USE_UUID,
            kunlun::NOUSE_UUID,
            kunlun::BAIDU_USE_UUID,
            kunlun::BAIDU_NOUSE_UUID,
        ],
    ));
    lists.extend(vendor(
        json!({"aws.amazon.com/neuroncore": "1"}),
        &[neuron::USE_UUID, neuron::NOUSE_UUID],
    ));
    for (limits, word) in [
        (json!({"huawei.com/Ascend910A": "1"}), "Ascend910A"),
        (json!({"iluvatar.ai/MR-V100-vgpu": "1"}), "MR-V100"),
    ] {
        lists.push((limits.clone(), names::ascend::use_uuid(word)));
        lists.push((limits, names::ascend::nouse_uuid(word)));
    }
    lists
}

#[test]
fn a_list_of_33_entries_is_refused_naming_the_annotation_and_32_pass() {
    for (limits, key) in every_list() {
        assert_eq!(
            refusal(limits.clone(), &key, &entries(MAX_LIST_ENTRIES, 8)),
            None,
            "{key}: {MAX_LIST_ENTRIES} entries are allowed"
        );
        let error = refusal(limits, &key, &entries(MAX_LIST_ENTRIES + 1, 8))
            .unwrap_or_else(|| panic!("{key}: 33 entries were accepted"));
        let rule = format!("annotation {key}: lists 33 entries; at most 32 are allowed");
        assert!(error.contains(&rule), "{key}: {error}");
        // Two containers read a vendor's list; it is refused once.
        assert_eq!(error.matches(&rule).count(), 1, "{error}");
    }
}

#[test]
fn an_entry_over_128_bytes_is_refused_without_repeating_it() {
    for (limits, key) in every_list() {
        let longest = entries(2, MAX_LIST_ENTRY_BYTES);
        assert_eq!(refusal(limits.clone(), &key, &longest), None, "{key}");
        let long = format!("A100, {}", "x".repeat(MAX_LIST_ENTRY_BYTES + 1));
        let error = refusal(limits, &key, &long)
            .unwrap_or_else(|| panic!("{key}: a 129-byte entry was accepted"));
        assert!(
            error.contains(&format!("annotation {key}: entry "))
                && error.contains("is 129 bytes long; an entry may be at most 128 bytes"),
            "{key}: {error}"
        );
        assert!(
            error.len() < 300,
            "the entry is cut in the message: {error}"
        );
    }
}

#[test]
fn a_value_over_the_total_bound_is_refused_even_when_its_entries_are_blank() {
    let blanks = format!("A100{}", ",".repeat(MAX_LIST_BYTES));
    for (limits, key) in every_list() {
        let error = refusal(limits, &key, &blanks)
            .unwrap_or_else(|| panic!("{key}: {} bytes were accepted", blanks.len()));
        assert!(
            error.contains(&format!(
                "annotation {key}: is 8196 bytes long; a list may be at most 8192 bytes"
            )),
            "{key}: {error}"
        );
    }
    // Blanks and spaces within the bound are fine.
    let spaced = format!(
        " , {}, ,",
        entries(MAX_LIST_ENTRIES, 100).replace(',', " , ")
    );
    assert!(spaced.len() <= MAX_LIST_BYTES);
    assert_eq!(refusal(nvidia(), keys::USE_GPU_TYPE, &spaced), None);
}

#[test]
fn type_lists_are_lowercased_once_and_uuid_lists_are_sets() {
    let pod = pod(
        nvidia(),
        json!({
            keys::USE_GPU_TYPE: "A100, H100",
            keys::USE_GPU_UUID: "GPU-b, GPU-a, GPU-b",
        }),
    );
    let options = parse_pod(&pod, &RequestConfig::default())
        .unwrap()
        .unwrap()
        .options;
    assert_eq!(options.use_gpu_types, ["a100", "h100"]);
    assert!(options.use_gpu_uuids.iter().eq(["GPU-a", "GPU-b"]));
}

#[test]
fn a_uuid_both_used_and_excluded_is_refused_once() {
    let pod = pod(
        nvidia(),
        json!({keys::USE_GPU_UUID: "GPU-a,GPU-b", keys::NOUSE_GPU_UUID: "GPU-b,GPU-c"}),
    );
    let error = parse_pod(&pod, &RequestConfig::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "invalid GPU request: annotation nvidia.com/use-gpuuuid: lists \"GPU-b\", which nvidia.com/nouse-gpuuuid excludes; no GPU could satisfy both"
    );
}

#[test]
fn long_values_of_other_annotations_are_cut_in_messages() {
    let long = "y".repeat(200_000);
    for key in [
        keys::NUMA_BIND,
        keys::VGPU_MODE,
        keys::GPU_SCHEDULER_POLICY,
        keys::NODE_SCHEDULER_POLICY,
        keys::DEVICE_SCORING_WEIGHTS,
    ] {
        let error = refusal(nvidia(), key, &long).expect("refused");
        assert!(error.contains(&format!("annotation {key}: ")), "{error}");
        assert!(error.len() < 400, "{key}: {} bytes", error.len());
        assert!(error.contains("(200000 bytes)"), "{key}: {error}");
    }
    // A long weight key, and the vendors' own annotations.
    let weights = format!("slot=1,core=1,{long}=1");
    let error = refusal(nvidia(), keys::DEVICE_SCORING_WEIGHTS, &weights).unwrap();
    assert!(error.len() < 400, "{error}");
    for (limits, key) in [
        (
            json!({"huawei.com/Ascend910A": "1"}),
            names::ascend::VNPU_MODE,
        ),
        (json!({"metax-tech.com/sgpu": "1"}), names::metax::APP_CLASS),
        (
            json!({"metax-tech.com/sgpu": "1"}),
            names::metax::QOS_POLICY,
        ),
    ] {
        // Read per container (two here), with the rule's own words.
        let error = refusal(limits, key, &long).expect("refused");
        assert!(error.contains(&format!("{key}: ")), "{error}");
        assert!(error.len() < 600, "{key}: {} bytes", error.len());
    }
}

//! The DRA examples (`examples/dra/`): a real v1.36 kube-apiserver accepts them (server-side dry run:
//! schema, CEL, constraints), and what they ask of a device is what the
//! node's ResourceSlice offers: the attributes they select on and constrain
//! by exist on its devices, and their capacity requests fit its policies.

use std::path::Path;

use serde_json::Value;
use tessera_api::{quantity, testing::gpu};
use tessera_node_agent::dra;

fn examples() -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/dra");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, serde_yaml_ng::from_str(&text).unwrap())
        })
        .collect()
}

#[tokio::test]
async fn the_api_server_accepts_the_dra_examples() {
    let plane = tessera_e2e::shared().await.unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/dra");
    let output = plane
        .kubectl()
        .unwrap()
        .args(["apply", "--dry-run=server", "-f"])
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout.matches("(server dry run)").count(),
        examples().len(),
        "{stdout}"
    );
}

#[test]
fn the_examples_ask_for_what_the_slice_offers() {
    let mut numa = gpu(0, "NVIDIA H100 80GB HBM3", 81559);
    numa.numa_node = Some(0);
    numa.compute_capability = Some("9.0".into());
    numa.driver_version = Some("550.54.15".into());
    let slice = dra::resource_slice("node-a", 1, &[numa]);
    let device = &slice.spec.devices.unwrap()[0];
    let attributes = device.attributes.as_ref().unwrap();
    let capacity = device.capacity.as_ref().unwrap();
    let mut asked = 0;
    for (name, example) in examples() {
        let Some(devices) = example["spec"]["spec"]["devices"].as_object() else {
            continue;
        };
        for constraint in devices
            .get("constraints")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for key in ["matchAttribute", "distinctAttribute"] {
                if let Some(attribute) = constraint[key].as_str() {
                    let local = attribute.strip_prefix("gpu.tessera.dev/").unwrap();
                    assert!(
                        attributes.contains_key(local),
                        "{name}: no attribute {local}"
                    );
                }
            }
        }
        for request in devices["requests"].as_array().unwrap() {
            let exactly = &request["exactly"];
            assert_eq!(exactly["deviceClassName"], "vgpu.tessera.dev", "{name}");
            for selector in exactly["selectors"].as_array().into_iter().flatten() {
                let cel = selector["cel"]["expression"].as_str().unwrap();
                assert!(
                    attributes.keys().any(|a| cel.contains(&format!(".{a}"))),
                    "{name}: {cel} selects on no attribute the slice has"
                );
            }
            let requests = exactly["capacity"]["requests"].as_object().unwrap();
            for (resource, amount) in requests {
                let amount = amount.as_str().unwrap();
                assert!(
                    capacity.contains_key(resource),
                    "{name}: no capacity {resource}"
                );
                match resource.as_str() {
                    "memory" => assert!(quantity::bytes_as_mib(amount).is_ok(), "{name}: {amount}"),
                    "cores" => assert!(
                        quantity::whole(amount).is_ok_and(|c| c <= 100),
                        "{name}: {amount}"
                    ),
                    other => panic!("{name}: unexpected capacity {other}"),
                }
                asked += 1;
            }
        }
    }
    assert_eq!(asked, 5, "every example's capacity requests were checked");
}

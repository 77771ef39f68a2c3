use std::{
    collections::BTreeSet,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    sync::Arc,
};

use tessera_api::v1alpha1::{GpuDevice, OperatingMode};

use super::*;

fn device(uuid: &str, mode: OperatingMode) -> GpuDevice {
    GpuDevice {
        family: Default::default(),
        network_id: None,
        uuid: uuid.into(),
        mode,
        ..tessera_api::testing::gpu(0, "NVIDIA H100 80GB HBM3", 81559)
    }
}

/// The GPUs of `devices` that get a daemon on a node in `mode`.
fn wanted_on(mode: OperatingMode, devices: Vec<GpuDevice>) -> BTreeSet<String> {
    let settings = tessera_api::v1alpha1::NodeSettings {
        operating_mode: mode,
        ..Default::default()
    };
    wanted(&Offer {
        resolved: tessera_api::node_config::resolve("n1", &Default::default(), &settings, &[]),
        devices,
    })
}

/// The GPUs of `devices` that get a daemon on an MPS node.
fn offer(devices: Vec<GpuDevice>) -> BTreeSet<String> {
    wanted_on(OperatingMode::Mps, devices)
}

#[test]
fn the_fake_daemon_answers_the_control_commands_through_its_pipe_directory() {
    let dir = tempfile::tempdir().unwrap();
    let manager = MpsManager::new(Arc::new(FakeControl), dir.path());
    let daemon = manager.ensure("GPU-mps-0").unwrap();
    let socket = daemon.pipe_dir.join(fake::SOCKET);
    assert!(
        std::fs::symlink_metadata(&socket)
            .unwrap()
            .file_type()
            .is_socket()
    );
    let mode = std::fs::metadata(&daemon.pipe_dir)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o755,
        "tenants may not write the pipe directory"
    );
    let control = FakeControl;
    let ask = |line: &str| control.command(&daemon, line).unwrap();
    assert_eq!(ask("get_server_list"), "");
    assert_eq!(ask("get_default_active_thread_percentage"), "100.0\n");
    assert_eq!(ask("set_default_active_thread_percentage 30"), "30.0\n");
    assert_eq!(ask("get_default_active_thread_percentage"), "30.0\n");
    assert!(ask("set_default_active_thread_percentage 130").starts_with("Invalid"));
    assert_eq!(ask("start_server -uid 1000"), "");
    assert_eq!(ask("start_server -uid 1000"), "", "one server per user");
    assert_eq!(ask("get_server_list").lines().count(), 1);
    assert_eq!(ask("set_default_device_pinned_mem_limit 0 8000M"), "");
    assert_eq!(ask("get_default_device_pinned_mem_limit 0"), "8000M\n");
    assert!(ask("rm -rf /").starts_with("Unrecognized command"));
    // Ensuring again finds it running: no second daemon.
    manager.ensure("GPU-mps-0").unwrap();
    assert_eq!(ask("get_server_list").lines().count(), 1);
    let log = std::fs::read_to_string(daemon.log_dir.join(fake::LOG)).unwrap();
    assert_eq!(log.matches("Control daemon started").count(), 1, "{log}");
    assert!(log.contains("Starting new server"), "{log}");
    ask("quit");
    assert!(control.command(&daemon, "get_server_list").is_err());
    assert!(!socket.exists());
}

#[test]
fn a_silent_client_does_not_stall_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let manager = MpsManager::new(Arc::new(FakeControl), dir.path());
    let daemon = manager.ensure("GPU-mps-0").unwrap();
    // A tenant connects and sends nothing, keeping the connection open.
    let _silent =
        std::os::unix::net::UnixStream::connect(daemon.pipe_dir.join(fake::SOCKET)).unwrap();
    let answer = FakeControl.command(&daemon, "get_default_active_thread_percentage");
    assert_eq!(answer.unwrap(), "100.0\n");
}

#[test]
fn daemons_follow_the_gpus_in_mps_mode() {
    let dir = tempfile::tempdir().unwrap();
    let manager = MpsManager::new(Arc::new(FakeControl), dir.path());
    let mut unhealthy = device("GPU-c", OperatingMode::Mps);
    unhealthy.health = DeviceHealth::Unhealthy;
    let offer_a = offer(vec![device("GPU-a", OperatingMode::Mps), unhealthy]);
    assert!(manager.reconcile(&offer_a).is_empty());
    let answers = |uuid: &str| {
        FakeControl
            .command(&manager.daemon(uuid).unwrap(), "get_server_list")
            .is_ok()
    };
    assert!(answers("GPU-a"));
    assert!(
        wanted_on(
            OperatingMode::HamiCore,
            vec![device("GPU-b", OperatingMode::HamiCore)]
        )
        .is_empty(),
        "hami-core GPUs get no daemon"
    );
    assert!(!answers("GPU-c"), "unhealthy GPUs get no daemon");
    // A daemon that died is started again on the next pass.
    FakeControl
        .command(&manager.daemon("GPU-a").unwrap(), "quit")
        .unwrap();
    assert!(!answers("GPU-a"));
    assert!(manager.reconcile(&offer_a).is_empty());
    assert!(answers("GPU-a"));
    // GPU-a leaves MPS mode: its daemon quits.
    let offer_b = wanted_on(
        OperatingMode::HamiCore,
        vec![device("GPU-a", OperatingMode::HamiCore)],
    );
    assert!(manager.reconcile(&offer_b).is_empty());
    assert!(!answers("GPU-a"));
}

#[test]
fn uuids_that_are_not_one_directory_name_are_refused() {
    let manager = MpsManager::new(Arc::new(FakeControl), "/var/lib/tessera/mps");
    for uuid in ["", ".", "..", "../etc", "GPU/x", "a\0b"] {
        let error = manager.daemon(uuid).unwrap_err().to_string();
        assert!(
            error.contains("cannot name a directory"),
            "{uuid:?}: {error}"
        );
    }
}

#[test]
fn a_symlinked_daemon_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    std::fs::create_dir_all(root.join("GPU-a")).unwrap();
    std::os::unix::fs::symlink(dir.path(), root.join("GPU-a/pipe")).unwrap();
    let manager = MpsManager::new(Arc::new(FakeControl), &root);
    let error = manager.ensure("GPU-a").unwrap_err().to_string();
    assert!(error.contains("not a directory"), "{error}");
}

/// NVIDIA's control program, played by a shell script that keeps its state
/// in the pipe directory: the agent's side of the real daemon is the same
/// code whichever program answers.
#[test]
fn nvidia_control_runs_the_program_with_the_daemons_environment() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("nvidia-cuda-mps-control");
    std::fs::write(
        &program,
        r#"#!/bin/sh
if [ "$1" = "-d" ]; then
  echo "$CUDA_VISIBLE_DEVICES $CUDA_MPS_LOG_DIRECTORY" > "$CUDA_MPS_PIPE_DIRECTORY/started"
  exit 0
fi
[ -f "$CUDA_MPS_PIPE_DIRECTORY/started" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
read -r line
case "$line" in
  get_server_list) exit 0 ;;
  quit) rm "$CUDA_MPS_PIPE_DIRECTORY/started" ;;
  *) echo "answer to $line" ;;
esac
"#,
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A test forking in parallel may hold the script open for writing for
    // an instant (ETXTBSY): wait until it can be run.
    while std::process::Command::new(&program)
        .arg("probe")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_err_and(|e| e.kind() == std::io::ErrorKind::ExecutableFileBusy)
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let root = dir.path().join("mps");
    // The agent's /dev/shm is not the clients': the daemon is not started.
    let elsewhere = MpsManager::new(Arc::new(NvidiaControl::new(&program)), &root);
    let error = elsewhere.ensure("GPU-h100-0").unwrap_err().to_string();
    assert!(error.contains("would not share memory"), "{error}");
    let control = NvidiaControl::new(&program).with_shm(root.join("shm"));
    let manager = MpsManager::new(Arc::new(control.clone()), &root);
    let daemon = manager.ensure("GPU-h100-0").unwrap();
    let started = std::fs::read_to_string(daemon.pipe_dir.join("started")).unwrap();
    assert_eq!(
        started.trim(),
        format!("GPU-h100-0 {}", daemon.log_dir.display())
    );
    assert_eq!(
        control
            .command(&daemon, "get_default_active_thread_percentage")
            .unwrap(),
        "answer to get_default_active_thread_percentage\n"
    );
    assert!(manager.reconcile(&offer(Vec::new())).is_empty());
    let error = control
        .command(&daemon, "get_server_list")
        .unwrap_err()
        .to_string();
    assert!(error.contains("Cannot find MPS control daemon"), "{error}");
    let missing = NvidiaControl::new(dir.path().join("absent")).with_shm(root.join("shm"));
    let error = missing.start(&daemon).unwrap_err().to_string();
    assert!(
        error.contains("absent") && error.contains("GPU-h100-0"),
        "{error}"
    );
}

#[test]
fn an_mps_container_is_served_its_gpu_s_running_daemon_and_one_gpu_only() {
    use crate::sharing::{Container, Serving};
    let dir = tempfile::tempdir().unwrap();
    let host = MpsManager::new(Arc::new(FakeControl), dir.path());
    let agent = MpsManager::new(Arc::new(FakeControl), dir.path());
    let container = |uuids: &[&str]| Container {
        holder: "ml/train".into(),
        name: "main".into(),
        slices: uuids
            .iter()
            .map(|u| tessera_api::testing::slice(u, 0, 8000, 30))
            .collect(),
        priority: None,
        region_dir: dir.path().join("containers/uid_main"),
        settings: Default::default(),
    };
    let two = agent.serve(&container(&["GPU-a", "GPU-b"])).unwrap_err();
    assert!(
        two.to_string()
            .contains("pod ml/train container main: an MPS container has one GPU"),
        "{two}"
    );
    host.ensure("GPU-a").unwrap();
    let contract = agent.serve(&container(&["GPU-a"])).unwrap();
    assert_eq!(contract.visible, ["GPU-a"]);
    assert_eq!(contract.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=8000M");
    assert_eq!(contract.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
    assert!(
        !contract.envs.keys().any(|k| k.starts_with("CUDA_DEVICE_")),
        "no interposer limits"
    );
    assert_eq!(contract.mounts[0].host_path, dir.path().join("GPU-a/pipe"));
}

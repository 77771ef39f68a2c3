//! The interposer against a region its own container corrupted: it never
//! crashes, it refuses CUDA loudly naming the region and the rule (when the
//! container has limits), and it never rebuilds a region the container's
//! other processes may hold reservations in.

use std::os::unix::fs::symlink;

use support::{Loader, World};
use tessera_vgpu_region::{MAX_DEVICES, REGION_SIZE, Region};

/// Puts one corruption in place.
type Corrupt = Box<dyn Fn()>;

/// What the container put where its region goes.
fn corruptions(world: &World) -> Vec<(&'static str, Corrupt)> {
    let path = world.region_path();
    let elsewhere = world.dir.path().join("elsewhere");
    let valid = {
        let scratch = world.dir.path().join("scratch");
        let mut limits = [0; MAX_DEVICES];
        limits[0] = 64 << 20;
        drop(Region::create_or_open(&scratch, &limits).unwrap());
        let bytes = std::fs::read(&scratch).unwrap();
        std::fs::remove_file(&scratch).unwrap();
        bytes
    };
    let with = move |at: usize, value: &[u8]| {
        let mut bytes = valid.clone();
        bytes[at..at + value.len()].copy_from_slice(value);
        bytes
    };
    let write = |bytes: Vec<u8>| {
        let path = path.clone();
        Box::new(move || std::fs::write(&path, &bytes).unwrap()) as Corrupt
    };
    vec![
        // Another container's limits: 1 GiB instead of the 64 MiB the
        // environment gives (offset 64: device 0's limit).
        ("other limits", write(with(64, &(1u64 << 30).to_ne_bytes()))),
        (
            "absurd slot count",
            write(with(24, &u32::MAX.to_ne_bytes())),
        ),
        (
            "random bytes",
            write((0..REGION_SIZE).map(|i| (i * 7 + 3) as u8).collect()),
        ),
        ("truncated", write(with(0, &[])[..4096].to_vec())),
        ("sparse and huge", {
            let path = path.clone();
            Box::new(move || {
                let file = std::fs::File::create(&path).unwrap();
                file.set_len(4 << 30).unwrap();
            })
        }),
        ("a link to a file elsewhere", {
            let (path, elsewhere) = (path.clone(), elsewhere.clone());
            let bytes = with(0, &[]);
            Box::new(move || {
                std::fs::write(&elsewhere, &bytes).unwrap();
                symlink(&elsewhere, &path).unwrap();
            })
        }),
        ("a directory", {
            let path = path.clone();
            Box::new(move || std::fs::create_dir(&path).unwrap())
        }),
        ("a FIFO", {
            let path = path.clone();
            Box::new(move || {
                let made = std::process::Command::new("mkfifo").arg(&path).status();
                assert!(made.unwrap().success(), "mkfifo {}", path.display());
            })
        }),
    ]
}

#[test]
fn a_corrupted_region_refuses_cuda_loudly_and_is_left_as_it_is() {
    let probe = World::new("8g");
    let names: Vec<&str> = corruptions(&probe).iter().map(|(n, _)| *n).collect();
    for (index, name) in names.iter().enumerate() {
        let world = World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "64m");
        let (_, corrupt) = corruptions(&world).swap_remove(index);
        corrupt();
        let before = std::fs::symlink_metadata(world.region_path()).unwrap();
        for loader in [Loader::Linked, Loader::Dlsym] {
            let report = world.run(loader, true, &["init"]);
            let stderr = report.stderr();
            assert!(
                stderr.contains("refusing CUDA"),
                "{name} {loader:?}: {stderr}"
            );
            assert!(stderr.contains("not rebuilding"), "{name}: {stderr}");
            assert!(
                stderr.contains(&world.region_path().display().to_string()),
                "{name}: names the region: {stderr}"
            );
            assert_eq!(report.ok().get("init_rc"), 3, "{name} {loader:?}");
        }
        let after = std::fs::symlink_metadata(world.region_path()).unwrap();
        assert_eq!(
            (after.file_type(), after.len()),
            (before.file_type(), before.len()),
            "{name}: left as it was"
        );
    }
}

#[test]
fn without_limits_a_corrupted_region_is_not_accounted_and_says_so() {
    let world = World::new("8g").env("LIBCUDA_LOG_LEVEL", "2");
    std::fs::write(world.region_path(), b"garbage").unwrap();
    let report = world.run(Loader::Linked, true, &["alloc", "plain", "4096", "1"]);
    let stderr = report.stderr();
    assert!(stderr.contains("not accounting"), "{stderr}");
    assert_eq!(report.ok().get("allocated"), 1);
}

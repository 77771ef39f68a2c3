//! The support of the interposer's integration tests and benchmarks:
//! builds the C probes (`interposer/tests/c/`) against the fake driver and
//! runs them as separate processes, with or without
//! `LD_PRELOAD=libtessera_vgpu.so`. The libraries are the ones the running
//! `cargo test` or `cargo bench` built, next to its executable.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

pub mod launch;

/// How a probe finds the driver's functions (see `tests/c/probe.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loader {
    /// Linked against libcuda.so.1.
    Linked,
    /// dlopen + dlsym of each versioned name.
    Dlsym,
    /// dlopen + cuGetProcAddress_v2 for everything, as cudart does.
    ProcAddr,
}

impl Loader {
    /// Every loader.
    pub const ALL: [Loader; 3] = [Loader::Linked, Loader::Dlsym, Loader::ProcAddr];

    /// The preprocessor symbol that selects this loader in the C programs.
    fn define(self) -> &'static str {
        match self {
            Loader::Linked => "LOADER_LINKED",
            Loader::Dlsym => "LOADER_DLSYM",
            Loader::ProcAddr => "LOADER_PROCADDR",
        }
    }
}

/// The built artifacts every test uses.
pub struct Built {
    /// `libtessera_vgpu.so`.
    pub interposer: PathBuf,
    /// A directory holding `libcuda.so.1` and `libnvidia-ml.so.1` (the fakes).
    pub lib_dir: PathBuf,
    /// (program, loader define) → executable.
    probes: HashMap<(&'static str, &'static str), PathBuf>,
}

/// The C test programs under `tests/c/`, each built with every loader.
pub const PROGRAMS: [&str; 2] = ["probe", "charges"];

/// Where cargo put this test's dependencies: `<target>/<profile>/deps`.
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().expect("deps directory").to_owned()
}

/// A cdylib built by this `cargo test` run (a dev-dependency of the crate
/// under test, e.g. `libnvidia_ml.so`, the fake NVML): next to the test
/// executable (fresh for this build), else in the profile directory above it.
pub fn cdylib(name: &str) -> PathBuf {
    let deps = deps_dir();
    [deps.join(name), deps.parent().unwrap().join(name)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found next to {}; run through cargo test",
                deps.display()
            )
        })
}

/// The interposer, the fakes and the probes, found or built once per
/// process.
pub fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let interposer = cdylib("libtessera_vgpu.so");
        let fake = cdylib("libcuda.so");
        let fake_nvml = cdylib("libnvidia_ml.so");
        // One fixed directory, each file written under a unique name and
        // renamed into place, so concurrent test runs never see half a file.
        let root = deps_dir().parent().unwrap().join("interposer-probes");
        let lib_dir = root.join("lib");
        std::fs::create_dir_all(&lib_dir).unwrap();
        let tmp = |path: &Path| path.with_extension(format!("tmp{}", std::process::id()));
        let driver = lib_dir.join("libcuda.so.1");
        std::fs::copy(&fake, tmp(&driver)).unwrap();
        std::fs::rename(tmp(&driver), &driver).unwrap();
        let nvml = lib_dir.join("libnvidia-ml.so.1");
        std::fs::copy(&fake_nvml, tmp(&nvml)).unwrap();
        std::fs::rename(tmp(&nvml), &nvml).unwrap();
        let mut probes = HashMap::new();
        for program in PROGRAMS {
            let source =
                Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/c/{program}.c"));
            for loader in Loader::ALL {
                let out = root.join(format!("{program}-{}", loader.define().to_lowercase()));
                let mut gcc = Command::new("gcc");
                gcc.args(["-std=c11", "-O1", "-Wall", "-Werror", "-pthread", "-o"])
                    .arg(tmp(&out))
                    .arg(format!("-D{}", loader.define()))
                    .arg(&source);
                if loader == Loader::Linked {
                    gcc.arg(&driver).arg(&nvml);
                }
                gcc.arg("-ldl");
                let status = gcc.status().expect("gcc runs");
                assert!(status.success(), "gcc failed for {program} {loader:?}");
                std::fs::rename(tmp(&out), &out).unwrap();
                probes.insert((program, loader.define()), out);
            }
        }
        Built {
            interposer,
            lib_dir,
            probes,
        }
    })
}

/// A world's directory: in memory (`/dev/shm`) where the machine has it.
/// The region and the fake GPU's state are shared file mappings; on a disk
/// the kernel writes their dirty pages back, and while the disk is loaded
/// (another build, etcd's fsyncs) a process that dirties one again can be
/// throttled or made to wait for the write, stalling its launches in the
/// middle of a measured window.
fn world_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    shm.is_dir()
        .then(|| tempfile::tempdir_in(shm).ok())
        .flatten()
        .unwrap_or_else(|| tempfile::tempdir().unwrap())
}

/// One test's world: its own fake-device state file and shared region.
pub struct World {
    /// Where its files live, removed with it.
    pub dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl World {
    /// A fake GPU of `device_memory` bytes (e.g. "8g").
    pub fn new(device_memory: &str) -> Self {
        let dir = world_dir();
        let env = vec![
            (
                "FAKE_CUDA_STATE".into(),
                dir.path().join("fake.state").display().to_string(),
            ),
            ("FAKE_CUDA_DEVICE_MEMORY".into(), device_memory.into()),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
                dir.path().join("vgpu.region").display().to_string(),
            ),
        ];
        Self { dir, env }
    }

    /// Adds an environment variable for every process of this world.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// The shared region of this world's container.
    pub fn region_path(&self) -> PathBuf {
        self.var("CUDA_DEVICE_MEMORY_SHARED_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.dir.path().join("vgpu.region"))
    }

    /// The value this world gives a variable (the last one set).
    pub fn var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Another process of this world's container: the same environment
    /// (region, fake GPU, limits), to which more variables can be added.
    pub fn same_container(&self) -> Self {
        Self {
            dir: world_dir(),
            env: self.env.clone(),
        }
    }

    /// Another container on this world's fake GPUs: its own region and
    /// environment, the same fake device state (`FAKE_CUDA_*`).
    pub fn neighbour(&self) -> Self {
        let mut world = Self::new("8g");
        world.env.extend(
            self.env
                .iter()
                .filter(|(n, _)| n.starts_with("FAKE_CUDA_"))
                .cloned(),
        );
        world
    }

    /// A probe command, preloaded or not.
    pub fn probe(&self, loader: Loader, preload: bool, args: &[&str]) -> Command {
        self.program("probe", loader, preload, args)
    }

    /// A command running one of [`PROGRAMS`], preloaded or not.
    pub fn program(&self, program: &str, loader: Loader, preload: bool, args: &[&str]) -> Command {
        let built = built();
        let path = built
            .probes
            .iter()
            .find(|((name, define), _)| *name == program && *define == loader.define())
            .map(|(_, path)| path)
            .unwrap_or_else(|| panic!("no program {program}"));
        let mut cmd = Command::new(path);
        cmd.args(args);
        self.apply(&mut cmd, preload);
        cmd
    }

    /// Any command in this world's environment.
    pub fn apply(&self, cmd: &mut Command, preload: bool) {
        let built = built();
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy().into_owned();
            if name.starts_with("CUDA_")
                || name.starts_with("FAKE_CUDA_")
                || name.starts_with("LIBCUDA_")
                || name.starts_with("TESSERA_")
                || name.starts_with("GPU_CORE")
                || name == "LD_PRELOAD"
            {
                cmd.env_remove(name);
            }
        }
        cmd.env("LD_LIBRARY_PATH", &built.lib_dir);
        for (name, value) in &self.env {
            cmd.env(name, value);
        }
        if preload {
            cmd.env("LD_PRELOAD", &built.interposer);
        }
    }

    /// Runs a probe to completion and parses its `key=value` output.
    pub fn run(&self, loader: Loader, preload: bool, args: &[&str]) -> Report {
        self.run_program("probe", loader, preload, args)
    }

    /// Runs `tests/c/charges.c` to completion and parses its output.
    pub fn charges(&self, loader: Loader, preload: bool, args: &[&str]) -> Report {
        self.run_program("charges", loader, preload, args)
    }

    fn run_program(&self, program: &str, loader: Loader, preload: bool, args: &[&str]) -> Report {
        let output = self
            .program(program, loader, preload, args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        Report::new(
            output,
            format!("{program} {loader:?} preload={preload} {args:?}"),
        )
    }
}

/// A finished probe.
pub struct Report {
    /// How the probe exited and what it printed.
    pub output: Output,
    values: HashMap<String, String>,
    what: String,
}

impl Report {
    fn new(output: Output, what: String) -> Self {
        let values = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect();
        Self {
            output,
            values,
            what,
        }
    }

    /// Asserts the probe exited 0 and returns itself.
    pub fn ok(self) -> Self {
        assert!(
            self.output.status.success(),
            "{} failed:\n{}",
            self.what,
            self.describe()
        );
        self
    }

    /// A numeric output value.
    pub fn get(&self, key: &str) -> u64 {
        let value = self
            .values
            .get(key)
            .unwrap_or_else(|| panic!("{}: no {key}:\n{}", self.what, self.describe()));
        value.parse().unwrap_or_else(|_| panic!("{key}={value}"))
    }

    /// What the probe printed to stderr.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    fn describe(&self) -> String {
        format!(
            "status {}\nstdout:\n{}\nstderr:\n{}",
            self.output.status,
            String::from_utf8_lossy(&self.output.stdout),
            self.stderr()
        )
    }
}

/// One MiB.
pub const MIB: u64 = 1 << 20;

/// Lets racing probes go (they wait for `start` to exist), waits for them,
/// and returns the total of their `ok=` and `oom=` counts; every probe must
/// succeed and report `other=0` (no error but out-of-memory).
pub fn race_totals(start: &Path, children: Vec<std::process::Child>) -> (u64, u64) {
    std::fs::write(start, b"").unwrap();
    let (mut ok, mut oom) = (0, 0);
    for child in children {
        let output = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let value = |key: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap()
                .parse()
                .unwrap()
        };
        assert_eq!(value("other"), 0, "{text}");
        ok += value("ok");
        oom += value("oom");
    }
    (ok, oom)
}

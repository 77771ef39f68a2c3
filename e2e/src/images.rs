//! The two images real nodes run, built from files on this machine:
//!
//! - [`PAUSE_IMAGE`], the pod sandbox: a static `pause` compiled from
//!   `e2e/images/pause.c`.
//! - [`CUDA_IMAGE`], for GPU workloads: busybox (shell and tools), the fake
//!   CUDA driver and NVML installed where the real ones would be
//!   (`libcuda.so.1`, `libnvidia-ml.so.1`), the C library they need, and
//!   `cuda-probe`, the interposer's test client built the way CUDA's runtime
//!   finds the driver (dlopen + cuGetProcAddress_v2). The interposer itself is
//!   not in the image: the node agent mounts it, as in production.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::oci::Image;
use crate::{Error, artifacts::Artifacts, tools};

/// The sandbox image every node's containerd is configured with.
pub const PAUSE_IMAGE: &str = "tessera.local/pause:v1";
/// The image GPU pods of the tests and the demo run.
pub const CUDA_IMAGE: &str = "tessera.local/cuda-demo:v1";

/// Archives ready for `ctr image import`.
#[derive(Debug, Clone)]
pub struct Archives {
    /// Every archive, one image each.
    pub paths: Vec<PathBuf>,
}

/// Builds both images into `out_dir` (reusing nothing: it takes a second).
pub fn build(out_dir: &Path, artifacts: &Artifacts) -> Result<Archives, Error> {
    std::fs::create_dir_all(out_dir).map_err(Error::io("create directory", out_dir))?;
    let work = out_dir.join("build");
    std::fs::create_dir_all(&work).map_err(Error::io("create directory", &work))?;

    let pause = work.join("pause");
    gcc(
        &[tools::repo_root().join("e2e/images/pause.c")],
        &pause,
        &["-static", "-Os"],
    )?;
    let mut image = Image::new(PAUSE_IMAGE);
    image.copy("/pause", &pause)?.command(&["/pause"]);
    let pause_archive = out_dir.join("pause.tar");
    image.write_archive(&pause_archive)?;

    let probe = work.join("cuda-probe");
    gcc(
        std::slice::from_ref(&artifacts.probe_source),
        &probe,
        &["-std=c11", "-O1", "-pthread", "-DLOADER_PROCADDR", "-ldl"],
    )?;
    let cuda_archive = out_dir.join("cuda-demo.tar");
    cuda_image(artifacts, &probe)?.write_archive(&cuda_archive)?;
    Ok(Archives {
        paths: vec![pause_archive, cuda_archive],
    })
}

fn cuda_image(artifacts: &Artifacts, probe: &Path) -> Result<Image, Error> {
    let mut image = Image::new(CUDA_IMAGE);
    // Merged /usr, as on current distributions.
    for (link, target) in [
        ("/bin", "usr/bin"),
        ("/sbin", "usr/sbin"),
        ("/lib", "usr/lib"),
        ("/lib64", "usr/lib64"),
    ] {
        image.symlink(link, target);
    }
    image
        .dir("/tmp")
        .dir("/etc")
        .dir("/proc")
        .dir("/sys")
        .dir("/dev");
    image.bytes("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644);
    image.bytes("/etc/group", "root:x:0:\n", 0o644);

    let busybox = which("busybox")?;
    image.copy("/usr/bin/busybox", &busybox)?;
    for applet in busybox_applets(&busybox)? {
        if applet != "busybox" {
            image.symlink(&format!("/usr/bin/{applet}"), "busybox");
        }
    }
    image.copy("/usr/local/bin/cuda-probe", probe)?;

    let libc_dir = library_dir(&artifacts.fake_cuda)?;
    let lib = |name: &str| format!("/usr{}/{name}", strip_usr(&libc_dir));
    image.copy(&lib("libcuda.so.1"), &artifacts.fake_cuda)?;
    image.copy(&lib("libnvidia-ml.so.1"), &artifacts.fake_nvml)?;
    for binary in [
        &busybox,
        probe,
        &artifacts.fake_cuda,
        &artifacts.fake_nvml,
        &artifacts.interposer,
    ] {
        for dependency in shared_libraries(binary)? {
            let path = format!("/usr{}", strip_usr(&dependency.display().to_string()));
            image.copy(&path, &dependency)?;
        }
    }
    image.command(&["/bin/sh"]);
    Ok(image)
}

fn strip_usr(path: &str) -> String {
    path.strip_prefix("/usr").unwrap_or(path).to_owned()
}

fn gcc(sources: &[PathBuf], out: &Path, flags: &[&str]) -> Result<(), Error> {
    let output = Command::new("gcc")
        .args(sources)
        .arg("-o")
        .arg(out)
        .args(flags)
        .output()
        .map_err(Error::io("run gcc", out))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "gcc failed building {}: {}",
            out.display(),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

fn which(program: &str) -> Result<PathBuf, Error> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            Error::Config(format!(
                "{program} is not installed (Debian: apt-get install busybox-static)"
            ))
        })
}

fn busybox_applets(busybox: &Path) -> Result<Vec<String>, Error> {
    let output = Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(Error::io("run", busybox))?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| !l.is_empty() && !l.contains('/'))
        .map(str::to_owned)
        .collect())
}

/// The shared libraries `binary` loads, by `ldd` (none for a static binary).
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, Error> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(Error::io("run ldd on", binary))?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)".
            let path = line.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// The directory of the C library `binary` loads: on the loader's default
/// search path, so the fake driver goes there too.
fn library_dir(binary: &Path) -> Result<String, Error> {
    shared_libraries(binary)?
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == "libc.so.6"))
        .and_then(|p| p.parent().map(|d| d.display().to_string()))
        .ok_or_else(|| {
            Error::Config(format!(
                "cannot tell where {} finds libc.so.6",
                binary.display()
            ))
        })
}

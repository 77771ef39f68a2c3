//! The two images real nodes run in the tests and the demo:
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

use super::rootfs::{self, Account};
use crate::oci::{Archive, Image};
use crate::{artifacts::Artifacts, error::Error, tools};

/// The sandbox image every node's containerd is configured with.
pub const PAUSE_IMAGE: &str = "tessera.local/pause:v1";
/// The image GPU pods of the tests and the demo run.
pub const CUDA_IMAGE: &str = "tessera.local/cuda-demo:v1";

/// Builds both images into `out_dir`, compiling in `work`.
pub fn build(out_dir: &Path, work: &Path, artifacts: &Artifacts) -> Result<Vec<Archive>, Error> {
    let pause = work.join("pause");
    rootfs::gcc(
        &[tools::repo_root().join("e2e/images/pause.c")],
        &pause,
        &["-static", "-Os"],
    )?;
    let mut image = Image::new(PAUSE_IMAGE);
    image.copy("/pause", &pause)?.command(&["/pause"]);
    let pause = image.write_archive(&out_dir.join("pause.tar"))?;

    let probe = work.join("cuda-probe");
    rootfs::gcc(
        std::slice::from_ref(&artifacts.probe_source),
        &probe,
        &["-std=c11", "-O1", "-pthread", "-DLOADER_PROCADDR", "-ldl"],
    )?;
    let cuda = cuda_image(artifacts, &probe)?.write_archive(&out_dir.join("cuda-demo.tar"))?;
    Ok(vec![pause, cuda])
}

fn cuda_image(artifacts: &Artifacts, probe: &Path) -> Result<Image, Error> {
    let mut image = Image::new(CUDA_IMAGE);
    rootfs::merged_usr_links(&mut image);
    rootfs::base(&mut image, Account::ROOT, "/bin/sh");
    image.dir("/etc").dir("/proc").dir("/sys").dir("/dev");

    let busybox = tools::system_program("busybox", "busybox-static")?;
    rootfs::program(&mut image, "/usr/bin/busybox", &busybox)?;
    for applet in busybox_applets(&busybox)? {
        if applet != "busybox" {
            image.symlink(&format!("/usr/bin/{applet}"), "busybox");
        }
    }
    rootfs::program(&mut image, "/usr/local/bin/cuda-probe", probe)?;

    // The fake driver goes beside the C library, on the loader's default
    // search path, where the real one would be.
    let libc_dir = library_dir(&artifacts.fake_cuda)?;
    let lib = |name: &str| rootfs::merged_usr(&libc_dir.join(name)).0;
    image.copy(&lib("libcuda.so.1"), &artifacts.fake_cuda)?;
    image.copy(&lib("libnvidia-ml.so.1"), &artifacts.fake_nvml)?;
    for library in [
        &artifacts.fake_cuda,
        &artifacts.fake_nvml,
        &artifacts.interposer,
    ] {
        rootfs::libraries(&mut image, library)?;
    }
    image.command(&["/bin/sh"]);
    Ok(image)
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

/// The directory of the C library `binary` loads: on the loader's default
/// search path, so the fake driver goes there too.
fn library_dir(binary: &Path) -> Result<PathBuf, Error> {
    rootfs::shared_libraries(binary)?
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == "libc.so.6"))
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .ok_or_else(|| {
            Error::Config(format!(
                "cannot tell where {} finds libc.so.6",
                binary.display()
            ))
        })
}

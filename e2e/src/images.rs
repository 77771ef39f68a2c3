//! Container images built from files on this machine, as OCI image-layout
//! archives ([`crate::oci`]), without a Docker daemon:
//!
//! - Tessera's own, which the Helm chart runs (`make images`,
//!   [`build_components`]): `tessera-controller`, `tessera-node-agent` and
//!   `kube-scheduler`. See `docs/images.md`.
//! - The two the harness's real nodes need besides ([`build`]): the pod
//!   sandbox [`PAUSE_IMAGE`] and the GPU workload [`CUDA_IMAGE`].
//!
//! [`build_all`] builds all five for a local cluster that installs the chart.

mod components;
mod demo;
pub mod rootfs;

use std::path::{Path, PathBuf};

pub use components::{
    CA_BUNDLE, ComponentInputs, DEFAULT_REGISTRY, INTERPOSER_PATH, ImageOptions,
    KUBE_SCHEDULER_REPOSITORY, VERSION, build_components,
};
pub use demo::{CUDA_IMAGE, PAUSE_IMAGE};

use crate::oci::Archive;
use crate::{artifacts::Artifacts, error::Error, tools};

/// Archives ready for `ctr images import`.
#[derive(Debug, Clone)]
pub struct Archives {
    /// Every archive, one image each, in import order.
    pub paths: Vec<PathBuf>,
    /// The same archives with their references and manifest digests.
    pub images: Vec<Archive>,
}

impl Archives {
    fn new(images: Vec<Archive>) -> Self {
        Self {
            paths: images.iter().map(|a| a.path.clone()).collect(),
            images,
        }
    }

    /// These archives without the images whose repository's last part is one
    /// of `names`: what a node that never runs those images imports (every
    /// imported image is a copy in the node's content store and another in
    /// its snapshots).
    pub fn except(&self, names: &[&str]) -> Self {
        let kept = self.images.iter().filter(|image| {
            split_reference(&image.reference)
                .and_then(|(repository, _)| repository.rsplit('/').next())
                .is_none_or(|last| !names.contains(&last))
        });
        Self::new(kept.cloned().collect())
    }

    /// The repository and tag of the image whose repository's last part is
    /// `name` (`tessera-controller` → `("ghcr.io/tessera-gpu/tessera-controller",
    /// "0.1.0")`), for chart values.
    pub fn reference(&self, name: &str) -> Option<(String, String)> {
        self.images.iter().find_map(|image| {
            let (repository, tag) = split_reference(&image.reference)?;
            (repository.rsplit('/').next() == Some(name))
                .then(|| (repository.to_owned(), tag.to_owned()))
        })
    }
}

/// `registry/name:tag` split at the tag's colon (a registry's port is not a
/// tag).
fn split_reference(reference: &str) -> Option<(&str, &str)> {
    let (repository, tag) = reference.rsplit_once(':')?;
    (!tag.contains('/')).then_some((repository, tag))
}

/// Builds the pause and CUDA demo images into `out_dir` (reusing nothing: it
/// takes a second).
pub fn build(out_dir: &Path, artifacts: &Artifacts) -> Result<Archives, Error> {
    let work = work_dir(out_dir)?;
    Ok(Archives::new(demo::build(out_dir, &work, artifacts)?))
}

/// Builds every image a local cluster installing the chart needs into
/// `out_dir`: the pause and CUDA demo images, and Tessera's three from
/// `artifacts` and the tools' kube-scheduler, named with the default registry
/// and tag.
pub fn build_all(out_dir: &Path, artifacts: &Artifacts) -> Result<Archives, Error> {
    let work = work_dir(out_dir)?;
    let mut images = demo::build(out_dir, &work, artifacts)?;
    let inputs = ComponentInputs::new(
        artifacts.controller.clone(),
        artifacts.agent.clone(),
        artifacts.interposer.clone(),
        tools::binary("kube-scheduler")?,
    )?;
    images.extend(build_components(
        out_dir,
        &inputs,
        &ImageOptions::default(),
    )?);
    Ok(Archives::new(images))
}

fn work_dir(out_dir: &Path) -> Result<PathBuf, Error> {
    let work = out_dir.join("build");
    std::fs::create_dir_all(&work).map_err(Error::io("create directory", &work))?;
    Ok(work)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_at_the_tag_and_are_found_by_name() {
        let archive = |reference: &str| Archive {
            reference: reference.to_owned(),
            path: PathBuf::from("x.tar"),
            digest: String::new(),
        };
        let archives = Archives::new(vec![
            archive("registry.local:5000/team/tessera-controller:dev"),
            archive("tessera.local/kube-scheduler:v1.36.3"),
        ]);
        assert_eq!(
            archives.reference("tessera-controller"),
            Some((
                "registry.local:5000/team/tessera-controller".to_owned(),
                "dev".to_owned()
            ))
        );
        assert_eq!(
            archives.reference("kube-scheduler"),
            Some((
                "tessera.local/kube-scheduler".to_owned(),
                "v1.36.3".to_owned()
            ))
        );
        assert_eq!(archives.reference("controller"), None);
        let rest = archives.except(&["tessera-controller"]);
        assert_eq!(rest.paths.len(), 1);
        assert_eq!(rest.reference("tessera-controller"), None);
        assert!(rest.reference("kube-scheduler").is_some());
        assert_eq!(split_reference("registry.local:5000/x"), None);
    }
}

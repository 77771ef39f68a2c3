//! Writes container images as OCI image-layout archives, built from files on
//! this machine, for `ctr image import`: the harness's nodes never pull.
//!
//! An image here is one layer (a tar of the listed files, with every parent
//! directory), an image config (entrypoint and environment) and a manifest,
//! named by the `io.containerd.image.name` annotation of the index. Archives
//! are deterministic: entries sorted, owner root, mtime 0.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::Error;

/// What one path in the image holds.
#[derive(Debug, Clone)]
enum Entry {
    Dir,
    File { data: Vec<u8>, mode: u32 },
    Symlink(String),
}

/// An image being assembled.
#[derive(Debug, Clone)]
pub struct Image {
    name: String,
    entries: BTreeMap<PathBuf, Entry>,
    command: Vec<String>,
    env: Vec<String>,
}

impl Image {
    /// An empty image called `name` (e.g. `tessera.local/pause:v1`).
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            entries: BTreeMap::new(),
            command: Vec::new(),
            env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".to_owned()],
        }
    }

    /// The image's reference.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds a directory (and its parents).
    pub fn dir(&mut self, path: &str) -> &mut Self {
        let path = relative(path);
        self.parents(&path);
        self.entries.insert(path, Entry::Dir);
        self
    }

    /// Adds `source` from this machine at `path`, keeping its permission bits.
    pub fn copy(&mut self, path: &str, source: &Path) -> Result<&mut Self, Error> {
        use std::os::unix::fs::PermissionsExt;
        let data = fs::read(source).map_err(Error::io("read image file", source))?;
        let mode = fs::metadata(source)
            .map_err(Error::io("stat image file", source))?
            .permissions()
            .mode()
            & 0o7777;
        Ok(self.bytes(path, data, mode))
    }

    /// Adds a file with these contents and permission bits.
    pub fn bytes(&mut self, path: &str, data: impl Into<Vec<u8>>, mode: u32) -> &mut Self {
        let path = relative(path);
        self.parents(&path);
        self.entries.insert(
            path,
            Entry::File {
                data: data.into(),
                mode,
            },
        );
        self
    }

    /// Adds a symbolic link at `path` pointing to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        let path = relative(path);
        self.parents(&path);
        self.entries.insert(path, Entry::Symlink(target.to_owned()));
        self
    }

    /// Sets the command a container runs when the pod gives none.
    pub fn command(&mut self, command: &[&str]) -> &mut Self {
        self.command = command.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Adds `NAME=value` to the image's environment.
    pub fn env(&mut self, name: &str, value: &str) -> &mut Self {
        self.env.push(format!("{name}={value}"));
        self
    }

    fn parents(&mut self, path: &Path) {
        for parent in path.ancestors().skip(1) {
            if !parent.as_os_str().is_empty() {
                self.entries
                    .entry(parent.to_path_buf())
                    .or_insert(Entry::Dir);
            }
        }
    }

    /// The layer: a tar of every entry.
    fn layer(&self) -> Result<Vec<u8>, std::io::Error> {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_gnu();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            match entry {
                Entry::Dir => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(0o755);
                    header.set_size(0);
                    tar.append_data(&mut header, path, std::io::empty())?;
                }
                Entry::File { data, mode } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    tar.append_data(&mut header, path, data.as_slice())?;
                }
                Entry::Symlink(target) => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    tar.append_link(&mut header, path, target)?;
                }
            }
        }
        tar.into_inner()
    }

    /// Writes the image as an OCI image-layout tar archive at `out`.
    pub fn write_archive(&self, out: &Path) -> Result<(), Error> {
        let io = |e: std::io::Error| Error::Io {
            context: "write image archive",
            path: out.to_owned(),
            source: e,
        };
        let layer = self.layer().map_err(io)?;
        let layer_digest = digest(&layer);
        let config = serde_json::to_vec(&json!({
            "architecture": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
            "os": "linux",
            "config": {"Cmd": self.command, "Env": self.env},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }))
        .map_err(|e| Error::Config(e.to_string()))?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest(&config), "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest, "size": layer.len(),
            }],
        }))
        .map_err(|e| Error::Config(e.to_string()))?;
        let tag = self.name.rsplit_once(':').map_or("latest", |(_, t)| t);
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest(&manifest), "size": manifest.len(),
                "annotations": {
                    "io.containerd.image.name": self.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        }))
        .map_err(|e| Error::Config(e.to_string()))?;

        let mut archive = tar::Builder::new(Vec::new());
        let mut add = |path: &str, data: &[u8]| -> std::io::Result<()> {
            let mut header = tar::Header::new_gnu();
            header.set_mode(0o644);
            header.set_mtime(0);
            header.set_size(data.len() as u64);
            archive.append_data(&mut header, path, data)
        };
        add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(io)?;
        add("index.json", &index).map_err(io)?;
        for blob in [&layer, &config, &manifest] {
            let name = format!("blobs/sha256/{}", &digest(blob)["sha256:".len()..]);
            add(&name, blob).map_err(io)?;
        }
        let bytes = archive.into_inner().map_err(io)?;
        let tmp = out.with_extension("tmp");
        fs::write(&tmp, bytes).map_err(io)?;
        fs::rename(&tmp, out).map_err(io)
    }
}

fn relative(path: &str) -> PathBuf {
    PathBuf::from(path.trim_start_matches('/'))
}

fn digest(data: &[u8]) -> String {
    let hash = Sha256::digest(data);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(archive: &[u8]) -> Vec<String> {
        tar::Archive::new(archive)
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect()
    }

    #[test]
    fn layer_holds_every_parent_and_is_deterministic() {
        let mut image = Image::new("tessera.local/t:v1");
        image
            .bytes("/usr/local/bin/tool", b"#!/bin/sh\n".to_vec(), 0o755)
            .symlink("/bin/sh", "busybox")
            .command(&["/bin/sh"]);
        let layer = image.layer().unwrap();
        assert_eq!(
            names(&layer),
            [
                "bin",
                "bin/sh",
                "usr",
                "usr/local",
                "usr/local/bin",
                "usr/local/bin/tool"
            ]
        );
        assert_eq!(layer, image.layer().unwrap());
    }

    #[test]
    fn archive_is_an_oci_layout_whose_digests_match() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("image.tar");
        let mut image = Image::new("tessera.local/t:v2");
        image.bytes("/hello", b"hi".to_vec(), 0o644);
        image.write_archive(&out).unwrap();
        let bytes = fs::read(&out).unwrap();
        let mut files = BTreeMap::new();
        for entry in tar::Archive::new(bytes.as_slice()).entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
            files.insert(path, data);
        }
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let manifest_ref = &index["manifests"][0];
        assert_eq!(
            manifest_ref["annotations"]["io.containerd.image.name"],
            "tessera.local/t:v2"
        );
        let blob = |d: &serde_json::Value| {
            let d = d.as_str().unwrap();
            let data = &files[&format!("blobs/sha256/{}", &d[7..])];
            assert_eq!(digest(data), d, "blob content matches its digest");
            data.clone()
        };
        let manifest: serde_json::Value =
            serde_json::from_slice(&blob(&manifest_ref["digest"])).unwrap();
        let layer = blob(&manifest["layers"][0]["digest"]);
        assert_eq!(names(&layer), ["hello"]);
        let config: serde_json::Value =
            serde_json::from_slice(&blob(&manifest["config"]["digest"])).unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            manifest["layers"][0]["digest"]
        );
    }
}

//! Writes container images as OCI image-layout archives, built from files on
//! this machine, without a Docker daemon: `ctr images import` reads them, and
//! `skopeo copy oci-archive:…` or `crane push` (on the unpacked layout) push
//! them.
//!
//! An image here is one uncompressed layer (a tar of the listed files, with
//! every parent directory), an image config and a manifest (both
//! [`oci_spec`] types), and an `index.json` naming the image for containerd
//! (`io.containerd.image.name`, the full reference) and for OCI tools
//! (`org.opencontainers.image.ref.name`, the tag). Archives are reproducible:
//! entries sorted, fixed owners and modes, one fixed mtime (0 unless
//! [`Image::mtime`] says otherwise, e.g. from `SOURCE_DATE_EPOCH`), no extended
//! attributes, no timestamps in the JSON, and JSON keys in sorted order.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use oci_spec::image::{
    ANNOTATION_REF_NAME, Arch, ConfigBuilder, Descriptor, Digest, ImageConfigurationBuilder,
    ImageIndexBuilder, ImageManifestBuilder, MediaType, OciLayoutBuilder, Os, PlatformBuilder,
    RootFsBuilder,
};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::error::Error;

/// The index annotation `ctr images import` names an image by.
pub const CONTAINERD_IMAGE_NAME: &str = "io.containerd.image.name";

/// The owner of an entry in the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u64,
    /// Group id.
    pub gid: u64,
}

impl Owner {
    /// root:root, the owner of everything unless told otherwise.
    pub const ROOT: Self = Self { uid: 0, gid: 0 };
}

/// What one path in the layer holds.
#[derive(Debug, Clone)]
enum Content {
    Dir,
    /// Contents given in memory.
    Bytes(Vec<u8>),
    /// A file on this machine, read when the layer is written.
    File(PathBuf),
    Symlink(String),
}

#[derive(Debug, Clone)]
struct Entry {
    content: Content,
    mode: u32,
    owner: Owner,
}

/// An image being assembled.
#[derive(Debug, Clone)]
pub struct Image {
    name: String,
    entries: BTreeMap<PathBuf, Entry>,
    entrypoint: Vec<String>,
    command: Vec<String>,
    env: Vec<String>,
    user: Option<String>,
    labels: BTreeMap<String, String>,
    mtime: u64,
}

/// An image archive written by [`Image::write_archive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    /// The image's reference (`registry/name:tag`), as index.json names it.
    pub reference: String,
    /// The archive.
    pub path: PathBuf,
    /// The manifest's digest (`sha256:…`): the image's identity in containerd
    /// and in a registry that stores the layer as it is.
    pub digest: String,
}

impl Image {
    /// An empty image called `name` (e.g. `tessera.local/pause:v1`), with
    /// `PATH=/usr/local/bin:/usr/bin:/bin`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            entries: BTreeMap::new(),
            entrypoint: Vec::new(),
            command: Vec::new(),
            env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".to_owned()],
            user: None,
            labels: BTreeMap::new(),
            mtime: 0,
        }
    }

    /// The image's reference.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds a directory (and its parents), root's, mode 0755.
    pub fn dir(&mut self, path: &str) -> &mut Self {
        self.dir_with(path, 0o755, Owner::ROOT)
    }

    /// Adds a directory (and its parents) with this mode and owner (e.g.
    /// `/tmp`, 01777).
    pub fn dir_with(&mut self, path: &str, mode: u32, owner: Owner) -> &mut Self {
        self.insert(path, Content::Dir, mode, owner)
    }

    /// Adds `source` from this machine at `path` (symbolic links followed),
    /// mode 0755 when the source is executable by anyone, else 0644; root's.
    /// The contents are read when the archive is written.
    pub fn copy(&mut self, path: &str, source: &Path) -> Result<&mut Self, Error> {
        use std::os::unix::fs::PermissionsExt;
        let metadata = fs::metadata(source).map_err(Error::io("stat image file", source))?;
        if !metadata.is_file() {
            return Err(Error::Config(format!(
                "{} is not a file (wanted at {path} in {})",
                source.display(),
                self.name
            )));
        }
        let mode = if metadata.permissions().mode() & 0o111 != 0 {
            0o755
        } else {
            0o644
        };
        Ok(self.insert(path, Content::File(source.to_owned()), mode, Owner::ROOT))
    }

    /// Adds a file with these contents and permission bits, root's.
    pub fn bytes(&mut self, path: &str, data: impl Into<Vec<u8>>, mode: u32) -> &mut Self {
        self.insert(path, Content::Bytes(data.into()), mode, Owner::ROOT)
    }

    /// Adds a symbolic link at `path` pointing to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.insert(
            path,
            Content::Symlink(target.to_owned()),
            0o777,
            Owner::ROOT,
        )
    }

    /// Sets the command a container runs when the pod gives none (`Cmd`;
    /// the arguments of the entrypoint when there is one).
    pub fn command(&mut self, command: &[&str]) -> &mut Self {
        self.command = command.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Sets the entrypoint: what a pod's `args` are given to.
    pub fn entrypoint(&mut self, entrypoint: &[&str]) -> &mut Self {
        self.entrypoint = entrypoint.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Sets `NAME=value` in the image's environment (replacing `NAME`).
    pub fn env(&mut self, name: &str, value: &str) -> &mut Self {
        let prefix = format!("{name}=");
        self.env.retain(|e| !e.starts_with(&prefix));
        self.env.push(format!("{prefix}{value}"));
        self
    }

    /// Sets the user containers run as (`uid:gid`).
    pub fn user(&mut self, user: &str) -> &mut Self {
        self.user = Some(user.to_owned());
        self
    }

    /// Adds a label to the image config (`org.opencontainers.image.*`).
    pub fn label(&mut self, key: &str, value: &str) -> &mut Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Sets the mtime of every tar entry, in seconds since the epoch (0
    /// unless set; `SOURCE_DATE_EPOCH` for reproducible builds).
    pub fn mtime(&mut self, seconds: u64) -> &mut Self {
        self.mtime = seconds;
        self
    }

    fn insert(&mut self, path: &str, content: Content, mode: u32, owner: Owner) -> &mut Self {
        let path = PathBuf::from(path.trim_start_matches('/'));
        for parent in path.ancestors().skip(1) {
            if !parent.as_os_str().is_empty() {
                self.entries.entry(parent.to_path_buf()).or_insert(Entry {
                    content: Content::Dir,
                    mode: 0o755,
                    owner: Owner::ROOT,
                });
            }
        }
        self.entries.insert(
            path,
            Entry {
                content,
                mode,
                owner,
            },
        );
        self
    }

    /// Writes the layer, a tar of every entry in path order, to `out`.
    fn write_layer(&self, out: impl Write) -> io::Result<()> {
        let mut tar = tar::Builder::new(out);
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_gnu();
            header.set_uid(entry.owner.uid);
            header.set_gid(entry.owner.gid);
            header.set_mtime(self.mtime);
            header.set_mode(entry.mode);
            match &entry.content {
                Content::Dir => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_size(0);
                    tar.append_data(&mut header, path, io::empty())?;
                }
                Content::Bytes(data) => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(data.len() as u64);
                    tar.append_data(&mut header, path, data.as_slice())?;
                }
                Content::File(source) => {
                    let file = File::open(source)?;
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(file.metadata()?.len());
                    tar.append_data(&mut header, path, file)?;
                }
                Content::Symlink(target) => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_size(0);
                    tar.append_link(&mut header, path, target)?;
                }
            }
        }
        tar.into_inner()?.flush()
    }

    /// Writes the image as an OCI image-layout tar archive at `out` (through
    /// a temporary file beside it) and returns its manifest digest.
    pub fn write_archive(&self, out: &Path) -> Result<Archive, Error> {
        let io = |context: &'static str| Error::io(context, out);
        let layer_file = out.with_extension("layer.tmp");
        let layer = {
            let file = File::create(&layer_file).map_err(io("create image layer"))?;
            let mut hashing = Hashing::new(BufWriter::new(file));
            self.write_layer(&mut hashing)
                .map_err(io("write image layer"))?;
            hashing.finish()
        };
        let result = self.write_layout(out, &layer_file, &layer);
        let _ = fs::remove_file(&layer_file);
        result
    }

    fn write_layout(&self, out: &Path, layer_file: &Path, layer: &Blob) -> Result<Archive, Error> {
        let spec = |e: oci_spec::OciSpecError| Error::Config(format!("image {}: {e}", self.name));
        let mut config = ConfigBuilder::default().env(self.env.clone());
        if !self.entrypoint.is_empty() {
            config = config.entrypoint(self.entrypoint.clone());
        }
        if !self.command.is_empty() {
            config = config.cmd(self.command.clone());
        }
        if let Some(user) = &self.user {
            config = config.user(user.clone());
        }
        if !self.labels.is_empty() {
            config = config.labels(self.labels.clone().into_iter().collect::<HashMap<_, _>>());
        }
        let config = ImageConfigurationBuilder::default()
            .architecture(architecture())
            .os(Os::Linux)
            .config(config.build().map_err(spec)?)
            .rootfs(
                RootFsBuilder::default()
                    .typ("layers")
                    .diff_ids(vec![layer.digest.clone()])
                    .build()
                    .map_err(spec)?,
            )
            .build()
            .map_err(spec)?;
        let config = Blob::of(canonical_json(&config)?);
        let manifest = ImageManifestBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageManifest)
            .config(config.descriptor(MediaType::ImageConfig)?)
            .layers(vec![layer.descriptor(MediaType::ImageLayer)?])
            .build()
            .map_err(spec)?;
        let manifest = Blob::of(canonical_json(&manifest)?);

        let tag = self.name.rsplit_once(':').map_or("latest", |(_, t)| t);
        let mut entry = manifest.descriptor(MediaType::ImageManifest)?;
        entry.set_annotations(Some(HashMap::from([
            (CONTAINERD_IMAGE_NAME.to_owned(), self.name.clone()),
            (ANNOTATION_REF_NAME.to_owned(), tag.to_owned()),
        ])));
        entry.set_platform(Some(
            PlatformBuilder::default()
                .architecture(architecture())
                .os(Os::Linux)
                .build()
                .map_err(spec)?,
        ));
        let index = ImageIndexBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageIndex)
            .manifests(vec![entry])
            .build()
            .map_err(spec)?;
        let layout = OciLayoutBuilder::default()
            .image_layout_version("1.0.0")
            .build()
            .map_err(spec)?;

        let layout = canonical_json(&layout)?;
        let index = canonical_json(&index)?;
        let tmp = out.with_extension("tmp");
        let write = (|| -> io::Result<()> {
            let file = File::create(&tmp)?;
            let mut archive = Layout {
                tar: tar::Builder::new(BufWriter::new(file)),
                mtime: self.mtime,
            };
            archive.file("oci-layout", &layout)?;
            archive.file("index.json", &index)?;
            archive.dir("blobs")?;
            archive.dir("blobs/sha256")?;
            let mut blobs = [(layer, true), (&config, false), (&manifest, false)];
            blobs.sort_by(|a, b| a.0.digest.cmp(&b.0.digest));
            for (blob, in_file) in blobs {
                let path = format!("blobs/sha256/{}", blob.hex());
                if in_file {
                    archive.stream(&path, blob.size, File::open(layer_file)?)?;
                } else {
                    archive.file(&path, &blob.data)?;
                }
            }
            archive.tar.into_inner()?.into_inner()?.sync_all()?;
            fs::rename(&tmp, out)
        })();
        write.map_err(|e| {
            let _ = fs::remove_file(&tmp);
            Error::Io {
                context: "write image archive",
                path: out.to_owned(),
                source: e,
            }
        })?;
        Ok(Archive {
            reference: self.name.clone(),
            path: out.to_owned(),
            digest: manifest.digest,
        })
    }
}

/// The archive's tar: root's entries, one mtime.
struct Layout<W: Write> {
    tar: tar::Builder<W>,
    mtime: u64,
}

impl<W: Write> Layout<W> {
    fn header(&self, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_mtime(self.mtime);
        header.set_size(size);
        header
    }

    fn dir(&mut self, path: &str) -> io::Result<()> {
        let mut header = self.header(tar::EntryType::Directory, 0o755, 0);
        self.tar.append_data(&mut header, path, io::empty())
    }

    fn file(&mut self, path: &str, data: &[u8]) -> io::Result<()> {
        self.stream(path, data.len() as u64, data)
    }

    fn stream(&mut self, path: &str, size: u64, data: impl io::Read) -> io::Result<()> {
        let mut header = self.header(tar::EntryType::Regular, 0o644, size);
        self.tar.append_data(&mut header, path, data)
    }
}

/// A blob: its digest and size, and its bytes when they are small (config,
/// manifest) rather than in a file (the layer).
#[derive(Debug)]
struct Blob {
    digest: String,
    size: u64,
    data: Vec<u8>,
}

impl Blob {
    fn of(data: Vec<u8>) -> Self {
        Self {
            digest: digest(&data),
            size: data.len() as u64,
            data,
        }
    }

    fn hex(&self) -> &str {
        self.digest.trim_start_matches("sha256:")
    }

    fn descriptor(&self, media_type: MediaType) -> Result<Descriptor, Error> {
        let digest = Digest::from_str(&self.digest)
            .map_err(|e| Error::Config(format!("digest {}: {e}", self.digest)))?;
        Ok(Descriptor::new(media_type, self.size, digest))
    }
}

/// A writer that hashes and counts what goes through it.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    size: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            size: 0,
        }
    }

    fn finish(self) -> Blob {
        Blob {
            digest: format!("sha256:{}", hex(&self.hasher.finalize())),
            size: self.size,
            data: Vec::new(),
        }
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// This machine's architecture as OCI names it (Go's GOARCH).
fn architecture() -> Arch {
    match std::env::consts::ARCH {
        "x86_64" => Arch::Amd64,
        "aarch64" => Arch::ARM64,
        other => Arch::from(other),
    }
}

/// `value` as compact JSON with every object's keys sorted: oci-spec keeps
/// annotations and labels in `HashMap`s, whose order changes from run to run.
fn canonical_json(value: &impl Serialize) -> Result<Vec<u8>, Error> {
    fn sorted(value: Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(String, Value)> = map.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
            }
            Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
            other => other,
        }
    }
    let value = serde_json::to_value(value).map_err(|e| Error::Config(e.to_string()))?;
    serde_json::to_vec(&sorted(value)).map_err(|e| Error::Config(e.to_string()))
}

/// The `sha256:<hex>` digest of `data`.
pub fn digest(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(archive: &[u8]) -> Vec<(String, u64, u64, u32)> {
        tar::Archive::new(archive)
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().display().to_string(),
                    h.uid().unwrap(),
                    h.mtime().unwrap(),
                    h.mode().unwrap(),
                )
            })
            .collect()
    }

    fn layer(image: &Image) -> Vec<u8> {
        let mut out = Vec::new();
        image.write_layer(&mut out).unwrap();
        out
    }

    #[test]
    fn layer_holds_every_parent_sorted_with_fixed_owners_modes_and_mtime() {
        let mut image = Image::new("tessera.local/t:v1");
        image
            .bytes("/usr/local/bin/tool", b"#!/bin/sh\n".to_vec(), 0o755)
            .symlink("/bin/sh", "busybox")
            .dir_with(
                "/home/nonroot",
                0o700,
                Owner {
                    uid: 65532,
                    gid: 65532,
                },
            )
            .mtime(1_700_000_000)
            .command(&["/bin/sh"]);
        let layer = layer(&image);
        let t = 1_700_000_000;
        assert_eq!(
            entries(&layer),
            [
                ("bin".to_owned(), 0, t, 0o755),
                ("bin/sh".to_owned(), 0, t, 0o777),
                ("home".to_owned(), 0, t, 0o755),
                ("home/nonroot".to_owned(), 65532, t, 0o700),
                ("usr".to_owned(), 0, t, 0o755),
                ("usr/local".to_owned(), 0, t, 0o755),
                ("usr/local/bin".to_owned(), 0, t, 0o755),
                ("usr/local/bin/tool".to_owned(), 0, t, 0o755),
            ]
        );
        assert_eq!(layer, super::tests::layer(&image));
    }

    #[test]
    fn copied_files_get_fixed_modes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("tool");
        let data = dir.path().join("data");
        fs::write(&tool, "x").unwrap();
        fs::write(&data, "y").unwrap();
        fs::set_permissions(&tool, fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(&data, fs::Permissions::from_mode(0o600)).unwrap();
        let mut image = Image::new("tessera.local/t:v1");
        image
            .copy("/tool", &tool)
            .unwrap()
            .copy("/data", &data)
            .unwrap();
        let modes: Vec<(String, u32)> = entries(&layer(&image))
            .into_iter()
            .map(|(p, _, _, m)| (p, m))
            .collect();
        assert_eq!(
            modes,
            [("data".to_owned(), 0o644), ("tool".to_owned(), 0o755)]
        );
        assert!(image.copy("/missing", &dir.path().join("missing")).is_err());
    }

    #[test]
    fn env_replaces_a_name_already_set() {
        let mut image = Image::new("tessera.local/t:v1");
        image.env("PATH", "/bin").env("A", "1");
        assert_eq!(image.env, ["PATH=/bin", "A=1"]);
    }

    #[test]
    fn json_keys_are_sorted_at_every_level() {
        let inner: HashMap<String, u32> = (0..20).map(|i| (format!("k{i:02}"), i)).collect();
        let outer = HashMap::from([("b", inner.clone()), ("a", inner)]);
        let json = String::from_utf8(canonical_json(&outer).unwrap()).unwrap();
        let sorted: String = (0..20)
            .map(|i| format!("\"k{i:02}\":{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(json, format!("{{\"a\":{{{sorted}}},\"b\":{{{sorted}}}}}"));
    }

    #[test]
    fn archive_is_an_oci_layout_whose_digests_match() {
        use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest};
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("image.tar");
        let mut image = Image::new("tessera.local/t:v2");
        image
            .bytes("/hello", b"hi".to_vec(), 0o644)
            .user("65532:65532");
        let archive = image.write_archive(&out).unwrap();
        let bytes = fs::read(&out).unwrap();
        let mut files = BTreeMap::new();
        for entry in tar::Archive::new(bytes.as_slice()).entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
            files.insert(path, data);
        }
        let index = ImageIndex::from_reader(files["index.json"].as_slice()).unwrap();
        let entry = &index.manifests()[0];
        let annotations = entry.annotations().clone().unwrap();
        assert_eq!(annotations[CONTAINERD_IMAGE_NAME], "tessera.local/t:v2");
        assert_eq!(annotations[ANNOTATION_REF_NAME], "v2");
        assert_eq!(entry.digest().to_string(), archive.digest);
        let blob = |d: &Descriptor| {
            let data = &files[&format!("blobs/sha256/{}", d.digest().digest())];
            assert_eq!(digest(data), d.digest().to_string());
            assert_eq!(data.len() as u64, d.size());
            data.clone()
        };
        let manifest = ImageManifest::from_reader(blob(entry).as_slice()).unwrap();
        let layer = blob(&manifest.layers()[0]);
        let names: Vec<String> = entries(&layer).into_iter().map(|e| e.0).collect();
        assert_eq!(names, ["hello"]);
        let config = ImageConfiguration::from_reader(blob(manifest.config()).as_slice()).unwrap();
        assert_eq!(
            config.rootfs().diff_ids()[0],
            manifest.layers()[0].digest().to_string()
        );
        assert_eq!(
            config.config().as_ref().unwrap().user().as_deref(),
            Some("65532:65532")
        );
        assert!(!dir.path().join("image.layer.tmp").exists());
        assert!(!dir.path().join("image.tmp").exists());
    }
}

//! Tessera's images (`make images`, `tessera_e2e::images::build_components`):
//! reproducible, valid OCI image layouts named for containerd, the right users,
//! the interposer in the agent's image, and every file `ldd` says a program
//! needs. Built from the debug build outputs of `cargo build --workspace`
//! (found as `tessera_e2e::artifacts` finds them) and a small static stand-in
//! for kube-scheduler; no root, network or control plane.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use oci_spec::image::{
    ANNOTATION_REF_NAME, ANNOTATION_SOURCE, ANNOTATION_TITLE, ANNOTATION_VERSION, Descriptor,
    ImageConfiguration, ImageIndex, ImageManifest, MediaType, OciLayout,
};
use pretty_assertions::assert_eq;
use sha2::{Digest, Sha256};
use tessera_e2e::artifacts::Artifacts;
use tessera_e2e::images::{self, ComponentInputs, ImageOptions, rootfs};
use tessera_e2e::oci::{Archive, CONTAINERD_IMAGE_NAME};

const CONTROLLER: &str = "ghcr.io/tessera-gpu/tessera-controller:0.1.0";
const AGENT: &str = "ghcr.io/tessera-gpu/tessera-node-agent:0.1.0";
const SCHEDULER: &str = "tessera.local/kube-scheduler:v1.36.3";

/// The inputs: the debug build outputs and a stand-in kube-scheduler, static
/// like the real one, that reports v1.36.3.
fn inputs() -> &'static ComponentInputs {
    static INPUTS: OnceLock<ComponentInputs> = OnceLock::new();
    INPUTS.get_or_init(|| {
        let artifacts = Artifacts::locate().expect("debug build outputs");
        // Cargo's directory for integration tests' files; built under a
        // name of this process's, then moved into place.
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("images");
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join(format!("kube-scheduler-{}.c", std::process::id()));
        std::fs::write(
            &source,
            "#include <stdio.h>\nint main(void) { puts(\"Kubernetes v1.36.3\"); return 0; }\n",
        )
        .unwrap();
        let built = source.with_extension("");
        rootfs::gcc(std::slice::from_ref(&source), &built, &["-static", "-Os"]).unwrap();
        let scheduler = dir.join("kube-scheduler");
        std::fs::rename(&built, &scheduler).unwrap();
        std::fs::remove_file(&source).unwrap();
        ComponentInputs::new(
            artifacts.controller,
            artifacts.agent,
            artifacts.interposer,
            scheduler,
        )
        .unwrap()
    })
}

fn build(options: &ImageOptions) -> (tempfile::TempDir, Vec<Archive>) {
    let dir = tempfile::tempdir().unwrap();
    let archives = images::build_components(dir.path(), inputs(), options).unwrap();
    (dir, archives)
}

/// One build with the default names, shared by the tests that only read it.
fn built() -> &'static [Checked] {
    static BUILT: OnceLock<Vec<Checked>> = OnceLock::new();
    BUILT.get_or_init(|| {
        let (dir, archives) = build(&ImageOptions::default());
        let checked = archives.iter().map(|a| check_layout(a, 0)).collect();
        drop(dir);
        checked
    })
}

fn image(reference: &str) -> &'static Checked {
    built()
        .iter()
        .find(|c| c.archive.reference == reference)
        .unwrap_or_else(|| panic!("no image {reference}"))
}

/// An image read back from its archive, every check of the layout passed.
struct Checked {
    archive: Archive,
    /// The sha256 of the whole archive file.
    file_digest: String,
    config: ImageConfiguration,
    layer: Layer,
}

impl Checked {
    fn user(&self) -> Option<String> {
        self.config.config().as_ref()?.user().clone()
    }

    fn env(&self) -> Vec<String> {
        self.config.config().clone().unwrap().env().clone().unwrap()
    }

    fn labels(&self) -> HashMap<String, String> {
        self.config
            .config()
            .clone()
            .unwrap()
            .labels()
            .clone()
            .unwrap()
    }

    fn entrypoint(&self) -> Vec<String> {
        self.config
            .config()
            .clone()
            .unwrap()
            .entrypoint()
            .clone()
            .unwrap()
    }
}

/// One entry of a layer.
#[derive(Debug, Clone)]
struct Node {
    kind: tar::EntryType,
    mode: u32,
    uid: u64,
    gid: u64,
    data: Vec<u8>,
    link: Option<String>,
}

#[derive(Debug, Default)]
struct Layer {
    nodes: BTreeMap<String, Node>,
}

impl Layer {
    /// Reads a layer and checks it is deterministic: entries in path order,
    /// each after its parent directory, mtime `mtime`, only directories,
    /// regular files and symbolic links (no PAX headers, so no xattrs).
    fn read(data: &[u8], mtime: u64) -> Self {
        let mut layer = Self::default();
        let mut previous = String::new();
        for entry in tar::Archive::new(data).entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let header = entry.header().clone();
            let kind = header.entry_type();
            assert!(
                matches!(
                    kind,
                    tar::EntryType::Directory | tar::EntryType::Regular | tar::EntryType::Symlink
                ),
                "{path}: {kind:?}"
            );
            assert!(path > previous, "{path} after {previous}");
            if let Some(parent) = Path::new(&path)
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
            {
                let parent = parent.display().to_string();
                assert_eq!(
                    layer.nodes.get(&parent).map(|n| n.kind),
                    Some(tar::EntryType::Directory),
                    "parent of {path}"
                );
            }
            assert_eq!(header.mtime().unwrap(), mtime, "{path}");
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            let link = entry.link_name().unwrap().map(|l| l.display().to_string());
            layer.nodes.insert(
                path.clone(),
                Node {
                    kind,
                    mode: header.mode().unwrap(),
                    uid: header.uid().unwrap(),
                    gid: header.gid().unwrap(),
                    data: bytes,
                    link,
                },
            );
            previous = path;
        }
        layer
    }

    /// The entry at absolute `path`, following symbolic links in the layer
    /// as the container would.
    fn resolve(&self, path: &str) -> Option<&Node> {
        let mut pending: Vec<String> = path
            .split('/')
            .filter(|c| !c.is_empty())
            .rev()
            .map(str::to_owned)
            .collect();
        let mut current: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(component) = pending.pop() {
            match component.as_str() {
                "." => continue,
                ".." => {
                    current.pop();
                    continue;
                }
                _ => current.push(component),
            }
            let node = self.nodes.get(&current.join("/"))?;
            if let Some(target) = node
                .link
                .as_ref()
                .filter(|_| node.kind == tar::EntryType::Symlink)
            {
                hops += 1;
                assert!(hops < 40, "symlink loop at {path}");
                current.pop();
                if target.starts_with('/') {
                    current.clear();
                }
                pending.extend(
                    target
                        .split('/')
                        .filter(|c| !c.is_empty())
                        .rev()
                        .map(str::to_owned),
                );
            }
        }
        self.nodes.get(&current.join("/"))
    }

    fn file(&self, path: &str) -> &Node {
        let node = self
            .resolve(path)
            .unwrap_or_else(|| panic!("{path} is not in the layer"));
        assert_eq!(node.kind, tar::EntryType::Regular, "{path}");
        node
    }
}

fn sha256(data: &[u8]) -> String {
    format!(
        "sha256:{}",
        Sha256::digest(data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// Reads an archive and checks it is an OCI image layout: `oci-layout`,
/// `index.json` naming one manifest for containerd and OCI tools, the
/// manifest, its config and layer, every blob named by its sha256 and of the
/// size its descriptor gives, media types right, no blob left over; the
/// layer's files at `mtime`.
fn check_layout(archive: &Archive, mtime: u64) -> Checked {
    let bytes = std::fs::read(&archive.path).unwrap();
    let mut files = BTreeMap::new();
    for entry in tar::Archive::new(bytes.as_slice()).entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().display().to_string();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        files.insert(path, data);
    }
    let layout = OciLayout::from_reader(files["oci-layout"].as_slice()).unwrap();
    assert_eq!(layout.image_layout_version(), "1.0.0");
    for (path, data) in &files {
        if let Some(hex) = path.strip_prefix("blobs/sha256/") {
            assert_eq!(sha256(data), format!("sha256:{hex}"), "{path}");
        }
    }
    let mut referenced = vec![
        "oci-layout".to_owned(),
        "index.json".to_owned(),
        "blobs".to_owned(),
        "blobs/sha256".to_owned(),
    ];
    let mut blob = |descriptor: &Descriptor, media_type: MediaType| -> Vec<u8> {
        assert_eq!(descriptor.media_type(), &media_type);
        let path = format!("blobs/sha256/{}", descriptor.as_digest_sha256().unwrap());
        let data = files.get(&path).unwrap_or_else(|| panic!("no {path}"));
        assert_eq!(data.len() as u64, descriptor.size(), "{path}");
        referenced.push(path);
        data.clone()
    };

    let index = ImageIndex::from_reader(files["index.json"].as_slice()).unwrap();
    assert_eq!(index.schema_version(), 2);
    assert_eq!(index.media_type(), &Some(MediaType::ImageIndex));
    let [entry] = index.manifests().as_slice() else {
        panic!("one manifest in {}", archive.path.display())
    };
    let annotations = entry.annotations().clone().unwrap();
    let tag = archive.reference.rsplit_once(':').unwrap().1;
    assert_eq!(annotations[CONTAINERD_IMAGE_NAME], archive.reference);
    assert_eq!(annotations[ANNOTATION_REF_NAME], tag);
    let platform = entry.platform().clone().unwrap();
    assert_eq!(platform.os().to_string(), "linux");
    assert_eq!(entry.digest().to_string(), archive.digest);

    let manifest =
        ImageManifest::from_reader(blob(entry, MediaType::ImageManifest).as_slice()).unwrap();
    assert_eq!(manifest.schema_version(), 2);
    assert_eq!(manifest.media_type(), &Some(MediaType::ImageManifest));
    let config = blob(manifest.config(), MediaType::ImageConfig);
    let config = ImageConfiguration::from_reader(config.as_slice()).unwrap();
    let [layer] = manifest.layers().as_slice() else {
        panic!("one layer in {}", archive.path.display())
    };
    let layer_data = blob(layer, MediaType::ImageLayer);
    assert_eq!(config.rootfs().typ(), "layers");
    assert_eq!(config.rootfs().diff_ids(), &[layer.digest().to_string()]);
    assert_eq!(config.os().to_string(), "linux");
    assert_eq!(
        config.architecture().to_string(),
        platform.architecture().to_string()
    );
    assert_eq!(config.created(), &None, "no timestamp in the config");
    referenced.sort();
    assert_eq!(
        referenced,
        files.keys().cloned().collect::<Vec<_>>(),
        "every file of the archive is referenced"
    );

    Checked {
        archive: archive.clone(),
        file_digest: sha256(&bytes),
        config,
        layer: Layer::read(&layer_data, mtime),
    }
}

/// What `ldd` names for `binary` (the test's own reading of its output).
fn ldd(binary: &Path) -> Vec<String> {
    let output = Command::new("ldd").arg(binary).output().unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            assert!(!line.contains("not found"), "{line}");
            let path = line.rsplit("=>").next()?.split_whitespace().next()?;
            path.starts_with('/').then(|| path.to_owned())
        })
        .collect()
}

#[test]
fn building_twice_gives_identical_archives_and_digests() {
    let (_dir, again) = build(&ImageOptions::default());
    assert_eq!(again.len(), built().len());
    for (archive, first) in again.iter().zip(built()) {
        assert_eq!(archive.reference, first.archive.reference);
        assert_eq!(
            archive.digest, first.archive.digest,
            "{}",
            archive.reference
        );
        assert_eq!(archive.path.file_name(), first.archive.path.file_name());
        let bytes = std::fs::read(&archive.path).unwrap();
        assert_eq!(
            sha256(&bytes),
            first.file_digest,
            "{} differs between builds",
            archive.reference
        );
    }
}

#[test]
fn archives_are_oci_layouts_named_for_containerd() {
    let names: Vec<&str> = built()
        .iter()
        .map(|c| c.archive.reference.as_str())
        .collect();
    assert_eq!(names, [CONTROLLER, AGENT, SCHEDULER]);
    for checked in built() {
        let file = checked.archive.path.file_name().unwrap().to_string_lossy();
        let title = &checked.labels()[ANNOTATION_TITLE];
        assert_eq!(file, format!("{title}.tar"));
    }
}

#[test]
fn registry_tag_and_mtime_are_options() {
    let options = ImageOptions {
        registry: "registry.example:5000/team/".to_owned(),
        tag: "dev".to_owned(),
        mtime: 1_700_000_000,
    };
    let (_dir, archives) = build(&options);
    let names: Vec<&str> = archives.iter().map(|a| a.reference.as_str()).collect();
    assert_eq!(
        names,
        [
            "registry.example:5000/team/tessera-controller:dev",
            "registry.example:5000/team/tessera-node-agent:dev",
            SCHEDULER,
        ]
    );
    for (archive, default) in archives.iter().zip(built()) {
        let checked = check_layout(archive, 1_700_000_000);
        assert_ne!(checked.archive.digest, default.archive.digest);
        // The version label is Tessera's version (kube-scheduler's), whatever the tag.
        assert_eq!(checked.labels(), default.labels());
    }
}

#[test]
fn controller_and_scheduler_run_as_nonroot_and_the_agent_as_root() {
    for (reference, user, passwd, group) in [
        (
            CONTROLLER,
            "65532:65532",
            "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
            "nonroot:x:65532:\n",
        ),
        (
            SCHEDULER,
            "65532:65532",
            "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
            "nonroot:x:65532:\n",
        ),
        (
            AGENT,
            "0:0",
            "root:x:0:0:root:/root:/sbin/nologin\n",
            "root:x:0:\n",
        ),
    ] {
        let image = image(reference);
        assert_eq!(image.user().as_deref(), Some(user), "{reference}");
        let layer = &image.layer;
        assert_eq!(
            String::from_utf8_lossy(&layer.file("/etc/passwd").data),
            passwd
        );
        assert_eq!(
            String::from_utf8_lossy(&layer.file("/etc/group").data),
            group
        );
        let home = passwd.split(':').nth(5).unwrap().trim_start_matches('/');
        let home = &layer.nodes[home];
        let (uid, gid) = user.split_once(':').unwrap();
        assert_eq!(
            (home.uid.to_string(), home.gid.to_string(), home.mode),
            (uid.to_owned(), gid.to_owned(), 0o700)
        );
        let tmp = &layer.nodes["tmp"];
        assert_eq!(
            (tmp.kind, tmp.mode, tmp.uid),
            (tar::EntryType::Directory, 0o1777, 0)
        );
        // Everything else is root's and not writable by others.
        for (path, node) in &layer.nodes {
            if path != "tmp" && node.kind != tar::EntryType::Symlink {
                assert_eq!(node.mode & 0o002, 0, "{reference}: {path}");
            }
        }
    }
}

#[test]
fn entrypoints_env_and_labels() {
    let host_ca = std::fs::read(images::CA_BUNDLE).unwrap();
    for (reference, program, source, version, tls) in [
        (
            CONTROLLER,
            "tessera-controller",
            "https://github.com/tessera-gpu/tessera",
            "0.1.0",
            true,
        ),
        (
            AGENT,
            "tessera-node-agent",
            "https://github.com/tessera-gpu/tessera",
            "0.1.0",
            true,
        ),
        (
            SCHEDULER,
            "kube-scheduler",
            "https://github.com/kubernetes/kubernetes",
            "v1.36.3",
            false,
        ),
    ] {
        let image = image(reference);
        assert_eq!(image.entrypoint(), [format!("/usr/local/bin/{program}")]);
        let env = image.env();
        assert!(
            env.contains(&"PATH=/usr/local/bin:/usr/bin:/bin".to_owned()),
            "{env:?}"
        );
        assert_eq!(
            env.contains(&format!("SSL_CERT_FILE={}", images::CA_BUNDLE)),
            tls,
            "{reference}: {env:?}"
        );
        assert_eq!(
            image.layer.resolve(images::CA_BUNDLE).map(|n| &n.data),
            tls.then_some(&host_ca)
        );
        let labels = image.labels();
        assert_eq!(labels[ANNOTATION_SOURCE], source);
        assert_eq!(labels[ANNOTATION_VERSION], version);
        assert_eq!(labels[ANNOTATION_TITLE], program);
    }
}

#[test]
fn agent_image_holds_the_interposer() {
    let layer = &image(AGENT).layer;
    let interposer = layer.file(images::INTERPOSER_PATH);
    assert_eq!(
        images::INTERPOSER_PATH,
        "/opt/tessera/lib/libtessera_vgpu.so"
    );
    assert!(interposer.data == std::fs::read(&inputs().interposer).unwrap());
    assert_eq!(interposer.mode, 0o755);
}

#[test]
fn every_file_ldd_names_for_a_program_is_in_its_image_and_nothing_else() {
    let inputs = inputs();
    for (reference, binary) in [
        (CONTROLLER, &inputs.controller),
        (AGENT, &inputs.agent),
        (SCHEDULER, &inputs.kube_scheduler),
    ] {
        let image = image(reference);
        let program = image.layer.file(&image.entrypoint()[0]);
        assert!(
            program.data == std::fs::read(binary).unwrap(),
            "{reference}: the program"
        );
        assert_eq!(program.mode, 0o755);
        let needed = ldd(binary);
        if reference == SCHEDULER {
            assert_eq!(needed, Vec::<String>::new(), "the stand-in is static");
        } else {
            assert!(needed.iter().any(|l| l.contains("/ld-linux")), "{needed:?}");
            assert!(
                needed.iter().any(|l| l.ends_with("/libc.so.6")),
                "{needed:?}"
            );
        }
        for library in &needed {
            let node = image.layer.file(library);
            assert!(
                node.data == std::fs::read(library).unwrap(),
                "{reference}: {library} holds what it resolves to on this machine"
            );
        }
        // Regular files: the program, its libraries, the accounts and, for
        // the Tessera images, the CA bundle (and the agent's interposer).
        let mut files: Vec<&str> = image
            .layer
            .nodes
            .iter()
            .filter(|(_, n)| n.kind == tar::EntryType::Regular)
            .map(|(p, _)| p.as_str())
            .collect();
        files.sort();
        let mut expected: Vec<String> = needed
            .iter()
            .map(|l| rootfs::merged_usr(Path::new(l)).0)
            .chain([
                image.entrypoint()[0].clone(),
                "/etc/passwd".into(),
                "/etc/group".into(),
            ])
            .chain((reference != SCHEDULER).then(|| images::CA_BUNDLE.to_owned()))
            .chain((reference == AGENT).then(|| images::INTERPOSER_PATH.to_owned()))
            .map(|p| p.trim_start_matches('/').to_owned())
            .collect();
        expected.sort();
        assert_eq!(files, expected, "{reference}");
    }
}

#[test]
fn inputs_are_checked_and_the_scheduler_asked_its_version() {
    let inputs = inputs();
    assert_eq!(inputs.kube_scheduler_version, "v1.36.3");
    let dir = tempfile::tempdir().unwrap();
    let error = ComponentInputs::in_dirs(dir.path(), dir.path())
        .unwrap_err()
        .to_string();
    for missing in [
        "tessera-controller",
        "tessera-node-agent",
        "libtessera_vgpu.so",
        "kube-scheduler",
    ] {
        assert!(error.contains(missing), "{error}");
    }
    // Not a Kubernetes binary: its version is unknown.
    let not_kubernetes = PathBuf::from("/bin/true");
    let error = ComponentInputs::new(
        inputs.controller.clone(),
        inputs.agent.clone(),
        inputs.interposer.clone(),
        not_kubernetes,
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("Kubernetes v"), "{error}");
}

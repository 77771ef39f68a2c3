//! What an image holds besides its own files: an account in `/etc/passwd` and
//! `/etc/group`, `/tmp`, and the shared libraries and loader `ldd` names for a
//! program, copied from this machine.
//!
//! Libraries go where a merged-`/usr` system keeps them: a path under `/lib`,
//! `/lib64` (or `/bin`, `/sbin`) is stored under `/usr`, with `/lib -> usr/lib`
//! style links, as Debian 12 and current distributions lay it out, whatever
//! this machine does. Each file is stored under the name `ldd` gives it,
//! holding the contents of what that name resolves to on this machine.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::Error;
use crate::oci::{Image, Owner};

/// The top-level directories a merged `/usr` replaces with links into `/usr`.
const MERGED: [&str; 6] = ["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// A user (and its group of the same name) that an image runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Account {
    /// The user and group name.
    pub name: &'static str,
    /// The user id and group id.
    pub owner: Owner,
    /// Its home directory, created owned by it (mode 0700).
    pub home: &'static str,
}

impl Account {
    /// root.
    pub const ROOT: Self = Self {
        name: "root",
        owner: Owner::ROOT,
        home: "/root",
    };

    /// The unprivileged user of distroless images (65532).
    pub const NONROOT: Self = Self {
        name: "nonroot",
        owner: Owner {
            uid: 65532,
            gid: 65532,
        },
        home: "/home/nonroot",
    };

    /// The `uid:gid` an image config's `User` names.
    pub fn user(&self) -> String {
        format!("{}:{}", self.owner.uid, self.owner.gid)
    }
}

/// Adds `account` to `/etc/passwd` and `/etc/group` (it is the only one, with
/// no login shell), its home directory and `/tmp` (01777).
pub fn base(image: &mut Image, account: Account, shell: &str) {
    let Account { name, owner, home } = account;
    image.bytes(
        "/etc/passwd",
        format!(
            "{name}:x:{}:{}:{name}:{home}:{shell}\n",
            owner.uid, owner.gid
        ),
        0o644,
    );
    image.bytes("/etc/group", format!("{name}:x:{}:\n", owner.gid), 0o644);
    image.dir_with(home, 0o700, owner);
    image.dir_with("/tmp", 0o1777, Owner::ROOT);
}

/// Adds `binary` from this machine at `path` with every shared library it
/// needs.
pub fn program(image: &mut Image, path: &str, binary: &Path) -> Result<(), Error> {
    image.copy(path, binary)?;
    libraries(image, binary)
}

/// Adds the shared libraries `ldd` names for `binary` (the loader among
/// them; nothing for a static binary), under a merged `/usr`.
pub fn libraries(image: &mut Image, binary: &Path) -> Result<(), Error> {
    let mut links = BTreeSet::new();
    for library in shared_libraries(binary)? {
        let (path, link) = merged_usr(&library);
        image.copy(&path, &library)?;
        links.extend(link);
    }
    for top in links {
        image.symlink(&format!("/{top}"), &format!("usr/{top}"));
    }
    Ok(())
}

/// Adds the links of a merged `/usr` for `/bin`, `/sbin`, `/lib` and `/lib64`.
pub fn merged_usr_links(image: &mut Image) {
    for top in ["bin", "sbin", "lib", "lib64"] {
        image.symlink(&format!("/{top}"), &format!("usr/{top}"));
    }
}

/// Where `path` goes under a merged `/usr`, and the top-level link that path
/// needs (`/lib/x/libc.so.6` → `/usr/lib/x/libc.so.6`, link `lib`).
pub fn merged_usr(path: &Path) -> (String, Option<&'static str>) {
    let text = path.display().to_string();
    let top = path
        .components()
        .nth(1)
        .and_then(|c| c.as_os_str().to_str())
        .and_then(|c| MERGED.iter().find(|m| **m == c));
    match top {
        Some(top) => (format!("/usr{text}"), Some(*top)),
        None => (text, None),
    }
}

/// The shared libraries `binary` loads, loader included, as `ldd` names
/// them; none for a static binary. Fails when `ldd` cannot find one.
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, Error> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(Error::io("run ldd on", binary))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        if format!("{stdout}{stderr}").contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        return Err(Error::Config(format!(
            "ldd {} failed: {}",
            binary.display(),
            stderr.trim()
        )));
    }
    let mut libraries = Vec::new();
    for line in stdout.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)",
        // "/lib64/ld-linux-x86-64.so.2 (0x...)", "linux-vdso.so.1 (0x...)"
        // or "libfoo.so.1 => not found".
        if line.contains("=> not found") {
            return Err(Error::Config(format!(
                "{} needs a library this machine lacks: {}",
                binary.display(),
                line.trim()
            )));
        }
        let path = line
            .split("=>")
            .last()
            .and_then(|s| s.split_whitespace().next());
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            libraries.push(PathBuf::from(path));
        }
    }
    Ok(libraries)
}

/// Compiles C `sources` into `out` with gcc.
pub fn gcc(sources: &[PathBuf], out: &Path, flags: &[&str]) -> Result<(), Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_usr_moves_only_the_merged_directories() {
        let cases = [
            (
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                Some("lib"),
            ),
            (
                "/lib64/ld-linux-x86-64.so.2",
                "/usr/lib64/ld-linux-x86-64.so.2",
                Some("lib64"),
            ),
            (
                "/usr/lib/x86_64-linux-gnu/libm.so.6",
                "/usr/lib/x86_64-linux-gnu/libm.so.6",
                None,
            ),
            ("/opt/x/lib/libfoo.so", "/opt/x/lib/libfoo.so", None),
            ("/library/libbar.so", "/library/libbar.so", None),
        ];
        for (host, image, link) in cases {
            assert_eq!(
                merged_usr(Path::new(host)),
                (image.to_owned(), link),
                "{host}"
            );
        }
    }

    #[test]
    fn a_static_binary_needs_no_library_and_a_dynamic_one_its_loader() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("main.c");
        std::fs::write(&source, "int main(void) { return 0; }\n").unwrap();
        let (fixed, dynamic) = (dir.path().join("static"), dir.path().join("dynamic"));
        gcc(std::slice::from_ref(&source), &fixed, &["-static"]).unwrap();
        gcc(std::slice::from_ref(&source), &dynamic, &[]).unwrap();
        assert_eq!(shared_libraries(&fixed).unwrap(), Vec::<PathBuf>::new());
        let libraries = shared_libraries(&dynamic).unwrap();
        assert!(
            libraries.iter().any(|l| l.ends_with("libc.so.6")),
            "{libraries:?}"
        );
        assert!(
            libraries
                .iter()
                .any(|l| l.to_string_lossy().contains("/ld-")),
            "{libraries:?}"
        );
    }
}

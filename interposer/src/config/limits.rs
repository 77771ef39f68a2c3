//! The node agent's limits file ([`LIMITS_FILE`]): where a container's limit
//! variables come from when it exists. The agent mounts it read-only, so a
//! tenant who sets the variables another way (`envFrom` a ConfigMap, a
//! wrapper script's `export`) cannot loosen them: the environment may repeat
//! what the file says (HAMi's images read it), and anything else is refused.
//!
//! The agent mounts the file's directory beside the container's region
//! directory ([`REGION_DIR`]), always both. A region directory without the
//! file means the file was hidden (the pod mounted a volume of its own over
//! [`tessera_api::env::LIMITS_DIR`]): the limits would then come from the
//! environment, which the tenant controls, so CUDA is refused instead.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::Path;

use tessera_api::env::{LIMITS_FILE, MAX_LIMITS_FILE, is_limit_var, parse_limits_file};

use super::Error;

/// Where the node agent mounts a container's shared region directory (the
/// agent's `contract::CONTAINER_REGION_DIR`, the directory of the region
/// path it sets in `CUDA_DEVICE_MEMORY_SHARED_CACHE`). Kept in step with the
/// agent's by hand: the interposer depends on nothing of the agent.
pub const REGION_DIR: &str = "/var/run/tessera/vgpu";

/// Reads the limits file at `path`; `None` when there is none (a container
/// started outside the agent, or by an agent before the file existed).
pub fn read(path: &Path) -> Result<Option<String>, Error> {
    let unreadable = |why: String| Error::LimitsFile {
        path: path.display().to_string(),
        why,
    };
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(e.to_string())),
    };
    let mut text = String::new();
    file.take(MAX_LIMITS_FILE as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| unreadable(e.to_string()))?;
    Ok(Some(text))
}

/// The variables the configuration is read from.
pub struct Vars {
    /// The limits file's variables, when there is one.
    file: Option<Vec<(String, String)>>,
    env: Vec<(OsString, OsString)>,
}

impl Vars {
    /// The variables of the limits file `file` (its text) over the
    /// environment `env`. Every limit variable the environment sets must
    /// have the file's value.
    pub fn new(
        file: Option<&str>,
        env: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<Self, Error> {
        let env: Vec<(OsString, OsString)> = env.into_iter().collect();
        let Some(text) = file else {
            return Ok(Self { file: None, env });
        };
        let file = parse_limits_file(text)?;
        for (name, value) in &env {
            let Some(name) = name.to_str().filter(|n| is_limit_var(n)) else {
                continue;
            };
            let written = file.iter().find(|(n, _)| n == name).map(|(_, v)| v);
            if written.map(OsStr::new) != Some(value.as_os_str()) {
                return Err(Error::Overridden {
                    name: name.to_owned(),
                    env: value.to_string_lossy().into_owned(),
                    file: written.cloned(),
                });
            }
        }
        Ok(Self {
            file: Some(file),
            env,
        })
    }

    /// `name`'s value: from the limits file for a limit variable when there
    /// is one, else from the environment.
    pub fn get(&self, name: &str) -> Option<OsString> {
        match &self.file {
            Some(file) if is_limit_var(name) => file
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| OsString::from(v)),
            _ => self
                .env
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone()),
        }
    }
}

/// Reads the limits file at `path` ([`read`]), which must exist when the
/// agent's region directory `region_dir` does (anything there, even a
/// dangling link, counts): the agent mounts both, so a region directory
/// alone means the file was hidden ([`Error::LimitsMissing`]).
pub fn read_beside(path: &Path, region_dir: &Path) -> Result<Option<String>, Error> {
    let text = read(path)?;
    if text.is_none() && std::fs::symlink_metadata(region_dir).is_ok() {
        return Err(Error::LimitsMissing {
            path: path.display().to_string(),
            region_dir: region_dir.display().to_string(),
        });
    }
    Ok(text)
}

/// The variables of this process: [`LIMITS_FILE`] over its environment;
/// refused when the agent's [`REGION_DIR`] is there without the file.
pub fn process_vars() -> Result<Vars, Error> {
    let file = read_beside(Path::new(LIMITS_FILE), Path::new(REGION_DIR))?;
    Vars::new(file.as_deref(), std::env::vars_os())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn env(vars: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        vars.iter()
            .map(|(n, v)| (OsString::from(n), OsString::from(v)))
            .collect()
    }

    const FILE: &str = "CUDA_DEVICE_MEMORY_LIMIT_0=4096m\nCUDA_DEVICE_SM_LIMIT=30\n";

    #[test]
    fn the_file_s_limits_win_and_the_environment_may_repeat_them() {
        let vars = Vars::new(
            Some(FILE),
            env(&[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "4096m"),
                ("LIBCUDA_LOG_LEVEL", "4"),
            ]),
        )
        .unwrap();
        let (config, _) = Config::from_vars(|n| vars.get(n)).unwrap();
        assert_eq!(config.limits[0], 4096 << 20);
        assert_eq!(config.sm_limits[0], 30);
        // Not a limit: the environment's.
        assert_eq!(config.log_level, 4);
    }

    #[test]
    fn a_limit_the_environment_changes_or_adds_is_refused() {
        for (name, value, file) in [
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "80g", Some("4096m")),
            ("CUDA_DEVICE_SM_LIMIT", "100", Some("30")),
            ("CUDA_DISABLE_CONTROL", "true", None),
            ("CUDA_DEVICE_MEMORY_LIMIT", "80g", None),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "80g", None),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/mine", None),
        ] {
            let Err(error) = Vars::new(Some(FILE), env(&[(name, value)])) else {
                panic!("{name}={value} was accepted");
            };
            match &error {
                Error::Overridden {
                    name: n,
                    env: e,
                    file: f,
                } => {
                    assert_eq!((n.as_str(), e.as_str()), (name, value));
                    assert_eq!(f.as_deref(), file);
                }
                other => panic!("{name}: {other}"),
            }
            assert!(error.to_string().contains(name), "{error}");
        }
    }

    #[test]
    fn without_a_file_the_environment_is_read_as_before() {
        let vars = Vars::new(None, env(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "80g")])).unwrap();
        assert_eq!(vars.get("CUDA_DEVICE_MEMORY_LIMIT_0"), Some("80g".into()));
        // A malformed file refuses CUDA, naming the line.
        let Err(error) = Vars::new(Some("CUDA_DEVICE_SM_LIMIT"), env(&[])) else {
            panic!("a malformed file was accepted");
        };
        assert!(error.to_string().contains("line 1"), "{error}");
    }

    #[test]
    fn a_missing_file_is_none_and_an_unreadable_one_an_error() {
        let dir = std::env::temp_dir().join(format!("tessera-limits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(read(&dir.join("absent")).unwrap().is_none());
        // A directory where the file should be.
        assert!(matches!(read(&dir), Err(Error::LimitsFile { .. })));
        let file = dir.join("limits.env");
        std::fs::write(&file, FILE).unwrap();
        assert_eq!(read(&file).unwrap().as_deref(), Some(FILE));
        // Too long: read to one byte past the bound, then refused by the parser.
        std::fs::write(&file, "x".repeat(MAX_LIMITS_FILE * 2)).unwrap();
        let text = read(&file).unwrap().unwrap();
        assert_eq!(text.len(), MAX_LIMITS_FILE + 1);
        assert!(Vars::new(Some(&text), env(&[])).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A pod that mounts its own volume over the limits directory hides the
    /// file but not the agent's region directory beside it.
    #[test]
    fn a_region_directory_without_the_limits_file_refuses_cuda() {
        let dir = std::env::temp_dir().join(format!("tessera-hidden-{}", std::process::id()));
        let (limits, region) = (dir.join("limits"), dir.join("vgpu"));
        std::fs::create_dir_all(&limits).unwrap();
        let file = limits.join("limits.env");

        // Neither: a container the agent did not serve reads its environment.
        assert_eq!(read_beside(&file, &region).unwrap(), None);

        // The region directory, but the file hidden: refused, and says why.
        std::fs::create_dir_all(&region).unwrap();
        let Err(error) = read_beside(&file, &region) else {
            panic!("a hidden limits file was taken as none");
        };
        assert!(matches!(error, Error::LimitsMissing { .. }), "{error}");
        let message = error.to_string();
        for needle in [
            file.display().to_string(),
            region.display().to_string(),
            "refusing CUDA".to_owned(),
        ] {
            assert!(message.contains(&needle), "{needle} not in {message}");
        }

        // Both: the file's limits.
        std::fs::write(&file, FILE).unwrap();
        assert_eq!(read_beside(&file, &region).unwrap().as_deref(), Some(FILE));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_region_directory_is_where_the_agent_mounts_it() {
        // The directory of the agent's region path, under the limits
        // directory's parent.
        let limits_parent = Path::new(tessera_api::env::LIMITS_DIR).parent().unwrap();
        assert_eq!(Path::new(REGION_DIR).parent().unwrap(), limits_parent);
        assert_eq!(REGION_DIR, "/var/run/tessera/vgpu");
    }
}

//! The node agent's limits file ([`LIMITS_FILE`]): where a container's limit
//! variables come from when it exists. The agent mounts it read-only, so a
//! tenant who sets the variables another way (`envFrom` a ConfigMap, a
//! wrapper script's `export`) cannot loosen them: the environment may repeat
//! what the file says (HAMi's images read it), and anything else is refused.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::Path;

use tessera_api::env::{LIMITS_FILE, MAX_LIMITS_FILE, is_limit_var, parse_limits_file};

use super::Error;

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

/// The variables of this process: [`LIMITS_FILE`] over its environment.
pub fn process_vars() -> Result<Vars, Error> {
    let file = read(Path::new(LIMITS_FILE))?;
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
}

use std::fmt;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An environment variable of the interposer contract has a malformed value.
    #[error("{name}={value:?}: {rule}")]
    InvalidEnv {
        /// The variable.
        name: String,
        /// The value it had.
        value: String,
        /// The rule it broke.
        rule: &'static str,
    },
    /// The node agent's limits file breaks a rule.
    #[error("limits file line {line}: {rule}")]
    InvalidLimitsFile {
        /// The line, from 1 (0: the file as a whole).
        line: usize,
        /// The rule it broke.
        rule: String,
    },
    /// A pod's GPU request breaks one or more rules; every broken rule is listed.
    #[error("invalid GPU request: {0}")]
    InvalidPodRequest(Violations),
    /// A configuration value breaks a rule.
    #[error("config {field}: {rule}")]
    InvalidConfig {
        /// The setting, as written in the configuration file.
        field: String,
        /// The rule it broke.
        rule: String,
    },
    /// A CRD could not be rendered as YAML.
    #[cfg(feature = "kube")]
    #[error("cannot render CRD {name} as YAML")]
    RenderCrd {
        /// The CRD's name.
        name: String,
        /// What went wrong.
        #[source]
        source: serde_yaml_ng::Error,
    },
}

impl Error {
    pub(crate) fn invalid_env(name: &str, value: &str, rule: &'static str) -> Self {
        Self::InvalidEnv {
            name: name.to_owned(),
            value: value.to_owned(),
            rule,
        }
    }
}

/// One broken rule in a pod's GPU request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The container the rule applies to; `None` for pod-level fields such as annotations.
    pub container: Option<String>,
    /// The resource name or annotation key at fault.
    pub field: String,
    /// What the rule is, in words.
    pub rule: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.container {
            Some(container) => write!(f, "container {container:?}: {}: {}", self.field, self.rule),
            None => write!(f, "annotation {}: {}", self.field, self.rule),
        }
    }
}

/// All the rules a pod's GPU request breaks, in the order they were found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Violations(pub Vec<Violation>);

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            v.fmt(f)?;
        }
        Ok(())
    }
}

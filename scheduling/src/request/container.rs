//! One container's resources to a [`ContainerRequest`].

use std::collections::BTreeMap;

use k8s_openapi::{api::core::v1::Container, apimachinery::pkg::api::resource::Quantity};

use super::config::RequestConfig;
use super::types::{
    ContainerKind, ContainerRequest, MAX_GPUS_PER_CONTAINER, MAX_MEMORY_MIB, MemoryRequest,
};
use tessera_api::Violation;
use tessera_api::quantity::{QuantityError, parse_whole};
use tessera_api::v1alpha1::DeviceFamily;

/// Parses a container; `Ok(None)` when it asks for no GPU.
pub(super) fn parse(
    container: &Container,
    kind: ContainerKind,
    config: &RequestConfig,
) -> Result<Option<ContainerRequest>, Vec<Violation>> {
    let names = &config.resources;
    let mut reader = Reader::new(container);
    let count = reader.read(&names.count, 0, u64::from(MAX_GPUS_PER_CONTAINER));
    let memory = reader.read(&names.memory, 1, MAX_MEMORY_MIB);
    let percentage = reader.read(&names.memory_percentage, 1, 100);
    let cores = reader.read(&names.cores, 0, 100);
    let priority = reader.read(&names.priority, 0, 1);

    let present = |value: &Field| !matches!(value, Field::Absent);
    let asks_for_slice = present(&memory) || present(&percentage) || present(&cores);
    if !asks_for_slice && matches!(count, Field::Absent | Field::Value(0)) {
        return reader.finish(None);
    }
    if present(&memory) && present(&percentage) {
        reader.violate(
            &names.memory,
            format!(
                "cannot be combined with {}; set one of them",
                names.memory_percentage
            ),
        );
    }
    let count = match count {
        Field::Value(0) => {
            reader.violate(
                &names.count,
                format!(
                    "is 0 but {}, {} or {} is set; ask for at least 1 GPU or remove them",
                    names.memory, names.memory_percentage, names.cores
                ),
            );
            0
        }
        Field::Value(n) => n,
        Field::Absent => u64::from(config.default_gpu_num),
        Field::Invalid => 0,
    };
    let memory = match (memory, percentage) {
        (Field::Value(mib), _) => MemoryRequest::Mib(mib),
        (_, Field::Value(percent)) => MemoryRequest::Percent(narrow(percent)),
        _ if config.default_memory == 0 => MemoryRequest::Percent(100),
        _ => MemoryRequest::Mib(config.default_memory),
    };
    let cores = match cores {
        Field::Value(cores) => narrow(cores),
        _ if memory.is_whole_device() => 100,
        _ => config.default_cores,
    };
    let priority = match priority {
        Field::Value(p) => Some(narrow(p)),
        _ => None,
    };
    reader.finish(Some(ContainerRequest {
        name: container.name.clone(),
        kind,
        family: DeviceFamily::Nvidia,
        count: narrow(count),
        memory,
        cores,
        priority,
        vendor: None,
    }))
}

fn lookup<'a>(map: Option<&'a BTreeMap<String, Quantity>>, name: &str) -> Option<&'a Quantity> {
    map.and_then(|m| m.get(name))
}

/// Values are bounded by `read` well below `u32::MAX`.
pub(super) fn narrow(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// One resource as read from a container.
pub(super) enum Field {
    Absent,
    Invalid,
    Value(u64),
}

impl Field {
    /// A value in units of `unit` (bounded by the read's maximum) as the
    /// base unit.
    pub(super) fn scaled(self, unit: u64) -> Self {
        match self {
            Self::Value(v) => Self::Value(v.saturating_mul(unit)),
            other => other,
        }
    }
}

pub(super) struct Reader<'a> {
    pub(super) container: &'a Container,
    pub(super) violations: Vec<Violation>,
}

impl<'a> Reader<'a> {
    /// A reader of `container` with nothing refused yet.
    pub(super) fn new(container: &'a Container) -> Self {
        Self {
            container,
            violations: Vec::new(),
        }
    }

    /// Reads a resource from limits (or requests when no limit is set) and
    /// checks it is a whole number in `min..=max`. An empty name (a
    /// resource a vendor section leaves unnamed) is never set.
    pub(super) fn read(&mut self, name: &str, min: u64, max: u64) -> Field {
        if name.is_empty() {
            return Field::Absent;
        }
        let resources = self.container.resources.as_ref();
        let limits = resources.and_then(|r| r.limits.as_ref());
        let requests = resources.and_then(|r| r.requests.as_ref());
        let Some(quantity) = lookup(limits, name).or_else(|| lookup(requests, name)) else {
            return Field::Absent;
        };
        let text = quantity.0.as_str();
        let rule = match parse_whole(text) {
            Ok(value) if (min..=max).contains(&value) => return Field::Value(value),
            Ok(value) => format!("must be between {min} and {max}, got {value}"),
            Err(QuantityError::Negative) => format!("must not be negative, got {text:?}"),
            Err(QuantityError::Fractional) => format!("must be a whole number, got {text:?}"),
            Err(QuantityError::Malformed) => format!("is not a valid quantity: {text:?}"),
            Err(QuantityError::Overflow) => {
                format!("must be between {min} and {max}, got {text:?}")
            }
        };
        self.violate(name, rule);
        Field::Invalid
    }

    /// A resource's quantity as written (limits, else requests), if set.
    pub(super) fn text(&self, name: &str) -> Option<String> {
        let resources = self.container.resources.as_ref();
        let limits = resources.and_then(|r| r.limits.as_ref());
        let requests = resources.and_then(|r| r.requests.as_ref());
        lookup(limits, name)
            .or_else(|| lookup(requests, name))
            .map(|q| q.0.clone())
    }

    /// `value` when every field read so far was valid, else the violations.
    pub(super) fn finish<T>(self, value: T) -> Result<T, Vec<Violation>> {
        if self.violations.is_empty() {
            Ok(value)
        } else {
            Err(self.violations)
        }
    }

    /// Refuses each of `fields` that is set although the count resource
    /// `count` is not (a vendor's memory or cores alone asks for nothing
    /// the kubelet could ever satisfy), and ends the container's parse.
    pub(super) fn without_count<T>(
        mut self,
        count: &str,
        noun: &str,
        fields: &[(&str, &Field)],
    ) -> Result<Option<T>, Vec<Violation>> {
        for &(name, field) in fields {
            if !matches!(field, Field::Absent) {
                self.violate(
                    name,
                    format!("is set but {count} is not; ask for at least 1 {noun}"),
                );
            }
        }
        self.finish(None)
    }

    pub(super) fn violate(&mut self, field: &str, rule: String) {
        self.violations.push(Violation {
            container: Some(self.container.name.clone()),
            field: field.to_owned(),
            rule,
        });
    }
}

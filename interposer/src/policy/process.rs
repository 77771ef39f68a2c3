//! What the hooks do in this process, decided once by the first hooked
//! call: pass through (`CUDA_DISABLE_CONTROL`), refuse CUDA (an invalid
//! configuration, or an unusable region while limits are set), or account
//! and enforce in the container's region.
//!
//! Nothing happens at load time: a process that never calls CUDA never
//! reads its environment or maps the region.

use std::ffi::c_uint;
use std::sync::OnceLock;

use tessera_api::env::CoreUtilizationPolicy;
use tessera_vgpu_region::{Opened, Region};

use crate::accounting::enforcer::Enforcer;
use crate::accounting::stores::StoreId;
use crate::config::{Config, Error};
use crate::driver::queries::{graph_reserved, pool_reserved};
use crate::log::{DEBUG, ERROR, INFO, WARN};
use crate::sys::{CUDA_ERROR_NOT_INITIALIZED, CUresult};

/// What the hooks do in this process.
pub(crate) enum State {
    /// `CUDA_DISABLE_CONTROL=true`: pass everything through.
    Disabled,
    /// The configuration is invalid: refuse CUDA (the reason was printed).
    Refused,
    /// Account and enforce.
    Enforcing(Box<Enforcer>),
}

/// The process's state, and the part of its configuration the compute
/// limiter reads.
struct Process {
    state: State,
    core_policy: CoreUtilizationPolicy,
}

static PROCESS: OnceLock<Process> = OnceLock::new();

fn process() -> &'static Process {
    PROCESS.get_or_init(|| {
        // The agent's limits file over the environment (config/limits.rs).
        let config = crate::config::limits::process_vars()
            .and_then(|vars| Config::from_vars(|name| vars.get(name)));
        let core_policy = config
            .as_ref()
            .map_or(CoreUtilizationPolicy::Default, |(c, _)| c.core_policy);
        Process {
            state: init(config),
            core_policy,
        }
    })
}

/// The process's state, set up by the first hooked call.
pub(crate) fn state() -> &'static State {
    &process().state
}

/// The process's enforcer, or a return from the calling hook where there is
/// none: `$disabled` (the driver's own call) when control is disabled,
/// `CUDA_ERROR_NOT_INITIALIZED` when CUDA is refused.
macro_rules! enforcer_or_return {
    ($disabled:expr) => {
        match $crate::policy::process::state() {
            $crate::policy::process::State::Disabled => return $disabled,
            $crate::policy::process::State::Refused => {
                return $crate::sys::CUDA_ERROR_NOT_INITIALIZED;
            }
            $crate::policy::process::State::Enforcing(enforcer) => enforcer,
        }
    };
}
pub(crate) use enforcer_or_return;

/// `GPU_CORE_UTILIZATION_POLICY`: when the compute limit applies.
pub(crate) fn core_policy() -> CoreUtilizationPolicy {
    process().core_policy
}

/// `cuInit`: sets the process up (so a bad configuration fails here, loudly)
/// and initialises the real driver.
///
/// # Safety
///
/// None beyond `cuInit`'s.
pub(crate) unsafe fn init_driver(flags: c_uint) -> CUresult {
    match state() {
        State::Refused => CUDA_ERROR_NOT_INITIALIZED,
        State::Disabled | State::Enforcing(_) => real!(cuInit(flags)),
    }
}

/// What the driver holds for a store (see `accounting/stores.rs`), `None`
/// when it cannot say.
fn store_held(id: StoreId) -> Option<u64> {
    match id {
        StoreId::Pool(pool) => pool_reserved(pool),
        StoreId::Graph(dev) => graph_reserved(dev),
    }
}

/// The state for a configuration (or why it is invalid).
fn init(config: Result<(Config, Option<Error>), Error>) -> State {
    let config = match config {
        Ok((config, warning)) => {
            crate::log::set_level(config.log_level);
            if let Some(warning) = warning {
                log!(WARN, "{warning}; using level 2");
            }
            config
        }
        Err(e) => {
            log!(ERROR, "invalid configuration, refusing CUDA: {e}");
            return State::Refused;
        }
    };
    if config.disabled {
        log!(INFO, "CUDA_DISABLE_CONTROL is set: not enforcing");
        return State::Disabled;
    }
    // The region is the container's to write: whatever is in it, this
    // process either attaches to a region whose header and limits are the
    // ones its environment gives (the environment comes from the node
    // agent's allocation and is authoritative), or refuses CUDA, saying
    // why. It never rebuilds a region: the container's other processes
    // hold reservations in it. See docs/interposer.md ("A corrupted region").
    let region = match Region::create_or_open_with(&config.region_path, &config.region_limits()) {
        Ok((
            region,
            Opened::Attached {
                limits_differ: true,
            },
        )) => {
            let found = region.limits();
            let wanted = config.region_limits();
            log!(
                ERROR,
                "refusing CUDA, not rebuilding the region: {}",
                Error::from(tessera_vgpu_region::Error::LimitsDiffer {
                    path: config.region_path.clone(),
                    found_memory: Box::new(found.memory),
                    found_sm: found.sm_percent,
                    found_priority: found.priority,
                    memory: Box::new(wanted.memory),
                    sm: wanted.sm_percent,
                    priority: wanted.priority,
                })
            );
            return State::Refused;
        }
        Ok((region, _)) => Some(region),
        Err(e) if config.any_limit() || config.any_sm_limit() => {
            log!(
                ERROR,
                "limits are set but the shared region is unusable, refusing CUDA (not rebuilding it): {}",
                Error::from(e)
            );
            return State::Refused;
        }
        Err(e) => {
            log!(
                WARN,
                "no memory limit is set and the shared region is unusable, not accounting: {}",
                Error::from(e)
            );
            None
        }
    };
    let limits = match &region {
        Some(region) => std::array::from_fn(|dev| region.limit(dev).unwrap_or(0)),
        None => config.limits,
    };
    log!(DEBUG, "limits per device (bytes, 0 = none): {limits:?}");
    State::Enforcing(Box::new(Enforcer::new(limits, region, store_held)))
}

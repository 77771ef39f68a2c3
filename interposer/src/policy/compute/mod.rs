//! Compute limits: `CUDA_DEVICE_SM_LIMIT` on every launch path.
//!
//! The container has one budget per device in the shared region: a token
//! bucket counted in nanoseconds of GPU time. It is refilled at `limit` % of
//! wall time (whichever process launches next credits the time since the
//! last refill, once) and capped at [`CAP_NS`](limiter::CAP_NS). A launch waits while the
//! budget is negative, then is charged an estimate of its duration; the
//! launch is bracketed by two events on its stream, and once they have
//! completed the estimate is replaced by the measured time between them. The
//! limit is therefore a share of measured GPU time: nothing depends on the
//! SM count, the grid size or how many processes launch (HAMi-core's bucket
//! counted blocks and was tuned with the SM count squared).
//!
//! Events also measure the time a launch waited for the device behind other
//! processes' work; where NVML reports per-process utilisation, each process
//! corrects its charges to its own GPU time every 100 ms (`usage.rs`).
//!
//! Estimates are per kernel (or graph) handle, falling back to the device's
//! running average; until the first launch on a device has been measured,
//! launches wait for the one in flight, so a burst cannot run ahead of the
//! budget. Work being captured into a graph is not charged: the graph is
//! charged when it is launched.
//!
//! Task priority: every launch through the limiter records its time and
//! device in the process's slot; while the node agent holds the device (a
//! higher-priority container is active on its GPU, see
//! `tessera_vgpu_region::priority`), limited launches wait.
//!
//! Cost: with no compute limit (unset, 0, 100, `CUDA_DISABLE_CONTROL`, or
//! policy `disable`) and low priority a launch loads one process-wide atomic
//! (`MODE`, `launch.rs`) and calls the driver. With a limit each launch also reads the
//! current context, records its time, asks whether the stream is capturing,
//! records two events and polls earlier launches' events.
//!
//! | file | what it holds |
//! |---|---|
//! | `launch.rs` | the one throttle body every launch hook calls, and the hooks' bodies |
//! | `limiter.rs` | the token bucket: admission, estimates, events |
//! | `usage.rs` | corrections from NVML's per-process utilisation |

pub(crate) mod launch;
pub(crate) mod limiter;
pub(crate) mod usage;

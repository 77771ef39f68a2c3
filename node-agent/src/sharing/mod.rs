//! How the node shares its GPUs: the one place the agent decides a sharing
//! mode and what it means.
//!
//! A [`Mode`] is picked from the node's settings ([`Mode::of`]) and, for a
//! container, from its slices ([`Mode::of_container`]); nothing else in the
//! agent looks at `operatingMode` or `migStrategy`, and what differs between
//! modes is asked of the mode ([`Mode::through_dra`], ...). Each mode has
//! up to two implementations:
//!
//! - an [`Offering`], in its file here: what a physical GPU offers in the
//!   mode (the whole GPU, its MIG layout, its instances as devices), which
//!   the inventory publishes; pure;
//! - a [`Serving`]: what a container gets in the mode, as the one
//!   [`Contract`](crate::contract::Contract) both doors serialise, once
//!   what that needs on the node is done. It lives beside the machinery it
//!   drives, and `plugin::modes` maps each mode to it.
//!
//! | mode | offering | serving |
//! |---|---|---|
//! | hami-core | [`WholeGpu`] | [`HamiCore`]: the interposer, its limits and directories |
//! | MPS | [`WholeGpu`] | `mps::MpsManager`: the GPU's daemon and the client's share |
//! | dynamic MIG | [`DynamicMigOffer`] | `mig::DynamicMig`: the instances, made at Allocate |
//! | static MIG (`mixed`) | [`StaticMigOffer`] | the profile plugins ([`static_mig::contract`]) |
//! | whole instances (`single`) | [`MigSingleOffer`] | [`HamiCore`] |
//!
//! A new mode is a variant of [`Mode`] (and its line in [`Mode::of`]), its
//! file here with its [`Offering`] (a line in [`offering`]), and its
//! [`Serving`] (a line in `plugin::modes`).

pub mod dynamic_mig;
pub mod hami_core;
pub mod mig_single;
pub mod mode;
pub mod static_mig;

pub use dynamic_mig::DynamicMigOffer;
pub use hami_core::{HamiCore, WholeGpu};
pub use mig_single::MigSingleOffer;
pub use mode::{Container, Mode, Offering, Serving};
pub use static_mig::StaticMigOffer;

/// How a physical GPU is offered in `mode`.
pub fn offering(mode: Mode) -> &'static dyn Offering {
    match mode {
        Mode::HamiCore | Mode::Mps => &WholeGpu,
        Mode::DynamicMig => &DynamicMigOffer,
        Mode::StaticMig => &StaticMigOffer,
        Mode::MigSingle => &MigSingleOffer,
    }
}

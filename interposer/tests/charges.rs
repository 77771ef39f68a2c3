//! What the driver consumes beyond plain allocations is charged exactly:
//! VMM mappings and retained handles, memory pools, arrays, graph memory and
//! contexts. Each test runs `tests/c/charges.c` under
//! `LD_PRELOAD=libtessera_vgpu.so` through every lookup path and checks that
//! the limit is exact (up to it succeeds, one granule more fails with
//! `CUDA_ERROR_OUT_OF_MEMORY`), that freeing returns the charge and that
//! `cuMemGetInfo` stays consistent with the fake GPU.

#[allow(dead_code)] // the charging tests use only part of the test support
mod support;

use support::{Loader, MIB, World};
use tessera_vgpu_region::Region;

const OOM: u64 = 2;

/// A world with one 8 GiB fake GPU and a 64 MiB limit.
fn limited() -> World {
    World::new("8g").env("CUDA_DEVICE_MEMORY_LIMIT", "64m")
}

#[test]
fn vmm_memory_is_charged_while_the_driver_keeps_it() {
    for loader in Loader::ALL {
        for (probe, fits) in [(32 * MIB, true), (34 * MIB, false)] {
            let world = limited();
            let args = ["vmm", &(32 * MIB).to_string(), &probe.to_string()];
            let r = world.charges(loader, true, &args).ok();
            let what = format!("{loader:?} probe={probe}");
            assert_eq!(r.get("same_handle"), 1, "{what}");
            // Released right after mapping: the mapping keeps the memory, and
            // its charge.
            assert_eq!(
                (r.get("mapped_free"), r.get("mapped_phys")),
                (32 * MIB, 32 * MIB),
                "{what}"
            );
            assert_eq!(r.get("probe_rc"), if fits { 0 } else { OOM }, "{what}");
            // The retained reference released, the mapping still holds it.
            assert_eq!(
                (
                    r.get("retained_released_free"),
                    r.get("retained_released_phys")
                ),
                (32 * MIB, 32 * MIB),
                "{what}"
            );
            assert_eq!(
                (
                    r.get("unmapped_free"),
                    r.get("unmapped_total"),
                    r.get("unmapped_phys")
                ),
                (64 * MIB, 64 * MIB, 0),
                "{what}"
            );
            let region = Region::open(&world.region_path()).unwrap();
            assert_eq!(region.used(0), 0, "{what}");
        }
    }
}

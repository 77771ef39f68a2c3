//! CUDA ordinals and NVML devices, matched by UUID.
//!
//! Limits are indexed by CUDA ordinal, the order in which the driver
//! enumerates the container's devices (fastest first by default, or as
//! `CUDA_VISIBLE_DEVICES` lists them); NVML indexes devices in PCI order. The
//! two agree only by chance, so an NVML device is matched to its CUDA ordinal
//! by comparing `nvmlDeviceGetUUID` with `cuDeviceGetUuid` (and
//! `cuDeviceGetUuid_v2`, which names a MIG instance where there is one) of
//! every ordinal, read once per process. A process that never called CUDA
//! (e.g. `nvidia-smi`) gets the driver initialised for this (`cuInit` creates
//! no context and takes no device memory).
//!
//! When the driver cannot be asked (no driver, `cuInit` fails, no UUID
//! function) the NVML index is taken as the ordinal, HAMi-core's identity
//! mapping, with a note at level 3.

use std::ffi::{c_char, c_int};
use std::sync::OnceLock;

use crate::log::INFO;
use crate::sys::{
    CUDA_SUCCESS, CUdevice, NVML_DEVICE_UUID_BUFFER_SIZE, NVML_SUCCESS, nvmlDevice_t,
};

/// A device UUID, the 16 bytes CUDA reports (NVML prints them as
/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
type Uuid = [u8; 16];

/// The UUIDs of each CUDA ordinal: `cuDeviceGetUuid`'s, and
/// `cuDeviceGetUuid_v2`'s where it differs (a MIG instance).
struct Ordinals(Vec<Vec<Uuid>>);

/// What an NVML device is for the limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ordinal {
    /// CUDA ordinal `0`.
    Cuda(usize),
    /// A device this process's CUDA does not see: no limit applies to it.
    NotVisible,
}

fn ordinals() -> Option<&'static Ordinals> {
    static ORDINALS: OnceLock<Option<Ordinals>> = OnceLock::new();
    ORDINALS
        .get_or_init(|| {
            let read = read_ordinals();
            if let Err(why) = &read {
                log!(
                    INFO,
                    "cannot read the CUDA devices' UUIDs ({why}); NVML indexes are taken as CUDA ordinals"
                );
            }
            read.ok()
        })
        .as_ref()
}

fn read_ordinals() -> Result<Ordinals, String> {
    let fns = &crate::driver::cuda::driver().fns;
    if fns.cuDeviceGetUuid.is_none() && fns.cuDeviceGetUuid_v2.is_none() {
        return Err("the driver has no cuDeviceGetUuid".into());
    }
    let rc = real!(cuInit(0));
    if rc != CUDA_SUCCESS {
        return Err(format!("cuInit failed with {rc}"));
    }
    let mut count: c_int = 0;
    let rc = real!(cuDeviceGetCount(&mut count));
    if rc != CUDA_SUCCESS {
        return Err(format!("cuDeviceGetCount failed with {rc}"));
    }
    let mut ordinals = Vec::new();
    for ordinal in 0..count {
        let mut dev: CUdevice = 0;
        let rc = real!(cuDeviceGet(&mut dev, ordinal));
        if rc != CUDA_SUCCESS {
            return Err(format!("cuDeviceGet({ordinal}) failed with {rc}"));
        }
        let mut uuids = Vec::new();
        let mut uuid: Uuid = [0; 16];
        if fns.cuDeviceGetUuid.is_some() && real!(cuDeviceGetUuid(&mut uuid, dev)) == CUDA_SUCCESS {
            uuids.push(uuid);
        }
        if fns.cuDeviceGetUuid_v2.is_some()
            && real!(cuDeviceGetUuid_v2(&mut uuid, dev)) == CUDA_SUCCESS
            && !uuids.contains(&uuid)
        {
            uuids.push(uuid);
        }
        if uuids.is_empty() {
            return Err(format!("no UUID for CUDA ordinal {ordinal}"));
        }
        ordinals.push(uuids);
    }
    Ok(Ordinals(ordinals))
}

/// The CUDA ordinal of an NVML device: by UUID, else (UUIDs unreadable on
/// either side) its NVML index.
pub(crate) fn cuda_ordinal(device: nvmlDevice_t) -> Option<Ordinal> {
    if let (Some(ordinals), Some(uuid)) = (ordinals(), nvml_uuid(device)) {
        return Some(
            ordinals
                .0
                .iter()
                .position(|uuids| uuids.contains(&uuid))
                .map_or(Ordinal::NotVisible, Ordinal::Cuda),
        );
    }
    let mut index = 0;
    let rc = real_nvml!(nvmlDeviceGetIndex(device, &mut index));
    (rc == NVML_SUCCESS).then_some(Ordinal::Cuda(index as usize))
}

/// The NVML device of CUDA ordinal `dev` (NVML initialised for it), `None`
/// when NVML or the UUIDs are unavailable. Read once per process.
pub(crate) fn nvml_device(dev: usize) -> Option<nvmlDevice_t> {
    static HANDLES: OnceLock<Vec<Option<usize>>> = OnceLock::new();
    let handles = HANDLES.get_or_init(|| {
        let Some(ordinals) = ordinals() else {
            return Vec::new();
        };
        if real_nvml!(nvmlInit_v2()) != NVML_SUCCESS {
            return Vec::new();
        }
        ordinals
            .0
            .iter()
            .map(|uuids| {
                uuids.iter().find_map(|uuid| {
                    let name = nvml_name(uuid);
                    let mut device: nvmlDevice_t = std::ptr::null_mut();
                    (real_nvml!(nvmlDeviceGetHandleByUUID(name.as_ptr(), &mut device))
                        == NVML_SUCCESS)
                        .then_some(device as usize)
                })
            })
            .collect()
    });
    handles
        .get(dev)
        .copied()
        .flatten()
        .map(|d| d as nvmlDevice_t)
}

/// An NVML device's UUID, `None` if NVML cannot say or it is not one.
fn nvml_uuid(device: nvmlDevice_t) -> Option<Uuid> {
    let mut text = [0 as c_char; NVML_DEVICE_UUID_BUFFER_SIZE];
    let rc = real_nvml!(nvmlDeviceGetUUID(
        device,
        text.as_mut_ptr(),
        text.len() as _
    ));
    if rc != NVML_SUCCESS {
        return None;
    }
    let text: Vec<u8> = text
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    parse_uuid(&text)
}

/// `GPU-7e55e4a0-fa4e-4000-8000-000000000001` (or `MIG-…`) → 16 bytes.
fn parse_uuid(text: &[u8]) -> Option<Uuid> {
    let hex = text
        .strip_prefix(b"GPU-")
        .or_else(|| text.strip_prefix(b"MIG-"))?;
    let digits: Vec<u8> = hex.iter().copied().filter(|&c| c != b'-').collect();
    if digits.len() != 32 {
        return None;
    }
    let mut uuid = [0u8; 16];
    for (byte, pair) in uuid.iter_mut().zip(digits.chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(uuid)
}

/// NVML's name of a GPU UUID, NUL-terminated.
fn nvml_name(uuid: &Uuid) -> Vec<c_char> {
    let text = tessera_api::names::gpu_uuid_string(uuid);
    text.bytes().map(|c| c as c_char).chain([0]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip_through_nvml_s_spelling() {
        let uuid: Uuid = [
            0x7e, 0x55, 0xe4, 0xa0, 0xfa, 0x4e, 0x40, 0x00, 0x80, 0x00, 0, 0, 0, 0, 0x12, 0xab,
        ];
        let name = nvml_name(&uuid);
        let text: Vec<u8> = name[..name.len() - 1].iter().map(|&c| c as u8).collect();
        assert_eq!(text, b"GPU-7e55e4a0-fa4e-4000-8000-0000000012ab");
        assert_eq!(parse_uuid(&text), Some(uuid));
        assert_eq!(
            parse_uuid(b"MIG-7e55e4a0-fa4e-4000-8000-0000000012ab"),
            Some(uuid)
        );
        for bad in [
            &b"7e55e4a0-fa4e-4000-8000-0000000012ab"[..],
            b"GPU-7e55e4a0",
            b"GPU-7e55e4a0-fa4e-4000-8000-0000000012zz",
            b"",
        ] {
            assert_eq!(parse_uuid(bad), None);
        }
    }
}

//! The fake devices' UUIDs, the same for the fake driver and the fake NVML
//! so that `cuDeviceGetUuid(_v2)` and `nvmlDeviceGetUUID` agree, as on a
//! real GPU.
//!
//! Device `d` of the fake driver (its CUDA ordinal; the fake NVML may list
//! the devices in another order, see `FAKE_NVML_DEVICE_ORDER`) has the
//! UUID `7e55e4a0-fa4e-4000-8000-0000000000dd` (`dd` = `d` in hex).

/// The 16 bytes `cuDeviceGetUuid` reports for device `dev`.
pub fn uuid(dev: usize) -> [u8; 16] {
    let mut bytes = [
        0x7e, 0x55, 0xe4, 0xa0, 0xfa, 0x4e, 0x40, 0x00, 0x80, 0x00, 0, 0, 0, 0, 0, 0,
    ];
    bytes[15] = dev as u8;
    bytes
}

/// The string NVML reports for device `dev`: `GPU-` and the UUID.
pub fn uuid_string(dev: usize) -> String {
    tessera_api::names::gpu_uuid_string(&uuid(dev))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_string_is_nvml_s_format_of_the_bytes() {
        assert_eq!(
            super::uuid_string(10),
            "GPU-7e55e4a0-fa4e-4000-8000-00000000000a"
        );
        assert_ne!(super::uuid(0), super::uuid(1));
    }
}

//! Gives the fake NVML the real one's soname, `libnvidia-ml.so.1`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}

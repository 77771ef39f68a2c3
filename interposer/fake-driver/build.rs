//! Gives the fake driver the real driver's soname, so programs linked
//! against it look for `libcuda.so.1` at run time, as with the real one.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}

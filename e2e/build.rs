//! `TESSERA_SKIP_REAL_NODES` at build time: the tests that need real nodes
//! (root, containerd, a kubelet) are then compiled as ignored, with the
//! reason, so a run that cannot start real nodes reports them as ignored
//! instead of passing them unrun. `make test` sets nothing and runs them.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(skip_real_nodes)");
    println!("cargo::rerun-if-env-changed=TESSERA_SKIP_REAL_NODES");
    if std::env::var_os("TESSERA_SKIP_REAL_NODES").is_some() {
        println!("cargo::rustc-cfg=skip_real_nodes");
    }
}

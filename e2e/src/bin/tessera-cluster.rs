//! placeholder until the cluster command lands
fn main() {}

//! Link options of the `proxops` binary.
//!
//! `-z pack-relative-relocs` (RELR, DT_RELR): the binary is position-independent, so the dynamic
//! loader rebases every pointer in its vtables and tables at start. As `.rela.dyn` those
//! relocations take 1.5 MB of the file, all read at every start and then resident for the life
//! of the agent; packed as a RELR bitmap they take a few KB (BENCHMARKS.md, "Footprint"). Needs
//! GNU ld ≥ 2.38 or lld, and glibc ≥ 2.36 at run time (Debian 12 and PVE 9's Debian 13 have both).

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu")
    {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo::rerun-if-changed=build.rs");
}

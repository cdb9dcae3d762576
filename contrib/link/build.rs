//! Release builds lay out the code a gateway runs before the rest of the text
//! (contrib/link/hot-text.ld, written by scripts/hot-text.py): the kernel maps code
//! into the resident set 64 KiB or more at a time, so scattered hot functions kept
//! nearly the whole text resident.

fn main() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/contrib/link/hot-text.ld");
    println!("cargo:rerun-if-changed={script}");
    println!("cargo:rerun-if-changed=contrib/link/build.rs");
    println!("cargo:rerun-if-env-changed=TIDEMARK_HOT_TEXT");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    // TIDEMARK_HOT_TEXT=0: for a linker without linker scripts (mold).
    if var("PROFILE") == "release"
        && var("CARGO_CFG_TARGET_OS") == "linux"
        && var("TIDEMARK_HOT_TEXT") != "0"
    {
        // INSERT: the script adds one output section to the linker's default layout.
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{script}");
    }
}

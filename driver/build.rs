//! The release link of the daemon, shaped for resident memory, which is mostly its own text and
//! what the loader touches at start (see BENCHMARKS.md, "Text placed in order"):
//! - the functions it runs go first, in the order of `symbol-order.txt` (written by
//!   `scripts/symbol-order.sh`), so the pages the kernel maps around them hold code it uses;
//! - relative relocations are packed (RELR): the loader otherwise reads 550 KB of them at every
//!   start, and those pages stay resident.

use std::env;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=symbol-order.txt");
    println!("cargo:rerun-if-env-changed=VGPU_DRA_SYMBOL_ORDER");

    let release = env::var("PROFILE").is_ok_and(|p| p == "release");
    // rustc links this target with its own lld, which reads both flags; GNU ld would refuse the
    // ordering file.
    let lld = env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu");
    if !release || !lld {
        return;
    }
    // Read by glibc 2.36 and later: the image's Debian 12 and anything newer.
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");

    let off = env::var("VGPU_DRA_SYMBOL_ORDER").is_ok_and(|v| v == "off");
    let order = Path::new(&env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("symbol-order.txt");
    if off || !order.is_file() {
        return;
    }
    // A name the build no longer has (new code, another compiler) is skipped, not an error: a
    // stale order costs memory, never a build.
    println!("cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}", order.display());
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
}

//! Native binaries known to load safely on this host: each was loaded in a worker process
//! (or built by this host's driver) before the caller's own loader saw it. The record is
//! local and private (`private.rs`), never in a cache directory another machine or user
//! can write: a shared cache says what a binary is, only this host says it is safe to load.
//!
//! One empty file per binary, named by a key over the binary's bytes, the kernel, the
//! flags, the device and the driver.
//!
//! The host also remembers which compilers' native code its driver refused (a compiler of
//! another release than the driver writes a `.ze_info` the driver does not know): one
//! empty file per (compiler identity, driver version), so the drop-ins go straight to the
//! driver's own compiler for the next kernels instead of paying the refused one again.

use crate::private;
use std::path::PathBuf;

fn dir() -> Option<PathBuf> {
    record_dir(
        "trusted-native",
        "native binaries are tried in a worker every time",
    )
}

fn record_dir(name: &str, without: &str) -> Option<PathBuf> {
    private::subdir(name)
        .map_err(|why| {
            crate::diag::warn_once(
                name,
                format!("{without} ({why}): the record of {name} cannot be kept"),
            )
        })
        .ok()
}

fn refused_key(compiler: &str, driver: &str) -> String {
    crate::cache::key(&[
        b"xpu-zebin/refused-compiler/v1",
        compiler.as_bytes(),
        driver.as_bytes(),
    ])
}

fn refused_dir() -> Option<PathBuf> {
    record_dir(
        "refused-compilers",
        "a compiler whose code the driver refused is tried again in every process",
    )
}

/// Has this host's driver (`driver`: its version) refused native code of `compiler` (an
/// `ocloc` identity) before?
pub fn compiler_refused(compiler: &str, driver: &str) -> bool {
    refused_dir().is_some_and(|d| {
        private::open_file(&d.join(refused_key(compiler, driver)), false, false).is_ok()
    })
}

/// Remember that this host's driver refuses native code of `compiler` (best effort).
pub fn remember_compiler_refused(compiler: &str, driver: &str) {
    if let Some(d) = refused_dir() {
        let _ = private::open_file(&d.join(refused_key(compiler, driver)), true, true);
    }
}

/// Has a binary with this key loaded safely here before?
pub fn known(key: &str) -> bool {
    dir().is_some_and(|d| private::open_file(&d.join(key), false, false).is_ok())
}

/// Remember that the binary with this key loads safely here (best effort: unremembered,
/// it is only tried again).
pub fn remember(key: &str) {
    if let Some(d) = dir() {
        let _ = private::open_file(&d.join(key), true, true);
    }
}

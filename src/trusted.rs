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
use serde::{Deserialize, Serialize};
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

/// One remembered refusal: which compiler's code which driver refused, when (seconds since
/// the epoch) and why. Kept in the record's file, so `doctor` can show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub compiler: String,
    pub driver: String,
    pub when: u64,
    pub why: String,
}

/// A record's file is small; anything larger is not one of ours.
const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// Remember that this host's driver refuses native code of `compiler` (best effort), and
/// why. Only a build this process's compiler has just made may say so (the callers': a
/// cache entry, a bundle, anything another user can write never does).
pub fn remember_compiler_refused(compiler: &str, driver: &str, why: &str) {
    let Some(d) = refused_dir() else { return };
    let record = Refusal {
        compiler: compiler.to_string(),
        driver: driver.to_string(),
        when: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_secs()),
        why: why.chars().take(2000).collect(),
    };
    let written = (|| -> std::io::Result<()> {
        use std::io::Write;
        let mut tmp = tempfile::Builder::new()
            .prefix(".record-")
            .tempfile_in(&d)?;
        tmp.write_all(&serde_json::to_vec(&record)?)?;
        tmp.persist(d.join(refused_key(compiler, driver)))
            .map_err(|e| e.error)?;
        Ok(())
    })();
    if written.is_err() {
        // Without its details, the record still holds.
        let _ = private::open_file(&d.join(refused_key(compiler, driver)), true, true);
    }
}

/// Every remembered refusal on this host. A record of an older release (an empty file) or
/// one that does not parse is listed with what can be said of it.
pub fn refusals() -> Vec<Refusal> {
    let Some(d) = refused_dir() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(&d) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let bytes = private::open_file(&entry.path(), false, false)
            .and_then(|f| crate::bounded::read(f, MAX_RECORD_BYTES));
        let when = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |t| t.as_secs());
        found.push(
            bytes
                .ok()
                .and_then(|b| serde_json::from_slice::<Refusal>(&b).ok())
                .unwrap_or_else(|| Refusal {
                    compiler: format!("unknown (record {name})"),
                    driver: "unknown".into(),
                    when,
                    why: "recorded by an older release, without details".into(),
                }),
        );
    }
    found.sort_by_key(|r| r.when);
    found
}

/// Forget every remembered refusal on this host; returns how many records were removed.
pub fn forget_refusals() -> usize {
    let Some(d) = refused_dir() else { return 0 };
    let Ok(entries) = std::fs::read_dir(&d) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
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

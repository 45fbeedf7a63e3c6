//! Native binaries known to load safely on this host: each was loaded in a worker process
//! (or built by this host's driver) before the caller's own loader saw it. The record is
//! local and private (`private.rs`), never in a cache directory another machine or user
//! can write: a shared cache says what a binary is, only this host says it is safe to load.
//!
//! One empty file per binary, named by a key over the binary's bytes, the kernel, the
//! flags, the device and the driver.

use crate::private;
use std::path::PathBuf;

fn dir() -> Option<PathBuf> {
    private::subdir("trusted-native")
        .map_err(|why| {
            crate::diag::warn_once(
                "trusted-native",
                format!(
                    "native binaries are tried in a worker every time ({why}): the record \
                     of those that loaded cannot be kept"
                ),
            )
        })
        .ok()
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

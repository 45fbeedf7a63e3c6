//! Warnings the engine has for the user, said once each, and details for a debug log. The
//! engine has no logger of its own: the bindings take these after each call and log the
//! warnings at WARNING on the `xpu_zebin` logger (a refused directory, a disabled
//! feature), so a problem that does not fail the compile is still said, once, and never
//! silently; the details at DEBUG on the logger `xpu_zebin.<part>` they name.

use crate::sync::{lock, Renewable};
use std::collections::HashSet;
use std::sync::Mutex;

pub(crate) static SAID: Renewable<Mutex<HashSet<String>>> =
    Renewable::new(|| Mutex::new(HashSet::new()), forget_after_fork);
static PENDING: Renewable<Mutex<Vec<String>>> =
    Renewable::new(|| Mutex::new(Vec::new()), forget_after_fork);
static DETAILS: Renewable<Mutex<Vec<(&'static str, String)>>> =
    Renewable::new(|| Mutex::new(Vec::new()), forget_after_fork);
/// Details kept for a debug log between two calls of the bindings, at most (the engine
/// used from Rust alone never takes them).
const MAX_DETAILS: usize = 4096;

/// In a forked child: what the parent said or queued is not the child's to say.
pub(crate) fn forget_after_fork() {
    SAID.renew();
    PENDING.renew();
    DETAILS.renew();
}

/// Queue `message` unless a warning with this `key` was already queued by this process.
pub fn warn_once(key: &str, message: impl Into<String>) {
    let fresh = lock(SAID.get()).insert(key.to_string());
    if fresh {
        lock(PENDING.get()).push(message.into());
    }
}

/// The warnings queued since the last call.
pub fn take() -> Vec<String> {
    std::mem::take(&mut *lock(PENDING.get()))
}

/// Queue a detail for the debug log of `part` (`xpu_zebin.<part>`).
pub fn detail(part: &'static str, message: impl Into<String>) {
    let mut details = lock(DETAILS.get());
    if details.len() < MAX_DETAILS {
        details.push((part, message.into()));
    }
}

/// The details queued since the last call, with their part.
pub fn take_details() -> Vec<(&'static str, String)> {
    std::mem::take(&mut *lock(DETAILS.get()))
}

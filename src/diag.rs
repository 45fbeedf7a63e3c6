//! Warnings the engine has for the user, said once each. The engine has no logger of its
//! own: the bindings take these after each call and log them at WARNING on the
//! `xpu_zebin` logger (a refused directory, a disabled feature), so a problem that does not
//! fail the compile is still said, once, and never silently.

use crate::sync::lock;
use std::collections::HashSet;
use std::sync::Mutex;

static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
static PENDING: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Queue `message` unless a warning with this `key` was already queued by this process.
pub fn warn_once(key: &str, message: impl Into<String>) {
    let fresh = lock(&SAID)
        .get_or_insert_with(HashSet::new)
        .insert(key.to_string());
    if fresh {
        lock(&PENDING).push(message.into());
    }
}

/// The warnings queued since the last call.
pub fn take() -> Vec<String> {
    std::mem::take(&mut *lock(&PENDING))
}

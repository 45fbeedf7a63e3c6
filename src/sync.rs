//! Locks that survive a panic: a thread that panicked while holding one (a bug, caught and
//! reported as an error) must not turn every later call into a second panic.

use std::sync::{Mutex, MutexGuard};

/// Lock `m`, taking it over if a panicking thread left it poisoned: every structure kept
/// behind these locks stays valid between statements (maps of workers, queues of notes).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Run `work`, turning a panic into an `internal_error` that names it: a bug of ours must
/// reach the caller as a classified error, never as a hang or a dead thread.
pub fn catch<T>(what: &str, work: impl FnOnce() -> T) -> Result<T, crate::error::BuildError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|payload| {
        let said = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        crate::error::BuildError::new(
            crate::error::ErrorKind::Internal,
            format!("{what} panicked: {said} (a bug in xpu-zebin; please report it)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_an_internal_error_and_a_poisoned_lock_is_taken_over() {
        let e = catch("the test", || -> u32 { panic!("boom {}", 1) }).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::Internal);
        assert!(e.message.contains("boom 1"), "{}", e.message);
        let m = Mutex::new(5);
        let _ = catch("poisoner", || {
            let _g = m.lock();
            panic!("while holding the lock")
        });
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 5);
    }
}

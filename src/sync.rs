//! Locks that survive a panic: a thread that panicked while holding one (a bug, caught and
//! reported as an error) must not turn every later call into a second panic.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A process-wide value (locks and what they guard) that a forked child starts afresh: a
/// lock another thread held at the fork stays held forever in the child, where that thread
/// does not exist (Python's `os.fork`, a `multiprocessing` fork). Made on first use; after
/// a fork the child's copy of the old value is left alone (it may be mid-change), never
/// dropped.
pub struct Renewable<T: 'static> {
    current: AtomicPtr<T>,
    make: fn() -> T,
    /// What the owning module runs in a forked child (it renews its values and lets go of
    /// what it held): registered when the value is first made.
    forget: fn(),
}

impl<T: Send + Sync> Renewable<T> {
    pub const fn new(make: fn() -> T, forget: fn()) -> Self {
        Renewable {
            current: AtomicPtr::new(std::ptr::null_mut()),
            make,
            forget,
        }
    }

    pub fn get(&self) -> &'static T {
        if let Some(now) = self.made() {
            return now;
        }
        renew_in_forked_children(self.forget);
        let fresh = Box::into_raw(Box::new((self.make)()));
        let null = std::ptr::null_mut();
        match self
            .current
            .compare_exchange(null, fresh, Ordering::AcqRel, Ordering::Acquire)
        {
            // SAFETY: from Box::into_raw, never freed.
            Ok(_) => unsafe { &*fresh },
            Err(other) => {
                // SAFETY: `fresh` was never shared; `other` is from Box::into_raw, never freed.
                unsafe {
                    drop(Box::from_raw(fresh));
                    &*other
                }
            }
        }
    }

    /// The value, if it was made.
    pub fn made(&self) -> Option<&'static T> {
        let now = self.current.load(Ordering::Acquire);
        // SAFETY: set only from Box::into_raw in `get`, and never freed.
        (!now.is_null()).then(|| unsafe { &*now })
    }

    /// In a forked child: the next use makes a fresh value.
    pub fn renew(&self) {
        self.current.store(std::ptr::null_mut(), Ordering::Release);
    }
}

/// The modules' forget functions a forked child runs, as addresses (0: free): a fixed
/// table, so the child reads it without a lock or an allocation.
static FORGET: [AtomicUsize; 16] = [const { AtomicUsize::new(0) }; 16];

/// Register, once, what a forked child runs before anything else, and `forget` among it:
/// every module that owns process-wide state forgets its parent's. The modules register
/// themselves (this one names none of them).
fn renew_in_forked_children(forget: fn()) {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    let address = forget as usize;
    for slot in &FORGET {
        match slot.compare_exchange(0, address, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(held) if held == address => break,
            Err(_) => continue,
        }
    }
    if !REGISTERED.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a handler that lives as long as the process.
        unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
    }
}

/// Runs in a forked child, on its only thread, before `fork` returns there.
extern "C" fn in_forked_child() {
    for slot in &FORGET {
        let address = slot.load(Ordering::Acquire);
        if address != 0 {
            // SAFETY: only `fn()` addresses are stored (`renew_in_forked_children`).
            let forget: fn() = unsafe { std::mem::transmute::<usize, fn()>(address) };
            forget();
        }
    }
}

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

//! One Triton front end per kernel, however many processes ask: Triton's compile of a
//! kernel (its IRs, SPIR-V and metadata, one group of Triton's cache) claimed as a native
//! build is (`claims.rs`), so that the ranks of a job sharing Triton's cache directory run
//! each kernel's front end once and the others take its group from Triton's cache.
//!
//! The claim lives in this user's cache directory, keyed apart from native builds (a hash
//! of Triton's cache key and the group's file name); `found` is Triton's cache asked
//! again (the caller's). Nothing here fails a compile: a claim that cannot be taken, a
//! holder killed, stopped or slower than `FRONT_END_BOUND`, leaves the caller to run its
//! own front end, as Triton does.

use super::claims::{Claim, Claims, Waited};
use super::SHARE_BUILDS_ENV;
use crate::cache::{Cache, Counter};
use crate::pool::CoreTurn;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// The longest a request waits for another process's front end of a kernel (Triton's
/// front end has no time limit of its own): beyond, it runs its own. Large kernels take
/// tens of seconds; a holder stopped is seen after `claims::STALLED` anyway.
pub const FRONT_END_BOUND: Duration = Duration::from_secs(300);

/// How a request for one of Triton's cache groups went.
pub enum Flight {
    /// This request runs the front end, holding the group's claim until it is dropped.
    Mine(Claim),
    /// Another's front end put the group meanwhile: Triton's cache answers (after this
    /// long a wait).
    Answered(Duration),
    /// It runs its front end without a claim (why).
    Alone(String),
    /// Its wait was cancelled (the caller's interrupt).
    Cancelled,
    /// Another process holds it, and the caller, with other front ends to run first,
    /// comes back for it later.
    Later,
}

/// The claim key of Triton's cache group `filename` under Triton's cache key `key`:
/// hex, never a native build's (another domain of the hash).
pub fn group_key(key: &str, filename: &str) -> String {
    let mut hash = blake3::Hasher::new();
    hash.update(b"a Triton cache group\0");
    hash.update(key.as_bytes());
    hash.update(b"\0");
    hash.update(filename.as_bytes());
    hash.finalize().to_hex().to_string()
}

/// Claim Triton's cache group `filename` of `key` (Triton's cache key and the directory of
/// Triton's cache it is in: processes with caches of their own never wait for each other)
/// in the cache of `cache_dir` (default:
/// the user's), or wait for the process that holds it: `found()` asks Triton's cache. A
/// wait answered is counted in that cache's ledger (`TritonWaits`, and the front end's
/// time it saved, `TritonWaitSavedMicros`). Held by another at
/// the first look, it steps aside (`Later`) when the caller says so (`step_aside`): it
/// has other front ends to run first. `Err`: a bad
/// `XPU_ZEBIN_SHARE_BUILDS` (no value is ignored).
pub fn claim_group(
    cache_dir: Option<&std::path::Path>,
    (key, filename): (&str, &str),
    (bound, cancel, step_aside): (Option<Duration>, &AtomicBool, bool),
    found: impl FnMut() -> bool,
) -> crate::error::Result<Flight> {
    if !crate::knobs::bool_knob(SHARE_BUILDS_ENV, true)? {
        return Ok(Flight::Alone(format!("{SHARE_BUILDS_ENV} is off")));
    }
    let cache = Cache::open(cache_dir);
    if !cache.in_service() {
        return Ok(Flight::Alone("the cache directory is not used".into()));
    }
    // The caller has just looked: the wait's first look is the next.
    let mut found = found;
    let waited = Claims::of(cache.dir()).wait(
        &group_key(key, filename),
        (Some(bound.unwrap_or(FRONT_END_BOUND)), cancel),
        // A front end runs in the caller's own thread: it takes no compiler's core.
        (&|| step_aside, &|_| CoreTurn::Go),
        || found().then_some(()),
    );
    Ok(match waited {
        Waited::Mine(claim, ..) => Flight::Mine(claim),
        Waited::Answered((), took, ran) => {
            // What the wait saved: the holder's front end, as long as it had run when its
            // group was found (its claim's word, kept within the wait and the bound:
            // another host's clock may differ); at least the wait itself.
            let saved = ran
                .unwrap_or(took)
                .clamp(took, took.saturating_add(FRONT_END_BOUND));
            if let Some(ledger) = cache.ledger_to_count() {
                ledger.count(Counter::TritonWaits, 1);
                let micros = u64::try_from(saved.as_micros()).unwrap_or(u64::MAX);
                ledger.count(Counter::TritonWaitSavedMicros, micros);
                cache.publish_counts(&ledger, false);
            }
            Flight::Answered(took)
        }
        Waited::Alone(why) => Flight::Alone(why),
        Waited::Cancelled => Flight::Cancelled,
        Waited::SteppedAside => Flight::Later,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn one_front_end_per_group_the_other_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let never = AtomicBool::new(false);
        let group = ("KEY", "kernel.json");
        let Flight::Mine(claim) =
            claim_group(Some(dir.path()), group, (None, &never, false), || false).unwrap()
        else {
            panic!("a free group is not claimed")
        };
        let (put, looked) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let waiter = {
            let (path, put, looked) = (dir.path().to_path_buf(), put.clone(), looked.clone());
            std::thread::spawn(move || {
                let never = AtomicBool::new(false);
                let flight = claim_group(Some(&path), group, (None, &never, false), || {
                    looked.store(true, Ordering::SeqCst);
                    put.load(Ordering::SeqCst)
                });
                matches!(flight, Ok(Flight::Answered(_)))
            })
        };
        // The group is put (and the claim let go) only once the waiter has looked.
        while !looked.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        put.store(true, Ordering::SeqCst);
        drop(claim);
        assert!(waiter.join().unwrap(), "the waiter ran its own front end");
    }

    #[test]
    fn a_caller_with_other_work_steps_aside_from_a_held_group() {
        let dir = tempfile::tempdir().unwrap();
        let never = AtomicBool::new(false);
        let group = ("KEY", "kernel.json");
        let claimed = claim_group(Some(dir.path()), group, (None, &never, true), || false);
        let Ok(Flight::Mine(_claim)) = claimed else {
            panic!("a free group is not claimed, stepping aside or not")
        };
        let later = claim_group(Some(dir.path()), group, (None, &never, true), || false);
        assert!(matches!(later, Ok(Flight::Later)));
    }

    #[test]
    fn groups_are_apart_from_builds_and_from_each_other() {
        let a = group_key("K", "a.json");
        assert_ne!(a, group_key("K", "b.json"));
        assert_ne!(a, group_key("Ka", ".json"));
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}

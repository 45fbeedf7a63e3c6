//! What each request did, counted in its cache directory's ledger (`cache::Ledger`), for
//! `xpu-zebin stats`: one atomic add per counter, never a failure of the compile. Called
//! once per request (`count_in`).

use crate::attempt::Attempt;
use crate::cache::{Cache, Counter, Ledger};
use crate::error::ErrorKind;

/// A request's answer, as it is counted.
pub enum Answered<'a> {
    /// From a level (its counter); `attempts`: the entry's own, the compile time saved.
    Hit(Counter, &'a [Attempt]),
    /// Compiled here: every attempt made.
    Built(&'a [Attempt]),
    /// Compiled here and failed: every attempt made (a retry that failed is no retry).
    Failed(&'a [Attempt]),
    /// Refused before any compile (a bad setting): a request, not a compile.
    Refused,
    /// From another's build of the same key, waited for; `attempts`: that build's own.
    Waited(&'a [Attempt]),
    /// A failure that repeats, remembered from an earlier build of the key (or the build
    /// waited for); `attempts`: that build's own.
    Remembered(&'a [Attempt]),
}

fn micros(attempts: &[Attempt]) -> u64 {
    let seconds: f64 = attempts.iter().map(|a| a.seconds.max(0.0)).sum();
    (seconds * 1e6).min(u64::MAX as f64) as u64
}

/// Count one request's answer in the ledger of its directory (`cache`), and publish the
/// counts for the other hosts sharing it (at once after a compile).
pub fn count_in(cache: Option<&Cache>, answered: Answered<'_>) {
    let Some((cache, ledger)) = cache.and_then(|c| Some((c, c.ledger_to_count()?))) else {
        return;
    };
    let urgent = matches!(answered, Answered::Built(_) | Answered::Failed(_));
    count(&ledger, answered);
    cache.publish_counts(&ledger, urgent);
}

/// Count one request's answer: from a level, a compile (and its retry), or refused.
pub fn count(ledger: &Ledger, answered: Answered<'_>) {
    ledger.count(Counter::Requests, 1);
    match answered {
        Answered::Refused => {}
        Answered::Hit(level, attempts) => {
            ledger.count(level, 1);
            ledger.count(Counter::SavedMicros, micros(attempts));
        }
        Answered::Waited(attempts) => {
            ledger.count(Counter::Waits, 1);
            ledger.count(Counter::WaitSavedMicros, micros(attempts));
        }
        Answered::Remembered(attempts) => {
            ledger.count(Counter::RememberedFailures, 1);
            ledger.count(Counter::SavedMicros, micros(attempts));
        }
        Answered::Built(attempts) | Answered::Failed(attempts) => {
            ledger.count(Counter::Compiles, 1);
            ledger.count(Counter::CompileMicros, micros(attempts));
            let retry = matches!(answered, Answered::Built(_)).then(|| retry_of(attempts));
            if let Some(why) = retry.flatten() {
                ledger.count(why, 1);
            }
        }
    }
}

/// The large-GRF retry of a fresh build whose attempts are `attempts`.
fn retry_of(attempts: &[Attempt]) -> Option<Counter> {
    let first = attempts.first()?;
    if attempts.len() < 2 {
        return None;
    }
    match &first.error {
        Some(e) if e.kind == ErrorKind::ScratchOverflow => Some(Counter::RetriesPtss),
        Some(_) => Some(Counter::RetriesFailure),
        None => Some(Counter::RetriesSpill),
    }
}

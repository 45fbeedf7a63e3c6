//! What each request did, counted in its cache directory's ledger (`cache::Ledger`), for
//! `xpu-zebin stats`: one atomic add per counter, never a failure of the compile.

use crate::cache::{Counter, Ledger};
use crate::engine::{Attempt, Outcome, Slot};
use crate::error::ErrorKind;

fn micros(attempts: &[Attempt]) -> u64 {
    let seconds: f64 = attempts.iter().map(|a| a.seconds.max(0.0)).sum();
    (seconds * 1e6).min(u64::MAX as f64) as u64
}

/// Count `outcome` of a request answered in `slot` (nothing when its cache is off).
pub fn count(slot: &Slot, outcome: &Outcome) {
    let Some(ledger) = slot.ledger() else {
        return;
    };
    match outcome {
        Ok(c) => answered(
            &ledger,
            c.cached,
            c.from_store,
            &c.attempts,
            retry_of(&c.attempts),
        ),
        // A request refused before any compile (a bad setting): a request, not a compile.
        Err(f) if f.attempts.is_empty() => ledger.count(Counter::Requests, 1),
        Err(f) => answered(&ledger, false, false, &f.attempts, None),
    }
}

/// One request's answer: from the local level, the store's, or a compile (and its retry).
pub fn answered(
    ledger: &Ledger,
    cached: bool,
    from_store: bool,
    attempts: &[Attempt],
    retry: Option<Counter>,
) {
    ledger.count(Counter::Requests, 1);
    if cached || from_store {
        let level = match from_store {
            true => Counter::StoreHits,
            false => Counter::LocalHits,
        };
        ledger.count(level, 1);
        ledger.count(Counter::SavedMicros, micros(attempts));
        return;
    }
    ledger.count(Counter::Compiles, 1);
    ledger.count(Counter::CompileMicros, micros(attempts));
    if let Some(why) = retry {
        ledger.count(why, 1);
    }
}

/// The large-GRF retry of a fresh build whose attempts are `attempts`.
pub fn retry_of(attempts: &[Attempt]) -> Option<Counter> {
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

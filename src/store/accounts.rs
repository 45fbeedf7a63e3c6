//! What each request did, counted in its cache directory's ledger (`cache::Ledger`), for
//! `xpu-zebin stats`: one atomic add per counter, never a failure of the compile.

use crate::cache::Counter;
use crate::engine::{Attempt, Compiled, Outcome, Slot};
use crate::error::ErrorKind;

fn micros(attempts: &[Attempt]) -> u64 {
    let seconds: f64 = attempts.iter().map(|a| a.seconds.max(0.0)).sum();
    (seconds * 1e6).min(u64::MAX as f64) as u64
}

/// The large-GRF retry a fresh build made, by what triggered it.
fn retry(c: &Compiled) -> Option<Counter> {
    let first = c.attempts.first()?;
    if c.attempts.len() < 2 {
        return None;
    }
    match &first.error {
        Some(e) if e.kind == ErrorKind::ScratchOverflow => Some(Counter::RetriesPtss),
        Some(_) => Some(Counter::RetriesFailure),
        None => Some(Counter::RetriesSpill),
    }
}

/// Count `outcome` of a request answered in `slot` (nothing when its cache is off).
pub fn count(slot: &Slot, outcome: &Outcome) {
    let Some(ledger) = slot.ledger() else {
        return;
    };
    ledger.count(Counter::Requests, 1);
    match outcome {
        Ok(c) if c.from_store || c.cached => {
            let level = match c.from_store {
                true => Counter::StoreHits,
                false => Counter::LocalHits,
            };
            ledger.count(level, 1);
            ledger.count(Counter::SavedMicros, micros(&c.attempts));
        }
        Ok(c) => {
            ledger.count(Counter::Compiles, 1);
            ledger.count(Counter::CompileMicros, micros(&c.attempts));
            if let Some(why) = retry(c) {
                ledger.count(why, 1);
            }
        }
        Err(f) => {
            ledger.count(Counter::Compiles, 1);
            ledger.count(Counter::CompileMicros, micros(&f.attempts));
        }
    }
}

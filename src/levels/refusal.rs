//! A failure that repeats (PTSS in both GRF modes, a kernel the compiler refuses), as the
//! levels keep it for its key: the next request for the key, in any process, is answered
//! with it without a build. Kept under a key of its own, derived from the build's
//! (`Levels::remember`: the key holds the compiler's identity, so a new compiler tries
//! again).

use crate::attempt::Attempt;
use crate::error::BuildError;
use serde::{Deserialize, Serialize};

/// A failure that repeats, as the levels keep it for its key: the error (with the
/// compiler's log) and every attempt made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Refusal {
    pub error: BuildError,
    pub attempts: Vec<Attempt>,
}

impl Refusal {
    /// A build's failure: its error (with the compiler's log) and every attempt made.
    pub fn of(error: &BuildError, attempts: &[Attempt]) -> Refusal {
        Refusal {
            error: error.clone(),
            attempts: attempts.to_vec(),
        }
    }

    /// A wait for another's build ended by the request's cancel.
    pub fn cancelled() -> Refusal {
        Refusal {
            error: BuildError::new(
                crate::error::ErrorKind::Cancelled,
                "cancelled while waiting for another's build of this kernel",
            ),
            attempts: Vec::new(),
        }
    }

    /// Would a build of the same key fail the same way again: every attempt failed in a
    /// way that repeats (`ErrorKind::is_repeatable`: not a timeout, a cancel, a crash).
    pub fn repeats(&self) -> bool {
        !self.attempts.is_empty()
            && self.error.kind.is_repeatable()
            && self
                .attempts
                .iter()
                .all(|a| a.error.as_ref().is_some_and(|e| e.kind.is_repeatable()))
    }
}

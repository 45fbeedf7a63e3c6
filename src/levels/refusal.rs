//! A failure that repeats (PTSS in both GRF modes, a kernel the compiler refuses), as the
//! levels keep it for its key: the next request for the key, in any process, is answered
//! with it without a build. Kept under a key of its own, derived from the build's
//! (`Levels::remember`: the key holds the compiler's identity, so a new compiler tries
//! again).

use crate::attempt::Attempt;
use crate::error::{BuildError, ErrorKind};
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
                ErrorKind::Cancelled,
                "cancelled while waiting for another's build of this kernel",
            ),
            attempts: Vec::new(),
        }
    }

    /// Would a build of the same key fail the same way again: every attempt failed in a
    /// way only the input explains (PTSS, a build the compiler refused, SPIR-V it
    /// rejected, a kernel or device it does not know), and the compiler said so in its log
    /// (`classify::compiler_reported`). Never a timeout, a cancel, a crash or a kill, a
    /// binary that could not be read back, or a failure with nothing from the compiler (a
    /// driver out of memory): those may not repeat, and the next request builds.
    pub fn repeats(&self) -> bool {
        let proven = |kind: ErrorKind| {
            matches!(
                kind,
                ErrorKind::ScratchOverflow
                    | ErrorKind::BuildFailure
                    | ErrorKind::InvalidSpirv
                    | ErrorKind::KernelNotFound
                    | ErrorKind::UnsupportedDevice
            )
        };
        !self.attempts.is_empty()
            && proven(self.error.kind)
            && crate::classify::compiler_reported(&self.error.log)
            && self
                .attempts
                .iter()
                .all(|a| a.error.as_ref().is_some_and(|e| proven(e.kind)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::AttemptError;

    fn failed(kind: ErrorKind, log: &str) -> Refusal {
        let error = BuildError::new(kind, "it failed").with_log(log);
        let attempt = |flags: &str| Attempt {
            build_flags: flags.into(),
            ok: false,
            spill_size: None,
            seconds: 1.0,
            started: 0.0,
            error: Some(AttemptError::from(&error)),
        };
        Refusal {
            attempts: vec![attempt(""), attempt("-cl-intel-256-GRF-per-thread")],
            error,
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// A failure entry is another's bytes: whatever they hold, decoding one never
        /// panics, and only a whole entry written under its own key is read back.
        #[test]
        fn any_bytes_at_a_failure_s_key_are_refused(bytes in proptest::collection::vec(
            proptest::prelude::any::<u8>(), 0..256)) {
            let at = crate::levels::failure_key(&"ab".repeat(32));
            proptest::prop_assert!(crate::cache::decode::<Refusal>(&at, &bytes).is_err());
        }
    }

    #[test]
    fn a_failure_kept_under_one_key_is_refused_under_another() {
        let said = "error: subgroup size 8";
        let entry = {
            let at = crate::levels::failure_key("00");
            crate::cache::encode(&at, &failed(ErrorKind::BuildFailure, said), &[]).unwrap()
        };
        let other = crate::levels::failure_key("01");
        assert!(crate::cache::decode::<Refusal>(&other, &entry).is_err());
        let own = crate::levels::failure_key("00");
        assert!(crate::cache::decode::<Refusal>(&own, &entry)
            .unwrap()
            .0
            .repeats());
    }

    #[test]
    fn only_what_the_compiler_said_of_the_input_repeats() {
        let said = "error: in kernel 'k': total scratch space exceeds HW supported limit";
        assert!(failed(ErrorKind::ScratchOverflow, said).repeats());
        assert!(failed(ErrorKind::BuildFailure, "error: subgroup size 8").repeats());
        // Nothing from the compiler (a driver out of memory), or not the input's.
        assert!(!failed(ErrorKind::BuildFailure, "").repeats());
        for kind in [
            ErrorKind::Timeout,
            ErrorKind::Cancelled,
            ErrorKind::CompilerCrash,
            ErrorKind::DegenerateBinary,
            ErrorKind::ToolchainMissing,
            ErrorKind::Internal,
            ErrorKind::LinkFailure,
        ] {
            assert!(!failed(kind, said).repeats(), "{kind:?}");
        }
        // One attempt that may not repeat (its twin was cancelled) makes the whole not.
        let mut mixed = failed(ErrorKind::ScratchOverflow, said);
        mixed.attempts[1].error = Some(AttemptError::from(&BuildError::new(
            ErrorKind::Cancelled,
            "cancelled",
        )));
        assert!(!mixed.repeats());
        assert!(!Refusal::cancelled().repeats());
    }
}

//! The one error type of the engine: a kind (data Python can list), a message, and the
//! compiler's log. Every failure path builds one of these, so nothing is lost on the way up.

use serde::{Deserialize, Serialize};

/// What went wrong, as data. `name()` is the stable string Python sees as `BuildError.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    ScratchOverflow,
    BuildFailure,
    InvalidSpirv,
    KernelNotFound,
    UnsupportedDevice,
    CompilerCrash,
    Timeout,
    ToolchainMissing,
    DegenerateBinary,
    InvalidArgument,
    Cancelled,
    NoDevice,
    LinkFailure,
    Internal,
}

impl ErrorKind {
    /// Would the same input fail the same way again? A timeout, a cancel, a crashed or
    /// missing compiler, a lost device or a bug of ours may not: an answer that depends on
    /// one of those is never cached.
    pub fn is_repeatable(self) -> bool {
        matches!(
            self,
            ErrorKind::ScratchOverflow
                | ErrorKind::BuildFailure
                | ErrorKind::InvalidSpirv
                | ErrorKind::KernelNotFound
                | ErrorKind::UnsupportedDevice
                | ErrorKind::DegenerateBinary
                | ErrorKind::InvalidArgument
                | ErrorKind::LinkFailure
        )
    }

    pub const ALL: [ErrorKind; 14] = [
        ErrorKind::ScratchOverflow,
        ErrorKind::BuildFailure,
        ErrorKind::InvalidSpirv,
        ErrorKind::KernelNotFound,
        ErrorKind::UnsupportedDevice,
        ErrorKind::CompilerCrash,
        ErrorKind::Timeout,
        ErrorKind::ToolchainMissing,
        ErrorKind::DegenerateBinary,
        ErrorKind::InvalidArgument,
        ErrorKind::Cancelled,
        ErrorKind::NoDevice,
        ErrorKind::LinkFailure,
        ErrorKind::Internal,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::ScratchOverflow => "scratch_overflow",
            ErrorKind::BuildFailure => "build_failure",
            ErrorKind::InvalidSpirv => "invalid_spirv",
            ErrorKind::KernelNotFound => "kernel_not_found",
            ErrorKind::UnsupportedDevice => "unsupported_device",
            ErrorKind::CompilerCrash => "compiler_crash",
            ErrorKind::Timeout => "timeout",
            ErrorKind::ToolchainMissing => "toolchain_missing",
            ErrorKind::DegenerateBinary => "degenerate_binary",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::NoDevice => "no_device",
            ErrorKind::LinkFailure => "link_failure",
            ErrorKind::Internal => "internal_error",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            ErrorKind::ScratchOverflow => {
                "per-thread scratch space (PTSS) exceeds the hardware limit; carries required and limit bytes"
            }
            ErrorKind::BuildFailure => "the compiler rejected the kernel",
            ErrorKind::InvalidSpirv => "the input is not a well-formed SPIR-V module",
            ErrorKind::KernelNotFound => "the requested kernel is not an entry point of the module",
            ErrorKind::UnsupportedDevice => "the compiler does not know the target device",
            ErrorKind::CompilerCrash => "the compiler died (signal or internal error)",
            ErrorKind::Timeout => "the compiler ran past its time limit and was killed",
            ErrorKind::ToolchainMissing => "no usable ocloc / Intel compiler was found",
            ErrorKind::DegenerateBinary => {
                "the compiler reported success but wrote no usable zebin (.ze_info, .text.*, .symtab)"
            }
            ErrorKind::InvalidArgument => "an argument is out of its domain",
            ErrorKind::Cancelled => "the job was cancelled (Ctrl-C)",
            ErrorKind::NoDevice => "no Level Zero driver or GPU device (set XPU_ZEBIN_SIMULATED_DEVICE=pvc to simulate one)",
            ErrorKind::LinkFailure => "the module imports symbols nothing provides (unlinked module)",
            ErrorKind::Internal => "a bug in xpu-zebin itself (a panic, caught and reported); please report it",
        }
    }
}

/// A classified failure with everything the user needs to act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{kind_name}: {message}", kind_name = kind.name())]
pub struct BuildError {
    pub kind: ErrorKind,
    pub message: String,
    /// The compiler's own output (stdout and stderr, interleaved), empty when it never ran.
    pub log: String,
    /// PTSS bytes the kernel needs (scratch_overflow only).
    pub required: Option<u64>,
    /// PTSS bytes the hardware allows (scratch_overflow only).
    pub limit: Option<u64>,
}

impl BuildError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        BuildError {
            kind,
            message: message.into(),
            log: String::new(),
            required: None,
            limit: None,
        }
    }

    pub fn with_log(mut self, log: impl Into<String>) -> Self {
        self.log = log.into();
        self
    }

    /// The same error, its message after `context` (what came before it).
    pub fn in_context(&self, context: &str) -> Self {
        let mut e = self.clone();
        e.message = format!("{context}{}", e.message);
        e
    }
}

pub type Result<T, E = BuildError> = std::result::Result<T, E>;

/// A failed attempt's error without its log (the log of the chosen attempt is kept once,
/// on the result or the raised error): what `--json` and `Attempt.error` carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptError {
    pub kind: ErrorKind,
    pub message: String,
    pub required: Option<u64>,
    pub limit: Option<u64>,
}

impl From<&BuildError> for AttemptError {
    fn from(e: &BuildError) -> Self {
        AttemptError {
            kind: e.kind,
            message: e.message.clone(),
            required: e.required,
            limit: e.limit,
        }
    }
}

impl std::fmt::Display for AttemptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.message)
    }
}

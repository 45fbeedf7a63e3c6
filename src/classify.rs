//! Compiler output -> typed outcome. Works on the text both ocloc generations print and on
//! Level Zero build logs, so every backend names its failures the same way.

use crate::error::{BuildError, ErrorKind};
use regex::Regex;
use std::sync::LazyLock;
use std::time::Duration;

/// How a compiler process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// Killed at its deadline, `limit` after it started.
    TimedOut {
        limit: Duration,
    },
    Cancelled,
    /// Killed by a crash watch: it sat in its crash handler after a fault
    /// (`crash_watch.rs`).
    StuckInCrashHandler,
}

// Upstream's wording ("... limit for kernel K: N bytes (max permitted PTSS M bytes)") and
// IGC 2.x's ("in kernel 'K': total scratch space exceeds HW supported limit: N bytes (max
// permitted PTSS M bytes)") share this shape.
static PTSS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?is)total scratch space exceeds HW supported limit[^\n]*?(\d+)\s*bytes\s*\(\s*max permitted PTSS\s*(\d+)\s*bytes",
    )
    .unwrap()
});
// Upstream's markers (driver.c `tryRaisePTSSOutOfResources`, compiler.py's
// `PTSS_OVERFLOW_RE`, #7285): any one of them in a failed build's log is a PTSS overflow,
// with 0/0 bytes when the log gives no numbers.
static PTSS_LOOSE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)total scratch space|scratch space exceeds|exceeding max permitted PTSS|per.thread scratch space",
    )
    .unwrap()
});
static UNSUPPORTED_DEVICE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)Cannot get HW Info for device|Could not determine device target|Unknown device|Invalid device").unwrap()
});
static INVALID_SPIRV: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)invalid spir-?v|spir-?v (?:parsing|parser|reader) error|failed to (?:parse|read) spir-?v|SPIRV consumption failed").unwrap()
});
static MISSING_LIBRARY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)error while loading shared libraries|cannot open shared object|Error! Loading of (?:IGC|FCL) library has failed|not found: /").unwrap()
});

/// PTSS overflow in a log: (required bytes, limit bytes).
pub fn scratch_overflow(log: &str) -> Option<(u64, u64)> {
    let caps = PTSS.captures(log)?;
    Some((caps[1].parse().ok()?, caps[2].parse().ok()?))
}

/// The ScratchOverflow error a log describes, with required and limit bytes when it says
/// them; the same for ocloc output and Level Zero build logs.
fn scratch_overflow_error(log: &str) -> Option<BuildError> {
    const WHAT: &str = "per-thread scratch space (PTSS) exceeds the hardware limit";
    if let Some((required, limit)) = scratch_overflow(log) {
        let message = format!("{WHAT}: {required} bytes required, {limit} bytes permitted");
        let mut e = BuildError::new(ErrorKind::ScratchOverflow, message).with_log(log);
        e.required = Some(required);
        e.limit = Some(limit);
        return Some(e);
    }
    PTSS_LOOSE.is_match(log).then(|| {
        let message = format!("{WHAT}: {}", headline(log).unwrap_or(""));
        BuildError::new(ErrorKind::ScratchOverflow, message).with_log(log)
    })
}

pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "signal",
    }
}

/// The line a human should read first: the first `error:` line, else the last line said.
fn headline(log: &str) -> Option<&str> {
    let mut lines = log.lines().map(str::trim).filter(|l| !l.is_empty());
    lines
        .clone()
        .find(|l| l.to_ascii_lowercase().contains("error"))
        .or_else(|| lines.rfind(|l| !l.starts_with("Command was:")))
}

/// A compiler that did not exit by itself: killed at its deadline, cancelled, crashed.
fn ended_early(exit: Exit) -> BuildError {
    match exit {
        Exit::TimedOut { limit } => BuildError::new(
            ErrorKind::Timeout,
            format!(
                "the compiler did not finish within {} s and was killed",
                limit.as_secs_f64()
            ),
        ),
        Exit::Cancelled => {
            BuildError::new(ErrorKind::Cancelled, "cancelled; the compiler was killed")
        }
        Exit::Signal(sig) => BuildError::new(
            ErrorKind::CompilerCrash,
            format!(
                "the compiler crashed: killed by {} ({sig})",
                signal_name(sig)
            ),
        ),
        Exit::StuckInCrashHandler => BuildError::new(
            ErrorKind::CompilerCrash,
            format!("the compiler crashed: {}", crate::crash_watch::STUCK_SAID),
        ),
        Exit::Code(code) => BuildError::new(
            ErrorKind::Internal,
            format!("exit {code} taken for an early end (a bug in xpu-zebin)"),
        ),
    }
}

/// Name the cause of a failed compile from how it ended and what it printed.
pub fn classify_failure(exit: Exit, log: &str) -> BuildError {
    let err = |kind, message: String| BuildError::new(kind, message).with_log(log);
    let code = match exit {
        Exit::Code(code) => code,
        other => return ended_early(other).with_log(log),
    };
    if let Some(e) = scratch_overflow_error(log) {
        return e;
    }
    if code == 127 || MISSING_LIBRARY.is_match(log) {
        return err(
            ErrorKind::ToolchainMissing,
            format!(
                "the compiler could not start (exit {code}): {}",
                headline(log).unwrap_or("no output")
            ),
        );
    }
    if UNSUPPORTED_DEVICE.is_match(log) {
        return err(
            ErrorKind::UnsupportedDevice,
            format!(
                "the compiler does not support this device: {}",
                headline(log).unwrap_or("")
            ),
        );
    }
    // A shell wrapper reports a child's death by signal N as exit 128+N.
    if (129..=159).contains(&code) {
        let sig = code - 128;
        if matches!(
            sig,
            libc::SIGSEGV | libc::SIGABRT | libc::SIGBUS | libc::SIGILL | libc::SIGFPE
        ) {
            return err(
                ErrorKind::CompilerCrash,
                format!("the compiler crashed: {} (exit {code})", signal_name(sig)),
            );
        }
        // Killed from outside (the OOM killer, a job's end): no answer of the input's.
        if matches!(sig, libc::SIGKILL | libc::SIGTERM) {
            return err(
                ErrorKind::CompilerCrash,
                format!(
                    "the compiler was killed: {} (exit {code})",
                    signal_name(sig)
                ),
            );
        }
    }
    if code == 255 || code == -1 {
        return err(
            ErrorKind::CompilerCrash,
            format!(
                "internal compiler error (ocloc exit {code}): {}",
                headline(log).unwrap_or("no output")
            ),
        );
    }
    if INVALID_SPIRV.is_match(log) {
        return err(
            ErrorKind::InvalidSpirv,
            format!(
                "the compiler rejected the SPIR-V: {}",
                headline(log).unwrap_or("")
            ),
        );
    }
    err(
        ErrorKind::BuildFailure,
        format!(
            "build failed (exit {code}): {}",
            headline(log).unwrap_or("the compiler printed nothing")
        ),
    )
}

/// Whether the compiler itself reported the failure in `log` (an `error` line of IGC's or
/// ocloc's): a failure with no such line (an empty log, a driver out of memory) may be
/// the host's, not the input's, and is never remembered as one that repeats.
pub fn compiler_reported(log: &str) -> bool {
    log.lines()
        .any(|l| l.to_ascii_lowercase().contains("error"))
}

/// Name the cause of a failed Level Zero module build from its result and build log.
pub fn classify_driver_failure(result: &str, log: &str) -> BuildError {
    let err = |kind, message: String| BuildError::new(kind, message).with_log(log);
    if let Some(e) = scratch_overflow_error(log) {
        return e;
    }
    let said = headline(log).unwrap_or("the build log is empty");
    if INVALID_SPIRV.is_match(log) {
        return err(
            ErrorKind::InvalidSpirv,
            format!("the driver rejected the SPIR-V ({result}): {said}"),
        );
    }
    err(
        ErrorKind::BuildFailure,
        format!("zeModuleCreate failed with {result}: {said}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compiler_killed_through_a_wrapper_is_no_build_failure() {
        for code in [128 + libc::SIGKILL, 128 + libc::SIGTERM] {
            let e = classify_failure(Exit::Code(code), "");
            assert_eq!(e.kind, ErrorKind::CompilerCrash, "exit {code}");
            assert!(e.message.contains("killed"), "{}", e.message);
        }
    }

    #[test]
    fn ptss_both_wordings() {
        let igc2 = "error: in kernel 'K': total scratch space exceeds HW supported limit: 265792 bytes (max permitted PTSS 262144 bytes)";
        assert_eq!(scratch_overflow(igc2), Some((265792, 262144)));
        let upstream = "error: total scratch space exceeds HW supported limit for kernel K: 300000 bytes (max permitted PTSS 262144 bytes)";
        assert_eq!(scratch_overflow(upstream), Some((300000, 262144)));
        let e = classify_failure(Exit::Code(245), igc2);
        assert_eq!(e.kind, ErrorKind::ScratchOverflow);
        assert_eq!((e.required, e.limit), (Some(265792), Some(262144)));
        assert_eq!(e.log, igc2);
        // Upstream's markers without numbers are still a PTSS overflow (0/0 upstream).
        for log in [
            "error: total scratch space of kernel K is too large",
            "error: scratch space exceeds what the thread may use",
            "error: exceeding max permitted PTSS",
            "error: per-thread scratch space would exceed the limit",
            "error: per-thread scratch space of 300000 bytes",
        ] {
            let e = classify_driver_failure("ZE_RESULT_ERROR_MODULE_BUILD_FAILURE", log);
            assert_eq!(e.kind, ErrorKind::ScratchOverflow, "{log}");
            assert_eq!((e.required, e.limit), (None, None));
        }
        let other = classify_failure(Exit::Code(1), "error: private memory of 64 bytes");
        assert_ne!(other.kind, ErrorKind::ScratchOverflow);
    }

    #[test]
    fn exits_and_signals() {
        assert_eq!(
            classify_failure(Exit::Signal(11), "").kind,
            ErrorKind::CompilerCrash
        );
        assert_eq!(
            classify_failure(Exit::Code(139), "").kind,
            ErrorKind::CompilerCrash
        );
        assert_eq!(
            classify_failure(Exit::Code(255), "x").kind,
            ErrorKind::CompilerCrash
        );
        assert_eq!(
            classify_failure(
                Exit::TimedOut {
                    limit: Duration::from_secs(3)
                },
                ""
            )
            .kind,
            ErrorKind::Timeout
        );
        // A limit under a second is said as given, not rounded to 0.
        let short = classify_failure(
            Exit::TimedOut {
                limit: Duration::from_millis(10),
            },
            "",
        );
        assert!(short.message.contains("within 0.01 s"), "{}", short.message);
        assert_eq!(
            classify_failure(
                Exit::Code(223),
                "Error: Cannot get HW Info for device nosuch."
            )
            .kind,
            ErrorKind::UnsupportedDevice
        );
        let e = classify_failure(Exit::Code(1), "noise\nerror: something broke\nmore");
        assert_eq!(e.kind, ErrorKind::BuildFailure);
        assert!(
            e.message.contains("error: something broke"),
            "{}",
            e.message
        );
    }
}

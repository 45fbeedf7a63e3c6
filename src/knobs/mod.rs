//! Environment knobs: one parser for every `XPU_ZEBIN_*` value (booleans, byte counts,
//! durations), so a bad value is an error naming the variable and what it holds, never a
//! silent default, a panic, or a deadline in the year 10^12.
//!
//! Every request starts with [`check`]: a bad knob fails the request at once with
//! `invalid_argument`. Code that reads a knob later (a worker, eviction) then reads a
//! value known to parse; where it cannot fail, it falls back to the default.

use crate::error::{BuildError, ErrorKind, Result};
use std::time::Duration;

/// The longest duration any knob or argument may hold: about 31 years. Longer is a typo
/// (or `inf`); 0 is how "no limit" is said where a limit can be turned off.
pub const MAX_SECONDS: f64 = 1e9;

/// What a knob holds, for its parser and its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Bytes,
    Seconds,
    /// A path or a name: any text.
    Text,
    /// A spill policy name (`spill.rs`).
    SpillPolicy,
    /// A whole number of things (jobs).
    Count,
    /// Seconds, or `off` (never).
    SecondsOrOff,
}

impl Kind {
    /// How the documentation names it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Bool => "boolean",
            Kind::Bytes => "bytes",
            Kind::Seconds => "seconds",
            Kind::Text => "text",
            Kind::SpillPolicy => "spill policy",
            Kind::Count => "count",
            Kind::SecondsOrOff => "seconds or off",
        }
    }
}

mod table;
pub use table::{Knob, Reader, KNOBS};

fn bad(name: &str, value: &str, expected: &str) -> BuildError {
    BuildError::new(
        ErrorKind::InvalidArgument,
        format!("{name}={value:?} is not valid: expected {expected}"),
    )
}

const BOOL_EXPECTED: &str = "a boolean: 1, true, yes, on or 0, false, no, off";
const BYTES_EXPECTED: &str = "a whole number of bytes (0 to 18446744073709551615)";
const SECONDS_EXPECTED: &str = "seconds, a finite number from 0 to 1e9";
const SECONDS_OR_OFF_EXPECTED: &str = "seconds, a finite number from 0 to 1e9, or off";

/// `1/true/yes/on` or `0/false/no/off`, any case, surrounding blanks ignored.
pub fn parse_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    // `u64::from_str` takes a leading '+'; a byte count is plain digits.
    (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .then(|| t.parse().ok())
        .flatten()
}

/// A duration from a number of seconds: finite, not negative, at most [`MAX_SECONDS`].
/// A positive value below a nanosecond is a nanosecond, never zero (which means no limit).
pub fn seconds(value: f64) -> Option<Duration> {
    (value.is_finite() && (0.0..=MAX_SECONDS).contains(&value))
        .then(|| Duration::try_from_secs_f64(value).ok())
        .flatten()
        .map(|d| match d.is_zero() && value > 0.0 {
            true => Duration::from_nanos(1),
            false => d,
        })
}

pub fn parse_seconds(text: &str) -> Option<Duration> {
    let t = text.trim();
    // Rust's float parser takes "inf", "nan" and "infinity": `seconds` rejects them.
    t.parse::<f64>().ok().and_then(seconds)
}

/// Seconds, or `off` (any case, surrounding blanks ignored): `Some(None)`.
pub fn parse_seconds_or_off(text: &str) -> Option<Option<Duration>> {
    match text.trim().eq_ignore_ascii_case("off") {
        true => Some(None),
        false => parse_seconds(text).map(Some),
    }
}

/// A duration argument (Python's `timeout=`): the same rule, as an `invalid_argument`.
pub fn seconds_argument(name: &str, value: f64) -> Result<Duration> {
    seconds(value).ok_or_else(|| {
        BuildError::new(
            ErrorKind::InvalidArgument,
            format!("{name}={value} is not valid: expected {SECONDS_EXPECTED} (0: no limit)"),
        )
    })
}

/// A text argument handed to a compiler (build flags, a device or kernel name): C strings
/// end at the first NUL, so one would silently cut what the compiler sees.
pub fn text_argument(name: &str, value: &str) -> Result<()> {
    match value.find('\0') {
        None => Ok(()),
        Some(at) => Err(BuildError::new(
            ErrorKind::InvalidArgument,
            format!(
                "{name} holds a NUL character at position {at}: the compiler would see only {:?}",
                &value[..at]
            ),
        )),
    }
}

/// The variable's text: `None` when unset or blank (the default applies).
fn raw(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(bad(name, &v.to_string_lossy(), "text that is valid UTF-8"))
        }
    }
}

fn check_one(name: &str, kind: Kind) -> Result<()> {
    match kind {
        Kind::Bool => bool_knob(name, false).map(drop),
        Kind::Bytes => bytes_knob(name, 0).map(drop),
        Kind::Seconds => seconds_knob(name, Duration::ZERO).map(drop),
        Kind::SecondsOrOff => seconds_or_off_knob(name, None).map(drop),
        // Paths: any bytes Linux allows (a path cannot even hold a NUL).
        Kind::Text | Kind::Count => Ok(()),
        Kind::SpillPolicy => match raw(name)? {
            Some(text) => crate::spill::SpillPolicy::parse(&text, name).map(drop),
            None => Ok(()),
        },
    }
}

/// Every knob set now parses; the first that does not is the error.
pub fn check() -> Result<()> {
    KNOBS
        .iter()
        .filter(|k| k.reader == Reader::Engine)
        .try_for_each(|k| check_one(k.name, k.kind))
}

/// Environment variable for the default compile timeout in seconds (0: none).
pub const TIMEOUT_ENV: &str = "XPU_ZEBIN_TIMEOUT";
/// Without a setting, a compile that runs this long is considered hung.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(900);

/// The time limit of each compiler run: the request's, else `XPU_ZEBIN_TIMEOUT`, else the
/// default; zero means none. A bad variable is an `invalid_argument` naming it.
pub fn effective_timeout(requested: Option<Duration>) -> Result<Option<Duration>> {
    let timeout = match requested {
        Some(t) => t,
        None => seconds_knob(TIMEOUT_ENV, DEFAULT_TIMEOUT)?,
    };
    Ok((!timeout.is_zero()).then_some(timeout))
}

/// What every request checks before anything runs: the environment's knobs, and text that
/// would reach a compiler cut at a NUL.
pub fn check_request(texts: &[(&str, &str)]) -> Result<()> {
    check()?;
    texts
        .iter()
        .try_for_each(|(name, value)| text_argument(name, value))
}

/// A text knob: its value, `None` when unset or blank; `Err` when it is not UTF-8.
pub fn text_knob(name: &str) -> Result<Option<String>> {
    raw(name)
}

/// A boolean knob: its value, `default` when unset; `Err` when it does not parse.
pub fn bool_knob(name: &str, default: bool) -> Result<bool> {
    match raw(name)? {
        None => Ok(default),
        Some(t) => parse_bool(&t).ok_or_else(|| bad(name, &t, BOOL_EXPECTED)),
    }
}

/// A byte-count knob: its value, `default` when unset; `Err` when it does not parse.
pub fn bytes_knob(name: &str, default: u64) -> Result<u64> {
    match raw(name)? {
        None => Ok(default),
        Some(t) => parse_bytes(&t).ok_or_else(|| bad(name, &t, BYTES_EXPECTED)),
    }
}

/// A duration knob: its value, `default` when unset; `Err` when it does not parse.
pub fn seconds_knob(name: &str, default: Duration) -> Result<Duration> {
    match raw(name)? {
        None => Ok(default),
        Some(t) => parse_seconds(&t).ok_or_else(|| bad(name, &t, SECONDS_EXPECTED)),
    }
}

/// A duration knob that can be turned off: its value (`None`: off), `default` when unset;
/// `Err` when it does not parse.
pub fn seconds_or_off_knob(name: &str, default: Option<Duration>) -> Result<Option<Duration>> {
    match raw(name)? {
        None => Ok(default),
        Some(t) => parse_seconds_or_off(&t).ok_or_else(|| bad(name, &t, SECONDS_OR_OFF_EXPECTED)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_is_seconds_or_off() {
        assert_eq!(parse_seconds_or_off(" OFF "), Some(None));
        assert_eq!(parse_seconds_or_off("0"), Some(Some(Duration::ZERO)));
        assert_eq!(
            parse_seconds_or_off("0.25"),
            Some(Some(Duration::from_millis(250)))
        );
        for t in ["offf", "never", "-1", "nan", "inf", "1e10", "", "0.1s"] {
            assert_eq!(parse_seconds_or_off(t), None, "{t}");
        }
    }

    #[test]
    fn durations_reject_what_would_overflow_or_mean_nothing() {
        for t in [
            "inf", "-inf", "nan", "NaN", "infinity", "1e20", "-5", "abc", "", "1e9.5", "0x10",
        ] {
            assert_eq!(parse_seconds(t), None, "{t}");
        }
        assert_eq!(parse_seconds(" 0 "), Some(Duration::ZERO));
        assert_eq!(parse_seconds("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(
            parse_seconds("1e9"),
            Some(Duration::from_secs(1_000_000_000))
        );
    }

    #[test]
    fn booleans_and_bytes() {
        assert_eq!(parse_bool(" YES "), Some(true));
        assert_eq!(parse_bool("off"), Some(false));
        assert_eq!(parse_bool("2"), None);
        assert_eq!(parse_bytes("+5"), None);
        assert_eq!(parse_bytes("-1"), None);
        assert_eq!(parse_bytes("18446744073709551616"), None);
        assert_eq!(parse_bytes(" 1024 "), Some(1024));
    }
}

//! How much a kernel spills, in bytes and in upstream's unit, and the one policy that
//! decides whether a good default-GRF build is retried in large GRF mode.
//!
//! Upstream's rule has moved and been reverted over runtime regressions (docs/design.md
//! §2), so it is data here, not a constant: `upstream` (the default) follows upstream's
//! current rule for each path; the older rules stay selectable by name.

use crate::error::{BuildError, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// Environment variable for the spill policy when a call does not name one.
pub const SPILL_POLICY_ENV: &str = "XPU_ZEBIN_SPILL_POLICY";

/// PyTorch Inductor's default `spill_threshold`, in upstream's unit (slots per lane):
/// the Level Zero JIT retries only above it (intel-xpu-backend-for-triton #7959).
pub const INDUCTOR_SPILL_THRESHOLD: u64 = 16;

/// What one kernel spills: bytes per hardware thread (`.ze_info` `spill_size`, Level
/// Zero `spillMemSize`) and the SIMD width it was compiled for (0: unknown).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spill {
    pub bytes: u64,
    pub simd: u32,
}

impl Spill {
    /// Upstream's `n_spills` (#7950): 32-bit slots per lane, `bytes / (4 * SIMD)`,
    /// truncated as CUDA and HIP report theirs; -1 when the SIMD width is unknown.
    pub fn slots(&self) -> i64 {
        match u64::from(self.simd).checked_mul(4) {
            Some(lane_bytes) if lane_bytes > 0 => {
                i64::try_from(self.bytes / lane_bytes).unwrap_or(i64::MAX)
            }
            _ => -1,
        }
    }
}

/// Which compile path a rule is for: upstream gives each its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The Level Zero JIT: upstream's `load_binary`, this package's `compile_and_load`.
    Jit,
    /// `ocloc`: upstream's `make_zebin`, this package's `compile`.
    Offline,
}

/// The spill policy as asked for (argument or `XPU_ZEBIN_SPILL_POLICY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpillPolicy {
    /// Upstream's current rule for the path: the JIT retries above 16 slots per lane
    /// (#7959); `make_zebin` retries on any spilled byte with an LTS driver (#8115/#8118),
    /// which is what upstream assumes when it cannot tell (a build farm has no driver).
    /// `upstream:load_binary`, `upstream:make_zebin` and `upstream:make_zebin-rolling`
    /// name one path's rule, whichever path builds.
    Upstream,
    /// A fixed rule.
    Rule(Rule),
}

/// When a good default-GRF build is retried in large GRF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Any spilled byte (#7615; `make_zebin` on LTS drivers since #8115).
    Any,
    /// More than N slots per lane (#7959 with N = 16; upstream's JIT today). A kernel of
    /// unknown SIMD width (upstream's `n_spills` -1) is not retried.
    Slots(u64),
    /// More than N bytes (upstream's first rule was 1000).
    Bytes(u64),
    /// Never for spills; a failed build is still retried.
    Never,
}

const EXPECTED: &str = "upstream, upstream:load_binary, upstream:make_zebin, \
    upstream:make_zebin-rolling, any, never, slots:N (more than N slots per lane) or bytes:N \
    (more than N bytes)";

impl SpillPolicy {
    /// Parse a policy name; `what` names where it came from, for the error.
    pub fn parse(text: &str, what: &str) -> Result<Self> {
        let t = text.trim().to_ascii_lowercase();
        // Plain digits, as every number the package reads (no sign).
        let number = |n: &str| {
            let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
            digits.then(|| n.parse::<u64>().ok()).flatten()
        };
        let parts = t.split_once(':').map(|(a, b)| (a.trim(), b.trim()));
        let policy = match parts {
            None if t.is_empty() || t == "upstream" => Some(SpillPolicy::Upstream),
            None if t == "any" => Some(SpillPolicy::Rule(Rule::Any)),
            None if t == "never" => Some(SpillPolicy::Rule(Rule::Never)),
            // Upstream's rule for one of its paths, whichever path builds here (the Triton
            // drop-in builds `load_binary`'s answers with ocloc when it can).
            Some(("upstream", "load_binary")) => {
                Some(SpillPolicy::Rule(Rule::Slots(INDUCTOR_SPILL_THRESHOLD)))
            }
            Some(("upstream", "make_zebin")) => Some(SpillPolicy::Rule(Rule::Any)),
            Some(("upstream", "make_zebin-rolling")) => {
                Some(SpillPolicy::Rule(Rule::Slots(INDUCTOR_SPILL_THRESHOLD)))
            }
            Some(("slots", n)) => number(n).map(|n| SpillPolicy::Rule(Rule::Slots(n))),
            Some(("bytes", n)) => number(n).map(|n| SpillPolicy::Rule(Rule::Bytes(n))),
            _ => None,
        };
        policy.ok_or_else(|| {
            BuildError::new(
                ErrorKind::InvalidArgument,
                format!("{what}={text:?} is not valid: expected {EXPECTED}"),
            )
        })
    }

    /// The request's policy: `asked`, else the environment's (`from_env`, the value of
    /// `XPU_ZEBIN_SPILL_POLICY`), else `upstream`.
    pub fn choose(asked: Option<&str>, from_env: Option<&str>) -> Result<Self> {
        match (asked, from_env) {
            (Some(text), _) => Self::parse(text, "spill_policy"),
            (None, Some(text)) => Self::parse(text, SPILL_POLICY_ENV),
            (None, None) => Ok(SpillPolicy::Upstream),
        }
    }

    /// The rule this policy means on `path`.
    pub fn rule(self, path: Path) -> Rule {
        match (self, path) {
            (SpillPolicy::Rule(rule), _) => rule,
            (SpillPolicy::Upstream, Path::Jit) => Rule::Slots(INDUCTOR_SPILL_THRESHOLD),
            (SpillPolicy::Upstream, Path::Offline) => Rule::Any,
        }
    }
}

impl Rule {
    /// Does a good default-GRF build that spills this much call for the large-GRF retry?
    pub fn retries(self, spill: Spill) -> bool {
        match self {
            Rule::Any => spill.bytes > 0,
            Rule::Slots(n) => spill.slots() > i64::try_from(n).unwrap_or(i64::MAX),
            Rule::Bytes(n) => spill.bytes > n,
            Rule::Never => false,
        }
    }

    /// The rule's name, as `parse` reads it (and as cache keys hold it).
    pub fn name(self) -> String {
        match self {
            Rule::Any => "any".into(),
            Rule::Never => "never".into(),
            Rule::Slots(n) => format!("slots:{n}"),
            Rule::Bytes(n) => format!("bytes:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_upstream_formula() {
        assert_eq!(
            Spill {
                bytes: 8192,
                simd: 16
            }
            .slots(),
            128
        );
        assert_eq!(
            Spill {
                bytes: 2047,
                simd: 32
            }
            .slots(),
            15
        );
        assert_eq!(
            Spill {
                bytes: 2048,
                simd: 32
            }
            .slots(),
            16
        );
        assert_eq!(Spill { bytes: 64, simd: 0 }.slots(), -1);
        assert_eq!(
            Spill {
                bytes: u64::MAX,
                simd: u32::MAX
            }
            .slots(),
            (u64::MAX / (4 * u64::from(u32::MAX))) as i64
        );
    }

    #[test]
    fn rules_per_path_and_names() {
        let up = SpillPolicy::parse(" Upstream ", "x").unwrap();
        assert_eq!(up.rule(Path::Jit), Rule::Slots(16));
        assert_eq!(up.rule(Path::Offline), Rule::Any);
        let two_kib = Spill {
            bytes: 2048,
            simd: 32,
        };
        assert!(!Rule::Slots(16).retries(two_kib));
        assert!(Rule::Slots(15).retries(two_kib));
        assert!(Rule::Any.retries(Spill { bytes: 1, simd: 0 }));
        assert!(!Rule::Slots(0).retries(Spill { bytes: 1, simd: 0 }));
        assert!(!Rule::Never.retries(two_kib));
        assert!(Rule::Bytes(1000).retries(two_kib));
        for name in ["any", "never", "slots:16", "bytes:1000"] {
            let p = SpillPolicy::parse(name, "x").unwrap();
            assert_eq!(p.rule(Path::Jit).name(), name);
        }
        let jit = SpillPolicy::parse("upstream:load_binary", "x").unwrap();
        assert_eq!(jit.rule(Path::Offline), Rule::Slots(16));
        let lts = SpillPolicy::parse("upstream:make_zebin", "x").unwrap();
        assert_eq!(lts.rule(Path::Jit), Rule::Any);
        let rolling = SpillPolicy::parse("upstream:make_zebin-rolling", "x").unwrap();
        assert_eq!(rolling.rule(Path::Jit), Rule::Slots(16));
        for bad in [
            "slots",
            "slots:-1",
            "bytes:1k",
            "some",
            "slots:16:2",
            "\0",
            "upstream:x",
        ] {
            let e = SpillPolicy::parse(bad, "spill_policy").unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{bad}");
            assert!(e.message.contains("spill_policy"));
        }
    }
}

//! How much a kernel spills, in bytes and in upstream's unit, and the one policy that
//! decides whether a good default-GRF build is retried in large GRF mode.
//!
//! Upstream's rule has moved and been reverted over runtime regressions (docs/design.md
//! §2), so it is data here, not a constant: [`LINES`] names each upstream line's rule per
//! path, `upstream` (the default) follows the current one ([`CURRENT_LINE`]), and the older
//! ones stay selectable by name (`upstream@7959`, ...).

use crate::error::{BuildError, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// Environment variable for the spill policy when a call does not name one.
pub const SPILL_POLICY_ENV: &str = "XPU_ZEBIN_SPILL_POLICY";

/// PyTorch Inductor's default `spill_threshold`, in upstream's unit (slots per lane):
/// #7959's JIT rule retried only above it.
pub const INDUCTOR_SPILL_THRESHOLD: u64 = 16;

/// Upstream's rebuild threshold since #8147: `REBUILD_SPILL_BYTES_PER_THREAD` in
/// compiler.py, `kRebuildSpillBytesPerThread` in driver.c (bytes per hardware thread).
pub const REBUILD_SPILL_BYTES_PER_THREAD: u64 = 1024;

/// The day upstream's sources were last read for [`LINES`].
pub const LAST_CHECKED: &str = "2026-11-25";

/// What one kernel spills: bytes per hardware thread (`.ze_info` `spill_size`, Level
/// Zero `spillMemSize`) and the SIMD width it was compiled for (0: unknown).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spill {
    pub bytes: u64,
    pub simd: u32,
}

impl Spill {
    /// Upstream's `n_spills` (#7950, driver.c's `Spills::slotsPerLane`): 32-bit slots per
    /// lane, `bytes / (4 * SIMD)`, truncated as CUDA and HIP report theirs; -1 when the
    /// SIMD width is unknown (upstream's answer when its sub-group query fails).
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
    /// `ocloc`: upstream's `make_zebin`, this package's `compile`. No driver is known
    /// here, so it takes make_zebin's rule for an LTS driver: upstream's answer for an
    /// unknown driver version.
    Offline,
}

/// One of upstream's paths, as a policy can name it (`upstream:make_zebin-rolling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamPath {
    /// driver.c's gate: it takes no LTS input, so one rule for every driver.
    LoadBinary,
    /// compiler.py's make_zebin with an LTS (or unknown) driver.
    MakeZebinLts,
    /// compiler.py's make_zebin with a rolling driver.
    MakeZebinRolling,
}

impl UpstreamPath {
    pub const ALL: [UpstreamPath; 3] = [
        UpstreamPath::LoadBinary,
        UpstreamPath::MakeZebinLts,
        UpstreamPath::MakeZebinRolling,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UpstreamPath::LoadBinary => "load_binary",
            UpstreamPath::MakeZebinLts => "make_zebin",
            UpstreamPath::MakeZebinRolling => "make_zebin-rolling",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "load_binary" => Some(UpstreamPath::LoadBinary),
            "make_zebin" | "make_zebin-lts" => Some(UpstreamPath::MakeZebinLts),
            "make_zebin-rolling" => Some(UpstreamPath::MakeZebinRolling),
            _ => None,
        }
    }
}

/// One upstream line's rule on each path, and the pull request that set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    /// How a policy names it: `upstream@<id>`.
    pub id: &'static str,
    pub what: &'static str,
    pub load_binary: Rule,
    pub make_zebin_lts: Rule,
    pub make_zebin_rolling: Rule,
}

impl Line {
    pub fn rule(&self, path: UpstreamPath) -> Rule {
        match path {
            UpstreamPath::LoadBinary => self.load_binary,
            UpstreamPath::MakeZebinLts => self.make_zebin_lts,
            UpstreamPath::MakeZebinRolling => self.make_zebin_rolling,
        }
    }
}

/// Upstream's lines, oldest first (intel/intel-xpu-backend-for-triton; docs/design.md §2).
pub const LINES: &[Line] = &[
    Line {
        id: "3.3",
        what: "triton-xpu 3.3: driver.c retries above 1000 bytes (spillMemSize); its \
               native path retries when IGC's log says 'spilled'",
        load_binary: Rule::Bytes(1000),
        make_zebin_lts: Rule::Any,
        make_zebin_rolling: Rule::Any,
    },
    Line {
        id: "7615",
        what: "#7615: any spilled byte, both paths",
        load_binary: Rule::Any,
        make_zebin_lts: Rule::Any,
        make_zebin_rolling: Rule::Any,
    },
    Line {
        id: "7959",
        what: "#7959 (backported #8000): more than 16 slots per lane (#7950's unit), both paths",
        load_binary: Rule::Slots(INDUCTOR_SPILL_THRESHOLD),
        make_zebin_lts: Rule::Slots(INDUCTOR_SPILL_THRESHOLD),
        make_zebin_rolling: Rule::Slots(INDUCTOR_SPILL_THRESHOLD),
    },
    Line {
        id: "8115",
        what: "#8115/#8118: #7959, but make_zebin on LTS drivers rebuilds on any spill",
        load_binary: Rule::Slots(INDUCTOR_SPILL_THRESHOLD),
        make_zebin_lts: Rule::Any,
        make_zebin_rolling: Rule::Slots(INDUCTOR_SPILL_THRESHOLD),
    },
    Line {
        id: "8147",
        what: "#8147 (fixing #8077, #8106): at least 1024 bytes per hardware thread \
               (REBUILD_SPILL_BYTES_PER_THREAD, kRebuildSpillBytesPerThread); make_zebin \
               on LTS drivers rebuilds on any spill; driver.c has no LTS input",
        load_binary: Rule::MinBytes(REBUILD_SPILL_BYTES_PER_THREAD),
        make_zebin_lts: Rule::Any,
        make_zebin_rolling: Rule::MinBytes(REBUILD_SPILL_BYTES_PER_THREAD),
    },
];

/// The line `upstream` means: upstream main's rule as last checked.
pub const CURRENT_LINE: &str = "8147";

/// The upstream line named `id` (`8147`, `#8147`, `3.3`).
pub fn line(id: &str) -> Option<&'static Line> {
    let id = id.trim().trim_start_matches('#');
    LINES.iter().find(|l| l.id == id)
}

/// The current upstream line.
pub fn current_line() -> &'static Line {
    // LINES holds CURRENT_LINE (a unit test says so); the last line is the newest anyway.
    line(CURRENT_LINE).unwrap_or(&LINES[LINES.len() - 1])
}

/// The spill policy as asked for (argument or `XPU_ZEBIN_SPILL_POLICY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpillPolicy {
    /// An upstream line's rule (`upstream`: the current one), for the path that builds or
    /// for the path named (`upstream:load_binary`, `upstream@7959:make_zebin-rolling`),
    /// whichever path builds (the Triton drop-in builds `load_binary`'s answers with ocloc
    /// when it can).
    Upstream {
        line: &'static Line,
        path: Option<UpstreamPath>,
    },
    /// A fixed rule.
    Rule(Rule),
}

/// When a good default-GRF build is retried in large GRF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Any spilled byte (#7615; `make_zebin` on LTS drivers since #8115).
    Any,
    /// More than N slots per lane (#7959 with N = 16). A kernel of unknown SIMD width
    /// (upstream's `n_spills` -1) is not retried.
    Slots(u64),
    /// More than N bytes (upstream's first rule was 1000).
    Bytes(u64),
    /// At least N bytes per hardware thread (#8147 with N = 1024); no SIMD width needed.
    MinBytes(u64),
    /// Never for spills; a failed build is still retried.
    Never,
}

const EXPECTED: &str = "upstream[@LINE][:PATH] (LINE: 3.3, 7615, 7959, 8115, 8147; PATH: \
    load_binary, make_zebin, make_zebin-rolling), any, never, slots:N (more than N slots per \
    lane), bytes:N (more than N bytes) or min-bytes:N (at least N bytes)";

impl SpillPolicy {
    /// Parse a policy name; `what` names where it came from, for the error.
    pub fn parse(text: &str, what: &str) -> Result<Self> {
        let t = text.trim().to_ascii_lowercase();
        // Plain digits, as every number the package reads (no sign).
        let number = |n: &str| {
            let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
            digits.then(|| n.parse::<u64>().ok()).flatten()
        };
        let (head, tail) = match t.split_once(':') {
            Some((a, b)) => (a.trim(), Some(b.trim())),
            None => (t.as_str(), None),
        };
        let upstream = |line_id: Option<&str>| {
            let line = match line_id {
                None => Some(current_line()),
                Some(id) => line(id),
            }?;
            let path = match tail {
                None => None,
                Some(p) => Some(UpstreamPath::parse(p)?),
            };
            Some(SpillPolicy::Upstream { line, path })
        };
        let policy = match (head, tail) {
            ("" | "upstream", _) if !(head.is_empty() && tail.is_some()) => upstream(None),
            (h, _) if h.starts_with("upstream@") => upstream(h.strip_prefix("upstream@")),
            ("any", None) => Some(SpillPolicy::Rule(Rule::Any)),
            ("never", None) => Some(SpillPolicy::Rule(Rule::Never)),
            ("slots", Some(n)) => number(n).map(|n| SpillPolicy::Rule(Rule::Slots(n))),
            ("bytes", Some(n)) => number(n).map(|n| SpillPolicy::Rule(Rule::Bytes(n))),
            ("min-bytes", Some(n)) => number(n).map(|n| SpillPolicy::Rule(Rule::MinBytes(n))),
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
            (None, None) => Self::parse("upstream", "spill_policy"),
        }
    }

    /// The rule this policy means on `path`.
    pub fn rule(self, path: Path) -> Rule {
        match (self, path) {
            (SpillPolicy::Rule(rule), _) => rule,
            (
                SpillPolicy::Upstream {
                    line,
                    path: Some(p),
                },
                _,
            ) => line.rule(p),
            (SpillPolicy::Upstream { line, path: None }, Path::Jit) => line.load_binary,
            (SpillPolicy::Upstream { line, path: None }, Path::Offline) => line.make_zebin_lts,
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
            // At least N, but never for no spill at all (min-bytes:0 is `any`).
            Rule::MinBytes(n) => spill.bytes > 0 && spill.bytes >= n,
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
            Rule::MinBytes(n) => format!("min-bytes:{n}"),
        }
    }

    /// In words, for `doctor` and the logs.
    pub fn describe(self) -> String {
        match self {
            Rule::Any => "any spilled byte".into(),
            Rule::Never => "never for spills".into(),
            Rule::Slots(n) => format!("more than {n} slots per lane"),
            Rule::Bytes(n) => format!("more than {n} bytes per hardware thread"),
            Rule::MinBytes(n) => format!("at least {n} bytes per hardware thread"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spill(bytes: u64, simd: u32) -> Spill {
        Spill { bytes, simd }
    }

    #[test]
    fn slots_follow_upstream_formula() {
        assert_eq!(spill(8192, 16).slots(), 128);
        assert_eq!(spill(2047, 32).slots(), 15);
        assert_eq!(spill(2048, 32).slots(), 16);
        assert_eq!(spill(64, 0).slots(), -1);
        assert_eq!(
            spill(u64::MAX, u32::MAX).slots(),
            (u64::MAX / (4 * u64::from(u32::MAX))) as i64
        );
    }

    /// Upstream's own unit table for `accepts_default_grf(spill_size, is_lts)` (#8147's
    /// test_accepts_default_grf): (bytes, LTS, accepted). The width does not matter.
    const UPSTREAM_GATE: [(u64, bool, bool); 10] = [
        (0, false, true),
        (0, true, true),
        (64, false, true),
        (64, true, false),
        (960, false, true),
        (1024, false, false),
        (1408, false, false),
        (2048, false, false),
        (960, true, false),
        (2048, true, false),
    ];

    #[test]
    fn the_default_is_upstreams_gate_of_today() {
        let up = SpillPolicy::parse("upstream", "x").unwrap();
        for (bytes, lts, accepted) in UPSTREAM_GATE {
            let path = if lts {
                UpstreamPath::MakeZebinLts
            } else {
                UpstreamPath::MakeZebinRolling
            };
            let SpillPolicy::Upstream { line, .. } = up else {
                panic!("upstream is not an upstream line")
            };
            for simd in [0, 8, 16, 32] {
                let rebuilds = line.rule(path).retries(spill(bytes, simd));
                assert_eq!(rebuilds, !accepted, "{bytes} B, lts {lts}, simd {simd}");
            }
            // driver.c has no LTS input: the JIT gate is the rolling one on every driver.
            if !lts {
                assert_eq!(up.rule(Path::Jit).retries(spill(bytes, 32)), !accepted);
            }
        }
        assert_eq!(up.rule(Path::Jit), Rule::MinBytes(1024));
        assert_eq!(up.rule(Path::Offline), Rule::Any);
        // The band #7959 went silent on at SIMD32 (#8077): 1024 to 2175 bytes.
        let old = SpillPolicy::parse("upstream@7959", "x").unwrap();
        for bytes in [1024, 1408, 2175] {
            assert!(!old.rule(Path::Jit).retries(spill(bytes, 32)));
            assert!(up.rule(Path::Jit).retries(spill(bytes, 32)));
        }
        assert!(old.rule(Path::Jit).retries(spill(2176, 32)));
    }

    #[test]
    fn every_line_is_selectable_by_name() {
        assert_eq!(current_line().id, CURRENT_LINE);
        for l in LINES {
            for id in [l.id.to_string(), format!("#{}", l.id)] {
                let p = SpillPolicy::parse(&format!("upstream@{id}"), "x").unwrap();
                assert_eq!(p.rule(Path::Jit), l.load_binary);
                assert_eq!(p.rule(Path::Offline), l.make_zebin_lts);
                for path in UpstreamPath::ALL {
                    let named = format!("upstream@{id}:{}", path.name());
                    let p = SpillPolicy::parse(&named, "x").unwrap();
                    assert_eq!(p.rule(Path::Jit), l.rule(path), "{named}");
                    assert_eq!(p.rule(Path::Offline), l.rule(path), "{named}");
                }
            }
        }
        let three = SpillPolicy::parse("upstream@3.3", "x").unwrap();
        assert!(!three.rule(Path::Jit).retries(spill(1000, 32)));
        assert!(three.rule(Path::Jit).retries(spill(1001, 32)));
    }

    #[test]
    fn rules_per_path_and_names() {
        let up = SpillPolicy::parse(" Upstream ", "x").unwrap();
        assert_eq!(up.rule(Path::Jit), Rule::MinBytes(1024));
        let two_kib = spill(2048, 32);
        assert!(!Rule::Slots(16).retries(two_kib));
        assert!(Rule::Slots(15).retries(two_kib));
        assert!(Rule::Any.retries(spill(1, 0)));
        assert!(!Rule::Slots(0).retries(spill(1, 0)));
        assert!(
            Rule::MinBytes(1024).retries(spill(1024, 0)),
            "no width needed"
        );
        assert!(!Rule::MinBytes(0).retries(spill(0, 32)));
        assert!(!Rule::Never.retries(two_kib));
        assert!(Rule::Bytes(1000).retries(two_kib));
        for name in ["any", "never", "slots:16", "bytes:1000", "min-bytes:1024"] {
            let p = SpillPolicy::parse(name, "x").unwrap();
            assert_eq!(p.rule(Path::Jit).name(), name);
        }
        let jit = SpillPolicy::parse("upstream:load_binary", "x").unwrap();
        assert_eq!(jit.rule(Path::Offline), Rule::MinBytes(1024));
        let lts = SpillPolicy::parse("upstream:make_zebin", "x").unwrap();
        assert_eq!(lts.rule(Path::Jit), Rule::Any);
        let rolling = SpillPolicy::parse("upstream:make_zebin-rolling", "x").unwrap();
        assert_eq!(rolling.rule(Path::Jit), Rule::MinBytes(1024));
        for bad in [
            "slots",
            "slots:-1",
            "bytes:1k",
            "min-bytes:",
            "some",
            "slots:16:2",
            "\0",
            "upstream:x",
            "upstream@",
            "upstream@9999",
            ":make_zebin",
            "upstream@8147:",
        ] {
            let e = SpillPolicy::parse(bad, "spill_policy").unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{bad}");
            assert!(e.message.contains("spill_policy"));
        }
    }
}

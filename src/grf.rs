//! GRF policy: which build flags to try, in which order, and which attempt wins.
//! Upstream's contract (docs/design.md §2), kept in one place so every backend agrees.

use crate::error::{BuildError, ErrorKind, Result};
use crate::spill::{Rule, Spill};
use crate::spirv::GrfRequest;

pub const GRF_128: &str = "-cl-intel-128-GRF-per-thread";
pub const GRF_256: &str = "-cl-intel-256-GRF-per-thread";
pub const GRF_512: &str = "-cl-intel-512-GRF-per-thread";
pub const GRF_AUTO: &str = "-cl-intel-enable-auto-large-GRF-mode";
pub const GRF_FLAGS: [&str; 4] = [GRF_128, GRF_256, GRF_512, GRF_AUTO];

/// Larger GRF halves the maximum work-group size; beyond this many warps the large-GRF
/// kernel could not launch, so it is never tried automatically.
pub const MAX_WARPS_FOR_LARGE_GRF: u32 = 32;

/// Does `flags` already choose a GRF mode? Then it is respected and never retried.
pub fn has_explicit_grf_flag(flags: &str) -> bool {
    flags.split_whitespace().any(|f| GRF_FLAGS.contains(&f))
}

/// The large-GRF flag for a device: 512 on `cri`, 256 elsewhere.
pub fn large_grf_flag(device_arch: &str) -> &'static str {
    if device_arch.trim().eq_ignore_ascii_case("cri") {
        GRF_512
    } else {
        GRF_256
    }
}

/// Registers per thread implied by the flags (128 when none).
pub fn n_regs(flags: &str) -> u32 {
    let words: Vec<&str> = flags.split_whitespace().collect();
    if words.contains(&GRF_512) {
        512
    } else if words.contains(&GRF_256) {
        256
    } else {
        128
    }
}

/// `n_regs` for a build with `flags` of `kernel` in `binary`, a kernel that may ask for its
/// own GRF mode: an explicit flag says it (upstream's contract); else, when the kernel asks
/// for its own mode, what the compiler built (`.ze_info` `grf_count`: measured, IGC 1.x
/// accepts the mode and ignores it), else the mode asked for; else 128.
pub fn n_regs_with(flags: &str, own: Option<GrfRequest>, binary: &[u8], kernel: &str) -> u32 {
    match own {
        Some(request) if !has_explicit_grf_flag(flags) => crate::zebin::parse(binary)
            .ok()
            .and_then(|info| info.kernel(kernel).and_then(|k| k.grf_count))
            .unwrap_or(request.n_regs()),
        _ => n_regs(flags),
    }
}

/// A kernel that asks for its own GRF mode (SPV_INTEL_maximum_registers) has an explicit
/// mode, as a GRF flag would: only the first rung, never a retry.
pub fn own_mode_is_explicit(ladder: &[String], own: Option<GrfRequest>) -> &[String] {
    match own {
        Some(_) => &ladder[..ladder.len().min(1)],
        None => ladder,
    }
}

/// `grf_mode` as Triton spells it: "default", "128", "256", "512", "auto"
/// (also "small" / "large", older Triton spellings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrfMode {
    Default,
    Fixed(&'static str),
}

impl GrfMode {
    pub fn parse(mode: &str) -> Result<Self> {
        Ok(match mode.trim() {
            "" | "default" => GrfMode::Default,
            "128" | "small" => GrfMode::Fixed(GRF_128),
            "256" | "large" => GrfMode::Fixed(GRF_256),
            "512" => GrfMode::Fixed(GRF_512),
            "auto" => GrfMode::Fixed(GRF_AUTO),
            other => {
                return Err(BuildError::new(
                    ErrorKind::InvalidArgument,
                    format!("unknown grf_mode '{other}': use default, 128, 256, 512 or auto"),
                ))
            }
        })
    }
}

fn join(base: &str, extra: &str) -> String {
    format!("{} {}", base.trim(), extra).trim().to_string()
}

/// The large-GRF rung for a device of `arch`: `max_grf_mode` when given (none for 128),
/// else 512 on `cri`, 256 elsewhere.
pub fn large_rung(max_grf_mode: Option<u32>, arch: &str) -> Result<Option<&'static str>> {
    match max_grf_mode {
        None => Ok(Some(large_grf_flag(arch))),
        Some(128) => Ok(None),
        Some(256) => Ok(Some(GRF_256)),
        Some(512) => Ok(Some(GRF_512)),
        Some(other) => Err(BuildError::new(
            ErrorKind::InvalidArgument,
            format!("max_grf_mode={other} is not valid: expected 128, 256 or 512"),
        )),
    }
}

/// The build flags to try on a device of `arch`, from the options as Triton names them:
/// `grf_mode` parsed, the large rung chosen (`large_rung`), then `ladder`.
pub fn ladder_asked(
    build_flags: &str,
    grf_mode: &str,
    num_warps: Option<u32>,
    max_grf_mode: Option<u32>,
    arch: &str,
) -> Result<Vec<String>> {
    let mode = GrfMode::parse(grf_mode)?;
    let large = large_rung(max_grf_mode, arch)?;
    Ok(ladder(build_flags, mode, num_warps, large))
}

/// The build flags to try, in order. Two entries mean "default, then `large`" (`None`:
/// the target has no larger GRF mode, so nothing is retried).
pub fn ladder(
    build_flags: &str,
    grf_mode: GrfMode,
    num_warps: Option<u32>,
    large: Option<&str>,
) -> Vec<String> {
    let base = build_flags.split_whitespace().collect::<Vec<_>>().join(" ");
    match grf_mode {
        GrfMode::Fixed(flag) if !has_explicit_grf_flag(&base) => vec![join(&base, flag)],
        GrfMode::Fixed(_) => vec![base],
        GrfMode::Default if has_explicit_grf_flag(&base) => vec![base],
        GrfMode::Default if num_warps.is_some_and(|w| w > MAX_WARPS_FOR_LARGE_GRF) => vec![base],
        GrfMode::Default => match large {
            Some(large) => {
                let large = join(&base, large);
                vec![base, large]
            }
            None => vec![base],
        },
    }
}

/// Does a first attempt (its spills if it built, its error kind if not) call for the
/// large-GRF retry? Failures that would fail the same way again are not retried.
pub fn needs_retry(first: Result<Spill, ErrorKind>, rule: Rule) -> bool {
    match first {
        Ok(spill) => rule.retries(spill),
        Err(kind) => matches!(
            kind,
            ErrorKind::ScratchOverflow
                | ErrorKind::BuildFailure
                | ErrorKind::CompilerCrash
                | ErrorKind::DegenerateBinary
        ),
    }
}

/// Which attempt wins, given each one's spills when it built (`None`: it failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    First,
    Retry,
    /// Both failed: raise the FIRST attempt's error, the one that explains the kernel.
    Neither,
}

/// Upstream's choice (`load_binary`): a retry that built wins (it was made because the
/// first failed or spilled too much); a failed retry keeps a good first build.
pub fn pick(first_built: bool, retry_built: bool) -> Pick {
    match (first_built, retry_built) {
        (_, true) => Pick::Retry,
        (true, false) => Pick::First,
        (false, false) => Pick::Neither,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladder_follows_upstream() {
        let d = GrfMode::Default;
        let pvc = Some(large_grf_flag("pvc"));
        assert_eq!(ladder("", d, None, pvc), vec!["", GRF_256]);
        assert_eq!(
            ladder("-O2", d, Some(32), Some(large_grf_flag("cri"))),
            vec!["-O2", &format!("-O2 {GRF_512}")]
        );
        assert_eq!(ladder("", d, Some(64), pvc), vec![""]);
        assert_eq!(ladder("", d, None, None), vec![""]);
        assert_eq!(ladder(GRF_128, d, None, pvc), vec![GRF_128]);
        assert_eq!(ladder(&format!("-x {GRF_256}"), d, None, pvc).len(), 1);
        let fixed = GrfMode::parse("256").unwrap();
        assert_eq!(ladder("", fixed, None, pvc), vec![GRF_256]);
        assert_eq!(
            ladder("", GrfMode::parse("auto").unwrap(), None, pvc),
            vec![GRF_AUTO]
        );
        assert!(GrfMode::parse("huge").is_err());
    }

    #[test]
    fn pick_follows_upstream() {
        assert_eq!(pick(false, true), Pick::Retry);
        assert_eq!(pick(true, false), Pick::First);
        assert_eq!(pick(false, false), Pick::Neither);
        assert_eq!(pick(true, true), Pick::Retry);
        assert!(needs_retry(Err(ErrorKind::ScratchOverflow), Rule::Never));
        assert!(!needs_retry(Err(ErrorKind::UnsupportedDevice), Rule::Any));
        let one = Spill { bytes: 1, simd: 16 };
        assert!(needs_retry(Ok(one), Rule::Any) && !needs_retry(Ok(one), Rule::Bytes(1)));
    }

    #[test]
    fn regs_from_flags() {
        assert_eq!(n_regs(""), 128);
        assert_eq!(n_regs(GRF_256), 256);
        assert_eq!(n_regs(&format!("-a {GRF_512}")), 512);
        assert_eq!(n_regs(GRF_AUTO), 128);
    }
}

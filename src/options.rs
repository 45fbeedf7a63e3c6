//! The options every entry point takes (`compile`, `compile_many`, `compile_and_load`, the
//! CLI, the Triton drop-ins), with their defaults in one place: `Options::default()`.

use crate::error::Result;
use crate::grf;
use crate::spill::{Path, Rule, SpillPolicy};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Options {
    /// Extra compiler options; a GRF flag here fixes the GRF mode (never retried).
    pub build_flags: String,
    /// Triton's `grf_mode`: "default" (the ladder), "128", "256", "512" or "auto".
    pub grf_mode: String,
    /// Triton's `num_warps`: above 32 the large-GRF rung is never tried (it halves the
    /// largest work-group).
    pub num_warps: Option<u32>,
    /// Offline: the kernel to report on (default: the module's only or first kernel).
    pub kernel_name: Option<String>,
    /// The device's architecture, which decides the large-GRF rung (512 on `cri`).
    /// Offline it defaults to the device name; on Level Zero, to what the device reports.
    pub device_arch: Option<String>,
    /// The largest GRF mode the target allows (128, 256 or 512: upstream's newest
    /// `load_binary` 7th argument, `metadata["max_grf_mode"]`); it is the large rung.
    pub max_grf_mode: Option<u32>,
    /// Offline: the `ocloc` to run (default: `$XPU_ZEBIN_OCLOC`, then PATH).
    pub ocloc: Option<PathBuf>,
    /// Per compiler run; `None`: `$XPU_ZEBIN_TIMEOUT`, else 900 s.
    pub timeout: Option<Duration>,
    pub cache: bool,
    pub cache_dir: Option<PathBuf>,
    /// When a good default-GRF build is retried (`spill.rs`); `None`:
    /// `$XPU_ZEBIN_SPILL_POLICY`, else `upstream`.
    pub spill_policy: Option<String>,
    /// Run both GRF modes at once; `None`: only when a core is idle.
    pub speculative: Option<bool>,
    /// Level Zero: build SPIR-V (and try handed native binaries) in a worker process;
    /// `None`: `$XPU_ZEBIN_ISOLATED`, else yes.
    pub isolated: Option<bool>,
    /// Offline: keep a zebin that imports symbols it does not define (a library meant
    /// to be linked); otherwise that is a `link_failure` naming them.
    pub allow_unresolved: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            build_flags: String::new(),
            grf_mode: "default".to_string(),
            num_warps: None,
            kernel_name: None,
            device_arch: None,
            max_grf_mode: None,
            ocloc: None,
            timeout: None,
            cache: true,
            cache_dir: None,
            spill_policy: None,
            speculative: None,
            isolated: None,
            allow_unresolved: false,
        }
    }
}

/// Environment variable that turns isolation off (`XPU_ZEBIN_ISOLATED=0`).
pub const ISOLATED_ENV: &str = "XPU_ZEBIN_ISOLATED";

impl Options {
    /// Every text option checked for what would reach a compiler cut at a NUL, and the
    /// environment's knobs: what each request does before anything runs.
    pub fn check(&self, more: &[(&str, &str)]) -> Result<()> {
        let texts = [
            ("build_flags", self.build_flags.as_str()),
            ("grf_mode", &self.grf_mode),
            ("kernel_name", self.kernel_name.as_deref().unwrap_or("")),
            ("device_arch", self.device_arch.as_deref().unwrap_or("")),
            ("spill_policy", self.spill_policy.as_deref().unwrap_or("")),
        ];
        crate::knobs::check_request(&[&texts[..], more].concat())
    }

    /// The spill rule for `path`.
    pub fn rule(&self, path: Path) -> Result<Rule> {
        let from_env = crate::knobs::text_knob(crate::spill::SPILL_POLICY_ENV)?;
        Ok(SpillPolicy::choose(self.spill_policy.as_deref(), from_env.as_deref())?.rule(path))
    }

    /// Build SPIR-V in a worker: as asked, else `$XPU_ZEBIN_ISOLATED`, else yes.
    pub fn isolated(&self) -> Result<bool> {
        match self.isolated {
            Some(v) => Ok(v),
            None => crate::knobs::bool_knob(ISOLATED_ENV, true),
        }
    }

    /// The build flags to try, in order, on a device of `arch`.
    pub fn ladder(&self, arch: &str) -> Result<Vec<String>> {
        let (flags, mode) = (&self.build_flags, &self.grf_mode);
        grf::ladder_asked(flags, mode, self.num_warps, self.max_grf_mode, arch)
    }

    /// What every request decides from its options before anything runs, checked in one
    /// pass: its GRF ladder on a device of `arch`, every text (and `more`) and knob
    /// (`check`), its time limit, its spill rule for `path`.
    pub fn checked(&self, more: &[(&str, &str)], arch: &str, path: Path) -> Result<Checked> {
        let ladder = self.ladder(arch)?;
        self.check(more)?;
        let timeout = crate::knobs::effective_timeout(self.timeout)?;
        let rule = self.rule(path)?;
        Ok(Checked {
            ladder,
            timeout,
            rule,
        })
    }
}

/// What `Options::checked` decides.
pub struct Checked {
    pub ladder: Vec<String>,
    /// Per compiler run; `None`: no limit.
    pub timeout: Option<Duration>,
    pub rule: Rule,
}

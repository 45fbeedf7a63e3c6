//! The offline compile engine: validate, consult the cache, run the GRF ladder through
//! ocloc, classify, choose. `compile_many` runs requests with bounded parallelism.

use crate::cache::{self, Cache, Lookup};
use crate::classify::{classify_failure, spills_from_log, Exit};
use crate::error::{BuildError, ErrorKind, Result};
use crate::grf::{self, GrfMode};
use crate::ladder::{self, Choice, Speculation};
use crate::ocloc::{self, JobSpec};
use crate::zebin::{self, ZebinInfo};
use crate::{batch, spirv};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Environment variable for the default compile timeout in seconds (0: none).
pub const TIMEOUT_ENV: &str = "XPU_ZEBIN_TIMEOUT";
/// Without a setting, a compile that runs this long is considered hung.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(900);

#[derive(Debug, Clone)]
pub struct CompileRequest {
    pub spirv: Vec<u8>,
    pub device: String,
    pub build_flags: String,
    pub grf_mode: String,
    pub num_warps: Option<u32>,
    pub kernel_name: Option<String>,
    pub ocloc: Option<PathBuf>,
    pub timeout: Option<Duration>,
    pub cache: bool,
    pub cache_dir: Option<PathBuf>,
    /// Spill size above which a successful default-GRF build is retried in large GRF.
    pub spill_threshold: u64,
    /// Run the default and large-GRF builds at once. `None`: only when a core is idle.
    pub speculative: Option<bool>,
}

impl CompileRequest {
    pub fn new(spirv: Vec<u8>, device: &str) -> Self {
        CompileRequest {
            spirv,
            device: device.to_string(),
            build_flags: String::new(),
            grf_mode: "default".to_string(),
            num_warps: None,
            kernel_name: None,
            ocloc: None,
            timeout: None,
            cache: true,
            cache_dir: None,
            spill_threshold: 0,
            speculative: None,
        }
    }
}

pub use crate::ladder::Attempt;

/// A successful compile.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Compiled {
    pub kernel: String,
    pub device: String,
    #[serde(skip)]
    pub binary: Vec<u8>,
    pub build_flags: String,
    pub grf_mode: String,
    pub n_regs: u32,
    pub spill_size: u64,
    /// The first attempt failed and a large-GRF attempt rescued the build.
    pub recovered: bool,
    pub cached: bool,
    pub attempts: Vec<Attempt>,
    /// The chosen attempt's compiler output.
    pub log: String,
    /// Things worth logging that are not failures (cache problems, spill retries).
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// A failed compile: the error to raise and the attempts that led to it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub error: BuildError,
    pub attempts: Vec<Attempt>,
    pub notes: Vec<String>,
}

/// What `compile` returns; the failure is boxed because it is large and rare.
pub type Outcome = std::result::Result<Compiled, Box<Failure>>;

impl From<BuildError> for Failure {
    fn from(error: BuildError) -> Self {
        Failure {
            error,
            attempts: Vec::new(),
            notes: Vec::new(),
        }
    }
}

impl From<BuildError> for Box<Failure> {
    fn from(error: BuildError) -> Self {
        Box::new(error.into())
    }
}

/// The time limit of each compiler run: the request's, else `XPU_ZEBIN_TIMEOUT`, else the
/// default; zero means none. A bad variable is an `invalid_argument` naming it.
pub(crate) fn effective_timeout(requested: Option<Duration>) -> Result<Option<Duration>> {
    let timeout = match requested {
        Some(t) => t,
        None => crate::knobs::seconds_knob(TIMEOUT_ENV, DEFAULT_TIMEOUT)?,
    };
    Ok((!timeout.is_zero()).then_some(timeout))
}

/// What every request checks before anything runs: the environment's knobs, and text that
/// would reach a compiler cut at a NUL.
pub(crate) fn check_request(texts: &[(&str, &str)]) -> Result<()> {
    crate::knobs::check()?;
    texts
        .iter()
        .try_for_each(|(name, value)| crate::knobs::text_argument(name, value))
}

struct Built {
    binary: Vec<u8>,
    spill_size: u64,
    log: String,
}

/// Spills from `.ze_info`'s spill_size, else from the compiler's warnings, else scratch.
fn spill_size(info: &ZebinInfo, kernel: &str, log: &str) -> u64 {
    let k = info.kernel(kernel).or(info.kernels.first());
    k.and_then(|k| k.spill_size)
        .or_else(|| spills_from_log(log))
        .or_else(|| k.map(|k| k.scratch_size))
        .unwrap_or(0)
}

fn build_once(
    ocloc_path: &std::path::Path,
    req: &CompileRequest,
    kernel: &str,
    flags: &str,
    timeout: Option<Duration>,
    cancel: &[&AtomicBool],
) -> (Attempt, Result<Built>) {
    let mut args = vec![
        "-spirv_input".to_string(),
        "-device".to_string(),
        req.device.clone(),
    ];
    if !flags.is_empty() {
        args.extend(["-options".to_string(), flags.to_string()]);
    }
    let spec = JobSpec {
        input: &req.spirv,
        input_name: "kernel.spv",
        args,
        timeout,
        cancel,
    };
    let (result, seconds) = match ocloc::run(ocloc_path, &spec) {
        Err(e) => (Err(e), 0.0),
        Ok(run) => {
            let seconds = run.seconds;
            let result = match (run.exit, run.output) {
                (Exit::Code(0), Some(binary)) => match zebin::parse(&binary) {
                    Ok(info) => Ok(Built {
                        spill_size: spill_size(&info, kernel, &run.log),
                        binary,
                        log: run.log,
                    }),
                    Err(e) => Err(e.with_log(run.log)),
                },
                (Exit::Code(0), None) => Err(BuildError::new(
                    ErrorKind::DegenerateBinary,
                    "ocloc reported success but wrote no binary",
                )
                .with_log(run.log)),
                (exit, _) => Err(classify_failure(exit, &run.log)),
            };
            (result, seconds)
        }
    };
    (
        Attempt::new(flags, seconds, &result, |b| b.spill_size),
        result,
    )
}

/// Compile one request. `cancel` stops it (the running ocloc is killed).
pub fn compile(req: &CompileRequest, cancel: &AtomicBool) -> Outcome {
    compile_inner(req, cancel, &|| true)
}

/// `may_speculate()` is false while more requests wait for a core, so a speculative build
/// would take it from them (unless the request asked for speculation explicitly).
fn compile_inner(
    req: &CompileRequest,
    cancel: &AtomicBool,
    may_speculate: &(dyn Fn() -> bool + Sync),
) -> Outcome {
    check_request(&[
        ("build_flags", &req.build_flags),
        ("device", &req.device),
        ("grf_mode", &req.grf_mode),
        ("kernel_name", req.kernel_name.as_deref().unwrap_or("")),
    ])?;
    let timeout = effective_timeout(req.timeout)?;
    let info = spirv::validate(&req.spirv)?;
    let kernel = info.select_kernel(req.kernel_name.as_deref())?;
    let mode = GrfMode::parse(&req.grf_mode)?;
    if req.device.trim().is_empty() {
        return Err(BuildError::new(
            ErrorKind::InvalidArgument,
            "device is empty: name a target such as pvc",
        )
        .into());
    }
    let ocloc_path = ocloc::discover(req.ocloc.as_deref())?;
    let ladder = grf::ladder(&req.build_flags, mode, req.num_warps, &req.device);
    let mut notes = Vec::new();

    // The cache and this request's key in it; the key needs the compiler's identity.
    let cached = if req.cache {
        let identity = ocloc::identity(&ocloc_path)?;
        let key = cache::key(&[
            b"offline-ocloc-v2",
            &req.spirv,
            req.device.as_bytes(),
            ladder.join("\n").as_bytes(),
            &req.spill_threshold.to_le_bytes(),
            identity.as_bytes(),
        ]);
        Some((Cache::open(req.cache_dir.as_deref()), key))
    } else {
        None
    };
    if let Some((cache, key)) = &cached {
        match cache.get::<Compiled>(key) {
            Lookup::Hit(mut hit, binary) => {
                hit.binary = binary;
                hit.cached = true;
                hit.kernel = kernel;
                return Ok(hit);
            }
            Lookup::Corrupt(note) => notes.push(note),
            Lookup::Miss => {}
        }
    }

    let speculation = Speculation::choose(req.speculative, req.spirv.len(), may_speculate);
    let Choice {
        chosen,
        built,
        attempts,
        notes,
    } = ladder::run(
        &ladder,
        req.spill_threshold,
        speculation,
        cancel,
        notes,
        |b: &Built| b.spill_size,
        |flags, cancel| build_once(&ocloc_path, req, &kernel, flags, timeout, cancel),
    )?;
    let build_flags = ladder[chosen].clone();
    let mut compiled = Compiled {
        kernel,
        device: req.device.clone(),
        n_regs: grf::n_regs(&build_flags),
        grf_mode: req.grf_mode.clone(),
        build_flags,
        spill_size: built.spill_size,
        recovered: chosen > 0 && !attempts[0].ok,
        cached: false,
        attempts,
        log: built.log,
        binary: built.binary,
        notes,
    };
    if let Some((cache, key)) = &cached {
        if let Some(note) = cache.put(key, &compiled, &compiled.binary) {
            compiled.notes.push(note);
        }
    }
    Ok(compiled)
}

pub use crate::batch::default_jobs;

/// Compile every request with at most `jobs` at once; results in input order. One failure
/// never stops the others. `on_done(index)` is called as each finishes.
pub fn compile_many(
    reqs: &[CompileRequest],
    jobs: usize,
    cancel: &AtomicBool,
    on_done: &(dyn Fn(usize) + Sync),
) -> Vec<Outcome> {
    batch::run(
        reqs,
        jobs,
        |r| r.spirv.len(),
        cancel,
        on_done,
        |r, may_speculate| compile_inner(r, cancel, may_speculate),
        |e| Err(e.into()),
    )
}

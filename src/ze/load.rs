//! `compile_and_load`: build a Level Zero module (SPIR-V or a native zebin), create the
//! kernel, read its spills, and retry in large GRF mode exactly as upstream `load_binary`
//! does. SPIR-V is built in crash-isolated workers (`build.rs`) and only the chosen native
//! binary is loaded here; a native binary handed in is loaded in a worker first. A SPIR-V
//! load stores that native binary in the cache, so a warm load of the same kernel skips
//! the JIT.

use super::build::{self, Built, Isolated};
use super::{runtime, DeviceInfo, Kernel, Module, Runtime};
use crate::cache::{self, Cache, Lookup};
use crate::engine::{check_request, effective_timeout, Attempt, Failure};
use crate::error::{BuildError, ErrorKind, Result};
use crate::grf::{self, GrfMode};
use crate::ladder::{self, Choice, Speculation};
use crate::{batch, spirv, zebin};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct LoadRequest {
    pub binary: Vec<u8>,
    pub kernel_name: String,
    pub build_flags: String,
    pub is_spv: bool,
    pub device: usize,
    /// Overrides the arch the device reports (decides 256 vs 512 large GRF).
    pub device_arch: Option<String>,
    pub cache: bool,
    pub cache_dir: Option<PathBuf>,
    /// spillMemSize above which a good default-GRF build is retried in large GRF.
    pub spill_threshold: u64,
    /// Build SPIR-V, and try a handed native binary, in a worker process (default).
    /// `false` runs IGC and the loader in this process, where an input that crashes them
    /// ends the process.
    pub isolated: bool,
    /// Per attempt; `None`: `XPU_ZEBIN_TIMEOUT` or the default.
    pub timeout: Option<Duration>,
    /// Both GRF modes at once. `None`: only when a core is idle (isolated builds only).
    pub speculative: Option<bool>,
}

impl LoadRequest {
    pub fn new(binary: Vec<u8>, kernel_name: &str) -> Self {
        LoadRequest {
            binary,
            kernel_name: kernel_name.to_string(),
            build_flags: String::new(),
            is_spv: true,
            device: 0,
            device_arch: None,
            cache: true,
            cache_dir: None,
            spill_threshold: 0,
            isolated: true,
            timeout: None,
            speculative: None,
        }
    }
}

/// A loaded kernel: owns its module and kernel handles (kernel declared first: it is
/// destroyed before its module).
pub struct Loaded {
    pub kernel: Kernel,
    pub module: Module,
    pub kernel_name: String,
    pub build_flags: String,
    pub n_regs: u32,
    /// `spillMemSize` of the chosen kernel, bytes.
    pub n_spills: u64,
    /// The device's maximum work-group size, as upstream returns it.
    pub n_max_threads: u32,
    pub private_mem_size: u32,
    pub simd_size: u32,
    pub build_log: String,
    pub attempts: Vec<Attempt>,
    pub recovered: bool,
    pub cached: bool,
    pub native_binary: Vec<u8>,
    pub notes: Vec<String>,
}

pub type LoadOutcome = std::result::Result<Loaded, Box<Failure>>;

/// What the cache keeps beside the native binary.
#[derive(Serialize, Deserialize)]
struct CachedLoad {
    build_flags: String,
    attempts: Vec<Attempt>,
    recovered: bool,
    build_log: String,
}

/// Check the input before any byte reaches the driver (random bytes end the process there).
fn validate(req: &LoadRequest) -> Result<()> {
    check_request(&[
        ("build_flags", &req.build_flags),
        ("kernel_name", &req.kernel_name),
        ("device_arch", req.device_arch.as_deref().unwrap_or("")),
    ])?;
    if req.is_spv {
        spirv::validate(&req.binary)?.select_kernel(Some(&req.kernel_name))?;
    } else {
        let info = zebin::parse(&req.binary)?;
        if info.kernel(&req.kernel_name).is_none() {
            let names: Vec<&str> = info.kernels.iter().map(|k| k.name.as_str()).collect();
            return Err(BuildError::new(
                ErrorKind::KernelNotFound,
                format!(
                    "kernel '{}' is not in the zebin; kernels: [{}]",
                    req.kernel_name,
                    names.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// The request's cache and the key of `what` on this device: what a driver built or loaded
/// holds only for that device and driver version.
fn device_cache(req: &LoadRequest, device: &DeviceInfo, what: &[&[u8]]) -> (Cache, String) {
    (
        Cache::open(req.cache_dir.as_deref()),
        device_key(device, what),
    )
}

/// The key of `what` on this device and driver.
fn device_key(device: &DeviceInfo, what: &[&[u8]]) -> String {
    let id = device.device_id.to_le_bytes();
    let on_device: [&[u8]; 3] = [device.name.as_bytes(), &id, device.driver.as_bytes()];
    cache::key(&[what, &on_device].concat())
}

/// Loading a native binary this process did not build (handed in, or read from a cache
/// that others may write) in a worker before this process does. A binary that loaded there
/// is remembered on this host (`trusted.rs`, per bytes, kernel, flags, device and driver),
/// so each is tried once, not once per process; `remember` false (the cache off) tries it
/// every time.
struct NativeTrial<'a> {
    device_index: usize,
    device: &'a DeviceInfo,
    remember: bool,
}

impl NativeTrial<'_> {
    fn key(&self, name: &str, native: &[u8], flags: &str) -> String {
        let what: &[&[u8]] = &[
            b"ze-native-loads-v2",
            native,
            name.as_bytes(),
            flags.as_bytes(),
        ];
        device_key(self.device, what)
    }

    fn run(
        &self,
        name: &str,
        native: &[u8],
        flags: &str,
        timeout: Option<Duration>,
        cancel: &[&AtomicBool],
    ) -> Result<()> {
        let key = self.remember.then(|| self.key(name, native, flags));
        if key.as_deref().is_some_and(crate::trusted::known) {
            return Ok(());
        }
        build::isolated(
            self.device_index,
            name,
            native,
            false,
            flags,
            timeout,
            cancel,
        )?;
        if let Some(key) = key {
            crate::trusted::remember(&key);
        }
        Ok(())
    }

    /// This host's driver built `native` just now: it needs no trial when it comes back
    /// from the cache.
    fn vouch(&self, name: &str, native: &[u8], flags: &str) {
        if self.remember {
            crate::trusted::remember(&self.key(name, native, flags));
        }
    }
}

fn finish(rt: &Runtime, req: &LoadRequest, built: Built, flags: String) -> Result<Loaded> {
    let device = rt.device_info(req.device)?;
    Ok(Loaded {
        native_binary: built.module.native_binary(),
        kernel_name: req.kernel_name.clone(),
        n_regs: grf::n_regs(&flags),
        build_flags: flags,
        n_spills: built.spills,
        n_max_threads: device.max_work_group_size,
        private_mem_size: built.private_mem_size,
        simd_size: built.simd_size,
        build_log: built.log,
        kernel: built.kernel,
        module: built.module,
        attempts: Vec::new(),
        recovered: false,
        cached: false,
        notes: Vec::new(),
    })
}

/// Build and load `req.kernel_name`, with upstream's large-GRF fallback. `cancel` kills
/// the running builds.
pub fn compile_and_load(req: &LoadRequest, cancel: &AtomicBool) -> LoadOutcome {
    load_inner(req, cancel, &|| true)
}

/// Load every request with at most `jobs` at once; results in input order, a failure in
/// its slot. `on_done(index)` is called as each finishes.
pub fn compile_and_load_many(
    reqs: &[LoadRequest],
    jobs: usize,
    cancel: &AtomicBool,
    on_done: &(dyn Fn(usize) + Sync),
) -> Vec<LoadOutcome> {
    batch::run(
        reqs,
        jobs,
        |r| r.binary.len(),
        cancel,
        on_done,
        |r, may_speculate| load_inner(r, cancel, may_speculate),
        |e| Err(e.into()),
    )
}

fn load_inner(
    req: &LoadRequest,
    cancel: &AtomicBool,
    may_speculate: &(dyn Fn() -> bool + Sync),
) -> LoadOutcome {
    validate(req)?;
    let timeout = effective_timeout(req.timeout)?;
    let rt = runtime()?;
    let device = rt.device_info(req.device)?.clone();
    let arch = req
        .device_arch
        .clone()
        .or(device.arch.clone())
        .unwrap_or_default();
    // Upstream retries only SPIR-V without an explicit GRF flag; a native binary is final.
    let ladder = if req.is_spv {
        grf::ladder(&req.build_flags, GrfMode::Default, None, &arch)
    } else {
        vec![req.build_flags.clone()]
    };
    let mut notes = Vec::new();
    // Only a SPIR-V load has a JIT worth skipping; the key is hashed only then.
    let cached = (req.cache && req.is_spv).then(|| {
        let rungs = ladder.join("\n");
        let what: &[&[u8]] = &[
            b"ze-load-v2",
            &req.binary,
            rungs.as_bytes(),
            &req.spill_threshold.to_le_bytes(),
        ];
        device_cache(req, &device, what)
    });
    let trial = NativeTrial {
        device_index: req.device,
        device: &device,
        remember: req.cache,
    };
    if let Some((cache, key)) = &cached {
        match cache.get::<CachedLoad>(key) {
            Lookup::Hit(meta, native) => {
                // A cache entry is untrusted input (a shared cache, a neighbour, a torn
                // disk): its binary loads here only once it has loaded in a worker.
                let tried = if req.isolated {
                    trial.run(
                        &req.kernel_name,
                        &native,
                        &meta.build_flags,
                        timeout,
                        &[cancel],
                    )
                } else {
                    Ok(())
                };
                let loaded = tried.and_then(|()| {
                    build::in_process(
                        rt,
                        req.device,
                        &req.kernel_name,
                        &native,
                        false,
                        &meta.build_flags,
                    )
                });
                match loaded {
                    Ok(built) => {
                        let mut loaded = finish(rt, req, built, meta.build_flags)?;
                        loaded.attempts = meta.attempts;
                        loaded.recovered = meta.recovered;
                        loaded.build_log = meta.build_log;
                        loaded.cached = true;
                        return Ok(loaded);
                    }
                    Err(e) => notes.push(format!(
                        "cached native binary did not load ({e}); rebuilding"
                    )),
                }
            }
            Lookup::Corrupt(note) => notes.push(note),
            Lookup::Miss => {}
        }
    }

    let (chosen, built, attempts, mut notes) = if req.is_spv && req.isolated {
        let speculation = Speculation::choose(req.speculative, req.binary.len(), may_speculate);
        let Choice {
            chosen,
            built: isolated,
            attempts,
            notes,
        } = ladder::run(
            &ladder,
            req.spill_threshold,
            speculation,
            cancel,
            notes,
            |b: &Isolated| b.spills,
            |flags, cancel| {
                ladder::timed(
                    flags,
                    |b: &Isolated| b.spills,
                    || {
                        let name = &req.kernel_name;
                        let (device, input) = (req.device, &req.binary);
                        build::isolated(device, name, input, true, flags, timeout, cancel)
                    },
                )
            },
        )?;
        // Only the driver's own native binary is loaded here: no IGC in this process.
        let flags = &ladder[chosen];
        match build::in_process(
            rt,
            req.device,
            &req.kernel_name,
            &isolated.native,
            false,
            flags,
        ) {
            Ok(mut built) => {
                trial.vouch(&req.kernel_name, &isolated.native, flags);
                built.log = isolated.log;
                (chosen, built, attempts, notes)
            }
            Err(mut error) => {
                error.message = format!(
                    "the native binary built by the worker did not load here: {}",
                    error.message
                );
                return Err(Box::new(Failure {
                    error,
                    attempts,
                    notes,
                }));
            }
        }
    } else {
        // In this process: a native binary (no IGC), or SPIR-V with isolation turned off.
        // A native binary this process is handed loads in a worker first (it can end the
        // process that loads it), unless one already loaded these bytes on this device.
        let trial = (!req.is_spv && req.isolated).then_some(&trial);
        let choice = ladder::run(
            &ladder,
            req.spill_threshold,
            Speculation::Never,
            cancel,
            notes,
            |b: &Built| b.spills,
            |flags, cancel| {
                ladder::timed(
                    flags,
                    |b: &Built| b.spills,
                    || {
                        let (name, input) = (&req.kernel_name, &req.binary);
                        if let Some(trial) = &trial {
                            trial.run(name, input, flags, timeout, cancel)?;
                        }
                        build::in_process(rt, req.device, name, input, req.is_spv, flags)
                    },
                )
            },
        )?;
        (choice.chosen, choice.built, choice.attempts, choice.notes)
    };
    let recovered = chosen == 1 && !attempts[0].ok;
    let mut loaded = finish(rt, req, built, ladder[chosen].clone())?;
    if let Some((cache, key)) = &cached {
        let meta = CachedLoad {
            build_flags: loaded.build_flags.clone(),
            attempts: attempts.clone(),
            recovered,
            build_log: loaded.build_log.clone(),
        };
        if let Some(note) = cache.put(key, &meta, &loaded.native_binary) {
            notes.push(note);
        }
    }
    loaded.attempts = attempts;
    loaded.recovered = recovered;
    loaded.notes = notes;
    Ok(loaded)
}

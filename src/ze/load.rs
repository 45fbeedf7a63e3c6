//! `compile_and_load`: build a Level Zero module (SPIR-V JIT or native zebin), create the
//! kernel, read its spills, and retry in large GRF mode exactly as upstream `load_binary`
//! does. A SPIR-V load stores the driver's native binary in the cache, so a warm load of
//! the same kernel skips the JIT.

use super::{ffi, runtime, Kernel, Module, Runtime};
use crate::cache::{self, Cache, Lookup};
use crate::classify::classify_driver_failure;
use crate::engine::{choose, Attempt, Choice, Failure};
use crate::error::{BuildError, ErrorKind, Result};
use crate::grf::{self, GrfMode};
use crate::{spirv, zebin};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;

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

/// What the cache keeps beside the native binary.
#[derive(Serialize, Deserialize)]
struct CachedLoad {
    build_flags: String,
    attempts: Vec<Attempt>,
    recovered: bool,
    build_log: String,
}

struct Built {
    kernel: Kernel,
    module: Module,
    spills: u64,
    props: ffi::ze_kernel_properties_t,
    log: String,
}

fn classify_result(r: ffi::ze_result_t, log: &str) -> BuildError {
    let name = ffi::result_name(r);
    match r {
        ffi::ZE_RESULT_ERROR_INVALID_NATIVE_BINARY => BuildError::new(
            ErrorKind::UnsupportedDevice,
            format!("the native binary is not for this device ({name})"),
        )
        .with_log(log),
        ffi::ZE_RESULT_ERROR_DEVICE_LOST | ffi::ZE_RESULT_ERROR_UNINITIALIZED => {
            BuildError::new(ErrorKind::NoDevice, format!("the driver failed: {name}")).with_log(log)
        }
        _ => classify_driver_failure(&name, log),
    }
}

/// One build: module, kernel, properties; every failure classified, nothing leaked.
fn build(
    rt: &'static Runtime,
    req: &LoadRequest,
    input: &[u8],
    is_spv: bool,
    flags: &str,
) -> Result<Built> {
    let (module, log) = rt
        .create_module(req.device, input, is_spv, flags)
        .map_err(|(r, log)| classify_result(r, &log))?;
    let kernel = match module.create_kernel(&req.kernel_name) {
        Ok(k) => k,
        Err(ffi::ZE_RESULT_ERROR_INVALID_KERNEL_NAME) => {
            return Err(BuildError::new(
                ErrorKind::KernelNotFound,
                format!(
                    "kernel '{}' is not in the module; kernels: [{}]",
                    req.kernel_name,
                    module.kernel_names().join(", ")
                ),
            )
            .with_log(log))
        }
        Err(ffi::ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED) => {
            let (_, link_log) = module.link_log();
            let symbols = unresolved_symbols(&link_log);
            return Err(BuildError::new(
                ErrorKind::LinkFailure,
                if symbols.is_empty() {
                    "module is unlinked: it imports symbols nothing provides (the driver does not name them)".to_string()
                } else {
                    format!("module is unlinked: unresolved symbols: {}", symbols.join(", "))
                },
            )
            .with_log(format!("{log}{link_log}")));
        }
        Err(r) => {
            return Err(BuildError::new(
                ErrorKind::BuildFailure,
                format!("zeKernelCreate failed with {}", ffi::result_name(r)),
            )
            .with_log(log))
        }
    };
    let props = kernel.properties().map_err(|r| {
        BuildError::new(
            ErrorKind::BuildFailure,
            format!("zeKernelGetProperties failed with {}", ffi::result_name(r)),
        )
        .with_log(log.clone())
    })?;
    Ok(Built {
        spills: props.spill_mem_size as u64,
        kernel,
        module,
        props,
        log,
    })
}

/// The symbols a link log says nothing provides, each once, in order.
fn unresolved_symbols(link_log: &str) -> Vec<String> {
    static SYMBOL: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"Unresolved Symbol <([^>]+)>|unresolved external symbol (\S+)").unwrap()
    });
    let mut names: Vec<String> = Vec::new();
    for c in SYMBOL.captures_iter(link_log) {
        let name = c.get(1).or(c.get(2)).map_or("", |m| m.as_str()).to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

fn attempt(flags: &str, started: Instant, result: &Result<Built>) -> Attempt {
    Attempt {
        build_flags: flags.to_string(),
        ok: result.is_ok(),
        spill_size: result.as_ref().ok().map(|b| b.spills),
        seconds: started.elapsed().as_secs_f64(),
        error: result.as_ref().err().map(|e| e.to_string()),
    }
}

/// Check the input before any byte reaches the driver (random bytes end the process there).
fn validate(req: &LoadRequest) -> Result<()> {
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

fn finish(rt: &Runtime, req: &LoadRequest, built: Built, flags: String) -> Result<Loaded> {
    let device = rt.device_info(req.device)?;
    Ok(Loaded {
        native_binary: built.module.native_binary(),
        kernel_name: req.kernel_name.clone(),
        n_regs: grf::n_regs(&flags),
        build_flags: flags,
        n_spills: built.spills,
        n_max_threads: device.max_work_group_size,
        private_mem_size: built.props.private_mem_size,
        simd_size: if built.props.required_subgroup_size != 0 {
            built.props.required_subgroup_size
        } else {
            built.props.max_subgroup_size
        },
        build_log: built.log,
        kernel: built.kernel,
        module: built.module,
        attempts: Vec::new(),
        recovered: false,
        cached: false,
        notes: Vec::new(),
    })
}

/// Build and load `req.kernel_name`, with upstream's large-GRF fallback.
pub fn compile_and_load(req: &LoadRequest) -> std::result::Result<Loaded, Box<Failure>> {
    validate(req)?;
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
        let key = cache::key(&[
            b"ze-load-v1",
            &req.binary,
            ladder.join("\n").as_bytes(),
            &req.spill_threshold.to_le_bytes(),
            device.name.as_bytes(),
            &device.device_id.to_le_bytes(),
            device.driver.as_bytes(),
        ]);
        (Cache::open(req.cache_dir.as_deref()), key)
    });
    if let Some((cache, key)) = &cached {
        match cache.get::<CachedLoad>(key) {
            Lookup::Hit(meta, native) => match build(rt, req, &native, false, &meta.build_flags) {
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
            },
            Lookup::Corrupt(note) => notes.push(note),
            Lookup::Miss => {}
        }
    }

    let tried = |flags: &str| {
        let started = Instant::now();
        let result = build(rt, req, &req.binary, req.is_spv, flags);
        (attempt(flags, started, &result), result)
    };
    let first = tried(&ladder[0]);
    let first_outcome = first.1.as_ref().map(|b| b.spills).map_err(|e| e.kind);
    let retry = (ladder.len() == 2 && grf::needs_retry(first_outcome, req.spill_threshold))
        .then(|| tried(&ladder[1]));
    // The attempt not chosen drops in `choose`, destroying its kernel and module.
    let Choice {
        chosen,
        built,
        attempts,
    } = match choose(first, retry, |b| b.spills) {
        Ok(c) => c,
        Err(mut failure) => {
            failure.notes = notes;
            return Err(failure);
        }
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

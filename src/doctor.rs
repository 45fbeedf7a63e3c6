//! `xpu-zebin doctor`: what this machine's toolchain looks like to the engine, and why
//! something is slow or off (no persistent worker, no Level Zero device).

use crate::{cache, ocloc, pool, ze};
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct Report {
    pub ocloc: Option<String>,
    /// The driver version ocloc reports (`ocloc query OCL_DRIVER_VERSION`).
    pub compiler_version: Option<String>,
    pub ocloc_error: Option<String>,
    /// The libocloc persistent workers load, when there is one.
    pub libocloc: Option<String>,
    /// `persistent` or `one-shot`.
    pub worker_mode: String,
    /// Why compiles run one ocloc process each, when they do.
    pub worker_note: Option<String>,
    pub level_zero_devices: Vec<ze::DeviceInfo>,
    pub level_zero_error: Option<String>,
    /// Why Level Zero build workers cannot start, when they cannot.
    pub level_zero_worker_note: Option<String>,
    pub cache_dir: String,
    pub cache_entries: u64,
    pub cache_bytes: u64,
    /// Cores a compile may use at once (batches' default `jobs`).
    pub cores: usize,
    /// Where compilers of every process on this host count the cores they use; `None`
    /// when that directory is unusable (then speculation only sees this process).
    pub core_slots_dir: Option<String>,
    /// Cores running a compiler of some process on this host right now.
    pub cores_busy_on_host: Option<usize>,
}

/// Look at everything the engine would use, without compiling anything.
pub fn report(explicit_ocloc: Option<&Path>) -> Report {
    let found = ocloc::discover(explicit_ocloc);
    let (mut compiler_version, mut libocloc, mut worker_note) = (None, None, None);
    if let Ok(path) = &found {
        compiler_version = match ocloc::identity(path) {
            Ok(id) => id.rsplit('|').next().map(str::to_string),
            Err(e) => Some(format!("unknown ({e})")),
        };
        match ocloc::worker_library(path) {
            Ok(lib) => libocloc = Some(lib.display().to_string()),
            Err(why) => worker_note = Some(why),
        }
        if worker_note.is_none() {
            worker_note = ocloc::worker_unavailable(path);
        }
    }
    if !pool::persistent_enabled() {
        worker_note = Some(format!("{}=0", pool::PERSISTENT_ENV));
    }
    let (devices, ze_error) = match ze::devices() {
        Ok(d) => (d, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let cache = cache::Cache::open(None);
    let (entries, bytes) = cache.usage();
    let census = crate::cores::census();
    Report {
        ocloc: found.as_ref().ok().map(|p| p.display().to_string()),
        ocloc_error: found.err().map(|e| e.to_string()),
        compiler_version,
        worker_mode: if libocloc.is_some() && worker_note.is_none() {
            "persistent".into()
        } else {
            "one-shot".into()
        },
        libocloc,
        worker_note,
        level_zero_devices: devices,
        level_zero_error: ze_error,
        level_zero_worker_note: ze::build::unavailable(),
        cache_dir: cache.dir().display().to_string(),
        cache_entries: entries,
        cache_bytes: bytes,
        cores: crate::batch::default_jobs(),
        core_slots_dir: census.as_ref().map(|c| c.0.display().to_string()),
        cores_busy_on_host: census.map(|c| c.2),
    }
}

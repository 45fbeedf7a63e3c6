//! The offline compile engine: validate, ask the levels of native code
//! (`store::levels`: the local cache, the fleet's store), and on a miss run the GRF
//! ladder through ocloc, classify, choose (`ladder::settle`), and keep the answer in the
//! levels. `compile_many` runs requests with bounded parallelism.

use crate::cache::Cache;
use crate::classify::{classify_failure, Exit};
use crate::error::{BuildError, ErrorKind};
use crate::grf;
use crate::key::{KeyInputs, Purpose};
use crate::ladder::{self, Build, Plan, Settled, Speculation};
use crate::ocloc::{self, JobSpec};
use crate::options::Options;
use crate::spill::{Path, Spill};
use crate::store::levels::{Answered, Entry, Keep, Levels, Target};
use crate::zebin;
use crate::{batch, spirv};
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

pub use crate::ladder::{Attempt, Failure};

#[derive(Debug, Clone)]
pub struct CompileRequest {
    pub spirv: Vec<u8>,
    /// The `ocloc -device` name, e.g. `pvc`.
    pub device: String,
    pub options: Options,
}

impl CompileRequest {
    pub fn new(spirv: Vec<u8>, device: &str) -> Self {
        CompileRequest {
            spirv,
            device: device.to_string(),
            options: Options::default(),
        }
    }
}

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
    /// The kernel's spills, bytes per hardware thread, and its SIMD width.
    pub spill: Spill,
    /// The first attempt failed and a large-GRF attempt rescued the build.
    pub recovered: bool,
    pub cached: bool,
    pub attempts: Vec<Attempt>,
    /// The chosen attempt's compiler output.
    pub log: String,
    /// Things worth logging that are not failures (cache problems, spill retries).
    #[serde(skip)]
    pub notes: Vec<String>,
    /// The answer is another node's, taken from the fleet's store (`store::levels`).
    #[serde(skip)]
    pub from_store: bool,
}

/// What `compile` returns; the failure is boxed because it is large and rare.
pub type Outcome = std::result::Result<Compiled, Box<Failure>>;

/// One ocloc build of the module: its zebin and what the requested kernel spills.
struct Built {
    binary: Vec<u8>,
    spill: Spill,
    log: String,
}

impl Build for Built {
    fn spill(&self) -> Spill {
        self.spill
    }
    fn log(&self) -> &str {
        &self.log
    }
}

fn build_once(
    ocloc_path: &std::path::Path,
    req: &CompileRequest,
    kernel: &str,
    flags: &str,
    timeout: Option<Duration>,
    cancel: &[&AtomicBool],
) -> ladder::Tried<Built> {
    let mut args = vec![
        "-spirv_input".to_string(),
        "-device".to_string(),
        req.device.trim().to_string(),
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
            let result = match (run.exit, run.output) {
                (Exit::Code(0), Some(binary)) => zebin::parse(&binary)
                    .and_then(|info| info.kernel_spill(kernel))
                    .map(|spill| Built {
                        spill,
                        binary,
                        log: run.log.clone(),
                    })
                    .map_err(|e| e.with_log(run.log)),
                (Exit::Code(0), None) => Err(BuildError::new(
                    ErrorKind::DegenerateBinary,
                    "ocloc reported success but wrote no binary",
                )
                .with_log(run.log)),
                (exit, _) => Err(classify_failure(exit, &run.log)),
            };
            (result, run.seconds)
        }
    };
    (Attempt::new(flags, seconds, &result), result)
}

/// A zebin that imports symbols it does not define cannot load: the driver's link fails
/// on them (measured: Debian's IGC 1.x compiles calls of builtins it does not know,
/// `intel_sub_group_2d_block_*`, into such imports and reports success).
fn check_linked(binary: &[u8], kernel: &str, ocloc: &std::path::Path) -> Result<(), BuildError> {
    let symbols = zebin::parse(binary)?.undefined_symbols;
    if symbols.is_empty() {
        return Ok(());
    }
    Err(BuildError::new(
        ErrorKind::LinkFailure,
        format!(
            "kernel '{kernel}': {} left unresolved symbols nothing provides: {} (builtins \
             this compiler does not know; the driver's own compiler may; allow_unresolved \
             keeps such a build)",
            ocloc.display(),
            symbols.join(", ")
        ),
    ))
}

/// A request's key and the compiler's identity (a version and build of IGC) it holds.
fn cache_key(
    req: &CompileRequest,
    kernel: &str,
    ladder: &[String],
    rule: crate::spill::Rule,
    ocloc_path: &std::path::Path,
) -> Result<(String, String), BuildError> {
    let identity = ocloc::identity(ocloc_path)?;
    let key = KeyInputs {
        purpose: Purpose::Offline,
        input: &req.spirv,
        kernel,
        flags: ladder,
        rule: Some(rule),
        target: &[req.device.trim(), &identity],
    }
    .key();
    Ok((key, identity))
}

/// The cache and key that would answer `req`, and its kernel (what `compile` computes
/// before it looks).
pub fn entry_for(req: &CompileRequest) -> Result<(Cache, String, String), BuildError> {
    let s = slot(req)?;
    let cache = s
        .cache
        .unwrap_or_else(|| Cache::open(req.options.cache_dir.as_deref()));
    Ok((cache, s.key, s.kernel))
}

/// The request's device (trimmed) and time limit, checked as every path checks them
/// before anything runs.
fn checked(req: &CompileRequest) -> Result<(&str, Option<Duration>), BuildError> {
    req.options.check(&[("device", &req.device)])?;
    let timeout = crate::knobs::effective_timeout(req.options.timeout)?;
    let device = req.device.trim();
    if device.is_empty() {
        return Err(BuildError::new(
            ErrorKind::InvalidArgument,
            "device is empty: name a target such as pvc",
        ));
    }
    Ok((device, timeout))
}

/// What a request's compile learns before it builds: its SPIR-V checked, its kernel
/// chosen, its GRF ladder and spill rule, its compiler, its key, where it is cached.
/// Every level answers from one slot: the local cache, the fleet's store, the compiler.
pub struct Slot {
    /// None when the request's cache is off.
    cache: Option<Cache>,
    key: String,
    compiler: String,
    kernel: String,
    own_grf: Option<spirv::GrfRequest>,
    ocloc: std::path::PathBuf,
    device: String,
    timeout: Option<Duration>,
    rule: crate::spill::Rule,
    ladder: Vec<String>,
    options: Options,
}

/// The slot that answers `req`: a request `compile` would refuse is refused here.
pub fn slot(req: &CompileRequest) -> Result<Slot, BuildError> {
    prepare(req).map_err(|f| f.error)
}

/// The slot of `req`, or why `compile` refuses it.
pub fn prepare(req: &CompileRequest) -> Result<Slot, Box<Failure>> {
    let o = &req.options;
    let (device, timeout) = checked(req)?;
    let module = spirv::validate(&req.spirv)?;
    let kernel = module.select_kernel(o.kernel_name.as_deref())?;
    let own_grf = module.grf_request(&kernel);
    let rule = o.rule(Path::Offline)?;
    let ladder = grf::own_mode_is_explicit(
        o.ladder(o.device_arch.as_deref().unwrap_or(device))?,
        own_grf,
    );
    let ocloc = ocloc::discover(o.ocloc.as_deref())?;
    let (key, compiler) = cache_key(req, &kernel, &ladder, rule, &ocloc)?;
    Ok(Slot {
        cache: o.cache.then(|| Cache::open(o.cache_dir.as_deref())),
        key,
        compiler,
        kernel,
        own_grf,
        ocloc,
        device: device.to_string(),
        timeout,
        rule,
        ladder,
        options: o.clone(),
    })
}

/// Remove the cache entry that would answer `req` (a build the driver refused: bytes read
/// from a cache are never trusted further than one load). `Ok(false)`: there was none, or
/// it could not be removed (then rebuild without the cache).
pub fn forget_cached(req: &CompileRequest) -> Result<bool, BuildError> {
    let (cache, key, _) = entry_for(req)?;
    let removed = cache.remove(&key);
    if let (true, Some(l)) = (removed, cache.ledger()) {
        l.count(crate::cache::Counter::RefusedDriver, 1);
    }
    Ok(removed)
}

impl Slot {
    /// The key the answer is stored under (local cache and remote store).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The identity of the compiler the key holds.
    pub fn compiler(&self) -> &str {
        &self.compiler
    }

    /// What the answer is built for, as the levels sign and check it.
    fn target(&self) -> Target<'_> {
        Target {
            device: &self.device,
            compiler: &self.compiler,
        }
    }

    /// The levels this slot's request asks (`store`: the fleet's store among them).
    pub fn levels(&self, store: bool) -> crate::error::Result<Levels> {
        Levels::open(self.cache.clone(), store, None)
    }

    /// The local entry that answers, as stored, into the fleet's store (a farm publishing
    /// its cache); true when written.
    pub fn share(&self) -> crate::error::Result<bool> {
        self.levels(true)?
            .share(&self.key, self.target(), |e| self.check(e))
    }

    /// The local cache entry that answers, as stored (whole and this key's), if any: what
    /// a node shares with its fleet.
    pub fn local(&self) -> Option<Vec<u8>> {
        self.cache.as_ref()?.raw(&self.key)
    }

    /// What this request needs of an entry it did not build (another node's, verified by
    /// its signature): a zebin with this kernel whose record describes it, linked unless
    /// the request allows unresolved symbols.
    fn check(&self, entry: &Entry) -> Result<(), BuildError> {
        let kernel = &self.kernel;
        let info = zebin::parse(&entry.binary)?;
        if info.kernel_spill(kernel)? != entry.record.spill {
            return Err(BuildError::new(
                ErrorKind::InvalidArgument,
                "the entry's record does not describe its binary",
            ));
        }
        if !self.options.allow_unresolved && !info.undefined_symbols.is_empty() {
            check_linked(&entry.binary, kernel, &self.ocloc)?;
        }
        Ok(())
    }

    /// Take `entry` (another node's, already verified by its signature) into the local
    /// cache as this slot's answer, and answer with it: it must decode under the slot's
    /// own key (a checksum over key and body: an entry replayed under another key fails)
    /// and pass `check`.
    pub fn adopt(&self, entry: &[u8]) -> Result<Compiled, BuildError> {
        let Some(cache) = &self.cache else {
            return Err(BuildError::new(
                ErrorKind::InvalidArgument,
                "the cache is off for this request: nothing is taken into it",
            ));
        };
        let (record, binary) = crate::cache::decode::<crate::ladder::Record>(&self.key, entry)
            .map_err(|why| BuildError::new(ErrorKind::InvalidArgument, why))?;
        let adopted = Entry { record, binary };
        self.check(&adopted)?;
        let notes = cache
            .put_entry(&self.key, entry, false)
            .into_iter()
            .collect();
        Ok(self.answer_from(adopted, true, notes))
    }

    /// The answer a level's entry gives (`from_store`: the fleet's store's).
    fn answer_from(&self, entry: Entry, from_store: bool, notes: Vec<String>) -> Compiled {
        let Entry { record, binary } = entry;
        let kernel = &self.kernel;
        Compiled {
            n_regs: grf::n_regs_with(&record.build_flags, self.own_grf, &binary, kernel),
            kernel: kernel.clone(),
            device: self.device.clone(),
            binary,
            build_flags: record.build_flags,
            grf_mode: self.options.grf_mode.clone(),
            spill: record.spill,
            recovered: record.recovered,
            cached: true,
            attempts: record.attempts,
            log: record.log,
            notes,
            from_store,
        }
    }
}

/// Compile one request through every level: the local cache, the fleet's store (unless
/// `store` is false), then this process's compiler. `cancel` stops it (the running ocloc
/// is killed).
pub fn compile(req: &CompileRequest, store: bool, cancel: &AtomicBool) -> Outcome {
    compile_with(req, store, cancel, &|| true)
}

/// `may_speculate()` is false while more requests wait for a core, so a speculative build
/// would take it from them (unless the request asked for speculation explicitly).
fn compile_with(
    req: &CompileRequest,
    store: bool,
    cancel: &AtomicBool,
    may_speculate: &(dyn Fn() -> bool + Sync),
) -> Outcome {
    let slot = prepare(req)?;
    // Asked without the store, a request is the rebuild of one already counted (the
    // driver refused its kept build: `forget_cached`).
    let counted = store;
    let levels = match slot.levels(store) {
        Ok(levels) => levels,
        Err(e) => {
            if counted {
                Levels::count_refused(slot.cache.as_ref());
            }
            return Err(e.into());
        }
    };
    let outcome = answer(&slot, &levels, req, cancel, may_speculate);
    if !counted {
        return outcome;
    }
    levels.count(match &outcome {
        Ok(c) if c.cached => {
            let level = match c.from_store {
                true => crate::cache::Counter::StoreHits,
                false => crate::cache::Counter::LocalHits,
            };
            Answered::Hit(level, &c.attempts)
        }
        Ok(c) => Answered::Built(&c.attempts),
        Err(f) if f.attempts.is_empty() => Answered::Refused,
        Err(f) => Answered::Failed(&f.attempts),
    });
    outcome
}

/// The levels' answer to `slot`, else a build, kept in the levels.
fn answer(
    slot: &Slot,
    levels: &Levels,
    req: &CompileRequest,
    cancel: &AtomicBool,
    may_speculate: &(dyn Fn() -> bool + Sync),
) -> Outcome {
    let mut notes = Vec::new();
    let found = levels.find(0, &slot.key, slot.target(), |e| slot.check(e), &mut notes);
    if let Some(hit) = found? {
        let from_store = hit.from_store();
        let answer = slot.answer_from(hit.entry, from_store, notes);
        if !slot.options.allow_unresolved {
            check_linked(&answer.binary, &slot.kernel, &slot.ocloc).map_err(|error| Failure {
                error: error.with_log(answer.log.clone()),
                attempts: answer.attempts.clone(),
                notes: answer.notes.clone(),
            })?;
        }
        return Ok(answer);
    }
    // What the levels said comes first, whatever the build's outcome.
    match build(slot, levels, req, cancel, may_speculate) {
        Ok(mut built) => {
            notes.append(&mut built.notes);
            built.notes = notes;
            Ok(built)
        }
        Err(mut failure) => {
            notes.append(&mut failure.notes);
            failure.notes = notes;
            Err(failure)
        }
    }
}

/// Build `req` in `slot` with the GRF ladder, and keep the answer in the levels: an
/// answer shaped by a transient failure is returned, never kept; one that does not link
/// is kept here only (another request may allow it), never offered to the fleet.
fn build(
    slot: &Slot,
    levels: &Levels,
    req: &CompileRequest,
    cancel: &AtomicBool,
    may_speculate: &(dyn Fn() -> bool + Sync),
) -> Outcome {
    let o = &req.options;
    let plan = Plan {
        ladder: &slot.ladder,
        rule: slot.rule,
        speculation: Speculation::choose(o.speculative, req.spirv.len(), may_speculate),
        cancel,
    };
    let kernel = &slot.kernel;
    let Settled {
        product: binary,
        record,
        repeatable,
        mut notes,
    } = ladder::settle(
        plan,
        |flags, cancel| build_once(&slot.ocloc, req, kernel, flags, slot.timeout, cancel),
        |built: Built, _| Ok(built.binary),
    )?;
    let linked = match o.allow_unresolved {
        true => Ok(()),
        false => check_linked(&binary, kernel, &slot.ocloc),
    };
    let scope = match (repeatable, linked.is_ok()) {
        (false, _) => Keep::Nowhere,
        (true, false) => Keep::Here,
        (true, true) => Keep::Everywhere,
    };
    notes.extend(levels.keep(&slot.key, slot.target(), &record, &binary, scope)?);
    linked.map_err(|error| Failure {
        error: error.with_log(record.log.clone()),
        attempts: record.attempts.clone(),
        notes: notes.clone(),
    })?;
    let n_regs = grf::n_regs_with(&record.build_flags, slot.own_grf, &binary, kernel);
    Ok(Compiled {
        kernel: kernel.clone(),
        device: slot.device.clone(),
        binary,
        n_regs,
        build_flags: record.build_flags,
        grf_mode: o.grf_mode.clone(),
        spill: record.spill,
        recovered: record.recovered,
        cached: false,
        attempts: record.attempts,
        log: record.log,
        notes,
        from_store: false,
    })
}

pub use crate::batch::default_jobs;

/// Compile every request with at most `jobs` at once, each through every level
/// (`compile`); results in input order. One failure never stops the others.
/// `on_done(index)` is called as each finishes.
pub fn compile_many(
    reqs: &[CompileRequest],
    store: bool,
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
        |r, may_speculate| compile_with(r, store, cancel, may_speculate),
        |e| Err(e.into()),
    )
}

//! The offline compile engine: validate, ask the levels of native code
//! (`store::levels`: the local cache, the fleet's store), and on a miss run the GRF
//! ladder through ocloc, classify, choose (`ladder::settle`), and keep the answer in the
//! levels. `compile_many` runs requests with bounded parallelism.

use crate::cache::Cache;
use crate::cache::Counter;
use crate::classify::{classify_failure, Exit};
use crate::error::{BuildError, ErrorKind};
use crate::grf;
use crate::key::{KeyInputs, Purpose};
use crate::ladder::Record;
use crate::ladder::{self, Build, Plan, Speculation};
use crate::ocloc::{self, JobSpec};
use crate::options::Options;
use crate::spill::{Path, Spill};
use crate::store::levels::{Answered, Entry, Fits, Levels, Target};
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
    slot: &Slot,
    req: &CompileRequest,
    flags: &str,
    cancel: &[&AtomicBool],
) -> ladder::Tried<Built> {
    let (ocloc_path, kernel, timeout) = (&slot.ocloc, &slot.kernel, slot.timeout);
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

/// The cache and key that would answer `req`, and its kernel (what `compile` computes
/// before it looks).
pub fn entry_for(req: &CompileRequest) -> Result<(Cache, String, String), BuildError> {
    let s = slot(req)?;
    let cache = s
        .cache
        .unwrap_or_else(|| Cache::open(req.options.cache_dir.as_deref()));
    Ok((cache, s.key, s.kernel))
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
    /// The ocloc, as a message names it.
    compiler_path: String,
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

/// The slot of `req`, or why `compile` refuses it: each module it asks is asked once, in
/// one pass down (the options, then the SPIR-V).
pub fn prepare(req: &CompileRequest) -> Result<Slot, Box<Failure>> {
    let o = &req.options;
    let device = req.device.trim();
    let arch = o.device_arch.as_deref().unwrap_or(device);
    let checked = o.checked(&[("device", &req.device)], arch, Path::Offline)?;
    if device.is_empty() {
        return Err(BuildError::new(
            ErrorKind::InvalidArgument,
            "device is empty: name a target such as pvc",
        )
        .into());
    }
    let module = spirv::validate(&req.spirv)?;
    let kernel = module.select_kernel(o.kernel_name.as_deref())?;
    let own_grf = module.grf_request(&kernel);
    let ladder = checked.ladder;
    let ocloc = ocloc::discover(o.ocloc.as_deref())?;
    let compiler = ocloc::identity(&ocloc)?;
    let key = KeyInputs {
        purpose: Purpose::Offline,
        input: &req.spirv,
        kernel: &kernel,
        flags: &ladder,
        rule: Some(checked.rule),
        target: &[device, &compiler],
    }
    .key();
    Ok(Slot {
        cache: o.cache.then(|| Cache::open(o.cache_dir.as_deref())),
        key,
        compiler,
        kernel,
        own_grf,
        compiler_path: ocloc.display().to_string(),
        ocloc,
        device: device.to_string(),
        timeout: checked.timeout,
        rule: checked.rule,
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
            .share(&self.key, self.target(), self.fits())
    }

    /// The local cache entry that answers, as stored (whole and this key's), if any: what
    /// a node shares with its fleet.
    pub fn local(&self) -> Option<Vec<u8>> {
        self.cache.as_ref()?.raw(&self.key)
    }

    /// What this request needs of an entry it did not build: a zebin with this kernel
    /// whose record describes it, linked unless the request allows unresolved symbols.
    fn fits(&self) -> Fits<'_> {
        Fits {
            kernel: &self.kernel,
            linked: !self.options.allow_unresolved,
            compiler: &self.compiler_path,
        }
    }

    /// Take `entry` (another node's, already verified by its signature) into the local
    /// cache as this slot's answer, and answer with it: it must decode under the slot's
    /// own key (a checksum over key and body: an entry replayed under another key fails)
    /// and fit the request (`fits`).
    pub fn adopt(&self, entry: &[u8]) -> Result<Compiled, BuildError> {
        let Some(cache) = &self.cache else {
            return Err(BuildError::new(
                ErrorKind::InvalidArgument,
                "the cache is off for this request: nothing is taken into it",
            ));
        };
        let (record, binary) = crate::cache::decode::<Record>(&self.key, entry)
            .map_err(|why| BuildError::new(ErrorKind::InvalidArgument, why))?;
        let adopted = Entry { record, binary };
        self.fits().check(&adopted.binary, adopted.record.spill)?;
        let notes = cache
            .put_entry(&self.key, entry, false)
            .into_iter()
            .collect();
        Ok(self.answer(adopted, Some(Counter::StoreHits), notes))
    }

    /// The answer `entry` gives; `from`: the level that answered (None: built now).
    fn answer(&self, entry: Entry, from: Option<Counter>, notes: Vec<String>) -> Compiled {
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
            cached: from.is_some(),
            attempts: record.attempts,
            log: record.log,
            notes,
            from_store: from == Some(Counter::StoreHits),
        }
    }
}

/// Compile one request through every level: the local cache, the fleet's store (unless
/// `store` is false), then this process's compiler. `cancel` stops it (the running ocloc
/// is killed).
pub fn compile(req: &CompileRequest, store: bool, cancel: &AtomicBool) -> Outcome {
    compile_with(req, store, cancel, &|| true)
}

/// The request goes down once: its slot (`prepare`), the levels' answer, else a build
/// with the GRF ladder kept in the levels (`Levels::keep` decides where); then it is
/// counted, once, where the request's cache is. `may_speculate()` is false while more
/// requests wait for a core, so a speculative build would take it from them (unless the
/// request asked for speculation explicitly).
fn compile_with(
    req: &CompileRequest,
    store: bool,
    cancel: &AtomicBool,
    may_speculate: &(dyn Fn() -> bool + Sync),
) -> Outcome {
    let slot = prepare(req)?;
    let fits = slot.fits();
    // Asked without the store, a request is the rebuild of one already counted (the
    // driver refused its kept build: `forget_cached`).
    let counted = store;
    let mut notes = Vec::new();
    let (key, target) = (slot.key.as_str(), slot.target());
    let cache = slot.cache.clone();
    let (levels, found) = Levels::ask(cache, store, counted, key, target, fits, &mut notes)?;
    let answer = match found {
        Some(hit) => Ok((fits.linked(&hit.entry.binary), hit.entry, Some(hit.counter))),
        None => {
            let plan = Plan {
                ladder: &slot.ladder,
                own_grf: slot.own_grf,
                rule: slot.rule,
                speculation: Speculation::choose(
                    req.options.speculative,
                    req.spirv.len(),
                    may_speculate,
                ),
                cancel,
            };
            ladder::settle(
                plan,
                |flags, cancel| build_once(&slot, req, flags, cancel),
                |built: Built, _| Ok(built.binary),
            )
            .and_then(|settled| {
                notes.extend(settled.notes);
                let built = (&settled.record, settled.product.as_slice());
                let kept = levels.keep(key, target, built, settled.repeatable, Some(fits))?;
                notes.extend(kept.notes);
                let entry = Entry {
                    record: settled.record,
                    binary: settled.product,
                };
                Ok((kept.linked, entry, None))
            })
        }
    };
    // What the levels said comes first, whatever the answer.
    let outcome = match answer {
        Ok((Ok(()), entry, from)) => Ok(slot.answer(entry, from, notes)),
        Ok((Err(error), entry, _)) => Err(Box::new(Failure {
            error: error.with_log(entry.record.log),
            attempts: entry.record.attempts,
            notes,
        })),
        Err(mut failure) => {
            notes.append(&mut failure.notes);
            failure.notes = notes;
            Err(failure)
        }
    };
    if counted {
        levels.count(match &outcome {
            Ok(c) if c.from_store => Answered::Hit(Counter::StoreHits, &c.attempts),
            Ok(c) if c.cached => Answered::Hit(Counter::LocalHits, &c.attempts),
            Ok(c) => Answered::Built(&c.attempts),
            Err(f) if f.attempts.is_empty() => Answered::Refused,
            Err(f) => Answered::Failed(&f.attempts),
        });
    }
    outcome
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

//! The offline compile engine: validate, ask the levels of native code
//! (`levels`: bundles, the local cache, the fleet's store), and on a miss run the GRF
//! ladder through ocloc, classify, choose (`ladder::settle`), and keep the answer in the
//! levels. `compile_many` runs requests with bounded parallelism.

use crate::answer::Answering;
use crate::batch::Room;
use crate::bundle::search::Query;
use crate::cache::Cache;
use crate::cache::Counter;
use crate::error::{BuildError, ErrorKind};
use crate::key::{KeyInputs, Purpose};
use crate::ladder::{self, Plan, Speculation};
use crate::levels::{
    Answered, Asked, BundleAsk, Entry, Fits, Levels, Lookup, Refusal, Target, Wait,
};
use crate::ocloc::{self, Built, Job};
use crate::options::Options;
use crate::spill::Path;
use crate::{batch, spirv};
use std::sync::atomic::AtomicBool;

pub use crate::answer::Compiled;
pub use crate::attempt::Attempt;
pub use crate::ladder::Failure;

#[derive(Debug, Clone)]
pub struct CompileRequest {
    pub spirv: Vec<u8>,
    /// The `ocloc -device` name, e.g. `pvc`.
    pub device: String,
    pub options: Options,
    /// The bundles asked first (the Triton drop-ins': they know the release and the
    /// device's target profiles); None: no bundle. With bundles, a host without the
    /// compiler is still answered from them.
    pub bundle: Option<Query>,
    /// False for a request already counted once (its first answer, a level's, did not
    /// load here): it is not counted again.
    pub counted: bool,
}

impl CompileRequest {
    pub fn new(spirv: Vec<u8>, device: &str) -> Self {
        CompileRequest {
            spirv,
            device: device.to_string(),
            options: Options::default(),
            bundle: None,
            counted: true,
        }
    }
}

/// What `compile` returns; the failure is boxed because it is large and rare.
pub type Outcome = std::result::Result<Compiled, Box<Failure>>;

/// The cache and key that would answer `req`, and its kernel (what `compile` computes
/// before it looks).
pub fn entry_for(req: &CompileRequest) -> Result<(Cache, String, String), BuildError> {
    let s = slot(req)?;
    let cache = s
        .cache
        .unwrap_or_else(|| Cache::open(req.options.cache_dir.as_deref()));
    Ok((cache, s.key, s.job.kernel))
}

/// What a request's compile learns before it builds: its SPIR-V checked, its kernel
/// chosen, its GRF ladder and spill rule, its compiler, its key, where it is cached.
/// Every level answers from one slot: the local cache, the fleet's store, the compiler.
pub struct Slot {
    /// None when the request's cache is off.
    cache: Option<Cache>,
    key: String,
    compiler: String,
    /// Every attempt's compiler, device, kernel and time limit.
    job: Job,
    own_grf: Option<spirv::GrfRequest>,
    /// The ocloc, as a message names it.
    compiler_path: String,
    /// Why there is no compiler here, when only the bundles can answer.
    missing: Option<BuildError>,
    rule: crate::spill::Rule,
    ladder: Vec<String>,
    options: Options,
}

/// The slot that answers `req`: a request `compile` would refuse is refused here, its
/// SPIR-V validated in full (a slot adopts and shares entries: not a hit's hot path).
pub fn slot(req: &CompileRequest) -> Result<Slot, BuildError> {
    spirv::validate(&req.spirv)?;
    prepare(req).map_err(|f| f.error)
}

/// The slot of `req`, or why `compile` refuses it: each module it asks is asked once, in
/// one pass down (the cache's directory, the options, then the SPIR-V).
fn prepare(req: &CompileRequest) -> Result<Slot, Box<Failure>> {
    let o = &req.options;
    let cache = o.cache.then(|| Cache::open(o.cache_dir.as_deref()));
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
    // The settings' errors come first, as ever; from here on, invalid SPIR-V comes first.
    let from_the_spirv_on = || -> Result<Slot, Box<Failure>> {
        // The key's part of the SPIR-V: a hit hands no byte to a compiler. The full
        // validation runs before any does (`answer`, when it builds).
        let module = spirv::scan(&req.spirv)?;
        let kernel = module.select_kernel(o.kernel_name.as_deref())?;
        let own_grf = module.grf_request(&kernel);
        let ladder = checked.ladder;
        let found = ocloc::discover(o.ocloc.as_deref())
            .and_then(|path| ocloc::identity(&path).map(|identity| (path, identity)));
        let ((ocloc, compiler), missing) = match found {
            Ok(found) => (found, None),
            // The bundles come before the compiler: they may answer without it. Its error is
            // the answer to a miss, and a note beside a hit.
            Err(e) if req.bundle.is_some() => (Default::default(), Some(e)),
            Err(e) => return Err(e.into()),
        };
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
            cache,
            key,
            compiler,
            own_grf,
            compiler_path: match &missing {
                None => ocloc.display().to_string(),
                Some(_) => "the bundle's compiler".to_string(),
            },
            missing,
            job: Job {
                ocloc,
                device: device.to_string(),
                kernel,
                timeout: checked.timeout,
            },
            rule: checked.rule,
            ladder,
            options: o.clone(),
        })
    };
    // Nothing was built yet: invalid SPIR-V is the answer before anything found here.
    from_the_spirv_on().map_err(|failure| spirv::invalid_or(&req.spirv, failure))
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
            device: &self.job.device,
            compiler: &self.compiler,
        }
    }

    /// The levels `req` (this slot's request) asks: the bundles it names, its cache, and
    /// the fleet's store when `store` (never without a compiler here: the key would not
    /// be one a node publishes).
    fn asked<'r>(&'r self, req: &'r CompileRequest, store: bool) -> Asked<'r> {
        Asked {
            cache: self.cache.clone(),
            store: store && self.missing.is_none(),
            bundle: req.bundle.as_ref().map(|query| BundleAsk {
                query,
                input: &req.spirv,
                kernel: &self.job.kernel,
                options: &req.options,
            }),
        }
    }

    /// The levels this slot's request asks (`store`: the fleet's store among them).
    pub fn levels(&self, store: bool) -> crate::error::Result<Levels> {
        Levels::open(Asked {
            cache: self.cache.clone(),
            store,
            bundle: None,
        })
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
            kernel: &self.job.kernel,
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
        let (record, binary) = crate::cache::decode::<crate::attempt::Record>(&self.key, entry)
            .map_err(|why| BuildError::new(ErrorKind::InvalidArgument, why))?;
        self.fits().check(&binary, record.spill)?;
        let notes = cache
            .put_entry(&self.key, entry, false)
            .into_iter()
            .collect();
        let from = Some(Counter::StoreHits);
        Ok(Compiled::new(
            record,
            binary,
            &self.answering(),
            from,
            notes,
        ))
    }

    /// What this slot's request may wait for another's build of its key; None without a
    /// compiler here (nothing to claim or wait for: only the bundles answer).
    fn wait<'w>(
        &self,
        cancel: &'w AtomicBool,
        step_aside: &'w dyn Fn() -> bool,
    ) -> Option<Wait<'w>> {
        self.missing.is_none().then_some(Wait {
            limits: (self.job.timeout, self.ladder.len()),
            cancel,
            step_aside,
        })
    }

    /// What this slot's answer says beside its entry.
    fn answering(&self) -> Answering<'_> {
        Answering {
            kernel: &self.job.kernel,
            device: &self.job.device,
            grf_mode: &self.options.grf_mode,
            own_grf: self.own_grf,
        }
    }
}

/// Compile one request through every level: the bundles it names, the local cache, the
/// fleet's store (unless `store` is false), then this process's compiler. `cancel` stops
/// it (the running ocloc is killed).
pub fn compile(req: &CompileRequest, store: bool, cancel: &AtomicBool) -> Outcome {
    compile_with(req, store, cancel, &Room::alone())
}

/// The request goes down once: its slot (`prepare`), the levels' answer, else a build
/// with the GRF ladder kept in the levels (`Levels::keep` decides where); then it is
/// answered (`Compiled::new`) and counted, once, where the request's cache is.
/// `room.may_speculate()` is false while more requests of a batch wait for a core a
/// speculative build would take from them (unless the request asked for it explicitly);
/// in a batch, a request whose key another process builds steps aside (`room`).
fn compile_with(
    req: &CompileRequest,
    store: bool,
    cancel: &AtomicBool,
    room: &Room<'_>,
) -> Outcome {
    let slot = prepare(req)?;
    answer(req, &slot, store, cancel, room)
        .map_err(|failure| failure.invalid_spirv_first(&req.spirv))
}

fn answer(
    req: &CompileRequest,
    slot: &Slot,
    store: bool,
    cancel: &AtomicBool,
    room: &Room<'_>,
) -> Outcome {
    let (fits, answering) = (slot.fits(), slot.answering());
    // Asked without the store, a request is the rebuild of one already counted (the
    // driver refused its kept build: `forget_cached`).
    let counted = store && req.counted;
    let mut notes = Vec::new();
    let (key, target) = (slot.key.as_str(), slot.target());
    let asked = slot.asked(req, store);
    let step_aside = || room.step_aside();
    let wait = slot.wait(cancel, &step_aside);
    let looked = Levels::ask(asked, (counted, wait), (key, target), fits, &mut notes)?;
    let (levels, (found, building, waited)) = (
        looked.0,
        match looked.1 {
            Lookup::Hit(hit, waited) => (Some(hit), None, waited),
            Lookup::Build(building) => (None, Some(building), false),
            Lookup::Failed(refusal) => {
                let (error, attempts) = (refusal.error, refusal.attempts);
                return Err(Box::new(Failure {
                    error,
                    attempts,
                    notes,
                }));
            }
            // Its answer is dropped: the batch runs it again after its queue.
            Lookup::Later => return Err(batch::stepped_aside().into()),
        },
    );
    let no_compiler = slot.missing.as_ref().filter(|_| found.is_some());
    notes.extend(no_compiler.map(|m| m.in_context("a bundle answered; no compiler: ").message));
    // An entry, the level that gave it, and for a build made now whether it is worth
    // keeping (`Settled::repeatable`).
    let answered = match (found, &slot.missing) {
        (Some(hit), _) => Ok((hit.entry, Some(hit.counter), None)),
        (None, Some(missing)) => Err(missing.in_context("no bundle gave it, and ").into()),
        // Validated in full before a compiler sees it; a failure that repeats is kept for
        // its key, as an entry is (`keep`, below).
        (None, None) => (spirv::validate(&req.spirv).map_err(Box::<Failure>::from))
            .and_then(|_| build(req, slot, cancel, room))
            .inspect_err(|f| {
                let refusal = Refusal::of(&f.error, &f.attempts);
                notes.extend(levels.remember((key, target), &refusal))
            })
            .map(|(entry, repeatable, said)| {
                notes.extend(said);
                (entry, None, Some(repeatable))
            }),
    };
    let outcome = answered.and_then(|(entry, from, repeatable)| {
        let Entry { record, binary } = entry;
        let linked = fits.linked(&binary);
        if let Some(repeatable) = repeatable {
            let built = (&record, binary.as_slice());
            notes.extend(levels.keep(key, target, built, repeatable, linked.is_ok())?);
        }
        match linked {
            Ok(()) => Ok(Compiled::new(record, binary, &answering, from, Vec::new())),
            Err(error) => Err(Box::new(Failure {
                error: error.with_log(record.log),
                attempts: record.attempts,
                notes: Vec::new(),
            })),
        }
    });
    // What the levels said comes first, whatever the answer.
    let outcome = match outcome {
        Ok(compiled) => Ok(Compiled { notes, ..compiled }),
        Err(mut failure) => {
            notes.append(&mut failure.notes);
            failure.notes = notes;
            Err(failure)
        }
    };
    // Without a compiler, a miss is not counted: the caller's fallback (the driver's own
    // compiler) counts the request.
    let fell_through = slot.missing.is_some() && outcome.is_err();
    if counted && !fell_through {
        levels.count(match &outcome {
            Ok(c) if waited => Answered::Waited(&c.attempts),
            Ok(c) => match c.level {
                Some(level) => Answered::Hit(level, &c.attempts),
                None => Answered::Built(&c.attempts),
            },
            Err(f) if f.attempts.is_empty() => Answered::Refused,
            Err(f) => Answered::Failed(&f.attempts),
        });
    }
    drop(building); // let go once the answer is kept: its waiters find it
    outcome
}

/// Build `req` (its SPIR-V validated) here with its GRF ladder: the entry, whether it is
/// worth keeping (`Settled::repeatable`), and what the ladder says.
fn build(
    req: &CompileRequest,
    slot: &Slot,
    cancel: &AtomicBool,
    room: &Room<'_>,
) -> Result<(Entry, bool, Vec<String>), Box<Failure>> {
    let plan = Plan {
        ladder: &slot.ladder,
        own_grf: slot.own_grf,
        rule: slot.rule,
        speculation: Speculation::choose(
            req.options.speculative,
            req.spirv.len(),
            room.may_speculate(),
        ),
        cancel,
    };
    let settled = ladder::settle(
        plan,
        |flags, cancel| slot.job.attempt(&req.spirv, flags, cancel),
        |built: Built, _| Ok(built.binary),
    )?;
    let (record, binary) = (settled.record, settled.product);
    Ok((Entry { record, binary }, settled.repeatable, settled.notes))
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
        |r, room| compile_with(r, store, cancel, room),
        |e| Err(e.into()),
    )
}

//! `compile_and_load`: build a Level Zero module (SPIR-V or a native zebin), create the
//! kernel, read its spills, and retry in large GRF mode exactly as upstream `load_binary`
//! does. SPIR-V is built in crash-isolated workers (`build.rs`) and only the chosen native
//! binary is loaded here; a native binary handed in is loaded in a worker first. A SPIR-V
//! load asks the levels of native code first (`levels`: the local cache, the
//! fleet's store) and keeps its native binary there, so a warm load of the same kernel
//! skips the JIT.

use super::build::{self, Built, Isolated};
use super::{runtime, DeviceInfo, Kernel, Module, Runtime};
use crate::attempt::{self, Attempt, Record};
use crate::batch::Room;
use crate::cache::Cache;
use crate::error::Result;
use crate::grf;
use crate::key::{KeyInputs, Purpose};
use crate::knobs::effective_timeout;
use crate::ladder::{self, Failure, Plan, Settled, Speculation};
use crate::levels::{
    Answered, Asked, Building, BundleAsk, Entry, Hit, Levels, Refusal, Target, Turn, Wait,
};
use crate::options::Options;
use crate::spill::{Path, Spill};
use crate::spirv::GrfRequest;
use crate::{batch, spirv, zebin};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct LoadRequest {
    pub binary: Vec<u8>,
    pub kernel_name: String,
    /// SPIR-V (built by the driver, with the GRF ladder) or a native zebin (loaded as is).
    pub is_spv: bool,
    /// The Level Zero device's index.
    pub device: usize,
    pub options: Options,
    /// The bundles a SPIR-V load looks in first, for which target profiles (the Triton
    /// drop-in's: it knows Triton's release and target); None: no bundle.
    pub bundle: Option<crate::bundle::search::Query>,
}

impl LoadRequest {
    pub fn new(binary: Vec<u8>, kernel_name: &str) -> Self {
        LoadRequest {
            binary,
            kernel_name: kernel_name.to_string(),
            is_spv: true,
            device: 0,
            options: Options::default(),
            bundle: None,
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
    /// The chosen kernel's `spillMemSize` (bytes) and SIMD width.
    pub spill: Spill,
    /// The device's maximum work-group size, as upstream returns it.
    pub n_max_threads: u32,
    pub private_mem_size: u32,
    pub build_log: String,
    pub attempts: Vec<Attempt>,
    pub recovered: bool,
    pub cached: bool,
    pub native_binary: Vec<u8>,
    pub notes: Vec<String>,
    /// Built here from SPIR-V (else a native binary was handed in).
    pub from_spirv: bool,
    /// The level that answered (`levels`: a bundle, the local cache, the fleet's
    /// store); None when built or loaded here.
    pub level: Option<crate::cache::Counter>,
}

pub type LoadOutcome = std::result::Result<Loaded, Box<Failure>>;

/// Check the input before any byte reaches the driver (random bytes end the process there).
/// Returns the GRF mode a SPIR-V kernel asks for itself, if it does. With `for_key`, SPIR-V
/// is read only as far as its cache key needs (`spirv::scan`: a hit hands the driver no
/// byte of it), and the build validates it in full first (`Context::build`).
fn validate(req: &LoadRequest, for_key: bool) -> Result<Option<GrfRequest>> {
    if req.is_spv {
        let module = match for_key {
            true => spirv::scan(&req.binary)?,
            false => spirv::validate(&req.binary)?,
        };
        let kernel = module.select_kernel(Some(&req.kernel_name))?;
        Ok(module.grf_request(&kernel))
    } else {
        zebin::parse(&req.binary)?.kernel_spill(&req.kernel_name)?;
        Ok(None)
    }
}

/// Who builds or loads on this device: a key holds it (what a driver built or loaded
/// holds only for that device and driver version).
fn device_target(device: &DeviceInfo) -> [String; 3] {
    [
        device.name.clone(),
        device.device_id.to_string(),
        device.driver.clone(),
    ]
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
        let target = device_target(self.device);
        let target: Vec<&str> = target.iter().map(String::as_str).collect();
        KeyInputs {
            purpose: Purpose::NativeTrial,
            input: native,
            kernel: name,
            flags: &[flags.to_string()],
            rule: None,
            target: &target,
        }
        .key()
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

/// Build and load `req.kernel_name`, with upstream's large-GRF fallback. `cancel` kills
/// the running builds.
pub fn compile_and_load(req: &LoadRequest, cancel: &AtomicBool) -> LoadOutcome {
    load_inner(req, cancel, &Room::alone())
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
        |r, room| load_inner(r, cancel, room),
        |e| Err(e.into()),
    )
}

/// A loaded module and the native binary it was loaded from.
type Product = (Built, Vec<u8>);

/// What one request needs while it runs.
struct Context<'a> {
    req: &'a LoadRequest,
    rt: &'static Runtime,
    timeout: Option<Duration>,
    trial: NativeTrial<'a>,
    isolated: bool,
    /// SPIR-V read only for its key so far (`validate`): the build checks it in full first.
    unchecked_spirv: bool,
}

impl Context<'_> {
    /// Load `native` (built by this host's driver, or tried in a worker first) here.
    fn load_native(&self, native: Vec<u8>, flags: &str) -> Result<Product> {
        let req = self.req;
        let built =
            build::in_process(self.rt, req.device, &req.kernel_name, &native, false, flags)?;
        Ok((built, native))
    }

    /// A cache entry is untrusted input (a shared cache, a neighbour, a torn disk): its
    /// binary loads here only once it has loaded in a worker.
    fn revive(&self, record: &Record, native: Vec<u8>, cancel: &AtomicBool) -> Result<Product> {
        if self.isolated {
            let name = &self.req.kernel_name;
            let flags = &record.build_flags;
            self.trial
                .run(name, &native, flags, self.timeout, &[cancel])?;
        }
        self.load_native(native, &record.build_flags)
    }

    /// SPIR-V built by the driver in workers; only the chosen native binary is loaded
    /// here: no IGC in this process.
    fn isolated_build(&self, plan: Plan<'_>) -> Outcome {
        let req = self.req;
        ladder::settle(
            plan,
            |flags, cancel| {
                attempt::timed(flags, || {
                    let (name, input) = (&req.kernel_name, &req.binary);
                    build::isolated(req.device, name, input, true, flags, self.timeout, cancel)
                })
            },
            |isolated: Isolated, flags| {
                let (mut built, native) =
                    self.load_native(isolated.native, flags).map_err(|mut e| {
                        e.message = format!(
                            "the native binary built by the worker did not load here: {}",
                            e.message
                        );
                        e
                    })?;
                self.trial.vouch(&req.kernel_name, &native, flags);
                built.log = isolated.log;
                Ok((built, native))
            },
        )
    }

    /// The levels' entry of `key`, loaded: a level's entry is untrusted input, so it loads
    /// here once it has loaded in a worker; after one that does not load, the next
    /// level's is tried. An error is a bad setting of a level's.
    fn load_kept(
        &self,
        levels: &Levels,
        key: &str,
        target: Target<'_>,
        cancel: &AtomicBool,
        notes: &mut Vec<String>,
    ) -> Result<Option<Kept>> {
        let mut from = 0;
        while let Some(Hit { entry, counter, at }) = levels.find(from, key, target, None, notes)? {
            let Entry { record, binary } = entry;
            match self.revive(&record, binary, cancel) {
                Ok(product) => return Ok(Some((product, record, counter))),
                Err(e) => {
                    let what = format!(
                        "kernel '{}': native binary from {} did not load ({e}); trying the \
                         next level",
                        self.req.kernel_name,
                        crate::levels::said(counter)
                    );
                    if counter != crate::cache::Counter::LocalHits {
                        crate::diag::warn_once(&what, what.clone());
                    }
                    notes.push(what);
                }
            }
            if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                break; // the build that would follow is cancelled as well
            }
            from = at + 1;
        }
        Ok(None)
    }

    /// The levels' entry of `key`, loaded (`load_kept`); after every level missed, a
    /// failure remembered (the answer), or this load's turn (its claim, held until its
    /// build is kept), or another's build waited for and the levels asked again (`true`:
    /// the answer is a wait's).
    fn kept_or_turn(
        &self,
        levels: &Levels,
        (key, target): (&str, Target<'_>),
        (rungs, room): (usize, &Room<'_>),
        cancel: &AtomicBool,
        notes: &mut Vec<String>,
    ) -> std::result::Result<(Option<Kept>, Option<Building>, bool), Box<Failure>> {
        if let Some(kept) = self.load_kept(levels, key, target, cancel, notes)? {
            return Ok((Some(kept), None, false));
        }
        let wait = Wait {
            limits: (self.timeout, rungs),
            cancel,
            step_aside: &|| room.step_aside(),
        };
        match levels.after_miss((key, target), &wait, true, notes) {
            Ok(Turn::Build(building)) => Ok((None, Some(building), false)),
            // Its answer is dropped: the batch runs it again after its queue.
            Ok(Turn::Later) => Err(batch::stepped_aside().into()),
            Ok(Turn::Ready) => {
                let revived = self.load_kept(levels, key, target, cancel, notes)?;
                let waited = revived.is_some();
                Ok((revived, None, waited))
            }
            Err(refusal) => Err(Box::new(Failure {
                error: refusal.error,
                attempts: refusal.attempts,
                notes: std::mem::take(notes),
            })),
        }
    }

    /// Build the request (`build`) and keep the build in the levels; a failure that
    /// repeats is kept for its key. What the levels said (`notes`) comes first, whatever
    /// the build's outcome.
    fn build_and_keep(
        &self,
        (levels, (key, target)): (&Levels, (&str, Target<'_>)),
        ladder: (&[String], Option<GrfRequest>),
        (rule, cancel, room): (crate::spill::Rule, &AtomicBool, &Room<'_>),
        notes: &mut Vec<String>,
    ) -> std::result::Result<(Built, Vec<u8>, Record), Box<Failure>> {
        let Settled {
            product: (built, native),
            record,
            repeatable,
            notes: more,
        } = self
            .build(ladder, rule, cancel, room)
            .map_err(|mut failure| {
                let refusal = Refusal::of(&failure.error, &failure.attempts);
                notes.extend(levels.remember((key, target), &refusal));
                failure.notes.splice(0..0, notes.drain(..));
                failure
            })?;
        notes.extend(more);
        // The driver links what it builds (no link rule of the request's to keep).
        let built_here = (&record, native.as_slice());
        notes.extend(levels.keep(key, target, built_here, repeatable, true)?);
        Ok((built, native, record))
    }

    /// The GRF ladder for the request: SPIR-V in workers (speculatively when it gains),
    /// else in this process.
    fn build(
        &self,
        (ladder, own_grf): (&[String], Option<GrfRequest>),
        rule: crate::spill::Rule,
        cancel: &AtomicBool,
        room: &Room<'_>,
    ) -> Outcome {
        let req = self.req;
        if self.unchecked_spirv {
            spirv::validate(&req.binary)?;
        }
        let isolated_build = req.is_spv && self.isolated;
        let speculation = match isolated_build {
            true => Speculation::choose(
                req.options.speculative,
                req.binary.len(),
                room.may_speculate(),
            ),
            false => Speculation::Never,
        };
        let plan = Plan {
            ladder,
            own_grf,
            rule,
            speculation,
            cancel,
        };
        match isolated_build {
            true => self.isolated_build(plan),
            false => self.in_process_build(plan),
        }
    }

    /// In this process: a native binary (no IGC; tried in a worker first unless isolation
    /// is off or one already loaded these bytes on this device), or SPIR-V with isolation
    /// turned off.
    fn in_process_build(&self, plan: Plan<'_>) -> Outcome {
        let req = self.req;
        let trial = (!req.is_spv && self.isolated).then_some(&self.trial);
        ladder::settle(
            plan,
            |flags, cancel| {
                attempt::timed(flags, || {
                    let (name, input) = (&req.kernel_name, &req.binary);
                    if let Some(trial) = &trial {
                        trial.run(name, input, flags, self.timeout, cancel)?;
                    }
                    build::in_process(self.rt, req.device, name, input, req.is_spv, flags)
                })
            },
            |built: Built, _| {
                let native = built.module.native_binary();
                Ok((built, native))
            },
        )
    }
}

type Outcome = std::result::Result<Settled<Product>, Box<Failure>>;

/// A level's entry that loaded: the product, its record, the level that gave it.
type Kept = (Product, Record, crate::cache::Counter);

/// The key a SPIR-V load's native build is kept under: it holds the device and driver.
fn jit_key(
    req: &LoadRequest,
    device: &DeviceInfo,
    ladder: &[String],
    rule: crate::spill::Rule,
) -> String {
    let target = device_target(device);
    let target: Vec<&str> = target.iter().map(String::as_str).collect();
    KeyInputs {
        purpose: Purpose::Jit,
        input: &req.binary,
        kernel: &req.kernel_name,
        flags: ladder,
        rule: Some(rule),
        target: &target,
    }
    .key()
}

/// Upstream retries only SPIR-V without an explicit GRF mode (a flag, or the kernel's own
/// execution mode, which the ladder applies: `Plan::own_grf`); a native binary is final.
fn ladder_of(req: &LoadRequest, device: &DeviceInfo) -> Result<Vec<String>> {
    let o = &req.options;
    Ok(if req.is_spv {
        let arch = o.device_arch.as_deref().or(device.arch.as_deref());
        o.ladder(arch.unwrap_or(""))?
    } else {
        vec![o.build_flags.clone()]
    })
}

/// The levels a load asks, and its key there: bundles for SPIR-V the caller asked them for,
/// then (SPIR-V with the cache on: only it has a JIT worth skipping, and the key is
/// hashed only then) the local cache and the fleet's store.
fn levels_of(
    req: &LoadRequest,
    device: &DeviceInfo,
    ladder: &[String],
    rule: crate::spill::Rule,
) -> Result<(Levels, String)> {
    let o = &req.options;
    let kept = o.cache && req.is_spv;
    let key = match kept {
        true => jit_key(req, device, ladder, rule),
        false => String::new(),
    };
    let bundle = req
        .bundle
        .as_ref()
        .filter(|_| req.is_spv)
        .map(|query| BundleAsk {
            query,
            input: &req.binary,
            kernel: &req.kernel_name,
            options: o,
        });
    let cache = kept.then(|| Cache::open(o.cache_dir.as_deref()));
    // The store serves what the local cache keeps: only then are its settings read.
    let asked = Asked {
        cache,
        store: kept,
        bundle,
    };
    Ok((Levels::open(asked)?, key))
}

/// A load whose SPIR-V a cache may answer is read only for its key (`validate`); then an
/// input that is not valid SPIR-V is still the answer before anything found wrong after
/// it, before a build (a kernel name, a device, the levels' settings): the same error as
/// with the cache off.
fn load_inner(req: &LoadRequest, cancel: &AtomicBool, room: &Room<'_>) -> LoadOutcome {
    req.options.check(&[("kernel_name", &req.kernel_name)])?; // the settings' errors first
    let for_key = req.is_spv && req.options.cache;
    load_answer(req, for_key, cancel, room).map_err(|failure| match for_key {
        true => failure.invalid_spirv_first(&req.binary),
        false => failure,
    })
}

fn load_answer(
    req: &LoadRequest,
    for_key: bool,
    cancel: &AtomicBool,
    room: &Room<'_>,
) -> LoadOutcome {
    let own_grf = validate(req, for_key)?;
    let o = &req.options;
    let rt = runtime()?;
    let device = rt.device_info(req.device)?.clone();
    let rule = o.rule(Path::Jit)?;
    let ladder = ladder_of(req, &device)?;
    let (levels, key) = levels_of(req, &device, &ladder, rule)?;
    let compiler = device_target(&device).join("|");
    let target = Target {
        device: "",
        compiler: &compiler,
    };
    let context = Context {
        req,
        rt,
        timeout: effective_timeout(o.timeout)?,
        trial: NativeTrial {
            device_index: req.device,
            device: &device,
            remember: o.cache,
        },
        isolated: o.isolated()?,
        unchecked_spirv: for_key,
    };
    let mut notes = Vec::new();
    let (revived, claim, waited) = context.kept_or_turn(
        &levels,
        (&key, target),
        (ladder.len(), room),
        cancel,
        &mut notes,
    )?;
    let (built, native_binary, record, answered) = match revived {
        Some(((built, native), record, counter)) => (built, native, record, Some(counter)),
        None => {
            let built = context.build_and_keep(
                (&levels, (&key, target)),
                (&ladder, own_grf),
                (rule, cancel, room),
                &mut notes,
            )?;
            let (built, native, record) = built;
            (built, native, record, None)
        }
    };
    drop(claim); // let go once the build is kept: its waiters find it
    levels.count(match answered {
        Some(_) if waited => Answered::Waited(&record.attempts),
        Some(counter) => Answered::Hit(counter, &record.attempts),
        None => Answered::Built(&record.attempts),
    });
    let n_regs = grf::n_regs_with(
        &record.build_flags,
        own_grf,
        &native_binary,
        &req.kernel_name,
    );
    Ok(Loaded {
        level: answered,
        kernel_name: req.kernel_name.clone(),
        n_regs,
        build_flags: record.build_flags,
        spill: built.spill,
        n_max_threads: device.max_work_group_size,
        private_mem_size: built.private_mem_size,
        build_log: record.log,
        kernel: built.kernel,
        module: built.module,
        attempts: record.attempts,
        recovered: record.recovered,
        cached: answered.is_some(),
        native_binary,
        notes,
        from_spirv: req.is_spv,
    })
}

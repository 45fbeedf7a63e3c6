//! Which attempts, in which order: the GRF ladder run by every backend (ocloc and Level
//! Zero), in sequence or speculatively (both GRF modes at once, the loser cancelled), and
//! the choice between the attempts made ([`settle`]): the same code for both backends. The
//! ladder knows no cache: the engine asks the levels (`levels`) before it runs.
//! The policy itself is `grf.rs` and `spill.rs`.

use crate::attempt::{Attempt, Build, Record, Tried};
use crate::error::{BuildError, ErrorKind, Result};
use crate::grf::{self, Pick};
use crate::spill::Rule;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A failed compile: the error to raise and the attempts that led to it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub error: BuildError,
    pub attempts: Vec<Attempt>,
    pub notes: Vec<String>,
}

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

impl Failure {
    /// This failure, unless `spirv` is not valid SPIR-V and nothing was built: then that is
    /// the answer (`spirv::invalid_or`).
    pub fn invalid_spirv_first(self: Box<Self>, spirv: &[u8]) -> Box<Failure> {
        match self.attempts.is_empty() {
            true => crate::spirv::invalid_or(spirv, self),
            false => self,
        }
    }
}

/// The attempt chosen, what it built, and every attempt made.
pub struct Choice<B> {
    pub chosen: usize,
    pub built: B,
    pub attempts: Vec<Attempt>,
    /// Worth logging, not failures (a spill retry, a cancelled speculative build).
    pub notes: Vec<String>,
}

/// SPIR-V this large takes a second or more to build (measured: a 99 KB Triton matmul
/// 0.8-1.2 s a GRF mode): its large-GRF twin starts as soon as a core is idle.
pub const SPECULATE_MIN_SPIRV_BYTES: usize = 32 * 1024;

/// Any other kernel's twin starts once its default build has run this long (a hedge, as
/// in "The Tail at Scale"): past every small kernel (measured here: small Triton kernels
/// build in 18-63 ms a GRF mode with either compiler, 80-140 ms as a fresh worker's first
/// build, IGC starting), short against a build that overflows (the shipped PTSS sample,
/// 20 KB: 1.8 s with the modern ocloc, 7.8 s with Debian's). A twin that loses is
/// cancelled; it ran on an idle core.
pub const SPECULATE_AFTER: Duration = Duration::from_millis(200);
pub const SPECULATE_AFTER_ENV: &str = "XPU_ZEBIN_SPECULATE_AFTER";

/// When the large-GRF attempt may start before the default one has answered.
#[derive(Clone, Copy)]
pub enum Speculation<'a> {
    /// The ladder in sequence.
    Never,
    /// Both at once.
    Now,
    /// Once the default attempt has run `after`, as soon as a core is idle (then, or when
    /// one frees up while the default attempt runs) and `may()` agrees (a batch says no
    /// while jobs wait for a core).
    WhenIdle {
        after: Duration,
        may: &'a (dyn Fn() -> bool + Sync),
    },
}

impl<'a> Speculation<'a> {
    /// `speculative` as asked (`Some`), else automatic: at once for a large kernel, after
    /// `XPU_ZEBIN_SPECULATE_AFTER` (`SPECULATE_AFTER`; off: never) for any other.
    pub fn choose(
        speculative: Option<bool>,
        input_len: usize,
        may: &'a (dyn Fn() -> bool + Sync),
    ) -> Self {
        // Checked with every knob before the request began (`knobs::check`).
        let hedge = crate::knobs::seconds_or_off_knob(SPECULATE_AFTER_ENV, Some(SPECULATE_AFTER))
            .unwrap_or(Some(SPECULATE_AFTER));
        Speculation::with_hedge(speculative, input_len, may, hedge)
    }

    /// The rule, with the hedge delay given (None: never by time).
    fn with_hedge(
        speculative: Option<bool>,
        input_len: usize,
        may: &'a (dyn Fn() -> bool + Sync),
        hedge: Option<Duration>,
    ) -> Self {
        match (speculative, hedge) {
            (Some(true), _) => Speculation::Now,
            (Some(false), _) => Speculation::Never,
            (None, _) if input_len >= SPECULATE_MIN_SPIRV_BYTES => Speculation::WhenIdle {
                after: Duration::ZERO,
                may,
            },
            (None, Some(after)) => Speculation::WhenIdle { after, may },
            (None, None) => Speculation::Never,
        }
    }
}

/// How one request runs its ladder.
pub struct Plan<'a> {
    /// One or two build flag sets: default, then large GRF.
    pub ladder: &'a [String],
    /// The GRF mode the kernel asks for itself, if it does: then only the first rung is
    /// built (`grf::own_mode_is_explicit`).
    pub own_grf: Option<crate::spirv::GrfRequest>,
    pub rule: Rule,
    pub speculation: Speculation<'a>,
    pub cancel: &'a AtomicBool,
}

/// A request's build: what it produced, and how.
pub struct Settled<F> {
    pub product: F,
    pub record: Record,
    /// Every attempt failed, if at all, in a way that repeats: the input's own answer,
    /// worth keeping (not one shaped by a timeout, a cancel, a worker that died).
    pub repeatable: bool,
    /// Worth logging, not failures (a spill retry, a cancelled speculative build).
    pub notes: Vec<String>,
}

/// Build a request: run the ladder with `build`, choose, and `finish` the chosen build
/// into the product (a Level Zero build loads its native binary here). `recovered` and
/// the record are made here, once, for both backends.
pub fn settle<B: Build + Send, F>(
    plan: Plan<'_>,
    build: impl Fn(&str, &[&AtomicBool]) -> Tried<B> + Sync,
    finish: impl FnOnce(B, &str) -> Result<F>,
) -> std::result::Result<Settled<F>, Box<Failure>> {
    let plan = Plan {
        ladder: grf::own_mode_is_explicit(plan.ladder, plan.own_grf),
        ..plan
    };
    let Choice {
        chosen,
        built,
        attempts,
        notes,
    } = run(&plan, build)?;
    let flags = plan.ladder[chosen].clone();
    let record = Record {
        spill: built.spill(),
        log: built.log().to_string(),
        recovered: chosen > 0 && !attempts[0].ok,
        build_flags: flags,
        attempts,
    };
    let product = match finish(built, &record.build_flags) {
        Ok(product) => product,
        Err(error) => {
            return Err(Box::new(Failure {
                error,
                attempts: record.attempts,
                notes,
            }))
        }
    };
    let repeatable = record
        .attempts
        .iter()
        .all(|a| a.error.as_ref().is_none_or(|e| e.kind.is_repeatable()));
    Ok(Settled {
        product,
        record,
        repeatable,
        notes,
    })
}

/// Run the plan's ladder with `build`, which makes one attempt and stops when any of its
/// cancel flags is set. A second rung is tried when the first fails or its spills call
/// for it under the plan's rule; speculation starts it before the first has answered, and
/// cancels it if the first is accepted: the same answer as in sequence, sooner.
fn run<B: Build + Send>(
    plan: &Plan<'_>,
    build: impl Fn(&str, &[&AtomicBool]) -> Tried<B> + Sync,
) -> std::result::Result<Choice<B>, Box<Failure>> {
    let (ladder, cancel) = (plan.ladder, plan.cancel);
    let needs_retry = |first: &Result<B>| {
        grf::needs_retry(first.as_ref().map(B::spill).map_err(|e| e.kind), plan.rule)
    };
    let mut notes = Vec::new();
    let speculate = ladder.len() == 2 && !matches!(plan.speculation, Speculation::Never);
    let (first, retry) = if speculate {
        run_speculatively(plan, &mut notes, &build, &needs_retry)
    } else {
        let began = Instant::now();
        let first = guarded(&build, &ladder[0], &[cancel], began);
        let retry = (ladder.len() == 2 && needs_retry(&first.1))
            .then(|| guarded(&build, &ladder[1], &[cancel], began));
        (first, retry)
    };
    if let (Ok(b), Some(_)) = (&first.1, &retry) {
        let spill = b.spill();
        notes.push(format!(
            "spills {} bytes ({} slots per lane) with '{}'; tried '{}' ({} rule)",
            spill.bytes,
            spill.slots(),
            ladder[0],
            ladder[1],
            plan.rule.name()
        ));
    }
    match choose(first, retry) {
        Ok(mut choice) => {
            choice.notes = notes;
            Ok(choice)
        }
        Err(mut failure) => {
            failure.notes = notes;
            Err(failure)
        }
    }
}

/// Both rungs at once (or the second as soon as a core is idle); the second is cancelled
/// when the first is accepted.
fn run_speculatively<B: Build + Send>(
    plan: &Plan<'_>,
    notes: &mut Vec<String>,
    build: &(impl Fn(&str, &[&AtomicBool]) -> Tried<B> + Sync),
    needs_retry: &(impl Fn(&Result<B>) -> bool + Sync),
) -> (Tried<B>, Option<Tried<B>>) {
    let (ladder, cancel) = (plan.ladder, plan.cancel);
    let lost = AtomicBool::new(false);
    let first_done = AtomicBool::new(false);
    let began = Instant::now();
    std::thread::scope(|scope| {
        // No thread to be had (a process at its limit): the ladder in sequence.
        let twin = std::thread::Builder::new().name("xpu-zebin-twin".into());
        let twin = twin.spawn_scoped(scope, || -> Option<Tried<B>> {
            let _core = match plan.speculation {
                Speculation::WhenIdle { after, may } => {
                    let give_up =
                        || first_done.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed);
                    Some(crate::pool::wait_for_idle_core(
                        crate::batch::default_jobs(),
                        (&give_up, may),
                        (began, after),
                    )?)
                }
                _ => None,
            };
            Some(guarded(build, &ladder[1], &[cancel, &lost], began))
        });
        let twin = twin.ok();
        let first = guarded(build, &ladder[0], &[cancel], began);
        first_done.store(true, Ordering::Relaxed);
        crate::pool::notify_busy_changed(); // a twin still waiting for a core stops
        if needs_retry(&first.1) {
            let started = joined(twin, &ladder[1]);
            if let Some((twin, _)) = &started {
                notes.push(format!(
                    "large-GRF build ran alongside the default one (started {:.2} s into \
                     it, on an idle core)",
                    twin.started
                ));
            }
            let retry = started.unwrap_or_else(|| guarded(build, &ladder[1], &[cancel], began));
            (first, Some(retry))
        } else {
            lost.store(true, Ordering::Relaxed);
            if joined(twin, &ladder[1]).is_some() {
                notes.push("speculative large-GRF build cancelled: default GRF accepted".into());
            }
            (first, None)
        }
    })
}

/// An attempt's result when it panicked: that attempt's `internal_error`.
fn panicked<B: Build>(flags: &str, error: BuildError) -> Tried<B> {
    let result = Err(error);
    (Attempt::new(flags, 0.0, &result), result)
}

/// One attempt with `build`, started when it starts (seconds after the ladder `began`);
/// a panic in it is that attempt's `internal_error`.
fn guarded<B: Build>(
    build: &(impl Fn(&str, &[&AtomicBool]) -> Tried<B> + Sync),
    flags: &str,
    cancel: &[&AtomicBool],
    began: Instant,
) -> Tried<B> {
    let started = began.elapsed().as_secs_f64();
    let (attempt, result) = crate::sync::catch("a build attempt", || build(flags, cancel))
        .unwrap_or_else(|e| panicked(flags, e));
    (Attempt { started, ..attempt }, result)
}

/// The speculative twin's outcome: its attempt if it started (a thread for it was had);
/// a panic outside the attempt itself (waiting for a core) is that attempt's
/// `internal_error`.
fn joined<B: Build>(
    twin: Option<std::thread::ScopedJoinHandle<'_, Option<Tried<B>>>>,
    flags: &str,
) -> Option<Tried<B>> {
    twin?.join().unwrap_or_else(|_| {
        let error = BuildError::new(
            ErrorKind::Internal,
            "the speculative large-GRF attempt panicked (a bug in xpu-zebin; please report it)",
        );
        Some(panicked(flags, error))
    })
}

/// Apply the GRF policy's pick to the attempts made. The build not chosen drops here.
fn choose<B>(
    first: Tried<B>,
    retry: Option<Tried<B>>,
) -> std::result::Result<Choice<B>, Box<Failure>> {
    let (a0, r0) = first;
    let (p, mut attempts) = match &retry {
        None => (grf::pick(r0.is_ok(), false), vec![a0]),
        Some((a1, r1)) => (grf::pick(r0.is_ok(), r1.is_ok()), vec![a0, a1.clone()]),
    };
    let (chosen, built) = match (p, r0, retry) {
        (Pick::First, Ok(b), _) => (0, b),
        (Pick::Retry, _, Some((_, Ok(b)))) => (1, b),
        // Both failed: the FIRST attempt's error, the one that explains the kernel.
        (_, Err(error), _) => {
            return Err(Box::new(Failure {
                error,
                attempts: std::mem::take(&mut attempts),
                notes: Vec::new(),
            }))
        }
        // `pick` only chooses an attempt that built; anything else is a bug, said as one.
        _ => {
            return Err(Box::new(Failure {
                error: BuildError::new(
                    ErrorKind::Internal,
                    format!("the GRF policy chose {p:?}, an attempt that did not build"),
                ),
                attempts,
                notes: Vec::new(),
            }))
        }
    };
    Ok(Choice {
        chosen,
        built,
        attempts,
        notes: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(s: Speculation<'_>) -> Option<Duration> {
        match s {
            Speculation::WhenIdle { after, .. } => Some(after),
            Speculation::Never | Speculation::Now => None,
        }
    }

    #[test]
    fn a_twin_starts_by_size_at_once_else_by_time_unless_asked() {
        let may = || true;
        let hedge = Some(SPECULATE_AFTER);
        let big = SPECULATE_MIN_SPIRV_BYTES;
        let small = 3424; // a small Triton kernel's SPIR-V
        let rule = |asked, len, hedge| after(Speculation::with_hedge(asked, len, &may, hedge));
        assert_eq!(rule(None, big, hedge), Some(Duration::ZERO));
        assert_eq!(rule(None, big, None), Some(Duration::ZERO));
        assert_eq!(rule(None, small, hedge), Some(SPECULATE_AFTER));
        assert_eq!(
            rule(None, small, Some(Duration::ZERO)),
            Some(Duration::ZERO)
        );
        assert_eq!(rule(None, small, None), None); // off: never by time
        for len in [small, big] {
            let now = Speculation::with_hedge(Some(true), len, &may, None);
            assert!(matches!(now, Speculation::Now));
            let never = Speculation::with_hedge(Some(false), len, &may, hedge);
            assert!(matches!(never, Speculation::Never));
        }
    }
}

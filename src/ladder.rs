//! Which attempts, in which order: the GRF ladder run by every backend (ocloc and Level
//! Zero), in sequence or speculatively (both GRF modes at once, the loser cancelled), and
//! the choice between the attempts made. The policy itself is `grf.rs`.

use crate::engine::Failure;
use crate::error::{AttemptError, Result};
use crate::grf::{self, Pick};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};

/// One build of the ladder.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attempt {
    pub build_flags: String,
    pub ok: bool,
    pub spill_size: Option<u64>,
    pub seconds: f64,
    /// Why it failed, when it failed.
    pub error: Option<AttemptError>,
}

impl Attempt {
    pub fn new<B>(
        flags: &str,
        seconds: f64,
        result: &Result<B>,
        spills: impl Fn(&B) -> u64,
    ) -> Self {
        Attempt {
            build_flags: flags.to_string(),
            ok: result.is_ok(),
            spill_size: result.as_ref().ok().map(spills),
            seconds,
            error: result.as_ref().err().map(AttemptError::from),
        }
    }
}

/// One attempt and what it built.
pub type Tried<B> = (Attempt, Result<B>);

/// Make one attempt with `build`, timed and recorded.
pub fn timed<B>(
    flags: &str,
    spills: impl Fn(&B) -> u64,
    build: impl FnOnce() -> Result<B>,
) -> Tried<B> {
    let started = std::time::Instant::now();
    let result = build();
    let attempt = Attempt::new(flags, started.elapsed().as_secs_f64(), &result, spills);
    (attempt, result)
}

/// The attempt chosen, what it built, and every attempt made.
pub struct Choice<B> {
    pub chosen: usize,
    pub built: B,
    pub attempts: Vec<Attempt>,
    /// Worth logging, not failures (a spill retry, a cancelled speculative build).
    pub notes: Vec<String>,
}

/// Below this SPIR-V size a build takes tens of milliseconds: a speculative twin would
/// only cost a cancelled worker (measured: 37 ms per small Triton kernel with it, 23 ms
/// without), so automatic speculation is for kernels at least this large.
pub const SPECULATE_MIN_SPIRV_BYTES: usize = 32 * 1024;

/// When the large-GRF attempt may start before the default one has answered.
#[derive(Clone, Copy)]
pub enum Speculation<'a> {
    /// The ladder in sequence.
    Never,
    /// Both at once.
    Now,
    /// As soon as a core is idle (now, or when one frees up while the default attempt
    /// runs) and `may()` agrees (a batch says no while jobs wait for a core).
    WhenIdle(&'a (dyn Fn() -> bool + Sync)),
}

impl<'a> Speculation<'a> {
    /// `speculative` as asked (`Some`), else automatic for a kernel large enough to gain.
    pub fn choose(
        speculative: Option<bool>,
        input_len: usize,
        may: &'a (dyn Fn() -> bool + Sync),
    ) -> Self {
        match speculative {
            Some(true) => Speculation::Now,
            Some(false) => Speculation::Never,
            None if input_len >= SPECULATE_MIN_SPIRV_BYTES => Speculation::WhenIdle(may),
            None => Speculation::Never,
        }
    }
}

/// Run `ladder` (one or two build flag sets) with `build`, which makes one attempt and
/// stops when any of its cancel flags is set. A second rung is tried when the first fails
/// or spills more than `spill_threshold`; speculation starts it before the first has
/// answered, and cancels it if the first is accepted: the same answer as in sequence,
/// sooner. `notes` so far (cache trouble, say) come back first in the choice's or
/// failure's notes.
#[allow(clippy::too_many_arguments)]
pub fn run<B: Send>(
    ladder: &[String],
    spill_threshold: u64,
    speculation: Speculation<'_>,
    cancel: &AtomicBool,
    mut notes: Vec<String>,
    spills: impl Fn(&B) -> u64 + Sync,
    build: impl Fn(&str, &[&AtomicBool]) -> Tried<B> + Sync,
) -> std::result::Result<Choice<B>, Box<Failure>> {
    let needs_retry = |first: &Result<B>| {
        grf::needs_retry(
            first.as_ref().map(&spills).map_err(|e| e.kind),
            spill_threshold,
        )
    };
    let speculate = ladder.len() == 2 && !matches!(speculation, Speculation::Never);
    let (first, retry) = if speculate {
        let lost = AtomicBool::new(false);
        let first_done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let twin = scope.spawn(|| -> Option<Tried<B>> {
                let _core = match speculation {
                    Speculation::WhenIdle(may) => {
                        let give_up =
                            || first_done.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed);
                        Some(crate::pool::wait_for_idle_core(
                            crate::batch::default_jobs(),
                            &give_up,
                            may,
                        )?)
                    }
                    _ => None,
                };
                Some(guarded(&build, &ladder[1], &[cancel, &lost]))
            });
            let first = guarded(&build, &ladder[0], &[cancel]);
            first_done.store(true, Ordering::Relaxed);
            crate::pool::notify_busy_changed(); // a twin still waiting for a core stops
            if needs_retry(&first.1) {
                let started = joined(twin, &ladder[1]);
                if started.is_some() {
                    notes.push(
                        "large-GRF build ran alongside the default one (a core was idle)".into(),
                    );
                }
                let retry = started.unwrap_or_else(|| guarded(&build, &ladder[1], &[cancel]));
                (first, Some(retry))
            } else {
                lost.store(true, Ordering::Relaxed);
                if joined(twin, &ladder[1]).is_some() {
                    notes
                        .push("speculative large-GRF build cancelled: default GRF accepted".into());
                }
                (first, None)
            }
        })
    } else {
        let first = guarded(&build, &ladder[0], &[cancel]);
        let retry = (ladder.len() == 2 && needs_retry(&first.1))
            .then(|| guarded(&build, &ladder[1], &[cancel]));
        (first, retry)
    };
    if let (Ok(b), Some(_)) = (&first.1, &retry) {
        notes.push(format!(
            "spills {} bytes with '{}'; tried '{}'",
            spills(b),
            ladder[0],
            ladder[1]
        ));
    }
    match choose(first, retry, &spills) {
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

/// One attempt with `build`; a panic in it is that attempt's `internal_error`.
fn guarded<B>(
    build: &(impl Fn(&str, &[&AtomicBool]) -> Tried<B> + Sync),
    flags: &str,
    cancel: &[&AtomicBool],
) -> Tried<B> {
    crate::sync::catch("a build attempt", || build(flags, cancel)).unwrap_or_else(|e| {
        let result = Err(e);
        (Attempt::new(flags, 0.0, &result, |_: &B| 0), result)
    })
}

/// The speculative twin's outcome: its attempt if it started; a panic outside the attempt
/// itself (waiting for a core) is that attempt's `internal_error`.
fn joined<B>(
    twin: std::thread::ScopedJoinHandle<'_, Option<Tried<B>>>,
    flags: &str,
) -> Option<Tried<B>> {
    twin.join().unwrap_or_else(|_| {
        let result = Err(crate::error::BuildError::new(
            crate::error::ErrorKind::Internal,
            "the speculative large-GRF attempt panicked (a bug in xpu-zebin; please report it)",
        ));
        Some((Attempt::new(flags, 0.0, &result, |_: &B| 0), result))
    })
}

/// Apply the GRF policy's pick to the attempts made. The build not chosen drops here.
fn choose<B>(
    first: Tried<B>,
    retry: Option<Tried<B>>,
    spills: impl Fn(&B) -> u64,
) -> std::result::Result<Choice<B>, Box<Failure>> {
    let (a0, r0) = first;
    let built_spills = |r: &Result<B>| r.as_ref().ok().map(&spills);
    let (p, mut attempts) = match &retry {
        None => (
            built_spills(&r0).map_or(Pick::Neither, |_| Pick::First),
            vec![a0],
        ),
        Some((a1, r1)) => (
            grf::pick(built_spills(&r0), built_spills(r1)),
            vec![a0, a1.clone()],
        ),
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
                error: crate::error::BuildError::new(
                    crate::error::ErrorKind::Internal,
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

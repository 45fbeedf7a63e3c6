//! Persistent worker processes: anything that runs IGC (libocloc, the Level Zero driver's
//! JIT) runs in one of these, never in the caller. An input that crashes the compiler costs
//! a worker; the caller gets a classified error and goes on.
//!
//! One mechanism for every backend: a worker is `[loader --library-path L] python -m
//! xpu_zebin._worker ARGS...` (the loader part is the glibc trick of the modern compiler),
//! it greets once its library is loaded, then serves requests until its stdin closes or it
//! has been idle for `XPU_ZEBIN_WORKER_IDLE_SECONDS`. Idle workers are kept per kind
//! (bounded), replaced when they die, and killed (whole process group) on timeout or cancel.
//! Whatever a worker prints (IGC writes to fds 1 and 2) goes to a file the caller reads, so a
//! worker that dies still leaves its log behind.
//!
//! Frames on the worker's stdin/stdout, integers little-endian, both directions:
//! the magic `XZF3` (the protocol's version), u32 header length, u64 payload length, JSON
//! header, payload bytes. Both sides check the magic and the lengths' bounds before they
//! read, and grow their buffers only as bytes arrive: a garbled or oversized frame is a
//! dead worker (replaced), never a huge allocation. Writes and reads have deadlines and
//! watch the cancel flags, so a worker that stops reading cannot hang the caller.
//!
//! A worker dies with its caller: it watches its stdin, and when the caller's end closes
//! (the caller exited, however it ended) it kills its own process group at once, even in
//! the middle of a build.
//!
//! The module, by concern: `slots.rs` counts this process's running compilers and holds
//! the host's core slots (what speculation asks before it starts a twin); `frame.rs` is
//! the protocol, both sides; `worker.rs` is the caller's side of one worker (spawn, send,
//! read with deadlines, kill); `serve.rs` is the worker's side (its loop, and dying with
//! its caller or when stuck in a crash handler, with `crash_watch.rs`); this file keeps
//! the idle workers per kind and answers `call`.

use crate::classify::Exit;
use crate::cores::{Slot, Taken};
use crate::sync::{lock, Renewable};
use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

mod frame;
mod serve;
mod slots;
mod worker;

pub use frame::{log_tail, read_frame, write_frame, MAX_LOG_BYTES};
pub use serve::{serve, FAULTED_SAID};
pub use slots::{
    busy, changes, free_core, join_multiprocess_batch, notify_busy_changed, notify_let_go,
    reserve_core, wait_for_change, wait_for_idle_core, BusyGuard, CoreTurn, Reserved,
    WaitingForCore, CORE_WAIT_ENV, SETTLE,
};
pub use worker::prefer_for_oom_kill;
// Each part sees the others' items (pub(super)) through these, as in one file.
use frame::*;
use slots::*;
use worker::*;

/// Set to `0` to use no persistent ocloc workers (one ocloc process per compile).
pub const PERSISTENT_ENV: &str = "XPU_ZEBIN_PERSISTENT";
/// A worker with no request for this long exits by itself, returning its memory.
pub const IDLE_EXIT_ENV: &str = "XPU_ZEBIN_WORKER_IDLE_SECONDS";
const DEFAULT_IDLE_EXIT_SECONDS: u64 = 300;
/// What a worker says once its library is loaded (changes with the frame format).
const READY: &[u8; 4] = b"XZW3";
/// Every frame starts with this.
const FRAME_MAGIC: &[u8; 4] = b"XZF3";
/// Bounds of a frame's parts: a header is JSON with a compiler log, a payload one SPIR-V
/// module or zebin.
pub const MAX_HEADER_BYTES: u64 = 64 << 20;
pub const MAX_PAYLOAD_BYTES: u64 = 1 << 30;
/// What is kept of a worker's chatter per job: the end, where the errors are.
const MAX_CHATTER_BYTES: u64 = 1 << 20;
/// A worker that could not start is tried again this many times (with a growing pause)
/// before the request gives up on workers of its kind.
const SPAWN_TRIES: u32 = 3;
/// How long a new worker may take to load IGC or the driver and greet.
const STARTUP: Duration = Duration::from_secs(60);
/// A worker is replaced after this many jobs, bounding whatever IGC accumulates.
const JOBS_PER_WORKER: u32 = 256;
/// Idle workers kept per kind: each holds IGC (~200 MB measured), so a many-core machine
/// does not keep one per core forever. Busier moments start more, briefly.
const MAX_IDLE_PER_KIND: usize = 8;

/// How to start a Python that can import this package (set by the bindings at import).
#[derive(Debug, Clone)]
pub struct PythonRuntime {
    /// The real interpreter binary (not a venv symlink: a loader needs the ELF file).
    pub executable: PathBuf,
    /// `sys.path` joined for PYTHONPATH, so the worker imports the same package.
    pub pythonpath: String,
}

static PYTHON: OnceLock<PythonRuntime> = OnceLock::new();

/// Enable workers by telling the pool how to start one.
pub fn configure(runtime: PythonRuntime) {
    let _ = PYTHON.set(runtime);
}

/// Are persistent ocloc workers wanted (`XPU_ZEBIN_PERSISTENT` is not false)?
pub fn persistent_enabled() -> bool {
    // A bad value fails the request before it gets here (`knobs::check`).
    crate::knobs::bool_knob(PERSISTENT_ENV, true).unwrap_or(true)
}

/// How long an idle worker is kept; zero: none is kept, each ends after its job.
fn idle_exit() -> Duration {
    let default = Duration::from_secs(DEFAULT_IDLE_EXIT_SECONDS);
    crate::knobs::seconds_knob(IDLE_EXIT_ENV, default).unwrap_or(default)
}

/// One kind of worker: workers with the same key are interchangeable.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Names the pool of interchangeable workers (an ocloc path, a Level Zero device set).
    pub key: String,
    /// Arguments after `python -m xpu_zebin._worker`.
    pub args: Vec<OsString>,
    /// A dynamic loader to start Python under, with its `--library-path`.
    pub loader: Option<(PathBuf, Option<String>)>,
    pub env: Vec<(OsString, OsString)>,
}

/// How one request ended.
#[derive(Debug)]
pub enum Reply {
    Done {
        header: Vec<u8>,
        payload: Vec<u8>,
        /// What the worker printed on fds 1 and 2 during the job.
        chatter: String,
    },
    /// The worker died on this job (an IGC crash): how it ended and what it printed.
    Died { exit: Exit, chatter: String },
    /// Killed at the deadline.
    TimedOut { seconds: f64, chatter: String },
    /// Killed because a cancel flag was set.
    Cancelled,
    /// The worker answered something that is not a frame (or too large a one): it was
    /// killed and will be replaced.
    Garbled { why: String, chatter: String },
}
#[derive(Default)]
struct Pool {
    idle: HashMap<String, Vec<Worker>>,
    /// Kinds whose workers could not start lately.
    broken: HashMap<String, Broken>,
}

/// A kind of worker that could not start, [`SPAWN_TRIES`] times in a row within one
/// request: not tried again for a while (each try costs a Python start), then tried again
/// (a fork that failed under memory pressure, a library installed since), so a long-lived
/// process recovers. The wait doubles with each such failure in a row.
struct Broken {
    why: String,
    since: Instant,
    failures: u32,
}

/// Seconds before a kind that could not start is tried again (first wait; it doubles).
pub const RETRY_ENV: &str = "XPU_ZEBIN_WORKER_RETRY_SECONDS";
const DEFAULT_RETRY_SECONDS: u64 = 5;
const MAX_RETRY: Duration = Duration::from_secs(3600);

impl Broken {
    fn retry_after(&self) -> Duration {
        let default = Duration::from_secs(DEFAULT_RETRY_SECONDS);
        let first = crate::knobs::seconds_knob(RETRY_ENV, default).unwrap_or(default);
        first
            .saturating_mul(1u32 << self.failures.saturating_sub(1).min(16))
            .min(MAX_RETRY)
    }

    fn still(&self) -> bool {
        self.since.elapsed() < self.retry_after()
    }
}

static POOL: Renewable<Mutex<Pool>> =
    Renewable::new(|| Mutex::new(Pool::default()), forget_after_fork);

/// In a forked child: the parent's workers, its running compilers and its locks are not
/// the child's (`sync::Renewable`). The child closes its copies of the idle workers' pipes
/// (the workers stay the parent's) when the pool was not locked at the fork; else its state
/// may be mid-change and is left alone.
pub(crate) fn forget_after_fork() {
    if let Some(Ok(mut pool)) = POOL.made().map(Mutex::try_lock) {
        drop(std::mem::take(&mut pool.idle)); // no kill, no wait: just this process's fds
    }
    POOL.renew();
    BUSY_CHANGED.renew();
    BUSY.store(0, Ordering::Relaxed);
    STARTING.store(0, Ordering::Relaxed);
    forget_reserved();
}

/// A live idle worker of this kind, if any (idle workers may have ended themselves).
fn take_idle(key: &str) -> Option<Worker> {
    let mut pool = lock(POOL.get());
    let idle = pool.idle.get_mut(key)?;
    while let Some(mut w) = idle.pop() {
        if w.alive() {
            return Some(w);
        }
        let _ = w.child.wait();
    }
    None
}

/// Why workers of this kind cannot be used, if they cannot.
pub fn unavailable(key: &str) -> Option<String> {
    if PYTHON.get().is_none() {
        return Some("workers are started through Python; the package was not imported".into());
    }
    lock(POOL.get())
        .broken
        .get(key)
        .filter(|b| b.still())
        .map(|b| b.why.clone())
}

/// A new worker, tried [`SPAWN_TRIES`] times with a growing pause (a failed fork under
/// memory pressure passes); cancel and the deadline end the tries.
fn spawn_with_retries(
    python: &PythonRuntime,
    spec: &WorkerSpec,
    cancel: &[&AtomicBool],
    deadline: Option<Instant>,
) -> Result<Worker, Unstarted> {
    let mut pause = Duration::from_millis(100);
    let mut tries = 0;
    loop {
        match Worker::spawn(python, spec, cancel, deadline) {
            Err(Unstarted::Failed(why)) => {
                tries += 1;
                if tries >= SPAWN_TRIES {
                    return Err(Unstarted::Failed(why));
                }
                let until = Instant::now() + pause;
                while Instant::now() < until {
                    if cancel.iter().any(|c| c.load(Ordering::Relaxed)) {
                        return Err(Unstarted::Cancelled);
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Unstarted::TimedOut);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                pause *= 4;
            }
            other => return other,
        }
    }
}

/// Remember that workers of this kind could not start. Said once by whoever needs them:
/// the ocloc engine warns once per compiler (it goes on one process per compile), a Level
/// Zero build raises `toolchain_missing` naming why.
fn mark_broken(spec: &WorkerSpec, why: &str) {
    let mut pool = lock(POOL.get());
    let failures = pool.broken.get(&spec.key).map_or(0, |b| b.failures);
    let broken = Broken {
        why: why.to_string(),
        since: Instant::now(),
        failures: failures + 1,
    };
    pool.broken.insert(spec.key.clone(), broken);
}

/// Run one request on a worker of `spec`'s kind. `Err` says why no worker could be had (it
/// could not start, or quit without answering): never a build failure of the input.
pub fn call(
    spec: &WorkerSpec,
    header: &[u8],
    payload: &[u8],
    cancel: &[&AtomicBool],
    timeout: Option<Duration>,
) -> Result<Reply, String> {
    let Some(python) = PYTHON.get() else {
        return Err("workers are started through Python; the package was not imported".into());
    };
    call_with(python, spec, header, payload, cancel, timeout)
}

/// A worker that answered goes back to its kind's idle list, or ends when the list is
/// full, it has served its jobs, or idle workers are not kept.
fn job_done(spec: &WorkerSpec, mut worker: Worker) {
    worker.jobs += 1;
    let keep = !idle_exit().is_zero() && worker.jobs < JOBS_PER_WORKER;
    let mut pool = lock(POOL.get());
    let idle = pool.idle.entry(spec.key.clone()).or_default();
    if keep && idle.len() < MAX_IDLE_PER_KIND {
        idle.push(worker);
    } else {
        drop(pool);
        worker.kill();
    }
}

fn call_with(
    python: &PythonRuntime,
    spec: &WorkerSpec,
    header: &[u8],
    payload: &[u8],
    cancel: &[&AtomicBool],
    timeout: Option<Duration>,
) -> Result<Reply, String> {
    if let Some(why) = lock(POOL.get()).broken.get(&spec.key).filter(|b| b.still()) {
        return Err(why.why.clone());
    }
    check_sizes(header, payload)?;
    block_sigpipe();
    let _busy = BusyGuard::new();
    let started = Instant::now();
    let deadline = timeout.and_then(|t| started.checked_add(t));
    let timed_out = |chatter: String| Reply::TimedOut {
        seconds: timeout.unwrap_or_default().as_secs_f64(),
        chatter,
    };
    let mut quit_fresh = 0;
    // An idle worker that ends itself (idle timeout) just as a request arrives closes
    // without answering and exits 0: then the request goes to the next idle worker, or a
    // fresh one. Each turn uses up an idle worker or starts one, so this ends.
    loop {
        let (mut worker, reused) = match take_idle(&spec.key) {
            Some(w) => (w, true),
            None => match starting(|| spawn_with_retries(python, spec, cancel, deadline)) {
                Ok(w) => {
                    lock(POOL.get()).broken.remove(&spec.key);
                    (w, false)
                }
                Err(Unstarted::Cancelled) => return Ok(Reply::Cancelled),
                Err(Unstarted::TimedOut) => return Ok(timed_out(String::new())),
                Err(Unstarted::Failed(why)) => {
                    let why = format!("{why} ({SPAWN_TRIES} tries)");
                    mark_broken(spec, &why);
                    return Err(why);
                }
            },
        };
        let _ = worker.new_chatter(); // anything from before this job is not its log
        match worker.exchange(header, payload, cancel, deadline) {
            Ok((header, payload)) => {
                let chatter = worker.new_chatter();
                job_done(spec, worker);
                return Ok(Reply::Done {
                    header,
                    payload,
                    chatter,
                });
            }
            Err((wait @ (Wait::Unsent | Wait::Closed), answered)) => {
                // Did it take the job? Not when it closed before the request reached it,
                // died with request bytes unread (killed while idle: the OOM killer prefers
                // workers), or ended by itself without answering (of idleness, or a fresh
                // one that quit at once). None of that is the input's doing: the next idle
                // worker, or a fresh one, takes the job.
                let unsent = matches!(wait, Wait::Unsent) || unread(&worker.stdin) > 0;
                let chatter = worker.new_chatter();
                let exit = worker.reap();
                if !(unsent || (!answered && exit == Exit::Code(0))) {
                    return Ok(Reply::Died { exit, chatter });
                }
                if reused {
                    continue;
                }
                quit_fresh += 1;
                if quit_fresh < SPAWN_TRIES {
                    continue;
                }
                return Err(format!(
                    "{SPAWN_TRIES} new workers in a row ended without taking a request{}",
                    chatter
                        .trim()
                        .lines()
                        .last()
                        .map_or(String::new(), |l| format!(": {l}"))
                ));
            }
            Err((Wait::Garbled(why), _)) => {
                let chatter = worker.new_chatter();
                worker.kill();
                return Ok(Reply::Garbled { why, chatter });
            }
            Err((Wait::TimedOut, _)) => {
                let chatter = worker.new_chatter();
                worker.kill();
                return Ok(timed_out(chatter));
            }
            Err((Wait::Cancelled, _)) | Err((Wait::Done, _)) => {
                worker.kill();
                return Ok(Reply::Cancelled);
            }
        }
    }
}

/// Why workers are off, for each kind that has them off now (for diagnostics).
pub fn broken() -> Vec<(String, String)> {
    lock(POOL.get())
        .broken
        .iter()
        .filter(|(_, b)| b.still())
        .map(|(k, b)| (k.clone(), b.why.clone()))
        .collect()
}

/// Stop every idle worker and forget which kinds could not start (tests, benchmarks, or
/// before fork): the next request starts afresh.
pub fn shutdown() {
    let mut pool = lock(POOL.get());
    pool.broken.clear();
    let idle: Vec<Worker> = pool.idle.drain().flat_map(|(_, w)| w).collect();
    drop(pool);
    for w in idle {
        w.kill();
    }
}

#[cfg(test)]
mod tests;

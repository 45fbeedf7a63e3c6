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
//! u32 header length, JSON header, u64 payload length, payload bytes.

use crate::classify::Exit;
use crate::cores::{Slot, Taken};
use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, LazyLock, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Set to `0` to use no persistent ocloc workers (one ocloc process per compile).
pub const PERSISTENT_ENV: &str = "XPU_ZEBIN_PERSISTENT";
/// A worker with no request for this long exits by itself, returning its memory.
pub const IDLE_EXIT_ENV: &str = "XPU_ZEBIN_WORKER_IDLE_SECONDS";
const DEFAULT_IDLE_EXIT_SECONDS: u64 = 300;
/// What a worker says once its library is loaded.
const READY: &[u8; 4] = b"XZW2";
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

/// Are persistent ocloc workers wanted (`XPU_ZEBIN_PERSISTENT` is not `0`)?
pub fn persistent_enabled() -> bool {
    std::env::var(PERSISTENT_ENV).map_or(true, |v| v.trim() != "0")
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
}

/// Processes running compilers for this process right now (workers busy with a job and
/// one-shot ocloc processes). Each also holds a core slot of the host (`cores.rs`) when one
/// is free: speculation uses a core only when one is idle, in this process and on the host.
static BUSY: AtomicUsize = AtomicUsize::new(0);

pub fn busy() -> usize {
    BUSY.load(Ordering::Relaxed)
}

/// Woken whenever a compiler of this process starts or ends (and when a waiter's own
/// condition changes). Compilers of other processes are seen at the next poll.
static BUSY_CHANGED: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
const POLL_OTHER_PROCESSES: Duration = Duration::from_millis(100);

/// Wake everyone waiting in [`wait_for_idle_core`].
pub fn notify_busy_changed() {
    let _lock = BUSY_CHANGED.0.lock().unwrap();
    BUSY_CHANGED.1.notify_all();
}

/// How long a speculative build waits before taking an idle core, in a process that runs
/// tasks of a batch spread over several processes (see [`join_multiprocess_batch`]).
pub const SETTLE: Duration = Duration::from_millis(100);
static SETTLE_TWINS: AtomicBool = AtomicBool::new(false);

/// This process runs tasks of a batch spread over several processes (Dask workers, a
/// process pool), which start their tasks at the same moment (measured a few ms apart on a
/// Dask LocalCluster): from now on its speculative builds wait [`SETTLE`] first, so that
/// the other processes' real work takes its cores before any twin does. A lone process
/// has no one to wait for, and its twins start at once.
pub fn join_multiprocess_batch() {
    SETTLE_TWINS.store(true, Ordering::Relaxed);
}

/// Wait until one more compiler fits on the cores (of this process, and of the host) and
/// `may` agrees (in a multi-process batch, no sooner than [`SETTLE`] from now); then take
/// that core: the returned guard counts as a running compiler until dropped, so two waiters
/// never take one idle core. `None` once `give_up` says so.
pub fn wait_for_idle_core(
    cores: usize,
    give_up: &dyn Fn() -> bool,
    may: &dyn Fn() -> bool,
) -> Option<BusyGuard> {
    let settle = if SETTLE_TWINS.load(Ordering::Relaxed) {
        SETTLE
    } else {
        Duration::ZERO
    };
    let settled = Instant::now() + settle;
    let mut lock = BUSY_CHANGED.0.lock().unwrap();
    loop {
        if give_up() {
            return None;
        }
        let now = Instant::now();
        if now < settled {
            lock = BUSY_CHANGED.1.wait_timeout(lock, settled - now).unwrap().0;
            continue;
        }
        if busy() < cores && may() {
            let slot = match crate::cores::try_take() {
                Taken::Slot(slot) => Some(Some(slot)),
                Taken::Uncounted => Some(None),
                Taken::Full => None, // other processes run compilers on the idle cores
            };
            if let Some(slot) = slot {
                BUSY.fetch_add(1, Ordering::Relaxed); // under the lock: no twin takes it too
                return Some(BusyGuard { slot });
            }
        }
        // Woken on every change here; the timeout is when other processes are seen.
        lock = BUSY_CHANGED
            .1
            .wait_timeout(lock, POLL_OTHER_PROCESSES)
            .unwrap()
            .0;
    }
}

/// Counts one running compiler (and holds its host core slot, if one was free) while alive.
pub struct BusyGuard {
    slot: Option<Slot>,
}

impl BusyGuard {
    pub fn new() -> Self {
        let slot = match crate::cores::try_take() {
            Taken::Slot(slot) => Some(slot),
            Taken::Full | Taken::Uncounted => None,
        };
        BUSY.fetch_add(1, Ordering::Relaxed);
        notify_busy_changed();
        BusyGuard { slot }
    }
}

impl Default for BusyGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        drop(self.slot.take()); // free before waking anyone who would take it
        BUSY.fetch_sub(1, Ordering::Relaxed);
        notify_busy_changed();
    }
}

// ---------------------------------------------------------------------------------------
// Caller side.

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    /// The worker's fds 1 and 2; read here from `seen` on.
    chatter: File,
    seen: u64,
    jobs: u32,
}

enum Wait {
    Done,
    TimedOut,
    Cancelled,
    Closed,
}

impl Worker {
    fn spawn(python: &PythonRuntime, spec: &WorkerSpec) -> std::io::Result<Worker> {
        let mut command = match &spec.loader {
            Some((loader, library_path)) => {
                let mut c = Command::new(loader);
                if let Some(lp) = library_path {
                    c.args(["--library-path", lp]);
                }
                c.arg(&python.executable);
                c
            }
            None => Command::new(&python.executable),
        };
        let chatter = tempfile::tempfile()?;
        command
            .args(["-m", "xpu_zebin._worker"])
            .args(&spec.args)
            .env("PYTHONPATH", &python.pythonpath)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(chatter.try_clone()?)
            // Its own group: the terminal's Ctrl-C reaches Python, which cancels us; a kill
            // takes the worker and anything it started.
            .process_group(0);
        let mut child = command.spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut worker = Worker {
            child,
            stdin,
            stdout,
            chatter,
            seen: 0,
            jobs: 0,
        };
        let mut greeting = [0u8; 4];
        let waited = worker.read_exact_until(&mut greeting, &[], Some(Instant::now() + STARTUP));
        if !matches!(waited, Wait::Done) || &greeting != READY {
            let said = worker.new_chatter();
            worker.kill();
            let said = said.trim();
            return Err(std::io::Error::other(format!(
                "a worker (python -m xpu_zebin._worker {}) did not start{}",
                spec.args
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                if said.is_empty() {
                    String::new()
                } else {
                    format!(": {}", said.lines().last().unwrap_or(said))
                }
            )));
        }
        Ok(worker)
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Text the worker printed since the last call.
    fn new_chatter(&mut self) -> String {
        let end = self.chatter.metadata().map_or(self.seen, |m| m.len());
        if end <= self.seen {
            return String::new();
        }
        let mut buf = vec![0u8; (end - self.seen) as usize];
        let n = self.chatter.read_at(&mut buf, self.seen).unwrap_or(0);
        buf.truncate(n);
        self.seen += n as u64;
        String::from_utf8_lossy(&buf).into_owned()
    }

    fn kill(mut self) {
        // SAFETY: killpg on the group created for this worker.
        unsafe { libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    /// How a worker whose stdout closed ended: wait a little for it to go, then kill it.
    fn reap(mut self) -> Exit {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    // SAFETY: as in kill(): the rest of the worker's group goes too.
                    unsafe { libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL) };
                    return match (status.code(), status.signal()) {
                        (Some(code), _) => Exit::Code(code),
                        (None, Some(sig)) => Exit::Signal(sig),
                        _ => Exit::Code(-1),
                    };
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    self.kill();
                    return Exit::Code(-1);
                }
            }
        }
    }

    /// Read exactly `buf.len()` bytes, giving up at the deadline or on cancel.
    fn read_exact_until(
        &mut self,
        buf: &mut [u8],
        cancel: &[&AtomicBool],
        deadline: Option<Instant>,
    ) -> Wait {
        let fd = self.stdout.as_raw_fd();
        let mut filled = 0;
        while filled < buf.len() {
            if cancel.iter().any(|c| c.load(Ordering::Relaxed)) {
                return Wait::Cancelled;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Wait::TimedOut;
            }
            // Wake on data at once; every 20 ms otherwise to look at the cancel flags.
            let slice = deadline.map_or(20, |d| (d - now).as_millis().clamp(1, 20) as i32);
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            if unsafe { libc::poll(&mut pfd, 1, slice) } <= 0 {
                continue;
            }
            match self.stdout.read(&mut buf[filled..]) {
                Ok(0) | Err(_) => return Wait::Closed,
                Ok(n) => filled += n,
            }
        }
        Wait::Done
    }

    /// Send one request and read its response; `Err(bytes read)` when the worker closed.
    fn exchange(
        &mut self,
        header: &[u8],
        payload: &[u8],
        cancel: &[&AtomicBool],
        deadline: Option<Instant>,
    ) -> Result<(Vec<u8>, Vec<u8>), (Wait, bool)> {
        let sent = write_frame(&mut self.stdin, header, payload);
        if sent.is_err() {
            return Err((Wait::Closed, false));
        }
        let mut started = false;
        let mut read = |w: &mut Worker, buf: &mut [u8]| {
            let r = match w.read_exact_until(buf, cancel, deadline) {
                Wait::Done => Ok(()),
                other => Err((other, started)),
            };
            started = true;
            r
        };
        let mut len = [0u8; 4];
        read(self, &mut len)?;
        let mut header = vec![0u8; u32::from_le_bytes(len) as usize];
        read(self, &mut header)?;
        let mut len = [0u8; 8];
        read(self, &mut len)?;
        let mut payload = vec![0u8; u64::from_le_bytes(len) as usize];
        read(self, &mut payload)?;
        Ok((header, payload))
    }
}

fn write_frame(out: &mut impl Write, header: &[u8], payload: &[u8]) -> std::io::Result<()> {
    out.write_all(&(header.len() as u32).to_le_bytes())?;
    out.write_all(header)?;
    out.write_all(&(payload.len() as u64).to_le_bytes())?;
    out.write_all(payload)?;
    out.flush()
}

#[derive(Default)]
struct Pool {
    idle: HashMap<String, Vec<Worker>>,
    /// Kinds whose workers could not start lately.
    broken: HashMap<String, Broken>,
}

/// A kind of worker that could not start: not tried again for a while (a missing library
/// stays missing, and each try costs a Python start), but not forever either (a fork that
/// failed under memory pressure, a library installed since), so a long-lived process
/// recovers. The wait doubles with each failure in a row.
struct Broken {
    why: String,
    since: Instant,
    failures: u32,
}

/// Seconds before a kind that could not start is tried again (first wait; it doubles).
pub const RETRY_ENV: &str = "XPU_ZEBIN_WORKER_RETRY_SECONDS";
const DEFAULT_RETRY_SECONDS: u64 = 60;
const MAX_RETRY: Duration = Duration::from_secs(3600);

impl Broken {
    fn retry_after(&self) -> Duration {
        let first = std::env::var(RETRY_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_RETRY_SECONDS);
        Duration::from_secs(first)
            .saturating_mul(1u32 << self.failures.saturating_sub(1).min(16))
            .min(MAX_RETRY)
    }

    fn still(&self) -> bool {
        self.since.elapsed() < self.retry_after()
    }
}

static POOL: LazyLock<Mutex<Pool>> = LazyLock::new(|| Mutex::new(Pool::default()));

/// A live idle worker of this kind, if any (idle workers may have ended themselves).
fn take_idle(key: &str) -> Option<Worker> {
    let mut pool = POOL.lock().unwrap();
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
    let pool = POOL.lock().unwrap();
    pool.broken
        .get(key)
        .filter(|b| b.still())
        .map(|b| b.why.clone())
}

/// Run one request on a worker of `spec`'s kind. `Err` says why no worker could be had (it
/// could not start); the kind is then left alone for a while (see [`Broken`]).
pub fn call(
    spec: &WorkerSpec,
    header: &[u8],
    payload: &[u8],
    cancel: &[&AtomicBool],
    timeout: Option<Duration>,
) -> Result<Reply, String> {
    if let Some(why) = unavailable(&spec.key) {
        return Err(why);
    }
    let python = PYTHON.get().expect("checked above");
    let _busy = BusyGuard::new();
    let started = Instant::now();
    let deadline = timeout.map(|t| started + t);
    // An idle worker that ends itself (idle timeout) just as a request arrives closes
    // without answering and exits 0: then the request goes to the next idle worker, or a
    // fresh one. Each turn uses up an idle worker or starts one, so this ends.
    loop {
        let (mut worker, reused) = match take_idle(&spec.key) {
            Some(w) => (w, true),
            None => match Worker::spawn(python, spec) {
                Ok(w) => {
                    POOL.lock().unwrap().broken.remove(&spec.key);
                    (w, false)
                }
                Err(e) => {
                    let why = e.to_string();
                    let mut pool = POOL.lock().unwrap();
                    let failures = pool.broken.get(&spec.key).map_or(0, |b| b.failures);
                    let broken = Broken {
                        why: why.clone(),
                        since: Instant::now(),
                        failures: failures + 1,
                    };
                    pool.broken.insert(spec.key.clone(), broken);
                    return Err(why);
                }
            },
        };
        let _ = worker.new_chatter(); // anything from before this job is not its log
        match worker.exchange(header, payload, cancel, deadline) {
            Ok((header, payload)) => {
                let chatter = worker.new_chatter();
                worker.jobs += 1;
                let mut pool = POOL.lock().unwrap();
                let idle = pool.idle.entry(spec.key.clone()).or_default();
                if worker.jobs < JOBS_PER_WORKER && idle.len() < MAX_IDLE_PER_KIND {
                    idle.push(worker);
                } else {
                    drop(pool);
                    worker.kill();
                }
                return Ok(Reply::Done {
                    header,
                    payload,
                    chatter,
                });
            }
            Err((Wait::Closed, answered)) => {
                let chatter = worker.new_chatter();
                let exit = worker.reap();
                if reused && !answered && exit == Exit::Code(0) {
                    continue; // it had just ended of idleness
                }
                return Ok(Reply::Died { exit, chatter });
            }
            Err((Wait::TimedOut, _)) => {
                let chatter = worker.new_chatter();
                worker.kill();
                return Ok(Reply::TimedOut {
                    seconds: timeout.unwrap_or_default().as_secs_f64(),
                    chatter,
                });
            }
            Err(_) => {
                worker.kill();
                return Ok(Reply::Cancelled);
            }
        }
    }
}

/// Why workers are off, for each kind that has them off now (for diagnostics).
pub fn broken() -> Vec<(String, String)> {
    POOL.lock()
        .unwrap()
        .broken
        .iter()
        .filter(|(_, b)| b.still())
        .map(|(k, b)| (k.clone(), b.why.clone()))
        .collect()
}

/// Stop every idle worker (tests, benchmarks, or before fork).
pub fn shutdown() {
    let idle: Vec<Worker> = POOL
        .lock()
        .unwrap()
        .idle
        .drain()
        .flat_map(|(_, w)| w)
        .collect();
    for w in idle {
        w.kill();
    }
}

// ---------------------------------------------------------------------------------------
// Worker side.

fn read_frame(input: &mut impl Read) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let mut header = vec![0u8; u32::from_le_bytes(len) as usize];
    input.read_exact(&mut header)?;
    let mut len = [0u8; 8];
    input.read_exact(&mut len)?;
    let mut payload = vec![0u8; u64::from_le_bytes(len) as usize];
    input.read_exact(&mut payload)?;
    Ok(Some((header, payload)))
}

/// The worker's main loop: greet, then answer each request with `handle(header, payload)`
/// until stdin closes or no request comes for the idle time. Call it once the library
/// the worker exists for is loaded: the greeting tells the caller it started.
pub fn serve(
    mut handle: impl FnMut(Vec<u8>, Vec<u8>) -> (Vec<u8>, Vec<u8>),
) -> std::io::Result<()> {
    // IGC may print straight to fd 1: keep the protocol on a private copy of stdout and send
    // fd 1 where fd 2 goes (the caller's chatter file).
    // SAFETY: plain descriptor juggling on this process's own fds.
    let protocol_fd = unsafe { libc::dup(1) };
    if protocol_fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: protocol_fd is a fresh descriptor owned from here on; dup2 on our own fds.
    let mut protocol = unsafe {
        libc::dup2(2, 1);
        <File as std::os::fd::FromRawFd>::from_raw_fd(protocol_fd)
    };
    protocol.write_all(READY)?;
    protocol.flush()?;
    let idle_exit = std::env::var(IDLE_EXIT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_IDLE_EXIT_SECONDS);
    let millis = i32::try_from(idle_exit.saturating_mul(1000)).unwrap_or(i32::MAX);
    let mut stdin = std::io::stdin().lock();
    loop {
        let mut pfd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        if unsafe { libc::poll(&mut pfd, 1, millis) } == 0 {
            return Ok(()); // idle: the caller starts a new worker when it needs one
        }
        let Some((header, payload)) = read_frame(&mut stdin)? else {
            return Ok(());
        };
        let (header, payload) = handle(header, payload);
        write_frame(&mut protocol, &header, &payload)?;
    }
}

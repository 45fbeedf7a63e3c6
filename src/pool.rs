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

/// Processes running compilers for this process right now (workers busy with a job and
/// one-shot ocloc processes). Each also holds a core slot of the host (`cores.rs`) when one
/// is free: speculation uses a core only when one is idle, in this process and on the host.
static BUSY: AtomicUsize = AtomicUsize::new(0);

pub fn busy() -> usize {
    BUSY.load(Ordering::Relaxed)
}

/// Woken whenever a compiler of this process starts or ends (and when a waiter's own
/// condition changes). Compilers of other processes are seen at the next poll.
type Changed = (Mutex<()>, Condvar);
static BUSY_CHANGED: Renewable<Changed> =
    Renewable::new(|| (Mutex::new(()), Condvar::new()), forget_after_fork);
const POLL_OTHER_PROCESSES: Duration = Duration::from_millis(100);

/// Wake everyone waiting in [`wait_for_idle_core`].
pub fn notify_busy_changed() {
    let changed = BUSY_CHANGED.get();
    let _lock = lock(&changed.0);
    changed.1.notify_all();
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
    let changed = BUSY_CHANGED.get();
    let mut guard = lock(&changed.0);
    loop {
        if give_up() {
            return None;
        }
        let now = Instant::now();
        if now < settled {
            guard = wait_timeout(changed, guard, settled - now);
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
                return Some(BusyGuard {
                    slot,
                    pid: std::process::id(),
                });
            }
        }
        // Woken on every change here; the timeout is when other processes are seen.
        guard = wait_timeout(changed, guard, POLL_OTHER_PROCESSES);
    }
}

fn wait_timeout<'a>(
    changed: &'a Changed,
    guard: MutexGuard<'a, ()>,
    timeout: Duration,
) -> MutexGuard<'a, ()> {
    match changed.1.wait_timeout(guard, timeout) {
        Ok((guard, _)) => guard,
        Err(poisoned) => poisoned.into_inner().0,
    }
}

/// Counts one running compiler (and holds its host core slot, if one was free) while alive.
pub struct BusyGuard {
    slot: Option<Slot>,
    /// The process it counts in: a forked child's copy counts for nothing.
    pid: u32,
}

impl BusyGuard {
    pub fn new() -> Self {
        let slot = match crate::cores::try_take() {
            Taken::Slot(slot) => Some(slot),
            Taken::Full | Taken::Uncounted => None,
        };
        BUSY.fetch_add(1, Ordering::Relaxed);
        notify_busy_changed();
        BusyGuard {
            slot,
            pid: std::process::id(),
        }
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
        if self.pid == std::process::id() {
            BUSY.fetch_sub(1, Ordering::Relaxed);
            notify_busy_changed();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Framing, both sides.

/// A frame's parts, as read: bounded, and grown only as bytes arrive.
struct FrameHead {
    header_len: usize,
    payload_len: usize,
}

fn frame_prefix(header: &[u8], payload: &[u8]) -> [u8; 16] {
    let mut prefix = [0u8; 16];
    prefix[..4].copy_from_slice(FRAME_MAGIC);
    prefix[4..8].copy_from_slice(&(header.len() as u32).to_le_bytes());
    prefix[8..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    prefix
}

/// Check a frame's 16-byte prefix: the magic and both lengths within bounds.
fn parse_prefix(prefix: &[u8; 16]) -> Result<FrameHead, String> {
    if &prefix[..4] != FRAME_MAGIC {
        return Err(format!(
            "not a frame: starts with {:02x?}, expected {:?} (a worker of another version, or \
             output that is not the protocol)",
            &prefix[..4],
            String::from_utf8_lossy(FRAME_MAGIC)
        ));
    }
    let header = u32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]) as u64;
    let mut len = [0u8; 8];
    len.copy_from_slice(&prefix[8..]);
    let payload = u64::from_le_bytes(len);
    if header > MAX_HEADER_BYTES || payload > MAX_PAYLOAD_BYTES {
        return Err(format!(
            "a frame of {header} + {payload} bytes is over the bounds ({MAX_HEADER_BYTES} + \
             {MAX_PAYLOAD_BYTES})"
        ));
    }
    Ok(FrameHead {
        header_len: header as usize,
        payload_len: payload as usize,
    })
}

/// Check that `header` and `payload` fit in a frame before sending them.
fn check_sizes(header: &[u8], payload: &[u8]) -> Result<(), String> {
    if header.len() as u64 > MAX_HEADER_BYTES || payload.len() as u64 > MAX_PAYLOAD_BYTES {
        return Err(format!(
            "a request of {} + {} bytes is over the worker protocol's bounds ({MAX_HEADER_BYTES} \
             + {MAX_PAYLOAD_BYTES})",
            header.len(),
            payload.len()
        ));
    }
    Ok(())
}

/// What a worker sends of a compiler log: its end (where the errors are), so an answer
/// always fits a frame.
pub const MAX_LOG_BYTES: usize = 4 << 20;

/// The last `MAX_LOG_BYTES` of `log`, cut at a character boundary.
pub fn log_tail(mut log: String) -> String {
    if log.len() > MAX_LOG_BYTES {
        let mut from = log.len() - MAX_LOG_BYTES;
        while !log.is_char_boundary(from) {
            from += 1;
        }
        log.drain(..from);
    }
    log
}

/// Read one frame from a blocking reader (the worker's side). `Ok(None)` at a clean end.
pub fn read_frame(input: &mut impl Read) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut prefix = [0u8; 16];
    match input.read_exact(&mut prefix) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let head = parse_prefix(&prefix).map_err(std::io::Error::other)?;
    let mut read_part = |len: usize| -> std::io::Result<Vec<u8>> {
        let mut part = Vec::new();
        input.take(len as u64).read_to_end(&mut part)?;
        if part.len() < len {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(part)
    };
    let header = read_part(head.header_len)?;
    let payload = read_part(head.payload_len)?;
    Ok(Some((header, payload)))
}

/// Write one frame to a blocking writer (the worker's side).
pub fn write_frame(out: &mut impl Write, header: &[u8], payload: &[u8]) -> std::io::Result<()> {
    check_sizes(header, payload).map_err(std::io::Error::other)?;
    out.write_all(&frame_prefix(header, payload))?;
    out.write_all(header)?;
    out.write_all(payload)?;
    out.flush()
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
    /// Closed before it took the whole request: it died idle, not of the job.
    Unsent,
    Garbled(String),
}

/// Why no worker could be had for a request.
enum Unstarted {
    Failed(String),
    Cancelled,
    TimedOut,
}

fn set_nonblocking(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor this process owns; no memory is involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A write to a worker that just died raises SIGPIPE, which ends a process that did not
/// ignore it (Python ignores it, an embedder or `signal(SIGPIPE, SIG_DFL)` may not): this
/// thread blocks it, and sees EPIPE instead.
fn block_sigpipe() {
    // SAFETY: a sigset built by sigemptyset/sigaddset, passed to pthread_sigmask for the
    // calling thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Bytes written to a worker's stdin that it has not read yet.
fn unread(stdin: &ChildStdin) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the valid pointer.
    let r = unsafe { libc::ioctl(stdin.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r == 0 {
        n.max(0) as usize
    } else {
        0
    }
}

/// Where workers run: the package's private directory (only this user writes there), else
/// the root directory.
fn worker_dir() -> PathBuf {
    crate::private::subdir("work").unwrap_or_else(|_| PathBuf::from("/"))
}

/// This worker is what the kernel's OOM killer picks before its caller: an input that
/// makes IGC balloon costs the worker, not the caller (raising one's own score needs no
/// rights; without /proc nothing changes).
fn prefer_me_for_oom_kill() {
    let _ = std::fs::write("/proc/self/oom_score_adj", b"1000");
}

/// The same for a one-shot compiler process, set between fork and exec.
pub fn prefer_for_oom_kill(command: &mut Command) {
    // SAFETY: runs between fork and exec; open, write and close are async-signal-safe and
    // touch only the static path and value. A failure (no /proc) changes nothing.
    unsafe {
        command.pre_exec(|| {
            let fd = libc::open(
                c"/proc/self/oom_score_adj".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if fd >= 0 {
                libc::write(fd, b"1000".as_ptr().cast(), 4);
                libc::close(fd);
            }
            Ok(())
        })
    };
}

/// Wait for `events` on `fd` for at most 20 ms (so cancel flags are seen), or until the
/// deadline. `Ok(true)` when `fd` is ready (or hung up), `Ok(false)` when the slice passed,
/// `Err(wait)` when the wait is over for good.
fn poll_slice(
    fd: RawFd,
    events: libc::c_short,
    cancel: &[&AtomicBool],
    deadline: Option<Instant>,
) -> Result<bool, Wait> {
    if cancel.iter().any(|c| c.load(Ordering::Relaxed)) {
        return Err(Wait::Cancelled);
    }
    let now = Instant::now();
    if deadline.is_some_and(|d| now >= d) {
        return Err(Wait::TimedOut);
    }
    let slice = deadline.map_or(20, |d| (d - now).as_millis().clamp(1, 20) as i32);
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call. A failure (EINTR) or a
    // timeout is just another turn of the caller's loop.
    Ok(unsafe { libc::poll(&mut pfd, 1, slice) } > 0)
}

impl Worker {
    fn spawn(
        python: &PythonRuntime,
        spec: &WorkerSpec,
        cancel: &[&AtomicBool],
        deadline: Option<Instant>,
    ) -> Result<Worker, Unstarted> {
        let failed = |e: std::io::Error| Unstarted::Failed(e.to_string());
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
        let chatter = tempfile::tempfile().map_err(failed)?;
        command
            .args(["-m", "xpu_zebin._worker"])
            .args(&spec.args)
            .env("PYTHONPATH", &python.pythonpath)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(chatter.try_clone().map_err(failed)?)
            // `python -m` puts the working directory first on sys.path: never the caller's
            // (anyone may write there, and plant an `xpu_zebin` to run as this user).
            .current_dir(worker_dir())
            // Its own group: the terminal's Ctrl-C reaches Python, which cancels us; a kill
            // takes the worker and anything it started.
            .process_group(0);
        let mut child = command.spawn().map_err(failed)?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            // SAFETY: killpg on the group just created for this child.
            unsafe { libc::killpg(child.id() as libc::pid_t, libc::SIGKILL) };
            let _ = child.wait();
            return Err(Unstarted::Failed("the worker's pipes were not made".into()));
        };
        let mut worker = Worker {
            child,
            stdin,
            stdout,
            chatter,
            seen: 0,
            jobs: 0,
        };
        if let Err(e) = set_nonblocking(worker.stdin.as_raw_fd()) {
            worker.kill();
            return Err(failed(e));
        }
        let mut greeting = [0u8; 4];
        let startup = Instant::now() + STARTUP;
        let until = deadline.map_or(startup, |d| d.min(startup));
        let waited = worker.read_exact_until(&mut greeting, cancel, Some(until));
        match waited {
            Wait::Done if &greeting == READY => return Ok(worker),
            Wait::Cancelled => {
                worker.kill();
                return Err(Unstarted::Cancelled);
            }
            Wait::TimedOut if deadline.is_some_and(|d| d <= startup) => {
                worker.kill();
                return Err(Unstarted::TimedOut);
            }
            _ => {}
        }
        let said = worker.new_chatter();
        worker.kill();
        let said = said.trim();
        Err(Unstarted::Failed(format!(
            "a worker (python -m xpu_zebin._worker {}) did not start{}",
            spec.args
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            // The line that names the problem: the last error, else the last line.
            match (
                waited,
                said.lines()
                    .rfind(|l| l.to_ascii_lowercase().contains("error"))
                    .or(said.lines().last()),
            ) {
                (Wait::TimedOut, _) => format!(" within {} s", STARTUP.as_secs()),
                (_, Some(last)) => format!(": {last}"),
                (Wait::Done, None) => ": it greeted with something else".into(),
                _ => String::new(),
            }
        )))
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Text the worker printed since the last call (its last MiB, where errors are).
    fn new_chatter(&mut self) -> String {
        let end = self.chatter.metadata().map_or(self.seen, |m| m.len());
        if end <= self.seen {
            return String::new();
        }
        let from = self.seen.max(end.saturating_sub(MAX_CHATTER_BYTES));
        let mut buf = vec![0u8; (end - from) as usize];
        let n = self.chatter.read_at(&mut buf, from).unwrap_or(0);
        buf.truncate(n);
        self.seen = from + n as u64;
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Kill the worker's whole group, then reap it (in this order: once reaped, its pid
    /// and group id may belong to someone else).
    fn kill(mut self) {
        // SAFETY: killpg on the group created for this worker, whose leader is not reaped.
        unsafe { libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    /// How a worker whose stdout closed ended: wait a little for it to go (without
    /// reaping it, so its group id stays ours), kill its group, then reap it.
    fn reap(mut self) -> Exit {
        let deadline = Instant::now() + Duration::from_secs(5);
        let pid = self.child.id() as libc::id_t;
        while Instant::now() < deadline {
            // SAFETY: waitid with a zeroed siginfo out-parameter; WNOWAIT leaves the child
            // to be reaped below.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let r = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            // SAFETY: si_pid is set by waitid when a child changed state (0 otherwise).
            if r != 0 || unsafe { info.si_pid() } != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: the leader is not reaped yet: the group id is still this worker's.
        unsafe { libc::killpg(pid as libc::pid_t, libc::SIGKILL) };
        match self.child.wait() {
            Ok(status) => match (status.code(), status.signal()) {
                (Some(crate::crash_watch::STUCK_EXIT), _) => Exit::StuckInCrashHandler,
                (Some(code), _) => Exit::Code(code),
                (None, Some(sig)) => Exit::Signal(sig),
                _ => Exit::Code(-1),
            },
            Err(_) => Exit::Code(-1),
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
            match poll_slice(fd, libc::POLLIN, cancel, deadline) {
                Err(wait) => return wait,
                Ok(false) => continue,
                Ok(true) => {}
            }
            match self.stdout.read(&mut buf[filled..]) {
                Ok(0) => return Wait::Closed,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Wait::Closed,
            }
        }
        Wait::Done
    }

    /// Read `len` bytes, growing the buffer only as they arrive.
    fn read_part(
        &mut self,
        len: usize,
        cancel: &[&AtomicBool],
        deadline: Option<Instant>,
    ) -> Result<Vec<u8>, Wait> {
        const CHUNK: usize = 1 << 20;
        let mut part = Vec::new();
        while part.len() < len {
            let at = part.len();
            part.resize(at + (len - at).min(CHUNK), 0);
            match self.read_exact_until(&mut part[at..], cancel, deadline) {
                Wait::Done => {}
                other => return Err(other),
            }
        }
        Ok(part)
    }

    /// Write all of `bytes` to the worker's stdin (non-blocking), giving up at the deadline,
    /// on cancel, or when the worker closed it.
    fn write_until(
        &mut self,
        bytes: &[u8],
        cancel: &[&AtomicBool],
        deadline: Option<Instant>,
    ) -> Wait {
        let fd = self.stdin.as_raw_fd();
        let mut sent = 0;
        while sent < bytes.len() {
            match self.stdin.write(&bytes[sent..]) {
                Ok(0) => return Wait::Closed,
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Err(wait) = poll_slice(fd, libc::POLLOUT, cancel, deadline) {
                        return wait;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Wait::Closed,
            }
        }
        Wait::Done
    }

    /// Send one request and read its response; `Err((how, answered))` otherwise, where
    /// `answered` says whether any byte of a response came. A worker that closed before
    /// taking the whole request is `(Closed, false)` with nothing of the job done by it.
    fn exchange(
        &mut self,
        header: &[u8],
        payload: &[u8],
        cancel: &[&AtomicBool],
        deadline: Option<Instant>,
    ) -> Result<(Vec<u8>, Vec<u8>), (Wait, bool)> {
        for part in [&frame_prefix(header, payload)[..], header, payload] {
            match self.write_until(part, cancel, deadline) {
                Wait::Done => {}
                Wait::Closed => return Err((Wait::Unsent, false)),
                other => return Err((other, false)),
            }
        }
        let mut prefix = [0u8; 16];
        match self.read_exact_until(&mut prefix, cancel, deadline) {
            Wait::Done => {}
            // A worker that closed before any byte of an answer: see `call`.
            Wait::Closed => return Err((Wait::Closed, false)),
            other => return Err((other, true)),
        }
        let head = parse_prefix(&prefix).map_err(|why| (Wait::Garbled(why), true))?;
        let header = self
            .read_part(head.header_len, cancel, deadline)
            .map_err(|w| (w, true))?;
        let payload = self
            .read_part(head.payload_len, cancel, deadline)
            .map_err(|w| (w, true))?;
        Ok((header, payload))
    }
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
            None => match spawn_with_retries(python, spec, cancel, deadline) {
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

// ---------------------------------------------------------------------------------------
// Worker side.

/// End this worker's whole process group as soon as its caller's end of stdin closes:
/// the caller exited (however it ended, SIGKILL included), so nobody waits for this build.
/// The same when the serving thread is stuck in a compiler's crash handler
/// (`crash_watch.rs`): the caller then sees the crash at once, not at its deadline.
fn die_with_caller() -> std::io::Result<()> {
    // SAFETY: getppid cannot fail.
    let caller = unsafe { libc::getppid() };
    let mut serving = crate::crash_watch::Watch::new(
        crate::crash_watch::current_thread(),
        crate::crash_watch::STUCK,
    );
    std::thread::Builder::new()
        .name("xpu-zebin-caller-watch".into())
        .spawn(move || loop {
            // events 0: only a hang-up or an error wakes this; requests do not. The caller's
            // end may also live on in a child it forked: then the caller's death shows as a
            // new parent (checked each second).
            let mut pfd = libc::pollfd {
                fd: 0,
                events: 0,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let r = unsafe { libc::poll(&mut pfd, 1, 1000) };
            let hung_up =
                r > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0;
            // SAFETY: getppid cannot fail.
            if hung_up || unsafe { libc::getppid() } != caller {
                // SAFETY: kill(0) signals this process's own group (the worker and whatever
                // it started); nothing else is touched.
                unsafe { libc::kill(0, libc::SIGKILL) };
                std::process::exit(1);
            }
            if serving.stuck(Instant::now()) {
                // Said with an exit status of its own, so the caller reports the crash at
                // once instead of re-running the input (it would hang in the same handler);
                // the caller kills the rest of the group. `_exit`: nothing that may need a
                // lock the stuck thread holds (malloc's, stdio's).
                // SAFETY: writes of static bytes to fd 2, then the end of the process.
                unsafe {
                    for said in ["\nxpu-zebin worker: ", crate::crash_watch::STUCK_SAID, "\n"] {
                        libc::write(2, said.as_ptr().cast(), said.len());
                    }
                    libc::_exit(crate::crash_watch::STUCK_EXIT);
                }
            }
        })
        .map(|_| ())
}

/// What a worker whose compiler's crash handler caught a fault adds to the request's log.
pub const FAULTED_SAID: &str = "the compiler's crash handler caught a fault during this \
     request; this worker ends after answering";

/// The worker's main loop: greet, then answer each request with `handle(header, payload)`
/// until stdin closes or no request comes for the idle time. Call it once the library
/// the worker exists for is loaded: the greeting tells the caller it started.
pub fn serve(
    mut handle: impl FnMut(Vec<u8>, Vec<u8>) -> (Vec<u8>, Vec<u8>),
) -> std::io::Result<()> {
    // IGC may print straight to fd 1: keep the protocol on a private copy of stdout and send
    // fd 1 where fd 2 goes (the caller's chatter file).
    // SAFETY: plain descriptor juggling on this process's own fds.
    let protocol_fd = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 0) };
    if protocol_fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: protocol_fd is a fresh descriptor owned from here on.
    let mut protocol = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(protocol_fd) };
    // SAFETY: dup2 on this process's own descriptors.
    if unsafe { libc::dup2(2, 1) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    die_with_caller()?;
    prefer_me_for_oom_kill();
    protocol.write_all(READY)?;
    protocol.flush()?;
    // Zero: the caller keeps no idle worker and ends this one itself.
    let idle = idle_exit();
    let millis = if idle.is_zero() {
        -1
    } else {
        i32::try_from(idle.as_millis()).unwrap_or(i32::MAX)
    };
    let mut stdin = std::io::stdin().lock();
    let mut served = 0u64;
    loop {
        let mut pfd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // The first request follows the greeting: no idle limit before it.
        let wait = if served == 0 { -1 } else { millis };
        // SAFETY: one valid pollfd for the duration of the call.
        match unsafe { libc::poll(&mut pfd, 1, wait) } {
            0 => return Ok(()), // idle: the caller starts a new worker when it needs one
            r if r < 0 => {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            _ => {}
        }
        let Some((header, payload)) = read_frame(&mut stdin)? else {
            return Ok(());
        };
        let (header, payload) = handle(header, payload);
        // A crash handler that jumped back out of a fault leaves the crash signals blocked:
        // the compile answered, on a heap the fault may have corrupted. Answer, then end (exit
        // 0, as an idle worker does: the caller's next request goes to a fresh one).
        let faulted = crate::crash_watch::unblock_crash_signals();
        if faulted {
            eprintln!("\nxpu-zebin worker: {FAULTED_SAID}");
        }
        write_frame(&mut protocol, &header, &payload)?;
        served += 1;
        if faulted {
            // SAFETY: ends the process now: no destructor or atexit handler runs on that heap.
            unsafe { libc::_exit(0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker played by a shell script (the protocol's other end, misbehaving on purpose;
    /// no compiler is involved): `sh SCRIPT -m xpu_zebin._worker KEY`.
    fn script_worker(body: &str) -> (tempfile::TempDir, PythonRuntime, WorkerSpec) {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("worker.sh");
        std::fs::write(&script, body).unwrap();
        let runtime = PythonRuntime {
            executable: script,
            pythonpath: String::new(),
        };
        let spec = WorkerSpec {
            key: format!("script:{}", dir.path().display()),
            args: vec![],
            loader: Some(("/bin/sh".into(), None)),
            env: vec![],
        };
        (dir, runtime, spec)
    }

    fn call_script(body: &str, payload: &[u8], timeout: Duration) -> (Result<Reply, String>, f64) {
        let (_dir, runtime, spec) = script_worker(body);
        let started = Instant::now();
        let reply = call_with(&runtime, &spec, b"{}", payload, &[], Some(timeout));
        (reply, started.elapsed().as_secs_f64())
    }

    #[test]
    fn a_garbled_reply_is_a_garbled_worker() {
        let (reply, _) = call_script(
            "printf XZW3; head -c 16 >/dev/null; printf 'this is no frame at all'; sleep 30\n",
            b"",
            Duration::from_secs(60),
        );
        assert!(matches!(reply, Ok(Reply::Garbled { .. })), "{reply:?}");
    }

    #[test]
    fn an_oversized_reply_is_refused_before_it_is_read() {
        // Magic, header length 0, payload length 2^63: refused at once, nothing allocated.
        let (reply, seconds) = call_script(
            "printf XZW3; head -c 18 >/dev/null; printf 'XZF3\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\200'; sleep 30\n",
            b"",
            Duration::from_secs(60),
        );
        assert!(
            matches!(&reply, Ok(Reply::Garbled { why, .. }) if why.contains("bounds")),
            "{reply:?}"
        );
        assert!(seconds < 20.0, "{seconds}");
    }

    #[test]
    fn a_worker_that_never_reads_cannot_block_the_write() {
        // 4 MiB does not fit in a pipe: a blocking write would wait forever.
        let (reply, seconds) = call_script(
            "printf XZW3; sleep 60\n",
            &vec![0u8; 4 << 20],
            Duration::from_millis(500),
        );
        assert!(matches!(reply, Ok(Reply::TimedOut { .. })), "{reply:?}");
        assert!(seconds < 20.0, "{seconds}");
    }

    #[test]
    fn start_up_honours_the_callers_deadline() {
        let (reply, seconds) = call_script("sleep 60\n", b"", Duration::from_millis(500));
        assert!(matches!(reply, Ok(Reply::TimedOut { .. })), "{reply:?}");
        assert!(seconds < 20.0, "{seconds}");
    }

    #[test]
    fn workers_that_quit_without_answering_are_no_crash_of_the_input() {
        let (reply, _) = call_script("printf XZW3; exit 0\n", b"", Duration::from_secs(60));
        assert!(
            matches!(&reply, Err(why) if why.contains("new workers in a row")),
            "{reply:?}"
        );
        let (reply, _) = call_script("exit 3\n", b"", Duration::from_secs(60));
        assert!(
            matches!(&reply, Err(why) if why.contains("did not start")),
            "{reply:?}"
        );
    }

    #[test]
    fn a_worker_that_dies_mid_reply_is_a_death_not_a_hang() {
        let (reply, _) = call_script(
            "printf XZW3; head -c 18 >/dev/null; printf 'XZF3\\002\\000\\000\\000'; kill -9 $$\n",
            b"",
            Duration::from_secs(60),
        );
        assert!(
            matches!(
                reply,
                Ok(Reply::Died {
                    exit: Exit::Signal(9),
                    ..
                })
            ),
            "{reply:?}"
        );
    }

    /// Not a test by itself: the worker side of the tests below, run when this test binary
    /// is started as a worker (`XPU_ZEBIN_TEST_WORKER`, the protocol on fd 3).
    /// `libocloc:PATH`: a real libocloc worker (the real compiler, hosted by this binary
    /// instead of Python). `pids`: it answers each request with its pid; a `fault` request
    /// returns with SIGSEGV blocked on the serving thread, the state libocloc's guard leaves
    /// when it jumps back out of a fault (the real guards here abort instead: measured on
    /// both compilers).
    #[test]
    fn worker_main() {
        let Some(role) = std::env::var_os("XPU_ZEBIN_TEST_WORKER") else {
            return;
        };
        // SAFETY: fd 3 is the protocol pipe the script set up; dup2 on own fds.
        unsafe { libc::dup2(3, 1) };
        if let Some(lib) = role.to_string_lossy().strip_prefix("libocloc:") {
            let served = crate::libocloc::serve(std::path::Path::new(lib));
            std::process::exit(i32::from(served.is_err()));
        }
        let served = serve(|_, payload| {
            if payload == b"fault" {
                // SAFETY: a sigset built here, for this thread's own mask.
                unsafe {
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut set);
                    libc::sigaddset(&mut set, libc::SIGSEGV);
                    libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                }
            }
            (std::process::id().to_string().into_bytes(), Vec::new())
        });
        std::process::exit(i32::from(served.is_err()));
    }

    #[test]
    fn a_worker_whose_crash_handler_caught_a_fault_ends_after_answering() {
        let exe = std::env::current_exe().unwrap();
        let (_dir, runtime, mut spec) = script_worker(&format!(
            "exec '{}' --exact pool::tests::worker_main --nocapture --test-threads=1 3>&1 1>&2\n",
            exe.display()
        ));
        spec.env = vec![("XPU_ZEBIN_TEST_WORKER".into(), "pids".into())];
        let ask = |payload: &[u8]| match call_with(
            &runtime,
            &spec,
            b"{}",
            payload,
            &[],
            Some(Duration::from_secs(120)),
        ) {
            Ok(Reply::Done {
                header, chatter, ..
            }) => (String::from_utf8(header).unwrap(), chatter),
            other => panic!("{other:?}"),
        };
        let (first, _) = ask(b"hello");
        let (faulted, said) = ask(b"fault");
        assert_eq!(first, faulted, "an answering worker is kept");
        assert!(said.contains(FAULTED_SAID), "{said}");
        let (next, _) = ask(b"hello");
        assert_ne!(next, faulted, "the worker that faulted served another job");
        let (again, _) = ask(b"hello");
        assert_eq!(next, again);
    }

    /// This test binary as a real libocloc worker (see `worker_main`).
    fn libocloc_worker(dir: &std::path::Path) -> PythonRuntime {
        let script = dir.join("worker");
        let exe = std::env::current_exe().unwrap();
        let body = format!(
            "#!/bin/sh\nXPU_ZEBIN_TEST_WORKER=\"libocloc:$4\" exec '{}' --exact \
             pool::tests::worker_main --nocapture --test-threads=1 3>&1 1>&2\n",
            exe.display()
        );
        std::fs::write(&script, body).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&script, mode).unwrap();
        PythonRuntime {
            executable: script,
            pythonpath: String::new(),
        }
    }

    /// A thread holding every lock a compile takes (and a busy slot) until told to let go.
    fn hold_every_lock() -> (std::thread::JoinHandle<()>, std::sync::mpsc::Sender<()>) {
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _busy = BusyGuard::new();
            let _locks = (
                lock(POOL.get()),
                lock(&BUSY_CHANGED.get().0),
                lock(crate::ocloc::IDENTITIES.get()),
                lock(crate::ocloc::SPECS.get()),
                lock(crate::diag::SAID.get()),
            );
            held_tx.send(()).unwrap();
            let _ = release_rx.recv_timeout(Duration::from_secs(300));
        });
        held_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        (holder, release_tx)
    }

    /// The exit status of a child process, killed if it has not ended within `limit`.
    fn exit_within(child: libc::pid_t, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        let mut status = 0;
        // SAFETY: waitpid/kill on our own unreaped child, with a status out-parameter.
        unsafe {
            while libc::waitpid(child, &mut status, libc::WNOHANG) == 0 {
                if Instant::now() > deadline {
                    libc::kill(child, libc::SIGKILL);
                    libc::waitpid(child, &mut status, 0);
                    return None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status))
    }

    /// A child forked while another thread holds every lock a compile takes (the pool's,
    /// the busy count's, the compiler identities' and worker kinds', the warnings') compiles
    /// with the real compiler on a worker of its own: nothing of the parent's (held locks,
    /// busy count, idle workers) is the child's. The parent's idle worker stays its own.
    #[test]
    fn a_child_forked_while_the_locks_are_held_compiles_on_workers_of_its_own() {
        let ocloc = crate::ocloc::discover(None).expect("the real ocloc (apt: intel-opencl-icd)");
        let dir = tempfile::tempdir().unwrap();
        configure(libocloc_worker(dir.path()));
        let key = format!("ocloc:{}", ocloc.display());
        let idle = || -> Vec<u32> {
            let pool = lock(POOL.get());
            pool.idle
                .get(&key)
                .map_or(vec![], |w| w.iter().map(|w| w.child.id()).collect())
        };
        let source = "kernel void add(global float *a) { a[get_global_id(0)] += 1.0f; }";
        let no = AtomicBool::new(false);
        let spirv = crate::ocloc::opencl_to_spirv(&ocloc, source, "pvc", "", &no).unwrap();
        let compiled = || {
            let spec = crate::ocloc::JobSpec {
                input: &spirv,
                input_name: "kernel.spv",
                args: ["-spirv_input", "-device", "pvc"]
                    .map(String::from)
                    .to_vec(),
                timeout: Some(Duration::from_secs(120)),
                cancel: &[],
            };
            let run = crate::ocloc::run(&ocloc, &spec);
            matches!(
                run,
                Ok(crate::ocloc::RawRun {
                    exit: Exit::Code(0),
                    output: Some(_),
                    ..
                })
            )
        };
        assert!(compiled());
        let parents = idle();
        assert_eq!(parents.len(), 1, "the compile left its worker idle");

        let (holder, release) = hold_every_lock();
        assert_eq!(busy(), 1);
        // SAFETY: the child runs only the checks and the compile below, then _exits.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // The exit status names the first check that failed.
            let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                [
                    busy() == 0,
                    idle().is_empty(),
                    compiled(),
                    idle().len() == 1,
                ]
                .iter()
                .position(|ok| !ok)
                .map_or(0, |i| i as i32 + 2)
            }));
            // SAFETY: ends the child without running the test harness's exit.
            unsafe { libc::_exit(failed.unwrap_or(1)) };
        }
        assert!(child > 0);
        release.send(()).unwrap();
        holder.join().unwrap();
        let exit = exit_within(child, Duration::from_secs(120));
        // Exit 2: busy count inherited, 3: idle workers inherited, 4: compile failed,
        // 5: its worker not kept; None: it hung (killed at the deadline).
        assert_eq!(exit, Some(0), "the forked child failed");
        assert_eq!(idle(), parents, "the child took the parent's idle worker");
        assert!(compiled());
        assert_eq!(idle(), parents);
    }

    #[test]
    fn a_worker_its_crash_watch_ended_says_so() {
        let (reply, _) = call_script(
            "printf XZW3; head -c 18 >/dev/null; exit 86\n",
            b"",
            Duration::from_secs(60),
        );
        assert!(
            matches!(
                reply,
                Ok(Reply::Died {
                    exit: Exit::StuckInCrashHandler,
                    ..
                })
            ),
            "{reply:?}"
        );
    }

    #[test]
    fn frames_round_trip_and_bad_prefixes_are_refused() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"{\"a\":1}", b"payload").unwrap();
        let (h, p) = read_frame(&mut wire.as_slice()).unwrap().unwrap();
        assert_eq!(
            (h.as_slice(), p.as_slice()),
            (&b"{\"a\":1}"[..], &b"payload"[..])
        );
        // A huge declared payload is refused before any allocation.
        let mut huge = frame_prefix(b"", b"").to_vec();
        huge[8..].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(read_frame(&mut huge.as_slice()).is_err());
        // A truncated frame is an error, not a short read taken as whole.
        let cut = &wire[..wire.len() - 1];
        assert!(read_frame(&mut &cut[..]).is_err());
        assert!(read_frame(&mut &b"XZF2xxxxxxxxxxxx"[..]).is_err());
        assert!(read_frame(&mut &b""[..]).unwrap().is_none());
    }
}

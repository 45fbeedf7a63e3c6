//! A worker stuck in a compiler's crash handler ends itself.
//!
//! libocloc guards each compile with its own SIGSEGV/SIGILL handler, which prints a
//! backtrace and jumps back into the compiler (which then aborts: measured with both
//! libocloc versions here, so such a worker dies). `backtrace` is not async-signal-safe: a
//! fault inside `malloc` (heap corruption, where IGC crashes most) leaves the handler
//! waiting forever on the allocator's or the loader's lock (seen here: a worker killed
//! with SIGSEGV inside IGC's `realloc` hung in `backtrace` until the caller's deadline).
//! The worker's watch thread samples the serving thread: crash signals blocked (it is
//! inside a handler) and no CPU time spent for [`STUCK`] means it never returns, and the
//! worker ends itself with [`STUCK_EXIT`], so the caller reports a crash at once (never a
//! re-run, which would hang in the same handler). A one-shot compiler process is watched the
//! same way by the caller that waits for it (every thread of it). After each request the
//! crash signals are unblocked again (the handler's `longjmp` leaves them blocked): finding
//! them blocked says a handler caught a fault during the request, and the worker ends after
//! answering (the fault may have corrupted its heap).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a thread may sit inside a crash handler without running before it counts as
/// stuck: a backtrace takes milliseconds; a deadlock never ends.
pub const STUCK: Duration = Duration::from_secs(5);

/// The exit status of a worker its watch ended for sitting in a crash handler.
pub const STUCK_EXIT: i32 = 86;

/// What the log says of a compiler ended for sitting in a crash handler.
pub const STUCK_SAID: &str = "its crash handler did not return after a fault (no progress \
     for 5 s with crash signals blocked: it deadlocks when the fault hit inside malloc), so it \
     was killed";

const CRASH_SIGNALS: [libc::c_int; 4] = [libc::SIGSEGV, libc::SIGILL, libc::SIGBUS, libc::SIGFPE];

/// This thread's id, for a watch from another thread.
pub fn current_thread() -> libc::pid_t {
    // SAFETY: gettid cannot fail.
    unsafe { libc::gettid() }
}

/// Unblock the crash signals on this thread (a handler that jumped out left them blocked;
/// blocked, a later fault would not reach any handler). True when some were blocked: a
/// crash handler caught a fault on this thread since they were last unblocked.
pub fn unblock_crash_signals() -> bool {
    // SAFETY: sigsets built here and passed by pointer for the call only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in CRASH_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, &mut old);
        CRASH_SIGNALS
            .iter()
            .any(|&s| libc::sigismember(&old, s) == 1)
    }
}

/// A thread's blocked signals and CPU ticks (user + system), from its /proc task dir
/// (`status` and `stat` paths, NUL-terminated). Nothing here allocates: the watch thread
/// must not wait on a malloc lock the stuck thread holds (measured: a watch that allocated
/// hung on the allocator's lock of a thread stopped inside malloc).
fn sample(status: &[u8], stat: &[u8]) -> Option<(u64, u64)> {
    let mut buf = [0u8; 4096];
    let text = read(status, &mut buf)?;
    let at = find(text, b"SigBlk:")? + b"SigBlk:".len();
    let blocked = text[at..]
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_hexdigit())
        .try_fold(0u64, |n, &b| {
            let digit = (b as char).to_digit(16)?;
            n.checked_mul(16)?.checked_add(u64::from(digit))
        })?;
    let text = read(stat, &mut buf)?;
    // Fields after the command name (which may hold spaces): state is the first; utime
    // and stime are the 12th and 13th.
    let after = &text[text.iter().rposition(|&b| b == b')')? + 1..];
    let mut fields = after
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    let utime = number(fields.nth(11)?)?;
    let stime = number(fields.next()?)?;
    Some((blocked, utime + stime))
}

/// The start of a file (a NUL-terminated path) in `buf`, read with plain system calls.
fn read<'a>(path: &[u8], buf: &'a mut [u8]) -> Option<&'a [u8]> {
    if path.last() != Some(&0) {
        return None;
    }
    // SAFETY: a NUL-terminated path; read writes at most buf.len() bytes into buf.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        (n > 0).then(|| &buf[..n as usize])
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn number(digits: &[u8]) -> Option<u64> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

fn in_crash_handler(blocked: u64) -> bool {
    CRASH_SIGNALS
        .iter()
        .any(|&s| blocked & (1u64 << (s - 1)) != 0)
}

/// One thread's samples: since when it has sat in a handler without running, and its ticks
/// then. True once that has lasted `stuck_after`.
fn still(
    since: &mut Option<(Instant, u64)>,
    sampled: Option<(u64, u64)>,
    now: Instant,
    stuck_after: Duration,
) -> bool {
    let Some((_, ticks)) = sampled.filter(|&(blocked, _)| in_crash_handler(blocked)) else {
        *since = None; // running normally, or gone: nothing to say
        return false;
    };
    match *since {
        Some((from, at)) if at == ticks => now.duration_since(from) >= stuck_after,
        _ => {
            *since = Some((now, ticks));
            false
        }
    }
}

/// `<dir>/status` and `<dir>/stat`, NUL-terminated, made once.
fn paths(dir: &str) -> (Vec<u8>, Vec<u8>) {
    let path = |name: &str| format!("{dir}/{name}\0").into_bytes();
    (path("status"), path("stat"))
}

/// Samples of one thread of this process, taken from another thread of it (which allocates
/// nothing after `new`).
pub struct Watch {
    status: Vec<u8>,
    stat: Vec<u8>,
    stuck_after: Duration,
    since: Option<(Instant, u64)>,
}

impl Watch {
    pub fn new(tid: libc::pid_t, stuck_after: Duration) -> Self {
        let (status, stat) = paths(&format!("/proc/self/task/{tid}"));
        Watch {
            status,
            stat,
            stuck_after,
            since: None,
        }
    }

    /// Is the thread stuck in a crash handler, as of `now`? Call it every second or so.
    pub fn stuck(&mut self, now: Instant) -> bool {
        let sampled = sample(&self.status, &self.stat);
        still(&mut self.since, sampled, now, self.stuck_after)
    }
}

/// Samples of every thread of another process (a one-shot compiler, watched by the caller
/// that waits for it).
pub struct ProcessWatch {
    tasks: String,
    stuck_after: Duration,
    since: HashMap<String, Option<(Instant, u64)>>,
}

impl ProcessWatch {
    pub fn new(pid: u32, stuck_after: Duration) -> Self {
        ProcessWatch {
            tasks: format!("/proc/{pid}/task"),
            stuck_after,
            since: HashMap::new(),
        }
    }

    /// Is one of its threads stuck in a crash handler, as of `now`?
    pub fn stuck(&mut self, now: Instant) -> bool {
        let Ok(dir) = std::fs::read_dir(&self.tasks) else {
            return false; // gone: its exit says the rest
        };
        let mut stuck = false;
        let mut seen = HashMap::new();
        for task in dir.filter_map(|e| e.ok()) {
            let task = task.path().display().to_string();
            let (status, stat) = paths(&task);
            let mut since = self.since.remove(&task).flatten();
            stuck |= still(&mut since, sample(&status, &stat), now, self.stuck_after);
            seen.insert(task, since);
        }
        self.since = seen;
        stuck
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that blocks SIGSEGV and then sleeps (as one deadlocked inside a handler
    /// does) is stuck once the time has passed; one that blocks nothing never is.
    #[test]
    fn a_thread_asleep_with_crash_signals_blocked_is_stuck() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: a sigset built here, for this thread's own mask.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGSEGV);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            tx.send(current_thread()).unwrap();
            done_rx.recv().unwrap();
        });
        let tid = rx.recv().unwrap();
        let t0 = Instant::now();
        let mut watch = Watch::new(tid, STUCK);
        assert!(!watch.stuck(t0));
        assert!(!watch.stuck(t0 + Duration::from_secs(1)));
        assert!(watch.stuck(t0 + STUCK + Duration::from_secs(1)));
        let mut calm = Watch::new(current_thread(), STUCK);
        assert!(!calm.stuck(t0));
        assert!(!calm.stuck(t0 + STUCK * 2));
        done_tx.send(()).unwrap();
        sleeper.join().unwrap();
        assert!(!Watch::new(tid, STUCK).stuck(t0 + STUCK * 2)); // gone: nothing to say
        assert!(STUCK_SAID.contains(&format!(" {} s ", STUCK.as_secs())));
    }
}

//! A worker stuck in a compiler's crash handler ends itself.
//!
//! libocloc guards each compile with its own SIGSEGV/SIGILL handler, which prints a
//! backtrace and jumps back into the compiler. `backtrace` is not async-signal-safe: a
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

/// A thread's blocked signals and CPU ticks (user + system), from its /proc task dir.
fn sample(task: &str) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("{task}/status")).ok()?;
    let blocked = status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())?;
    let stat = std::fs::read_to_string(format!("{task}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is the first; utime
    // and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((blocked, ticks))
}

fn in_crash_handler(blocked: u64) -> bool {
    CRASH_SIGNALS
        .iter()
        .any(|&s| blocked & (1u64 << (s - 1)) != 0)
}

/// Samples of one thread of this process, or of every thread of another, taken from
/// another thread.
pub struct Watch {
    /// A /proc task dir (one thread), or a task list (every thread of a process).
    what: Watched,
    stuck_after: Duration,
    /// Per thread: since when it has sat in a handler without running, and its ticks then.
    still: HashMap<String, (Instant, u64)>,
}

enum Watched {
    Thread(String),
    Process(String),
}

impl Watch {
    /// A thread of this process.
    pub fn new(tid: libc::pid_t, stuck_after: Duration) -> Self {
        Self::of(
            Watched::Thread(format!("/proc/self/task/{tid}")),
            stuck_after,
        )
    }

    /// Every thread of a process (a one-shot compiler, watched by its caller).
    pub fn process(pid: u32, stuck_after: Duration) -> Self {
        Self::of(Watched::Process(format!("/proc/{pid}/task")), stuck_after)
    }

    fn of(what: Watched, stuck_after: Duration) -> Self {
        Watch {
            what,
            stuck_after,
            still: HashMap::new(),
        }
    }

    /// Is a watched thread stuck in a crash handler, as of `now`? Call it every second or
    /// so.
    pub fn stuck(&mut self, now: Instant) -> bool {
        let tasks = match &self.what {
            Watched::Thread(task) => vec![task.clone()],
            Watched::Process(list) => std::fs::read_dir(list)
                .map(|dir| {
                    dir.filter_map(|e| e.ok())
                        .map(|e| e.path().display().to_string())
                        .collect()
                })
                .unwrap_or_default(),
        };
        let mut still = HashMap::new();
        let mut stuck = false;
        for task in tasks {
            let Some((blocked, ticks)) = sample(&task) else {
                continue; // gone: nothing to say
            };
            if !in_crash_handler(blocked) {
                continue;
            }
            let since = match self.still.get(&task) {
                Some(&(since, at)) if at == ticks => since,
                _ => now,
            };
            stuck |= now.duration_since(since) >= self.stuck_after;
            still.insert(task, (since, ticks));
        }
        self.still = still;
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

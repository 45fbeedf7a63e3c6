//! A worker stuck in a compiler's crash handler ends itself.
//!
//! libocloc guards each compile with its own SIGSEGV/SIGILL handler, which prints a
//! backtrace and jumps back into the compiler. `backtrace` is not async-signal-safe: a
//! fault inside `malloc` (heap corruption, where IGC crashes most) leaves the handler
//! waiting forever on the allocator's or the loader's lock (seen here: a worker killed
//! with SIGSEGV inside IGC's `realloc` hung in `backtrace` until the caller's deadline).
//! The worker's watch thread samples the serving thread: crash signals blocked (it is
//! inside a handler) and no CPU time spent for [`STUCK`] means it never returns, and the
//! worker ends its process group, so the caller sees a crash at once. After each request
//! the crash signals are unblocked again (the handler's `longjmp` leaves them blocked).

use std::time::{Duration, Instant};

/// How long a thread may sit inside a crash handler without running before it counts as
/// stuck: a backtrace takes milliseconds; a deadlock never ends.
pub const STUCK: Duration = Duration::from_secs(5);

const CRASH_SIGNALS: [libc::c_int; 4] = [libc::SIGSEGV, libc::SIGILL, libc::SIGBUS, libc::SIGFPE];

/// This thread's id, for a watch from another thread.
pub fn current_thread() -> libc::pid_t {
    // SAFETY: gettid cannot fail.
    unsafe { libc::gettid() }
}

/// Unblock the crash signals on this thread (a handler that jumped out left them blocked;
/// blocked, a later fault would not reach any handler).
pub fn unblock_crash_signals() {
    // SAFETY: a sigset built here and passed by pointer for the call only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in CRASH_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// The thread's blocked signals and CPU ticks (user + system), from /proc.
fn sample(tid: libc::pid_t) -> Option<(u64, u64)> {
    let task = format!("/proc/self/task/{tid}");
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

/// Samples of one thread, taken from another.
pub struct Watch {
    tid: libc::pid_t,
    stuck_after: Duration,
    /// Since when it has sat in a handler without running, and its CPU ticks then.
    still: Option<(Instant, u64)>,
}

impl Watch {
    pub fn new(tid: libc::pid_t, stuck_after: Duration) -> Self {
        Watch {
            tid,
            stuck_after,
            still: None,
        }
    }

    /// Is the thread stuck in a crash handler, as of `now`? Call it every second or so.
    pub fn stuck(&mut self, now: Instant) -> bool {
        let Some((blocked, ticks)) = sample(self.tid) else {
            return false;
        };
        if !in_crash_handler(blocked) {
            self.still = None;
            return false;
        }
        match self.still {
            Some((since, at)) if at == ticks => now.duration_since(since) >= self.stuck_after,
            _ => {
                self.still = Some((now, ticks));
                false
            }
        }
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
    }
}

//! How many compilers this process runs now, and the host's core slots they hold: what
//! speculation asks before it starts a second GRF mode beside a build.

use super::*;

/// Processes running compilers for this process right now (workers busy with a job and
/// one-shot ocloc processes). Each also holds a core slot of the host (`cores.rs`) when one
/// is free: speculation uses a core only when one is idle, in this process and on the host.
pub(super) static BUSY: AtomicUsize = AtomicUsize::new(0);

pub fn busy() -> usize {
    BUSY.load(Ordering::Relaxed)
}

/// Woken whenever a compiler of this process starts or ends (and when a waiter's own
/// condition changes). Compilers of other processes are seen at the next poll.
pub(super) type Changed = (Mutex<()>, Condvar);
pub(super) static BUSY_CHANGED: Renewable<Changed> =
    Renewable::new(|| (Mutex::new(()), Condvar::new()), forget_after_fork);
pub(super) const POLL_OTHER_PROCESSES: Duration = Duration::from_millis(100);

/// Wake everyone waiting in [`wait_for_idle_core`].
pub fn notify_busy_changed() {
    let changed = BUSY_CHANGED.get();
    let _lock = lock(&changed.0);
    changed.1.notify_all();
}

/// How long a speculative build waits before taking an idle core, in a process that runs
/// tasks of a batch spread over several processes (see [`join_multiprocess_batch`]).
pub const SETTLE: Duration = Duration::from_millis(100);
pub(super) static SETTLE_TWINS: AtomicBool = AtomicBool::new(false);

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

pub(super) fn wait_timeout<'a>(
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

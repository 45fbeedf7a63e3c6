//! How many compilers this process runs now, and the host's core slots they hold: what
//! speculation asks before it starts a second GRF mode beside a build, and what a shared
//! build asks before it claims its key (`reserve_core`).

use super::*;
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::AtomicU64;

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

/// Let-goes so far (bumped under `BUSY_CHANGED`'s lock): a compiler of this process ended,
/// a core or a claim of it was let go. A waiter that looked before one never sleeps
/// through it (`wait_for_change`); a compiler starting is no such change.
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// Wake everyone waiting in [`wait_for_idle_core`] (a compiler of this process started).
pub fn notify_busy_changed() {
    let changed = BUSY_CHANGED.get();
    let _lock = lock(&changed.0);
    changed.1.notify_all();
}

/// Wake everyone waiting in [`wait_for_idle_core`] or [`wait_for_change`]: a compiler of
/// this process ended, or a core or a claim of it was let go.
pub fn notify_let_go() {
    let changed = BUSY_CHANGED.get();
    let _lock = lock(&changed.0);
    CHANGES.fetch_add(1, Ordering::Relaxed);
    changed.1.notify_all();
}

/// The let-goes so far, to wait for the next (`wait_for_change`).
pub fn changes() -> u64 {
    CHANGES.load(Ordering::Relaxed)
}

/// Sleep until a let-go after `seen` (`changes()`), or until `timeout`.
pub fn wait_for_change(seen: u64, timeout: Duration) {
    let until = Instant::now() + timeout;
    let changed = BUSY_CHANGED.get();
    let mut guard = lock(&changed.0);
    while CHANGES.load(Ordering::Relaxed) == seen {
        let Some(left) = until
            .checked_duration_since(Instant::now())
            .filter(|l| !l.is_zero())
        else {
            return;
        };
        guard = wait_timeout(changed, guard, left);
    }
}

/// Requests of this process waiting for a core (`reserve_core` said `Wait`): no twin takes
/// a core they wait for.
static CORE_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// One request waiting for a core, counted while alive (on the thread that waits).
pub struct WaitingForCore {
    pid: u32,
    _here: PhantomData<*const ()>,
}

impl WaitingForCore {
    pub fn new() -> WaitingForCore {
        CORE_WAITERS.fetch_add(1, Ordering::Relaxed);
        let (pid, _here) = (std::process::id(), PhantomData);
        WaitingForCore { pid, _here }
    }
}

impl Default for WaitingForCore {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for WaitingForCore {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            CORE_WAITERS.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Workers this process is starting now, and when the last start ended (nanoseconds after
/// `EPOCH`): a hedged twin never counts its delay through a worker's start-up (a Python
/// process: 0.1-0.3 s, longer than a small kernel's build). Kept for the process, not per
/// build: any start-up holds every hedge back, and the delay counts from the end of the
/// last one (a twin late by a start-up, never early).
pub(super) static STARTING: AtomicUsize = AtomicUsize::new(0);
static LAST_STARTED: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// `start()`, counted as a worker starting (see [`STARTING`]) until it returns or
/// unwinds; twins waiting are woken when it ends.
pub(super) fn starting<T>(start: impl FnOnce() -> T) -> T {
    struct Starting(Instant);
    impl Drop for Starting {
        fn drop(&mut self) {
            let nanos = u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX);
            LAST_STARTED.fetch_max(nanos, Ordering::Relaxed);
            STARTING.fetch_sub(1, Ordering::Relaxed);
            notify_busy_changed();
        }
    }
    STARTING.fetch_add(1, Ordering::Relaxed);
    let _counted = Starting(*EPOCH.get_or_init(Instant::now));
    start()
}

/// When a twin that waits `after` behind a build that `began` may start: `after` from the
/// later of its beginning and the last worker start of this process (None while one is
/// starting). `after` 0 is at once, start-ups or not.
fn hedge_from(began: Instant, after: Duration) -> Option<Instant> {
    if after.is_zero() {
        return Some(began);
    }
    if STARTING.load(Ordering::Relaxed) > 0 {
        return None;
    }
    let last = EPOCH
        .get()
        .map(|epoch| *epoch + Duration::from_nanos(LAST_STARTED.load(Ordering::Relaxed)));
    Some(last.map_or(began, |last| last.max(began)) + after)
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

/// Wait until a build that `began` has run `after` (not counting a worker's start-up,
/// `hedge_from`), then until one more compiler fits on the cores (of this process, and of
/// the host) and `may` agrees (in a multi-process batch, no sooner than [`SETTLE`] from
/// now); then take that core: the returned guard counts as a running compiler until
/// dropped, so two waiters never take one idle core. `None` once `give_up` says so (a
/// wake-up, `notify_busy_changed`, has it asked at once).
pub fn wait_for_idle_core(
    cores: usize,
    (give_up, may): (&dyn Fn() -> bool, &dyn Fn() -> bool),
    (began, after): (Instant, Duration),
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
        // Woken when a start-up ends; the poll bounds the wait all the same.
        let Some(hedged) = hedge_from(began, after) else {
            guard = wait_timeout(changed, guard, POLL_OTHER_PROCESSES);
            continue;
        };
        let not_before = settled.max(hedged);
        if now < not_before {
            guard = wait_timeout(changed, guard, not_before - now);
            continue;
        }
        let waited_for = CORE_WAITERS.load(Ordering::Relaxed) > 0;
        if busy() < cores && may() && !waited_for {
            let slot = match crate::cores::try_take() {
                Taken::Slot(slot) => Some(Some(slot)),
                Taken::Uncounted => Some(None),
                Taken::Full => None, // other processes run compilers on the idle cores
            };
            if let Some(slot) = slot {
                BUSY.fetch_add(1, Ordering::Relaxed); // under the lock: no twin takes it too
                TWINS.fetch_add(1, Ordering::Relaxed);
                TWIN_HERE.with(|n| n.set(n.get() + 1));
                return Some(BusyGuard {
                    slot,
                    counts: Counts::Twin,
                    pid: std::process::id(),
                    _here: PhantomData,
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
    counts: Counts,
    /// The process it counts in: a forked child's copy counts for nothing.
    pid: u32,
    /// Not `Send`: a twin's is counted on its thread (`TWIN_HERE`).
    _here: PhantomData<*const ()>,
}

/// What a [`BusyGuard`] counts.
enum Counts {
    /// A compiler, in `BUSY`.
    Compiler,
    /// A speculative build's compiler (`wait_for_idle_core`): in `BUSY`, `TWINS` and on
    /// its thread, whose compilers it holds the core for.
    Twin,
    /// Nothing: a compiler on a twin's thread, counted by the twin's guard.
    Nothing,
}

/// Speculative builds of this process holding a core (a real build never waits for one:
/// `reserve_core`), in all and on this thread.
static TWINS: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static TWIN_HERE: Cell<usize> = const { Cell::new(0) };
}

impl BusyGuard {
    pub fn new() -> Self {
        let pid = std::process::id();
        if TWIN_HERE.with(Cell::get) > 0 {
            let (slot, counts, _here) = (None, Counts::Nothing, PhantomData);
            return BusyGuard {
                slot,
                counts,
                pid,
                _here,
            };
        }
        // A thread that reserved a core for its build runs its compilers in it.
        let slot = match RESERVED_HERE.with(Cell::get) {
            0 => match crate::cores::try_take() {
                Taken::Slot(slot) => Some(slot),
                Taken::Full | Taken::Uncounted => None,
            },
            _ => None,
        };
        BUSY.fetch_add(1, Ordering::Relaxed);
        notify_busy_changed();
        let (counts, _here) = (Counts::Compiler, PhantomData);
        BusyGuard {
            slot,
            counts,
            pid,
            _here,
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
        let freed = self.slot.take().is_some(); // free before waking anyone who would take it
        if self.pid != std::process::id() {
            return;
        }
        if freed {
            core_freed();
        }
        match self.counts {
            Counts::Nothing => return,
            Counts::Compiler => {}
            Counts::Twin => {
                TWINS.fetch_sub(1, Ordering::Relaxed);
                TWIN_HERE.with(|n| n.set(n.get().saturating_sub(1)));
            }
        }
        BUSY.fetch_sub(1, Ordering::Relaxed);
        notify_let_go();
    }
}

/// When a core of this process was last let go, and when a request last went on behind
/// its own builds without one (nanoseconds after `QUEUE_EPOCH`; 0: never).
static LAST_FREED: AtomicU64 = AtomicU64::new(0);
static QUEUE_WENT: AtomicU64 = AtomicU64::new(0);
static QUEUE_EPOCH: OnceLock<Instant> = OnceLock::new();

/// Now, as `LAST_FREED` and `QUEUE_WENT` count it (never 0).
fn queue_now() -> u64 {
    let epoch = *QUEUE_EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn core_freed() {
    LAST_FREED.fetch_max(queue_now(), Ordering::Relaxed);
}

/// How long since a core of this process was last let go (None: never).
fn since_own_core_freed() -> Option<Duration> {
    match LAST_FREED.load(Ordering::Relaxed) {
        0 => None,
        at => Some(Duration::from_nanos(queue_now().saturating_sub(at))),
    }
}

/// Cores this process reserved for builds about to start (`reserve_core`), in all and on
/// this thread (a forked child starts with none: `forget_reserved`).
static RESERVED: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static RESERVED_HERE: Cell<usize> = const { Cell::new(0) };
}

/// How long a build waits for a core of a full host before it builds anyway, as every build
/// did before cores were reserved (at most an hour).
pub const CORE_WAIT_ENV: &str = "XPU_ZEBIN_CORE_WAIT_SECONDS";
const DEFAULT_CORE_WAIT: Duration = Duration::from_secs(10);
const MOST_CORE_WAIT: Duration = Duration::from_secs(3600);

fn core_wait() -> Duration {
    // A bad value fails the request before it gets here (`knobs::check`).
    let wait = crate::knobs::seconds_knob(CORE_WAIT_ENV, DEFAULT_CORE_WAIT);
    wait.unwrap_or(DEFAULT_CORE_WAIT).min(MOST_CORE_WAIT)
}

/// A wait for a core ran out in this process while it ran no compiler: the cores were busy
/// that long with others' work, not what it wanted, so it builds at once from then on.
static CORE_WAIT_RAN_OUT: AtomicBool = AtomicBool::new(false);

/// A core of the host taken for a build before its key is claimed, held until the build is
/// kept (it goes with the request's claim). The compilers this thread runs meanwhile count
/// in it ([`BusyGuard`] takes no other); a twin, on a thread of its own, takes its own.
/// Not `Send`: it is counted on the thread that took it.
pub struct Reserved {
    slot: Option<Slot>,
    pid: u32,
    _here: PhantomData<*const ()>,
}

impl Reserved {
    fn new(slot: Slot) -> Reserved {
        RESERVED.fetch_add(1, Ordering::Relaxed);
        RESERVED_HERE.with(|n| n.set(n.get() + 1));
        Reserved {
            slot: Some(slot),
            pid: std::process::id(),
            _here: PhantomData,
        }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        drop(self.slot.take()); // free before waking this process's waiters for it
        if self.pid == std::process::id() {
            RESERVED.fetch_sub(1, Ordering::Relaxed);
            RESERVED_HERE.with(|n| n.set(n.get().saturating_sub(1)));
            core_freed();
            notify_let_go();
        }
    }
}

/// What a build about to start finds of the host's cores (`reserve_core`).
pub enum CoreTurn {
    /// A free core, now this build's.
    Reserved(Reserved),
    /// Build as before: cores are not counted here, this thread holds one already (or
    /// the process is pinned to CPUs of its own), or it has waited
    /// `XPU_ZEBIN_CORE_WAIT_SECONDS`.
    Go,
    /// Every core of the host runs a compiler: wait (for the build wanted, kept by
    /// another, or a core).
    Wait,
}

/// The cores' word for a build about to start that has waited `waited` for one. The ranks
/// of a job, started together, each would start compilers of their own (a Python start
/// and IGC's load, about 0.15 s of CPU and 200 MB each) on a host whose cores are all
/// compiling; instead the builds that hold the cores go on, and the others wait for their
/// keys to be kept or a core to free. That holds in a process compiling already too: its
/// batch's further jobs would be more compilers than cores (and more workers), and the core
/// its own build frees is its next one's (its waiters are woken as it is let go).
pub fn reserve_core(waited: Duration) -> CoreTurn {
    match crate::cores::try_take() {
        Taken::Slot(slot) => CoreTurn::Reserved(Reserved::new(slot)),
        Taken::Uncounted => CoreTurn::Go,
        Taken::Full => full_host_turn(waited),
    }
}

/// `reserve_core`'s word when every core of the host runs a compiler.
fn full_host_turn(waited: Duration) -> CoreTurn {
    let wait = core_wait();
    // The wait since this process last let a core go: time behind its own builds is its
    // queue's, not the others'.
    let waited_on_others = since_own_core_freed().map_or(waited, |since| since.min(waited));
    // A thread holding a core builds in it (never waits on itself); a speculative build
    // took an idle core while nothing here waited, and real work builds beside it.
    if RESERVED_HERE.with(Cell::get) > 0 || TWINS.load(Ordering::Relaxed) > 0 {
        return CoreTurn::Go;
    }
    if pinned() || CORE_WAIT_RAN_OUT.load(Ordering::Relaxed) {
        return CoreTurn::Go;
    }
    // Cores of its own: a queue, whose next core is its own build's. It goes on when none
    // has been let go for the whole wait (one build that long: then so do the next, until
    // one is), or after `QUEUE_MOST` waits in all; it learns nothing of the others' cores.
    if RESERVED.load(Ordering::Relaxed) + busy() > 0 {
        let went_since = QUEUE_WENT.load(Ordering::Relaxed) > LAST_FREED.load(Ordering::Relaxed);
        if went_since || waited_on_others >= wait || waited >= wait * QUEUE_MOST {
            QUEUE_WENT.fetch_max(queue_now(), Ordering::Relaxed);
            return CoreTurn::Go;
        }
        return CoreTurn::Wait;
    }
    if waited_on_others >= wait {
        CORE_WAIT_RAN_OUT.store(true, Ordering::Relaxed);
        return CoreTurn::Go;
    }
    CoreTurn::Wait
}

/// A request behind its own process's builds goes on after this many core waits in all,
/// whoever took the cores freed meanwhile.
const QUEUE_MOST: u32 = 4;

/// A free core of the host for a build about to start, if there is one: never a wait.
pub fn free_core() -> Option<Reserved> {
    match crate::cores::try_take() {
        Taken::Slot(slot) => Some(Reserved::new(slot)),
        Taken::Full | Taken::Uncounted => None,
    }
}

/// Whether this process may run on fewer CPUs than its cgroup's (`taskset`, `srun
/// --cpu-bind`, a launcher binding each rank to its cores): its compilers run on its own
/// CPUs, whatever the others' do, so it never waits for the host's. Without a cgroup that
/// says (cgroup v2's `cpuset.cpus.effective`, v1's `cpuset.effective_cpus`), the CPUs
/// online are the host's.
fn pinned() -> bool {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: sched_getaffinity writes into the set given, of the size given, which
    // CPU_COUNT then reads; sysconf reads a system setting.
    let (ours, online) = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        match libc::sched_getaffinity(0, size, &mut set) {
            0 => (
                libc::CPU_COUNT(&set),
                libc::sysconf(libc::_SC_NPROCESSORS_ONLN),
            ),
            _ => return false,
        }
    };
    let allowed = cgroup_cpus().or_else(|| u64::try_from(online).ok());
    allowed.is_some_and(|all| u64::try_from(ours).is_ok_and(|ours| ours < all))
}

/// How many CPUs this process's cgroup may use, as its cpuset says.
fn cgroup_cpus() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let at = |line: &str, prefix: &str| line.strip_prefix(prefix).map(str::to_string);
    let file = groups.lines().find_map(|line| {
        at(line, "0::")
            .map(|path| format!("/sys/fs/cgroup{path}/cpuset.cpus.effective"))
            .or_else(|| {
                let (_, rest) = line.split_once(':')?;
                let (controllers, path) = rest.split_once(':')?;
                let cpuset = controllers.split(',').any(|c| c == "cpuset");
                cpuset.then(|| format!("/sys/fs/cgroup/cpuset{path}/cpuset.effective_cpus"))
            })
            .filter(|file| std::path::Path::new(file).is_file())
    })?;
    count_cpus(std::fs::read_to_string(file).ok()?.trim())
}

/// The CPUs a kernel CPU list names (`0-3,8,10-11`: 7); None when it does not parse or
/// names none.
fn count_cpus(list: &str) -> Option<u64> {
    let part = |p: &str| match p.split_once('-') {
        Some((a, b)) => b
            .parse::<u64>()
            .ok()?
            .checked_sub(a.parse().ok()?)?
            .checked_add(1),
        None => p.parse::<u64>().ok().map(|_| 1),
    };
    let count = list
        .split(',')
        .map(part)
        .try_fold(0u64, |n, c| n.checked_add(c?))?;
    (count > 0).then_some(count)
}

/// In a forked child: the parent's reservations, twins and waits are not the child's.
pub(super) fn forget_reserved() {
    RESERVED.store(0, Ordering::Relaxed);
    TWINS.store(0, Ordering::Relaxed);
    TWIN_HERE.with(|n| n.set(0));
    CORE_WAITERS.store(0, Ordering::Relaxed);
    CORE_WAIT_RAN_OUT.store(false, Ordering::Relaxed);
    LAST_FREED.store(0, Ordering::Relaxed);
    QUEUE_WENT.store(0, Ordering::Relaxed);
    RESERVED_HERE.with(|n| n.set(0));
}

#[cfg(test)]
mod tests {
    use super::count_cpus;

    #[test]
    fn a_cpu_list_is_counted_or_refused() {
        assert_eq!(count_cpus("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpus("5"), Some(1));
        for bad in ["", "3-1", "a", "0-", "-2", "1,,2", "0-18446744073709551615"] {
            assert_eq!(count_cpus(bad), None, "{bad:?}");
        }
    }
}

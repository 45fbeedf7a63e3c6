//! One build per key: a request that misses takes the key's claim before it builds and lets
//! go once its answer is kept, so that another request for the key (a thread of this
//! process, another process of this host, another host sharing the cache directory) waits
//! for that build and is answered from its entry (Nix's per-output build locks: claim,
//! look again, build, publish, let go).
//!
//! Claims live in the cache directory, `claims/<key>`, a file only while the key is
//! claimed:
//! - threads of one process: a table of the keys this process holds (a POSIX lock is the
//!   process's: a second thread would take it again);
//! - processes and hosts: a POSIX record lock on the key's file, let go when its holder
//!   ends, however it ends; where the file system refuses locks (or a lock call does not
//!   answer: asked once per process, on `claims/probe.lock`), a lease naming its holder,
//!   `claims/<key>.lease` (`cache::lease`: taken over at once when its holder is a process
//!   of this host that is gone, else when older than `LEASE_AGE`).
//!
//! A waiter with other work first (a batch's queue) steps aside instead of waiting.
//!
//! A turn to build takes a core of the host with its claim (`pool::reserve_core`): when
//! every core runs a compiler, the request waits for its key to be kept (or a core)
//! instead of claiming it, so the ranks of a job started together build on the cores they
//! hold rather than each start compilers on a full host.
//!
//! The holder renews its claim (the file's last change) every `RENEW` while it builds; a
//! waiter that sees no renewal for `STALLED` on its own clock (a holder stopped or hung,
//! another host's clock does not matter) builds for itself. So does one whose own bound
//! passes (what its own build may take), one whose cancel is set gives up, and a claim
//! that cannot be taken or looked at (a directory not this user's, no descriptors) costs
//! the request nothing but the sharing: it builds alone. Nothing here fails a compile.

use crate::cache::{keeper, lease};
use crate::pool::{CoreTurn, Reserved};
use crate::sync::{lock, Renewable};
use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How often a holder renews its claim.
pub const RENEW: Duration = Duration::from_secs(1);
/// A claim not renewed for this long, as its waiter's clock sees it, is a holder stopped
/// (SIGSTOP) or hung: ten renewals missed, far beyond a loaded host's scheduling delay.
pub const STALLED: Duration = Duration::from_secs(10);
/// A lease claim (a file system without locks) older than this is taken over (its holder
/// on another host died): renewed every `RENEW`, a live one never gets this old.
const LEASE_AGE: Duration = Duration::from_secs(30);
/// The first pause between two looks of a waiter; each next one is half again as long, up
/// to `MOST_PAUSE` (a build of tens of milliseconds is answered at once, a long one costs
/// ten looks a second: a rank waiting for the last kernel of its first step ends within
/// 0.1 s of its build, measured 3-4% sooner over four ranks' batch than at five a second).
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const MOST_PAUSE: Duration = Duration::from_millis(100);

/// The probe file of a claims directory: never a key's (a key is hex digits).
const PROBE: &str = "probe.lock";

/// Claims directories where POSIX record locks work, and where they were refused (or did
/// not answer): leases there. By device and inode, as this process found them.
static LOCKING: Renewable<Mutex<Vec<(u64, u64)>>> =
    Renewable::new(|| Mutex::new(Vec::new()), forget_modes_after_fork);
static LOCKLESS: Renewable<Mutex<Vec<(u64, u64)>>> =
    Renewable::new(|| Mutex::new(Vec::new()), forget_modes_after_fork);

fn forget_modes_after_fork() {
    LOCKING.renew();
    LOCKLESS.renew();
}

/// The keys this process holds, by claims directory. A forked child starts with none (it
/// holds no POSIX lock of its parent's). Their waiters are woken as one is let go
/// (`pool::notify_let_go`, as the cores this process lets go).
struct Held {
    /// By the claims directory's device and inode (two spellings of one directory are
    /// one), and the key.
    keys: Mutex<HashSet<(u64, u64, String)>>,
}

static HELD: Renewable<Held> = Renewable::new(
    || Held {
        keys: Mutex::new(HashSet::new()),
    },
    forget_after_fork,
);

fn forget_after_fork() {
    HELD.renew();
}

/// The claims of one cache directory.
#[derive(Clone)]
pub struct Claims {
    dir: PathBuf,
}

/// How a claim is held.
enum Hold {
    /// A POSIX record lock on this open file.
    Record(Arc<File>),
    /// A lease file (the file system refuses locks).
    Lease(Arc<lease::Lease>),
}

/// A key's claim, held: renewed while held, let go when dropped (its file removed while
/// still locked, then closed; the table's entry last, and its waiters woken).
pub struct Claim {
    path: PathBuf,
    /// Its entry in this process's table.
    entry: (u64, u64, String),
    hold: Option<Hold>,
    /// Dropped to stop the renewing thread.
    renewing: Option<std::sync::mpsc::Sender<()>>,
    /// The process that took it: a forked child dropping its copy removes nothing.
    pid: u32,
}

impl Drop for Claim {
    fn drop(&mut self) {
        drop(self.renewing.take());
        if self.pid != std::process::id() {
            std::mem::forget(self.hold.take()); // the parent's lock and file, not ours
            return;
        }
        match self.hold.take() {
            Some(Hold::Record(file)) => {
                // Removed only while it is still the file locked (a waiter that opened the
                // name before it went finds another inode and opens the name again).
                let same = std::fs::symlink_metadata(&self.path)
                    .ok()
                    .zip(file.metadata().ok())
                    .is_some_and(|(at, held)| (at.dev(), at.ino()) == (held.dev(), held.ino()));
                if same {
                    let _ = std::fs::remove_file(&self.path);
                }
                drop(file);
            }
            Some(Hold::Lease(lease)) => drop(lease),
            None => {}
        }
        lock(&HELD.get().keys).remove(&self.entry);
        crate::pool::notify_let_go();
    }
}

/// What a claim attempt found.
pub enum Taken {
    Mine(Claim),
    /// A thread of this process holds it.
    HeldHere,
    /// Another process holds it: its file as last seen (device, inode, last change), and
    /// when its holder took it, as the file says (`stamp`).
    HeldThere(Option<(u64, u64, SystemTime)>, Option<SystemTime>),
    /// No claim can be taken here (why): the request builds alone.
    Unavailable(String),
}

/// How a wait for another's build ended.
pub enum Waited<T> {
    /// The levels answered (`found`), after waiting this long; and how long the build
    /// waited for had run by then, as its claim said when it was taken (None: it said
    /// nothing, a thread of this process or a lease held it).
    Answered(T, Duration, Option<Duration>),
    /// This request took the claim (its holder let go with nothing kept, or died): it
    /// builds, holding it, and the core it reserved when one was free; and how long it
    /// waited for a core, if it did.
    Mine(Claim, Option<Reserved>, Option<Duration>),
    /// It builds without a claim (why: a stalled holder, its own bound, no claims here).
    Alone(String),
    /// Its cancel was set while it waited.
    Cancelled,
    /// Held by another at the first look, and the caller had other work (`step_aside`).
    SteppedAside,
}

impl Claims {
    /// The claims of the cache directory `cache_dir` (made on the first claim).
    pub fn of(cache_dir: &Path) -> Claims {
        Claims {
            dir: cache_dir.join("claims"),
        }
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        // A key names a file: hex digits only (the cache's keys), never a path.
        let plain =
            !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| b.is_ascii_hexdigit());
        plain.then(|| self.dir.join(key))
    }

    /// The claims directory, made (0700) and checked as this user's, not writable by others.
    fn ready(&self) -> Result<(u64, u64), String> {
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir);
        crate::private::check_dir(&self.dir, 0o002)?;
        let meta = std::fs::metadata(&self.dir).map_err(|e| e.to_string())?;
        Ok((meta.dev(), meta.ino()))
    }

    /// Whether `key`'s claim file or lease is there (its holder's, or left by one that died
    /// before letting go): one look at each name, no lock asked.
    fn may_be_claimed(&self, key: &str) -> bool {
        self.path(key).is_some_and(|path| {
            [path.with_extension("lease"), path]
                .iter()
                .any(|at| std::fs::symlink_metadata(at).is_ok())
        })
    }

    /// Take `key`'s claim now, or say who holds it; never waits.
    pub fn take(&self, key: &str) -> Taken {
        let Some(path) = self.path(key) else {
            return Taken::Unavailable(format!("{key:?} does not name a claim"));
        };
        let (dev, ino) = match self.ready() {
            Ok(dir) => dir,
            Err(why) => return Taken::Unavailable(format!("claims are off here: {why}")),
        };
        let entry = (dev, ino, key.to_string());
        let held = HELD.get();
        if !lock(&held.keys).insert(entry.clone()) {
            return Taken::HeldHere;
        }
        let taken = self.take_file(&path, entry.clone());
        if !matches!(taken, Taken::Mine(_)) {
            // No wake-up: nothing was let go (a thread that saw it held looks again soon,
            // and a wake here would wake this waiter's own next sleep).
            lock(&held.keys).remove(&entry);
        }
        taken
    }

    /// The file's claim (the table's `entry` is this thread's).
    fn take_file(&self, path: &Path, entry: (u64, u64, String)) -> Taken {
        let dir = (entry.0, entry.1);
        if let Err(refused) = self.locks_work(dir) {
            return self.take_lease(path, entry, &refused);
        }
        // A name removed by its last holder between our open and our lock is opened again.
        for _ in 0..4 {
            let file = match keeper::open_lock_file(path) {
                Ok(file) => Arc::new(file),
                Err(why) => return Taken::Unavailable(why),
            };
            match keeper::lock_now(dir, file.clone()) {
                Ok(true) => {}
                Ok(false) => return Taken::HeldThere(seen(path), taken_at(&file)),
                // Refused now, not at the probe: leases from here on; the file is left
                // (a lock call that did not answer may hold it, and its removal with it).
                Err(refused) => {
                    lock(LOCKLESS.get()).push(dir);
                    return self.take_lease(path, entry, &refused);
                }
            }
            let now = std::fs::symlink_metadata(path).ok();
            let held = file.metadata().ok();
            let same = now
                .zip(held)
                .is_some_and(|(a, b)| (a.dev(), a.ino()) == (b.dev(), b.ino()));
            if same {
                stamp(&file);
                return Taken::Mine(Claim::renewed(path, entry, Hold::Record(file)));
            }
        }
        Taken::Unavailable("the claim's file kept changing under us".into())
    }

    /// Whether POSIX record locks work in the claims directory `dir` (its device and
    /// inode): asked once per process, on a probe file of its own that is never removed
    /// (where a lock call never answers, the file it holds cannot be removed either).
    fn locks_work(&self, dir: (u64, u64)) -> Result<(), std::io::Error> {
        if lock(LOCKLESS.get()).contains(&dir) {
            return Err(std::io::Error::other("refused before"));
        }
        if lock(LOCKING.get()).contains(&dir) {
            return Ok(());
        }
        let probe = keeper::open_lock_file(&self.dir.join(PROBE)).map_err(std::io::Error::other);
        let answer = probe.and_then(|file| keeper::lock_now(dir, Arc::new(file)));
        match answer {
            Ok(_) => {
                lock(LOCKING.get()).push(dir);
                Ok(())
            }
            Err(refused) => {
                lock(LOCKLESS.get()).push(dir);
                Err(refused)
            }
        }
    }

    /// The claim as a lease, where the file system refuses locks (`refused`).
    fn take_lease(
        &self,
        path: &Path,
        entry: (u64, u64, String),
        refused: &std::io::Error,
    ) -> Taken {
        crate::diag::detail(
            "claims",
            format!(
                "{}: no POSIX locks ({refused}): lease claims",
                self.dir.display()
            ),
        );
        let at = path.with_extension("lease");
        match lease::take_at(&at, LEASE_AGE) {
            Some(lease) => Taken::Mine(Claim::renewed(path, entry, Hold::Lease(Arc::new(lease)))),
            None => match seen(&at) {
                Some(seen) => Taken::HeldThere(Some(seen), None),
                None => Taken::Unavailable("the lease claim could not be made".into()),
            },
        }
    }

    /// Wait for `key`'s holder: `found()` looks in the levels (an entry or a remembered
    /// failure ends the wait); the claim is taken when its holder lets go with nothing
    /// kept, together with a core of the host when `core` gives one (`pool::reserve_core`:
    /// on a host whose cores all run compilers, a request waits for its key to be kept or
    /// a core to free rather than start one more, for a bounded time). Ends
    /// alone when the holder stalls (`STALLED`) or `bound` passes (None: no bound of its
    /// own, the holder's life bounds it), and at once when `cancel` is set. Held by another
    /// at the first look, it ends at once when `step_aside()` says the caller has other
    /// work first.
    pub fn wait<T>(
        &self,
        key: &str,
        (bound, cancel): (Option<Duration>, &AtomicBool),
        (step_aside, core): (&dyn Fn() -> bool, &dyn Fn(Duration) -> CoreTurn),
        mut found: impl FnMut() -> Option<T>,
    ) -> Waited<T> {
        let start = Instant::now();
        let mut pause = FIRST_PAUSE;
        // The holder's file as last seen, and when it last changed (this clock's).
        let mut last: Option<(u64, u64, SystemTime)> = None;
        let mut changed = start;
        // When the holder last seen took its claim (its file's word).
        let mut since: Option<SystemTime> = None;
        // Since when this request has waited for a core; whether it has seen a holder.
        let mut cold: Option<Instant> = None;
        let mut held_seen = false;
        // Counted while it waits for a core: no twin of this process takes one meanwhile.
        let mut waiting: Option<crate::pool::WaitingForCore> = None;
        let answered = |answer: T, since: Option<SystemTime>| {
            let ran = since.and_then(|s| SystemTime::now().duration_since(s).ok());
            Waited::Answered(answer, start.elapsed(), ran)
        };
        loop {
            // Changes from here on wake the sleep below (none is slept through).
            let seen = crate::pool::changes();
            if cancel.load(Ordering::Relaxed) {
                return Waited::Cancelled;
            }
            if let Some(answer) = found() {
                return answered(answer, since);
            }
            // A turn to build starts with a core (None: wait for one); without claims here
            // nobody would be waited for, and past its own bound it claims and builds. A
            // key that may be claimed, or was, is looked at first: a holder is waited for
            // as one (a stopped one is seen), and one that let go with nothing kept leaves
            // its waiter to build as before.
            let bound_passed = bound.is_some_and(|b| start.elapsed() >= b);
            let turn = match held_seen || self.may_be_claimed(key) {
                true => Some(None),
                false => match core(cold.map_or(Duration::ZERO, |c| c.elapsed())) {
                    CoreTurn::Wait if !bound_passed && self.ready().is_ok() => None,
                    CoreTurn::Reserved(reserved) => Some(Some(reserved)),
                    CoreTurn::Wait | CoreTurn::Go => Some(None),
                },
            };
            let looked = turn.is_some();
            if looked {
                waiting = None;
            }
            match turn.map(|reserved| (self.take(key), reserved)) {
                // No core at the first look: other work first, as for a holder.
                None if cold.is_none() && step_aside() => return Waited::SteppedAside,
                None => {
                    cold.get_or_insert_with(Instant::now);
                    waiting.get_or_insert_with(crate::pool::WaitingForCore::new);
                }
                Some((Taken::Mine(claim), reserved)) => {
                    // Kept just before its holder let go: answered, the claim let go.
                    return match found() {
                        Some(answer) => answered(answer, since),
                        None => Waited::Mine(claim, reserved, cold.map(|c| c.elapsed())),
                    };
                }
                Some((Taken::Unavailable(why), _)) => return Waited::Alone(why),
                Some(_) if start == changed && step_aside() => return Waited::SteppedAside,
                Some((Taken::HeldHere, _)) => {
                    (changed, held_seen) = (Instant::now(), true); // not stalled
                }
                Some((Taken::HeldThere(now, taken), _)) => {
                    held_seen = true;
                    // Another holder's file (a new inode) says its own start, or nothing.
                    let file = |seen: Option<(u64, u64, SystemTime)>| seen.map(|s| (s.0, s.1));
                    since = taken.or(since.filter(|_| file(now) == file(last)));
                    if now != last {
                        (last, changed) = (now, Instant::now());
                    } else if changed.elapsed() >= STALLED {
                        return Waited::Alone(format!(
                            "the process building it has not renewed its claim for {} s \
                             (stopped or hung): built here",
                            STALLED.as_secs()
                        ));
                    }
                }
            }
            if looked && bound.is_some_and(|b| start.elapsed() >= b) {
                let waited = start.elapsed().as_secs_f64();
                return Waited::Alone(format!(
                    "waited {waited:.1} s for another process's build, as long as this \
                     request's own may take: built here"
                ));
            }
            // Woken early when a thread of this process lets go of a claim or a core.
            crate::pool::wait_for_change(seen, pause);
            pause = (pause * 3 / 2).min(MOST_PAUSE);
        }
    }
}

/// What a build that waited `waited` for a core says.
pub(super) fn waited_for_core(waited: Duration) -> String {
    format!(
        "waited {:.1} s for a core of this host (each running a compiler) \
         before building",
        waited.as_secs_f64()
    )
}

impl Claim {
    /// A claim held, renewed every `RENEW` by a thread of its own until dropped (without
    /// a thread, it is not renewed: its waiters build for themselves after `STALLED`).
    fn renewed(path: &Path, entry: (u64, u64, String), hold: Hold) -> Claim {
        // Whether to go on: a record lock is ours until dropped (a renewal that failed is
        // tried again a second later); a lease taken over by another is no longer.
        let renew: Box<dyn Fn() -> bool + Send> = match &hold {
            Hold::Record(file) => {
                let file = file.clone();
                Box::new(move || {
                    let _ = file.set_modified(SystemTime::now());
                    true
                })
            }
            Hold::Lease(lease) => {
                let lease = lease.clone();
                Box::new(move || lease.renew())
            }
        };
        Claim {
            path: path.to_path_buf(),
            entry,
            hold: Some(hold),
            renewing: renewing("xpu-zebin-claim", renew),
            pid: std::process::id(),
        }
    }
}

/// Call `renew` every `RENEW` on a thread of its own, while it says to go on, until the
/// sender returned is dropped; None when no thread could be made (then nothing renews,
/// and the claim's waiters build for themselves after `STALLED`).
pub(super) fn renewing(
    name: &str,
    renew: impl Fn() -> bool + Send + 'static,
) -> Option<std::sync::mpsc::Sender<()>> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(RENEW) {
                if !renew() {
                    break;
                }
            }
        });
    spawned.is_ok().then_some(tx)
}

/// Say in the claim's `file` when its holder took it (microseconds since 1970, as text),
/// for its waiters to count the build time a wait saved; a claim that cannot say it
/// holds all the same.
fn stamp(file: &File) {
    use std::os::unix::fs::FileExt;
    // Never a file with another name too (a link planted here is left as it is), nor a
    // time before 1970 (a clock that cannot say it).
    let alone = file.metadata().is_ok_and(|m| m.nlink() == 1);
    let since = SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    if let (true, Ok(since)) = (alone, since) {
        let text = format!("{}\n", since.as_micros());
        let _ = file
            .set_len(0)
            .and_then(|()| file.write_all_at(text.as_bytes(), 0));
    }
}

/// When the holder of a claim took it, as its `file` says (`stamp`); None when it says
/// nothing readable (written by no holder of ours, or not yet).
fn taken_at(file: &File) -> Option<SystemTime> {
    use std::os::unix::fs::FileExt;
    let mut text = [0u8; 24];
    let read = file.read_at(&mut text, 0).ok()?;
    let micros: u64 = std::str::from_utf8(text.get(..read)?)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    std::time::UNIX_EPOCH.checked_add(Duration::from_micros(micros))
}

/// The file at `path` as a waiter sees it: device, inode and last change.
fn seen(path: &Path) -> Option<(u64, u64, SystemTime)> {
    let m = std::fs::symlink_metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.modified().ok()?))
}

/// What a request that missed everywhere may wait for another's build: as long as its
/// own build may take (`limits`: its time limit per attempt, None: none, and its attempts),
/// until `cancel`; it steps aside instead when `step_aside()` says it has other work first.
pub struct Wait<'a> {
    pub limits: (Option<Duration>, usize),
    pub cancel: &'a AtomicBool,
    pub step_aside: &'a dyn Fn() -> bool,
}

impl Wait<'_> {
    /// The longest wait: the request's own build's bound and the time to see a holder
    /// stalled; None when its builds have no time limit (the holder's life bounds it).
    pub(super) fn bound(&self) -> Option<Duration> {
        let (timeout, rungs) = self.limits;
        let rungs = u32::try_from(rungs.max(1)).unwrap_or(u32::MAX);
        Some(timeout?.checked_mul(rungs)?.saturating_add(STALLED))
    }
}

#[cfg(test)]
mod tests;

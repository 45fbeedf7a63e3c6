//! The upkeep lock of a cache directory: one process, and one thread of it, keeps the
//! directory up at a time (moves old layouts in, recounts, cleans), and no one waits for
//! it: a process that finds it taken leaves the work to the holder. Where the file system
//! has POSIX record locks, it is one (released with its file when the holder dies, never
//! kept by a forked child); where it refuses them (many FUSE mounts, Lustre without
//! `flock`, NFS without a lock daemon), it is a lease (`lease.rs`). Either way nobody
//! waits, so a missing lock never stops a compile, and never stops the cache from being
//! cleaned. A lock call that does not answer within `LOCK_DEADLINE` (NFS with a lock
//! daemon that does not answer) is given up, and the directory uses leases from then on
//! in this process.

use super::lease::{self, Lease};
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::sync::Renewable;

/// Whether this process said (at debug) that a directory's file system refuses locks.
static SAID_LEASES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How long a lock call may take: a POSIX lock taken without waiting answers at once, but
/// on NFS the call goes to the server's lock daemon, and one that does not answer would
/// hold the write that asked for ever.
const LOCK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// Directories whose lock call did not answer in time, by device and inode: leases there.
static HANGING: Renewable<std::sync::Mutex<Vec<(u64, u64)>>> = Renewable::new(
    || std::sync::Mutex::new(Vec::new()),
    forget_hanging_after_fork,
);

fn forget_hanging_after_fork() {
    HANGING.renew();
}

/// The directories this process is keeping up now, by device and inode (two spellings of
/// one directory are one): one thread at a time each (a POSIX lock is the process's, so
/// two threads would both hold it). A forked child starts with none.
static KEPT_UP: Renewable<std::sync::Mutex<Vec<(u64, u64)>>> = Renewable::new(
    || std::sync::Mutex::new(Vec::new()),
    forget_turns_after_fork,
);

fn forget_turns_after_fork() {
    KEPT_UP.renew();
}

/// This thread's turn at a directory's upkeep, given back when dropped.
struct Turn((u64, u64));

impl Drop for Turn {
    fn drop(&mut self) {
        crate::sync::lock(KEPT_UP.get()).retain(|d| *d != self.0);
    }
}

/// Held while doing upkeep: the directory's lock, and this thread's turn (given back
/// after the lock: its file is closed first).
pub struct Held {
    _lock: Lock,
    _turn: Turn,
}

/// How the directory is held: a POSIX lock on this open file, or a lease.
enum Lock {
    Record(#[allow(dead_code)] std::sync::Arc<File>),
    Lease(#[allow(dead_code)] Lease),
}

/// The upkeep lock of `dir`, when no other process or thread holds it: a POSIX lock, else
/// (the file system refuses them) a lease. A lock or lease file that is not this user's
/// regular file (planted by a group member) is replaced.
pub fn try_lock(dir: &Path) -> Option<Held> {
    let id = std::fs::metadata(dir).map(|m| (m.dev(), m.ino())).ok()?;
    let turn = {
        let mut kept_up = crate::sync::lock(KEPT_UP.get());
        if kept_up.contains(&id) {
            return None;
        }
        kept_up.push(id);
        Turn(id)
    };
    let file = std::sync::Arc::new(open_lock_file(&dir.join("upkeep.lock")).ok()?);
    let lock = match lock_now(id, file.clone()) {
        // A process that could not take the POSIX lock on this file system (a transient
        // refusal, a client mounted otherwise) may hold the lease instead.
        Ok(true) if lease::held_by_another(dir) => return None,
        Ok(true) => Lock::Record(file),
        Ok(false) => return None, // held by another process
        Err(refused) => {
            if !SAID_LEASES.swap(true, std::sync::atomic::Ordering::Relaxed) {
                let why = format!("{}: no POSIX locks ({refused}): leases", dir.display());
                crate::diag::detail("cache", why);
            }
            Lock::Lease(lease::take(dir)?)
        }
    };
    Some(Held {
        _lock: lock,
        _turn: turn,
    })
}

/// A lock file (the upkeep lock, a key's claim), this user's regular file, opened without
/// following a link or blocking. Anything provably not this user's lock file at its name
/// (a link, a directory, a FIFO, another user's file: planted by a group member) is
/// replaced, once; any other failure (no descriptors left, a stale handle) is the answer,
/// and nothing is removed: another process may hold it.
pub(crate) fn open_lock_file(path: &Path) -> Result<File, String> {
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
    };
    let ours = |m: &std::fs::Metadata| m.file_type().is_file() && m.uid() == crate::private::uid();
    let planted = [
        libc::ELOOP,
        libc::EISDIR,
        libc::ENXIO,
        libc::EACCES,
        libc::EPERM,
    ];
    match open() {
        Ok(f) => match f.metadata() {
            Ok(m) if ours(&m) => return Ok(f),
            Ok(_) => {}
            Err(e) => return Err(format!("no lock file: {e}")),
        },
        Err(e) if e.raw_os_error().is_some_and(|c| planted.contains(&c)) => {
            if std::fs::symlink_metadata(path).as_ref().is_ok_and(ours) {
                return Err(format!("no lock file: {e}"));
            }
        }
        Err(e) => return Err(format!("no lock file: {e}")),
    }
    let _ = std::fs::remove_file(path).or_else(|_| std::fs::remove_dir_all(path));
    match open() {
        Ok(f) if f.metadata().is_ok_and(|m| ours(&m)) => Ok(f),
        Ok(_) => Err(format!("{} is not this user's file", path.display())),
        Err(e) => Err(format!("no lock file at {}: {e}", path.display())),
    }
}

/// A POSIX record lock on `file`, a file of the directory `dir` (its device and inode),
/// taken without waiting: Ok(false) when another process holds it, an error when the file
/// system refuses such locks or the call did not answer within `LOCK_DEADLINE` (then the
/// directory is not asked again by this process).
pub(crate) fn lock_now(dir: (u64, u64), file: std::sync::Arc<File>) -> std::io::Result<bool> {
    if crate::sync::lock(HANGING.get()).contains(&dir) {
        return Err(std::io::Error::other(
            "a lock call here did not answer in time",
        ));
    }
    let answer = record_lock_within(file, LOCK_DEADLINE);
    if answer
        .as_ref()
        .is_err_and(|e| e.kind() == std::io::ErrorKind::TimedOut)
    {
        crate::sync::lock(HANGING.get()).push(dir);
    }
    answer
}

/// `record_lock`, answered within `deadline` (else `TimedOut`): the call is made by a
/// thread of its own, left behind when it does not answer (it holds the file, which closes
/// when it returns, letting go of a lock it got late).
fn record_lock_within(
    file: std::sync::Arc<File>,
    deadline: std::time::Duration,
) -> std::io::Result<bool> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let asker = std::thread::Builder::new()
        .name("xpu-zebin-lock".into())
        .spawn(move || {
            let _ = tx.send(record_lock(&file));
        });
    if let Err(e) = asker {
        return Err(std::io::Error::other(format!(
            "no thread to ask for the lock: {e}"
        )));
    }
    rx.recv_timeout(deadline).unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the lock call did not answer within {deadline:?}"),
        ))
    })
}

/// A POSIX record lock on `file`, taken without waiting: Ok(false) when another process
/// holds it, an error when the file system refuses such locks.
fn record_lock(file: &File) -> std::io::Result<bool> {
    // A POSIX record lock, not flock: it belongs to this process, so a child forked while
    // it is held (Python's os.fork, a DataLoader worker) does not keep it for ever; it is
    // released when this file is closed or the process ends.
    // SAFETY: flock is plain data; zeroed, then set, is a valid whole-file write lock.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: fcntl on a descriptor we own, with a valid flock.
    let got = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(file), libc::F_SETLK, &lock) };
    if got == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EACCES | libc::EINTR) => Ok(false),
        _ => Err(e),
    }
}

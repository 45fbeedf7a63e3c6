//! The upkeep lock where the file system refuses POSIX locks (`keeper.rs`): a lease file,
//! `upkeep.lease`, made with `O_EXCL`, that names its holder (host, boot, process) and a
//! random token only the holder knows. It is let go by its holder (removed only while it
//! still carries the holder's token), and taken over when its holder is a process of this
//! host's boot that is gone, or when it is older than `LEASE` (a holder on another host
//! that died). No one waits for it.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long a lease holds: what upkeep under it takes (a slice: milliseconds; a recount
/// of a million entries' cache over a network: a minute or more), with room for clocks
/// that differ between hosts. A lease older than this, or dated further ahead than this,
/// is taken over; at worst two processes then keep the directory up at once, which its
/// accounts survive (a cleaning removes only what it finds, each shard's accounts are
/// set by whoever lists it last).
pub const LEASE: Duration = Duration::from_secs(300);
/// The lease file's name in the directory.
pub const NAME: &str = "upkeep.lease";
/// The most of a lease file read: a holder's line is far shorter.
const MAX_LINE: u64 = 512;

/// Who holds a lease: what its file says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    host: String,
    boot: String,
    pid: u32,
    token: String,
}

/// Random bytes, never blocking: where there is no entropy source, bytes from the clock,
/// the process and `salt`, still unique among the processes of one directory.
pub fn random_bytes<const N: usize>(salt: &str) -> [u8; N] {
    let mut bytes = [0u8; N];
    // SAFETY: getrandom writes at most the buffer's length into it.
    let got =
        unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), libc::GRND_NONBLOCK) };
    if got != bytes.len() as isize {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
        let seed = format!("{:?} {} {salt}", now, std::process::id());
        let mut hash = blake3::Hasher::new();
        hash.update(seed.as_bytes());
        hash.finalize_xof().fill(&mut bytes);
    }
    bytes
}

/// A fresh token only its maker knows: 16 random bytes in hex (`random_bytes`).
pub fn random_token(salt: &str) -> String {
    let bytes: [u8; 16] = random_bytes(salt);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Holder {
    /// This process, with a fresh token.
    fn me() -> Holder {
        let (host, boot) = here();
        let token = random_token(&host);
        Holder {
            host,
            boot,
            pid: std::process::id(),
            token,
        }
    }

    fn line(&self) -> String {
        format!("{} {} {} {}\n", self.host, self.boot, self.pid, self.token)
    }

    /// The holder `text` names: one line of four fields (a file being written, or
    /// anything else, names none).
    fn parse(text: &str) -> Option<Holder> {
        let mut fields = text.strip_suffix('\n')?.split(' ');
        let holder = Holder {
            host: fields.next()?.to_string(),
            boot: fields.next()?.to_string(),
            pid: fields.next()?.parse().ok()?,
            token: fields.next()?.to_string(),
        };
        fields.next().is_none().then_some(holder)
    }

    /// Whether this holder was a process of this host's current boot that is gone.
    fn gone_from_here(&self) -> bool {
        let (host, boot) = here();
        let known = !host.contains(UNKNOWN) && !boot.contains(UNKNOWN);
        if !known || (self.host.as_str(), self.boot.as_str()) != (host.as_str(), boot.as_str()) {
            return false;
        }
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return true;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
        !alive
    }
}

/// What names a host or boot that could not be read: never judged gone.
const UNKNOWN: &str = "unknown";

/// This host's name, and its boot and process namespace (a process id names one process
/// only within both: containers of one pod share a host name and a boot, not their ids).
fn here() -> (String, String) {
    let word = |text: String| {
        let word: String = text.split_whitespace().collect::<Vec<_>>().join("-");
        if word.is_empty() {
            UNKNOWN.to_string()
        } else {
            word
        }
    };
    let read = |p: &str| word(std::fs::read_to_string(p).unwrap_or_default());
    let pids = std::fs::read_link("/proc/self/ns/pid").map(|l| l.display().to_string());
    let boot = format!(
        "{}/{}",
        read("/proc/sys/kernel/random/boot_id"),
        word(pids.unwrap_or_default())
    );
    (read("/proc/sys/kernel/hostname"), boot)
}

/// What is at a lease's name, as one look at one file: its inode and last change, whether
/// it is this user's regular file, and the holder it names.
#[derive(Debug, PartialEq, Eq)]
struct Found {
    ino: u64,
    modified: Option<SystemTime>,
    ours: bool,
    holder: Option<Holder>,
}

/// What is at `path`: a regular file of this user's is opened (never following a link or
/// blocking on a FIFO), its status and holder read from the same open file; anything else
/// is only looked at.
fn look(path: &Path) -> Option<Found> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path);
    let (meta, file) = match opened {
        Ok(file) => (file.metadata().ok()?, Some(file)),
        Err(_) => (std::fs::symlink_metadata(path).ok()?, None),
    };
    let ours = meta.file_type().is_file() && meta.uid() == crate::private::uid();
    let holder = file.filter(|_| ours).and_then(|file| {
        let mut text = String::new();
        file.take(MAX_LINE).read_to_string(&mut text).ok()?;
        Holder::parse(&text)
    });
    Some(Found {
        ino: meta.ino(),
        modified: meta.modified().ok(),
        ours,
        holder,
    })
}

/// A lease held: removed when let go, while it still carries this holder's token.
pub struct Lease {
    path: PathBuf,
    token: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let found = look(&self.path).and_then(|f| f.holder);
        if found.is_some_and(|h| h.token == self.token) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Lease {
    /// Date the lease now, while it is still this holder's: a lease renewed is never
    /// taken over for its age. False when it is no longer this holder's.
    pub fn renew(&self) -> bool {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&self.path);
        let Ok(file) = file else { return false };
        let mut text = String::new();
        let read = (&file).take(MAX_LINE).read_to_string(&mut text);
        let mine = read.is_ok() && Holder::parse(&text).is_some_and(|h| h.token == self.token);
        mine && file.set_modified(SystemTime::now()).is_ok()
    }
}

/// The lease of `dir`, when no one holds it (one whose holder is gone, one older or dated
/// further ahead than `LEASE`, or anything but this user's regular file at its name, is
/// taken over).
pub fn take(dir: &Path) -> Option<Lease> {
    take_at(&dir.join(NAME), LEASE)
}

/// The lease at `path` (a key's claim, `levels::claims`), taken as `take` takes a
/// directory's, over when older than `max_age`.
pub fn take_at(path: &Path, max_age: Duration) -> Option<Lease> {
    let path = path.to_path_buf();
    let dir = path.parent()?;
    match make(&path) {
        Ok(lease) => return lease,
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return None,
        Err(_) => {}
    }
    let Some(seen) = look(&path) else {
        return make(&path).ok().flatten(); // let go meanwhile
    };
    if !stale(&seen, max_age) {
        return None;
    }
    // Moved aside, then checked to be the lease judged stale (its inode, last change and
    // holder), never another process's lease made meanwhile: that one is put back.
    let aside = dir.join(format!(
        "{}stale-lease-{}",
        super::TEMP_PREFIX,
        Holder::me().token
    ));
    std::fs::rename(&path, &aside).ok()?;
    if look(&aside).as_ref() != Some(&seen) {
        if !rename_no_replace(&aside, &path) {
            let _ = std::fs::remove_file(&aside);
        }
        return None;
    }
    // A planted directory is left aside if not empty (named as a temp: never an entry).
    let _ = std::fs::remove_file(&aside).or_else(|_| std::fs::remove_dir(&aside));
    make(&path).ok().flatten()
}

/// Whether some other process holds `dir`'s lease now: its file is this user's, names a
/// holder that may still run, and is not older than `LEASE` (asked by a process that took
/// the POSIX lock, in case another on the same file system could not).
pub fn held_by_another(dir: &Path) -> bool {
    let path = dir.join(NAME);
    look(&path).is_some_and(|seen| !stale(&seen, LEASE))
}

/// Whether a lease found may be taken over (older than `max_age`, its holder gone, or not
/// a lease).
fn stale(found: &Found, max_age: Duration) -> bool {
    let age = found
        .modified
        .map(|t| match SystemTime::now().duration_since(t) {
            Ok(past) => past,
            Err(ahead) => ahead.duration(),
        });
    !found.ours
        || age.is_none_or(|a| a > max_age)
        || found.holder.as_ref().is_some_and(Holder::gone_from_here)
}

/// A new lease at `path` (`Ok(None)`: made, but its holder could not be written, so it
/// was removed again).
fn make(path: &Path) -> std::io::Result<Option<Lease>> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let me = Holder::me();
    if std::io::Write::write_all(&mut &file, me.line().as_bytes()).is_err() {
        let _ = std::fs::remove_file(path);
        return Ok(None);
    }
    Ok(Some(Lease {
        path: path.to_path_buf(),
        token: me.token,
    }))
}

/// Rename `from` to `to` unless `to` exists (`renameat2` with `RENAME_NOREPLACE`, by its
/// system call: older C libraries lack the wrapper); false when not renamed.
fn rename_no_replace(from: &Path, to: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(from), Ok(to)) = (
        std::ffi::CString::new(from.as_os_str().as_bytes()),
        std::ffi::CString::new(to.as_os_str().as_bytes()),
    ) else {
        return false;
    };
    // SAFETY: two NUL-terminated paths, relative to the working directory (both absolute
    // or both the caller's); flags a constant.
    let done = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if done == 0 {
        return true;
    }
    // NFS, Lustre and older FUSE servers take no rename flags (EINVAL): a hard link, which
    // fails if the name exists, then the old name removed.
    let refused = std::io::Error::last_os_error().raw_os_error();
    let from = std::path::Path::new(std::ffi::OsStr::from_bytes(from.as_bytes()));
    let to = std::path::Path::new(std::ffi::OsStr::from_bytes(to.as_bytes()));
    if matches!(refused, Some(libc::EINVAL | libc::ENOSYS)) && std::fs::hard_link(from, to).is_ok()
    {
        let _ = std::fs::remove_file(from);
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_age(path: &Path, age: Duration) {
        let file = std::fs::File::options().append(true).open(path).unwrap();
        file.set_modified(SystemTime::now() - age).unwrap();
    }

    #[test]
    fn one_holder_at_a_time_and_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = take(dir.path()).expect("a free lease is taken");
        assert!(take(dir.path()).is_none(), "a held lease is taken again");
        assert!(held_by_another(dir.path()));
        drop(first);
        assert!(!dir.path().join(NAME).exists(), "a lease let go stays");
        assert!(take(dir.path()).is_some());
    }

    #[test]
    fn a_lease_older_than_its_time_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let old = take(dir.path()).unwrap();
        set_age(&dir.path().join(NAME), LEASE + Duration::from_secs(60));
        let new = take(dir.path()).expect("a stale lease is taken over");
        // The old holder lets go of nothing that is no longer its own.
        drop(old);
        assert!(
            dir.path().join(NAME).exists(),
            "the new holder's lease was removed"
        );
        assert!(take(dir.path()).is_none());
        drop(new);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?} left behind");
    }

    #[test]
    fn a_lease_dated_far_ahead_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let _old = take(dir.path()).unwrap();
        let file = std::fs::File::options()
            .append(true)
            .open(dir.path().join(NAME))
            .unwrap();
        file.set_modified(SystemTime::now() + LEASE + Duration::from_secs(60))
            .unwrap();
        assert!(
            take(dir.path()).is_some(),
            "a clock far ahead holds it forever"
        );
    }

    #[test]
    fn a_lease_of_a_process_gone_from_this_host_is_taken_over_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let mut holder = Holder::me();
        holder.pid = gone;
        std::fs::write(dir.path().join(NAME), holder.line()).unwrap();
        assert!(
            take(dir.path()).is_some(),
            "a dead holder's lease blocks upkeep"
        );
        // A live holder's is kept.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(NAME), Holder::me().line()).unwrap();
        assert!(take(dir.path()).is_none());
    }

    #[test]
    fn anything_planted_at_its_name_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(NAME)).unwrap();
        assert!(
            take(dir.path()).is_some(),
            "a planted directory blocks upkeep"
        );
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join(NAME)).unwrap();
        let lease = take(dir.path()).expect("a planted link blocks upkeep");
        assert!(std::fs::symlink_metadata(dir.path().join(NAME))
            .unwrap()
            .is_file());
        drop(lease);
        assert!(std::fs::metadata("/etc/passwd").is_ok());
    }

    #[test]
    fn a_file_being_written_is_not_taken_over_until_old() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(NAME), b"").unwrap();
        assert!(take(dir.path()).is_none(), "a lease being made is taken");
        set_age(&dir.path().join(NAME), LEASE + Duration::from_secs(1));
        assert!(take(dir.path()).is_some());
    }
}

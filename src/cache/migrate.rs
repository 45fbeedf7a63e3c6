//! Entries of the last layouts, never lost: `zebin-v2` (16 shards, by the key's first hex
//! digit) and `zebin-v1` (one flat directory), beside this layout's directory. They are
//! moved into this layout's shards a slice at a time (each writer's upkeep turn, and each
//! process's first use, moves a bounded number), so no request pays for moving a million
//! entries; a lookup that misses takes its own key's old entry at once. An entry is moved
//! by a hard link and an unlink, never over an entry written here since: a process killed
//! between the two leaves the same entry under both names, and the next slice drops the
//! old name. An entry of this user's that can never come into this layout (too large, or
//! on another file system, where neither a link nor a rename reaches) is removed, never
//! left uncounted for ever: a cache entry is rebuilt by the next compile that needs it. A
//! failure that may pass (a full disk, a shard not writable) leaves it where it is.

use super::ledger::{self, Ledger};
use super::upkeep::{self, shard_name, shard_of};
use super::MAX_ENTRY_BYTES;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The last layouts' directories, newest first.
const OLD_LAYOUTS: [&str; 2] = ["zebin-v2", "zebin-v1"];
/// Shards of `zebin-v2`.
const V2_SHARDS: usize = 16;
/// Entries moved per slice: a few tens of milliseconds of links here.
pub const SLICE: usize = 1024;
/// Names a slice looks at, at most (entries that cannot be moved use no budget).
const LOOK_AT: usize = 16 * SLICE;

/// Whether any last layout's directory is beside `dir` (this layout's).
pub fn any_left(dir: &Path) -> bool {
    let Some(base) = dir.parent() else {
        return false;
    };
    OLD_LAYOUTS.iter().any(|l| base.join(l).is_dir())
}

/// The `zebin-v2` shard of `key`: its first hex digit, else a hash's.
fn v2_shard(key: &str) -> String {
    let digit = match key.get(..1).and_then(|h| u8::from_str_radix(h, 16).ok()) {
        Some(d) => d as usize,
        None => blake3::hash(key.as_bytes()).as_bytes()[0] as usize,
    };
    format!("{:x}", digit % V2_SHARDS)
}

/// Whether an old directory of entries, and the one holding it, are private directories
/// of this user's (entries anyone else may write were never taken, and are not now).
fn private(old: &Path) -> bool {
    let parent = old.parent().unwrap_or(old);
    crate::private::check_dir(parent, 0o002).is_ok()
        && crate::private::check_dir(old, 0o002).is_ok()
}

/// The directories holding the last layouts' entries that may be taken (`private`).
fn old_dirs(base: &Path) -> Vec<PathBuf> {
    let v2 = base.join(OLD_LAYOUTS[0]);
    (0..V2_SHARDS)
        .map(|d| v2.join(format!("{d:x}")))
        .chain([base.join(OLD_LAYOUTS[1])])
        .filter(|d| private(d))
        .collect()
}

/// What moving one old entry did.
#[derive(Debug, PartialEq)]
pub(super) enum Moved {
    /// Moved in (its length): counted now, by the process whose link or rename made it.
    In(u64),
    /// The old name dropped (an entry was already here, or this user's entry can never
    /// come in: removed rather than left uncounted), or nothing to do.
    Dropped,
    /// Left where it is (not this user's entry, not a file, a failure that may pass, or
    /// the very name it would move to).
    Left,
}

/// Move one entry file to `to`, never over an entry there: by a hard link (counted by the
/// process whose link made the name: one killed before counting leaves it to the next
/// recount, as a killed writer does) and an unlink of the old name; where links do not
/// work (AFS, some FUSE and CIFS mounts), by a rename that replaces nothing. An entry
/// already at `to` means the old name is dropped (an entry was written here since, or
/// this is the same file under two names, left by a process killed between its link and
/// its unlink), unless `from` and `to` are one name reached twice (an old directory
/// swapped for a link to this layout's shard), which would lose the entry.
pub(super) fn move_one(from: &Path, to: &Path) -> Moved {
    let Ok(meta) = std::fs::symlink_metadata(from) else {
        return Moved::Dropped; // taken meanwhile
    };
    if !meta.file_type().is_file() || meta.uid() != crate::private::uid() {
        return Moved::Left;
    }
    let Some(shard) = to.parent() else {
        return Moved::Left;
    };
    let _ = std::fs::DirBuilder::new().mode(0o700).create(shard);
    if crate::private::check_dir(shard, 0o002).is_err() {
        return Moved::Left;
    }
    if meta.len() > MAX_ENTRY_BYTES && !one_name(from, to) {
        return drop_old(from); // never an entry of any layout's
    }
    match std::fs::hard_link(from, to) {
        Ok(()) => {
            let _ = std::fs::remove_file(from);
            return Moved::In(meta.len());
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return rename_noreplace(from, to, meta.len()),
    }
    if one_name(from, to) {
        return Moved::Left;
    }
    match std::fs::remove_file(from) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Moved::Left,
        _ => Moved::Dropped,
    }
}

/// Remove the old name of an entry of this user's that cannot come into this layout.
fn drop_old(from: &Path) -> Moved {
    match std::fs::remove_file(from) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Moved::Left,
        _ => Moved::Dropped,
    }
}

/// Whether `a` and `b` are one name (the same file name in one directory, however the
/// directory was reached), or cannot be told apart.
fn one_name(a: &Path, b: &Path) -> bool {
    let dir = |p: &Path| {
        p.parent()
            .and_then(|d| std::fs::metadata(d).ok())
            .map(|m| (m.dev(), m.ino()))
    };
    match (dir(a), dir(b)) {
        (Some(x), Some(y)) => x == y && a.file_name() == b.file_name(),
        _ => true,
    }
}

/// A rename of `from` to `to` that fails rather than replace an entry there.
fn rename_noreplace(from: &Path, to: &Path, len: u64) -> Moved {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(f), Ok(t)) = (
        std::ffi::CString::new(from.as_os_str().as_bytes()),
        std::ffi::CString::new(to.as_os_str().as_bytes()),
    ) else {
        return Moved::Left;
    };
    // SAFETY: two NUL-terminated paths, relative to the working directory.
    let got = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    let failed = std::io::Error::last_os_error().raw_os_error();
    match failed {
        _ if got == 0 => Moved::In(len),
        // An entry is here already: the old one goes, unless it is this very name.
        Some(libc::EEXIST) if !one_name(from, to) => match std::fs::remove_file(from) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Moved::Left,
            _ => Moved::Dropped,
        },
        // No RENAME_NOREPLACE on this file system: a plain rename, when nothing is there
        // (a write of this key in between is replaced by the old entry: both are its).
        Some(libc::EINVAL | libc::ENOSYS) if std::fs::symlink_metadata(to).is_err() => {
            match std::fs::rename(from, to) {
                Ok(()) => Moved::In(len),
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => drop_old(from),
                Err(_) => Moved::Left,
            }
        }
        // Another file system: it can never come in. Any other failure (a full disk, a
        // shard not writable, a passing I/O error) leaves it for a later slice.
        Some(libc::EXDEV) => drop_old(from),
        _ => Moved::Left,
    }
}

/// Take `key`'s entry of a last layout into `dir` (a lookup that missed), counted in
/// `ledger`; true when one was moved.
pub fn take(dir: &Path, ledger: &Ledger, key: &str) -> bool {
    let Some(base) = dir.parent() else {
        return false;
    };
    let name = format!("{key}.zeentry");
    let shard = shard_of(key);
    let to = dir.join(shard_name(shard)).join(&name);
    for old in [
        base.join(OLD_LAYOUTS[0]).join(v2_shard(key)),
        base.join(OLD_LAYOUTS[1]),
    ] {
        if private(&old) {
            if let Moved::In(len) = move_one(&old.join(&name), &to) {
                ledger.add(shard, len as i64, 1);
                return true;
            }
        }
    }
    false
}

/// Move up to `budget` entries of the last layouts into `dir`, each counted in `ledger`;
/// true when some may be left to move (the budget ran out). Entries that cannot be moved
/// do not use the budget, but no more than `LOOK_AT` names are looked at: a slice that
/// moved nothing says none is left, for this process. When the old directories hold
/// nothing more, they are removed, with their ledger and lock (taken first, so that a
/// process of an older release still cleaning there keeps them).
pub fn slice(dir: &Path, ledger: &Ledger, mut budget: usize) -> bool {
    let Some(base) = dir.parent() else {
        return false;
    };
    let (mut looked, mut moved) = (0usize, false);
    for old in old_dirs(base) {
        let Ok(entries) = std::fs::read_dir(&old) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name();
            let Some(key) = name.to_str().and_then(|n| n.strip_suffix(".zeentry")) else {
                continue;
            };
            if budget == 0 || looked >= LOOK_AT.max(budget.saturating_mul(16)) {
                return moved;
            }
            looked += 1;
            let shard = shard_of(key);
            match move_one(&entry.path(), &dir.join(shard_name(shard)).join(&name)) {
                Moved::In(len) => ledger.add(shard, len as i64, 1),
                Moved::Dropped => {}
                Moved::Left => continue,
            }
            (budget, moved) = (budget - 1, true);
        }
        upkeep::sweep(&old); // dead writers' temp files, so that it can go
        let _ = std::fs::remove_dir(&old); // when empty
    }
    for layout in OLD_LAYOUTS {
        let old = base.join(layout);
        let shards_left = (0..V2_SHARDS).any(|d| old.join(format!("{d:x}")).exists());
        if shards_left || crate::private::check_dir(&old, 0o002).is_err() {
            continue;
        }
        if let Some(_held) = super::keeper::try_lock(&old) {
            ledger::remove(&old);
            upkeep::sweep(&old);
            let _ = std::fs::remove_file(old.join("upkeep.lock"));
        }
        let _ = std::fs::remove_dir(&old); // when nothing else is left in it
    }
    false
}

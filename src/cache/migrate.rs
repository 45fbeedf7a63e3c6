//! Entries of the last layouts, never lost: `zebin-v2` (16 shards, by the key's first hex
//! digit) and `zebin-v1` (one flat directory), beside this layout's directory. They are
//! moved into this layout's shards a slice at a time (each writer's upkeep turn, and each
//! process's first use, moves a bounded number), so no request pays for moving a million
//! entries; a lookup that misses takes its own key's old entry at once. An entry is moved
//! by a hard link and an unlink, never over an entry written here since: a process killed
//! between the two leaves the same entry under both names, and the next slice drops the
//! old name.

use super::ledger::{self, Ledger};
use super::upkeep::{self, shard_name, shard_of};
use super::MAX_ENTRY_BYTES;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The last layouts' directories, newest first.
const OLD_LAYOUTS: [&str; 2] = ["zebin-v2", "zebin-v1"];
/// Shards of `zebin-v2`.
const V2_SHARDS: usize = 16;
/// Entries looked at per slice: a few tens of milliseconds of renames here.
pub const SLICE: usize = 1024;

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

/// The directories holding the last layouts' entries, each a private directory of this
/// user's (entries anyone else may write were never taken, and are not now).
fn old_dirs(base: &Path) -> Vec<PathBuf> {
    let v2 = base.join(OLD_LAYOUTS[0]);
    (0..V2_SHARDS)
        .map(|d| v2.join(format!("{d:x}")))
        .chain([base.join(OLD_LAYOUTS[1])])
        .filter(|d| {
            let parent = d.parent().unwrap_or(d);
            crate::private::check_dir(parent, 0o002).is_ok()
                && crate::private::check_dir(d, 0o002).is_ok()
        })
        .collect()
}

/// Move one entry file to `to`: its length when moved; None when it is not this user's
/// entry, or an entry is already at `to` (the old name is then dropped: the entry here
/// was written since, or is this very one, linked by a process killed before its unlink).
fn move_one(from: &Path, to: &Path) -> Option<u64> {
    let meta = std::fs::symlink_metadata(from).ok()?;
    if !meta.file_type().is_file()
        || meta.uid() != crate::private::uid()
        || meta.len() > MAX_ENTRY_BYTES
    {
        return None;
    }
    if let Some(shard) = to.parent() {
        let _ = std::fs::DirBuilder::new().mode(0o700).create(shard);
    }
    match std::fs::hard_link(from, to) {
        Ok(()) => {
            let _ = std::fs::remove_file(from);
            Some(meta.len())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_file(from);
            None
        }
        Err(_) => None,
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
        let private = crate::private::check_dir(&old, 0o002).is_ok()
            && old
                .parent()
                .is_some_and(|p| crate::private::check_dir(p, 0o002).is_ok());
        if private {
            if let Some(len) = move_one(&old.join(&name), &to) {
                ledger.add(shard, len as i64, 1);
                return true;
            }
        }
    }
    false
}

/// Move up to `budget` entries of the last layouts into `dir`, each counted in `ledger`;
/// true when some may be left (the budget ran out). When none is left, the emptied old
/// directories are removed with their ledgers and locks.
pub fn slice(dir: &Path, ledger: &Ledger, mut budget: usize) -> bool {
    let Some(base) = dir.parent() else {
        return false;
    };
    for old in old_dirs(base) {
        let Ok(entries) = std::fs::read_dir(&old) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name();
            let Some(key) = name.to_str().and_then(|n| n.strip_suffix(".zeentry")) else {
                continue;
            };
            if budget == 0 {
                return true;
            }
            budget -= 1;
            let shard = shard_of(key);
            let to = dir.join(shard_name(shard)).join(&name);
            if let Some(len) = move_one(&entry.path(), &to) {
                ledger.add(shard, len as i64, 1);
            }
        }
        upkeep::sweep(&old); // dead writers' temp files, so that it can go
        let _ = std::fs::remove_dir(&old); // when empty
    }
    for layout in OLD_LAYOUTS {
        let old = base.join(layout);
        if crate::private::check_dir(&old, 0o002).is_ok() {
            ledger::remove(&old);
            upkeep::sweep(&old);
            let _ = std::fs::remove_file(old.join("upkeep.lock"));
            let _ = std::fs::remove_dir(&old); // when nothing else is left in it
        }
    }
    false
}

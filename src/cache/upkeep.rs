//! Keeping a cache directory within its bound, at any size: no write lists the directory.
//! The ledger (`ledger.rs`) says how large the cache is; when it is over its bound, the
//! largest shards are cleaned, least recently used entries first (each shard's entries by
//! last use: LRU within a shard, shards chosen by size, as ccache does), down to nine
//! tenths of the bound. Upkeep runs under an advisory lock taken without waiting: a
//! process that finds it taken leaves the work to the one holding it, and a holder that
//! dies lets go with its file. Entries of the last layout (`zebin-v1`, one flat
//! directory) are moved into their shards, never lost.

use super::ledger::{Counter, Ledger, SHARDS};
use super::{ABANDONED_TEMP, TEMP_PREFIX};
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The name of shard `shard`'s directory.
pub fn shard_name(shard: usize) -> String {
    format!("{:x}", shard % SHARDS)
}

/// The shard of `key`: its first hex digit (keys are blake3 in hex), else a hash's.
pub fn shard_of(key: &str) -> usize {
    match key.get(..1).and_then(|h| usize::from_str_radix(h, 16).ok()) {
        Some(s) => s,
        None => blake3::hash(key.as_bytes()).as_bytes()[0] as usize % SHARDS,
    }
}

/// The upkeep lock of `dir`, when no other process holds it.
pub fn try_lock(dir: &Path) -> Option<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join("upkeep.lock"))
        .ok()?;
    // SAFETY: flock on a descriptor we own; released when the file is closed.
    let got = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    (got == 0).then_some(file)
}

/// One entry on disk: when last used, its size, where.
type Found = (SystemTime, u64, PathBuf);

/// The entries of shard `shard` (a dead writer's temp file is removed on the way), and
/// the ledger set to what they hold.
pub fn recount(dir: &Path, ledger: &Ledger, shard: usize) -> Vec<Found> {
    let mut found = Vec::new();
    let now = SystemTime::now();
    if let Ok(entries) = std::fs::read_dir(dir.join(shard_name(shard))) {
        for entry in entries.filter_map(|e| e.ok()) {
            let (path, Ok(m)) = (entry.path(), entry.metadata()) else {
                continue;
            };
            let Ok(modified) = m.modified() else { continue };
            if path.extension().is_some_and(|x| x == "zeentry") && m.file_type().is_file() {
                found.push((modified, m.len(), path));
            } else if entry
                .file_name()
                .as_encoded_bytes()
                .starts_with(TEMP_PREFIX.as_bytes())
                && now.duration_since(modified).unwrap_or_default() > ABANDONED_TEMP
            {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let bytes = found.iter().fold(0u64, |t, f| t.saturating_add(f.1));
    ledger.set_shard(shard, bytes, found.len() as u64);
    found
}

/// Remove least recently used entries until the cache holds at most nine tenths of
/// `max_bytes`; the number removed.
pub fn clean(dir: &Path, ledger: &Ledger, max_bytes: u64) -> u64 {
    let target = max_bytes - max_bytes / 10;
    let mut removed = 0;
    for _ in 0..2 * SHARDS {
        if ledger.bytes() <= target {
            break;
        }
        let largest = (0..SHARDS)
            .max_by_key(|s| ledger.shard_bytes(*s))
            .unwrap_or(0);
        let mut found = recount(dir, ledger, largest);
        if found.is_empty() {
            recount_all(dir, ledger); // the ledger had drifted
            continue;
        }
        found.sort();
        for (_, len, path) in found {
            if ledger.bytes() <= target {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                ledger.add(largest, -(len as i64), -1);
                removed += 1;
            }
        }
    }
    ledger.count(Counter::Evictions, removed);
    removed
}

pub fn recount_all(dir: &Path, ledger: &Ledger) {
    for shard in 0..SHARDS {
        recount(dir, ledger, shard);
    }
}

/// Move the entries of the last layout (`old`, one flat directory) into their shards of
/// `dir`; true when any was moved (the ledger must then be recounted).
pub fn migrate(old: &Path, dir: &Path) -> bool {
    if crate::private::check_dir(old, 0o002).is_err() {
        return false; // none, or not this user's alone: its entries were never taken
    }
    let Ok(entries) = std::fs::read_dir(old) else {
        return false;
    };
    let mut moved = false;
    for entry in entries.filter_map(|e| e.ok()) {
        let path = entry.path();
        let Some(key) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".zeentry"))
        else {
            continue;
        };
        let shard = dir.join(shard_name(shard_of(key)));
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&shard);
        if made.is_ok() && std::fs::rename(&path, shard.join(format!("{key}.zeentry"))).is_ok() {
            moved = true;
        }
    }
    let _ = std::fs::remove_dir(old); // when empty: nothing of it is left to read
    moved
}

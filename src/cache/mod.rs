//! Content-addressed native-binary cache, flat in cost at any size.
//!
//! Entries live in 256 shards (`zebin-v3/<the key's first two hex digits>/`); the
//! directory's accounts (bytes, entries, counters) are one shared mapped file
//! (`ledger.rs`), so a write never lists the directory: when the ledger says the cache is
//! over its bound, `upkeep.rs` removes the least recently used entries. The last layouts'
//! entries are moved in a slice at a time (`migrate.rs`). Where hosts share the directory,
//! each publishes its words there and reads the others' (`hosts.rs`).
//!
//! One file per key, its bytes an entry (`entry.rs`: compressed, checksummed over its key
//! so that an entry renamed onto another key never answers for another kernel).
//! Writes go to a temp file in the same directory and are renamed into place, so readers in
//! other processes see either nothing or a whole entry. A checksum mismatch means a torn or
//! tampered entry: it is removed and reported, and the caller recompiles. Nothing here may
//! fail a compile; every problem comes back as a note.

mod entry;
mod hosts;
pub(crate) mod keeper;
pub(crate) mod lease;
mod ledger;
mod migrate;
pub mod stats;
mod upkeep;

pub use entry::{
    decode, decode_within, encode, encode_plain, is_compressed, is_plain, uncompressed_len,
};
use ledger::Round;
pub use ledger::{Counter, Ledger};

use crate::private;
use crate::sync::{lock, Renewable};
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Environment variable for the cache directory (default: the user cache dir).
pub const CACHE_DIR_ENV: &str = "XPU_ZEBIN_CACHE_DIR";
/// Environment variable for the size bound in bytes (default 1 GiB).
pub const CACHE_MAX_ENV: &str = "XPU_ZEBIN_CACHE_MAX_BYTES";
const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// An entry being written; renamed into place when whole.
pub(crate) const TEMP_PREFIX: &str = ".tmp-";
/// A temp file untouched this long belongs to a writer that died (an entry is a few MB
/// written in one go); it is removed.
pub(crate) const ABANDONED_TEMP: Duration = Duration::from_secs(3600);
/// This layout's directory (the last layouts' entries are moved from theirs, never lost).
const LAYOUT: &str = "zebin-v3";
/// No entry is larger (a zebin is a few MB): a bigger file is not an entry, and is never
/// read into memory whole.
pub const MAX_ENTRY_BYTES: u64 = 256 << 20;

/// A path-valued variable, unset when empty or blank (as every knob is read).
fn path_var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.to_string_lossy().trim().is_empty())
        .map(PathBuf::from)
}

/// The cache directory: `$XPU_ZEBIN_CACHE_DIR`, else `$XDG_CACHE_HOME/xpu-zebin`, else
/// `~/.cache/xpu-zebin`, else (no home) `cache` in the package's private temp directory,
/// made and checked as private (`Err` says why it cannot be used).
pub fn default_dir() -> Result<PathBuf, String> {
    if let Some(dir) = path_var(CACHE_DIR_ENV) {
        return Ok(dir);
    }
    match path_var("XDG_CACHE_HOME").or_else(|| path_var("HOME").map(|h| h.join(".cache"))) {
        Some(base) => Ok(base.join("xpu-zebin")),
        None => private::subdir("cache"),
    }
}

fn max_bytes() -> u64 {
    // A bad value fails the request before it gets here (`knobs::check`).
    crate::knobs::bytes_knob(CACHE_MAX_ENV, DEFAULT_MAX_BYTES).unwrap_or(DEFAULT_MAX_BYTES)
}

/// A key: blake3 over every input that can change the output.
pub fn key(parts: &[&[u8]]) -> String {
    let mut hasher = blake3::Hasher::new();
    for part in parts {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.finalize().to_hex().to_string()
}

#[derive(Clone)]
pub struct Cache {
    dir: PathBuf,
    pub(crate) max_bytes: u64,
    /// Why this directory is not used, when another user could write into it.
    refused: Option<String>,
}

impl Cache {
    /// The cache in `dir` (default: [`default_dir`]). Its entries directory must belong to
    /// this user and not be world-writable (a group may share it); otherwise the cache is
    /// off for this request, said once as a warning: entries anyone may write are not
    /// trusted.
    pub fn open(dir: Option<&Path>) -> Cache {
        let (dir, refused) = match dir.map(Path::to_path_buf).map_or_else(default_dir, Ok) {
            Ok(base) => {
                let dir = base.join(LAYOUT);
                let refused = match std::fs::symlink_metadata(&dir) {
                    Err(_) => None, // made by the first put, 0700
                    Ok(_) => private::check_dir(&dir, 0o002).err(),
                };
                (dir, refused)
            }
            Err(why) => (private::base().join("cache").join(LAYOUT), Some(why)),
        };
        if let Some(why) = &refused {
            // Said once per reason (each names its directory).
            let message = format!("the binary cache is off: {why}");
            crate::diag::warn_once(&message, message.clone());
        }
        Cache {
            dir,
            max_bytes: max_bytes(),
            refused,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether this directory is used (not refused as writable by others).
    pub fn in_service(&self) -> bool {
        self.refused.is_none()
    }

    /// (entries, bytes) stored now, as the ledger counts them (recounted first when
    /// unknown; nothing is evicted by asking), or as listed when there is no ledger.
    pub fn usage(&self) -> (u64, u64) {
        match self.ledger() {
            Some(l) => {
                let mut read = false;
                if l.unknown_generation() != 0 {
                    if let Some(_held) = keeper::try_lock(&self.dir) {
                        // As `recount`: the others' words read under the lock first.
                        read = hosts::step(&self.dir, &l, hosts::Step::Fresh);
                        if read {
                            upkeep::recount_all(&self.dir, &l);
                            hosts::publish_now(&self.dir, &l); // before the lock goes
                        }
                    }
                }
                if !read {
                    hosts::step(&self.dir, &l, hosts::Step::Fresh); // every host's words now
                }
                hosts::publish(&self.dir, &l, true);
                (l.entries(), l.bytes())
            }
            None => upkeep::listed(&self.dir),
        }
    }

    /// Count every shard again, now (waiting for no one: false when another process holds
    /// the upkeep lock); the last layouts' entries are all moved in first.
    pub fn recount(&self) -> bool {
        let Some((in_use, _)) = self.in_use() else {
            return false;
        };
        let Some(_held) = keeper::try_lock(&self.dir) else {
            return false;
        };
        self.move_old(&in_use, usize::MAX);
        let ledger = &in_use.ledger;
        // Gone hosts' files folded, as a write's recount does, before the pass. What the
        // other hosts account for, now: a shard's count takes the rest.
        hosts::fold_gone(&self.dir, ledger);
        if !hosts::step(&self.dir, ledger, hosts::Step::Fresh) {
            return false;
        }
        upkeep::recount_all(&self.dir, ledger);
        hosts::publish_now(&self.dir, ledger); // before the lock goes
        true
    }

    /// Publish this host's counts (at once after a compile, `urgent`; at most every
    /// `hosts::PUBLISH_EVERY` otherwise), for the other hosts sharing the directory.
    pub fn publish_counts(&self, ledger: &Ledger, urgent: bool) {
        hosts::publish(&self.dir, ledger, urgent);
    }

    /// The counters of every host that used the directory, less the zero last set;
    /// `zero`: set the zero now.
    pub fn counters(&self, zero: bool) -> Vec<(Counter, u64)> {
        match self.in_use() {
            Some((in_use, _)) => hosts::counters(&self.dir, &in_use.ledger, zero),
            None => Counter::ALL.iter().map(|&c| (c, 0)).collect(),
        }
    }

    /// This directory's ledger (one per process and directory, made on first use); None
    /// while the directory does not exist or is refused.
    pub fn ledger(&self) -> Option<Arc<Ledger>> {
        self.in_use().map(|(in_use, _)| in_use.ledger.clone())
    }

    /// The ledger that counts a request's answer, the directory made (0700) on its first
    /// use: a request answered without a write (a bundle's hit, a refusal) still counts.
    pub fn ledger_to_count(&self) -> Option<Arc<Ledger>> {
        self.ledger().or_else(|| {
            let missing = std::fs::symlink_metadata(&self.dir).is_err();
            if self.refused.is_some() || !missing {
                return None;
            }
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir);
            self.ledger()
        })
    }

    /// This directory as this process uses it, and whether that began now. On first use
    /// its ledger is mapped, and a slice of the last layouts' entries moved in.
    fn in_use(&self) -> Option<(Arc<InUse>, bool)> {
        if self.refused.is_some() {
            return None;
        }
        if let Some(found) = lock(LEDGERS.get()).get(&self.dir) {
            // The same file still: a directory removed and made again has a new ledger.
            if found.ledger.is_at(&self.dir) {
                return Some((found.clone(), false));
            }
        }
        let old_left = migrate::any_left(&self.dir);
        if old_left {
            // An upgrade: this layout's directory is made now, to move the old ones in.
            let _ = std::fs::DirBuilder::new().mode(0o700).create(&self.dir);
        }
        if private::check_dir(&self.dir, 0o002).is_err() {
            return None;
        }
        let in_use = Arc::new(InUse {
            ledger: Arc::new(Ledger::open(&self.dir).ok()?),
            old_seen: old_left,
            old_left: AtomicBool::new(old_left),
        });
        lock(LEDGERS.get()).insert(self.dir.clone(), in_use.clone());
        if old_left {
            if let Some(_held) = keeper::try_lock(&self.dir) {
                self.move_old(&in_use, migrate::SLICE);
            }
        }
        Some((in_use, true))
    }

    /// Move up to `budget` of the last layouts' entries in (the caller holds the upkeep
    /// lock, so that no recount runs meanwhile).
    fn move_old(&self, in_use: &InUse, budget: usize) {
        if !migrate::slice(&self.dir, &in_use.ledger, budget) {
            in_use.old_left.store(false, Ordering::Relaxed);
        }
    }

    /// After a miss: whether to look again, because this process had not used the
    /// directory before (a slice of the last layouts was just moved in), or `key`'s own
    /// entry of a last layout was moved in now.
    fn take_old(&self, key: &str) -> bool {
        let Some((in_use, made)) = self.in_use() else {
            return false;
        };
        let taken = in_use.old_seen && migrate::take(&self.dir, &in_use.ledger, key);
        made || taken
    }

    /// What the ledger asks after a write: accounts rebuilt a slice at a time when
    /// unknown, one shard recounted now and then, a slice of the last layouts moved in, a slice of a cleaning
    /// when over the bound or in one. A note says what was evicted. Skipped while another
    /// process does it.
    fn upkeep(&self, in_use: &InUse) -> Option<String> {
        let ledger = &in_use.ledger;
        hosts::step(&self.dir, ledger, hosts::Step::Write);
        let recount = ledger.shard_due_after_write();
        let over = ledger.bytes() > self.max_bytes;
        let unknown = ledger.unknown_generation();
        let old_left = in_use.old_left.load(Ordering::Relaxed);
        let cleaning = ledger.round().is_some();
        if recount.is_none() && !over && unknown == 0 && !old_left && !cleaning {
            return None;
        }
        let Some(_held) = keeper::try_lock(&self.dir) else {
            return None; // the process that holds the lock does it, or the next writer
        };
        if recount.is_some() {
            // Now and then, as a shard is recounted: before the pass, which then reads
            // the fold with what it took.
            hosts::fold_gone(&self.dir, ledger);
        }
        // Every other host's words as they are now (a pass begun under the lock): accounts
        // set from a listing take the rest, and this host's are published before the lock
        // goes, for the next holder, of any host, to read. Without them, nothing is set.
        if !hosts::step(&self.dir, ledger, hosts::Step::Fresh) {
            return None;
        }
        let note = self.upkeep_held(in_use, recount);
        hosts::publish_now(&self.dir, ledger);
        note
    }

    /// `upkeep`'s work, with the upkeep lock held.
    fn upkeep_held(&self, in_use: &InUse, recount: Option<usize>) -> Option<String> {
        let ledger = &in_use.ledger;
        let old_left = in_use.old_left.load(Ordering::Relaxed);
        if old_left {
            self.move_old(in_use, migrate::SLICE);
        }
        // Read again under the lock: the last holder may have begun a walk or a round.
        let (unknown, cleaning) = (ledger.unknown_generation(), ledger.round().is_some());
        let walking = unknown != 0 && !cleaning;
        if walking {
            // A new or lost ledger (a fresh boot, a restored directory): its accounts are
            // rebuilt by a round that only walks, a slice per write like any cleaning, so
            // that no write lists the whole cache; its end makes them known.
            upkeep::sweep(&self.dir);
            upkeep::sweep(&self.dir.join(hosts::DIR));
            ledger.set_round(Some(&Round::walk()));
        } else if let (Some(shard), 0) = (recount, unknown) {
            upkeep::recount(&self.dir, ledger, shard);
        }
        if !cleaning && !walking && ledger.bytes() <= self.max_bytes {
            return None;
        }
        let mut removed = upkeep::clean(&self.dir, ledger, self.max_bytes, upkeep::SLICE_ENTRIES);
        if walking && ledger.round().is_none() && ledger.bytes() > self.max_bytes {
            // The walk ended in this slice (a small cache) and found the cache over its
            // bound: its cleaning starts now, one more slice.
            removed += upkeep::clean(&self.dir, ledger, self.max_bytes, upkeep::SLICE_ENTRIES);
        }
        (removed > 0).then(|| {
            format!(
                "cache over {} bytes: evicted {removed} least recently used entries",
                self.max_bytes
            )
        })
    }

    fn shard_dir(&self, key: &str) -> PathBuf {
        self.dir.join(upkeep::shard_name(upkeep::shard_of(key)))
    }

    fn path(&self, key: &str) -> PathBuf {
        self.shard_dir(key).join(format!("{key}.zeentry"))
    }

    /// The entry of `key` is gone (removed as corrupt or refused): the ledger says so.
    fn forget(&self, key: &str, len: u64) {
        if let Some(l) = self.ledger() {
            l.add(upkeep::shard_of(key), -(len as i64), -1);
        }
    }

    /// An entry's bytes: a regular file of this user's, not larger than an entry can be,
    /// opened without following links or blocking.
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        let file = private::open_file(path, false, false)?;
        let meta = file.metadata()?;
        if meta.uid() != private::uid() {
            return Err(std::io::Error::other(format!(
                "it belongs to user {}, not to this user: entries are only taken from this user",
                meta.uid()
            )));
        }
        if meta.len() > MAX_ENTRY_BYTES {
            return Err(std::io::Error::other(format!(
                "{} bytes, more than an entry can be ({MAX_ENTRY_BYTES})",
                meta.len()
            )));
        }
        // Sized by the file (at most MAX_ENTRY_BYTES, checked above), read in one go.
        let mut bytes = Vec::with_capacity(meta.len() as usize + 1);
        file.take(MAX_ENTRY_BYTES).read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// `key`'s entry as stored, not yet checked (`decode` checks it), marked as used; None
    /// when there is none, the note when it cannot be read.
    pub fn read_entry(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        if self.refused.is_some() {
            return Ok(None);
        }
        let path = self.path(key);
        let mut read = self.read(&path);
        let missed = |r: &std::io::Result<_>| {
            r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        };
        if missed(&read) && self.take_old(key) {
            read = self.read(&path);
        }
        match read {
            Ok(bytes) => {
                // Mark as recently used for eviction; failure to do so is harmless.
                let _ = private::open_file(&path, true, false)
                    .and_then(|f| f.set_modified(SystemTime::now()));
                Ok(Some(bytes))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!(
                "cache entry {} not used: {e}; it is rebuilt",
                path.display()
            )),
        }
    }

    /// `key`'s entry, `len` bytes as read, is not `key`'s (`why`: torn, altered, renamed):
    /// removed and counted. The note that says so.
    pub fn refuse(&self, key: &str, len: u64, why: &str) -> String {
        let path = self.path(key);
        if std::fs::remove_file(&path).is_ok() {
            self.forget(key, len);
        }
        if let Some(l) = self.ledger() {
            l.count(Counter::RefusedChecksum, 1);
        }
        format!(
            "cache entry {} was corrupt ({why}); removed",
            path.display()
        )
    }

    /// An entry's bytes as stored, when they are a valid entry of `key` (this user's,
    /// bounded, checksum over key and body): what a node shares with its fleet.
    pub fn raw(&self, key: &str) -> Option<Vec<u8>> {
        if self.refused.is_some() {
            return None;
        }
        let path = self.path(key);
        let bytes = match self.read(&path) {
            Ok(b) => b,
            Err(_) if self.take_old(key) => self.read(&path).ok()?,
            Err(_) => return None,
        };
        decode::<serde::de::IgnoredAny>(key, &bytes).ok()?;
        Some(bytes)
    }

    /// Remove an entry (one the driver refused); false when there was none or it could
    /// not be removed (a directory that fails its check is never written to).
    pub fn remove(&self, key: &str) -> bool {
        if self.refused.is_some() || private::check_dir(&self.dir, 0o002).is_err() {
            return false;
        }
        let path = self.path(key);
        let len = std::fs::symlink_metadata(&path).map(|m| m.len());
        let removed = std::fs::remove_file(&path).is_ok();
        if let (true, Ok(len)) = (removed, len) {
            self.forget(key, len);
        }
        removed
    }

    /// Store `entry`, the bytes of `key`'s entry (`encode`); `durable`: synced to disk (a
    /// fresh build; a copy of an entry kept elsewhere is fetched again if lost). A note
    /// when it could not be stored (the compile still succeeds).
    pub fn put_entry(&self, key: &str, entry: &[u8], durable: bool) -> Option<String> {
        if self.refused.is_some() {
            return None;
        }
        if entry.len() as u64 > MAX_ENTRY_BYTES {
            return Some(format!(
                "not cached: {} bytes is more than an entry may hold",
                entry.len()
            ));
        }
        let shard = self.shard_dir(key);
        let result = (|| -> std::io::Result<(i64, i64)> {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&shard)?;
            // Checked again now, not only at open: a compile takes long enough for the
            // directory to be swapped for someone else's (or a link to it).
            private::check_dir(&self.dir, 0o002).map_err(std::io::Error::other)?;
            private::check_dir(&shard, 0o002).map_err(std::io::Error::other)?;
            let mut tmp = tempfile::Builder::new()
                .prefix(TEMP_PREFIX)
                .tempfile_in(&shard)?;
            use std::io::Write;
            tmp.write_all(entry)?;
            if durable {
                tmp.as_file().sync_data()?;
            }
            let path = self.path(key);
            // A new entry counts once, however many processes write its key at once: the
            // first rename makes it, the others replace it.
            match tmp.persist_noclobber(&path) {
                Ok(_) => Ok((entry.len() as i64, 1)),
                Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {
                    let old = std::fs::symlink_metadata(&path).map_or(0, |m| m.len());
                    e.file.persist(&path).map_err(|e| e.error)?;
                    Ok((entry.len() as i64 - old as i64, 0))
                }
                Err(e) => Err(e.error),
            }
        })();
        match result {
            Ok((grown, new)) => match self.in_use() {
                Some((in_use, _)) => {
                    in_use.ledger.add(upkeep::shard_of(key), grown, new);
                    // What entries written take on disk against what they hold: the ratio
                    // `stats` shows (a failure's entry is no kernel's, but counts alike).
                    let held = uncompressed_len(entry).unwrap_or(entry.len() as u64);
                    in_use
                        .ledger
                        .count(Counter::WrittenBytes, entry.len() as u64);
                    in_use.ledger.count(Counter::WrittenUncompressedBytes, held);
                    self.upkeep(&in_use)
                }
                // No ledger here (a file system without shared maps, a name taken): the
                // bound is still held, by listing the cache (its cost grows with it).
                None => upkeep::evict_listed(&self.dir, self.max_bytes),
            },
            Err(e) => Some(format!("cache write to {} failed: {e}", self.dir.display())),
        }
    }
}

/// A cache directory as this process uses it: its ledger, and whether the last layouts
/// may still hold entries to move in.
struct InUse {
    ledger: Arc<Ledger>,
    /// A last layout was there at first use: a miss looks for its key's old entry.
    old_seen: bool,
    /// Slices may still move entries in.
    old_left: AtomicBool,
}

/// Directories in use: one ledger mapping per process and directory (a forked child keeps
/// its parent's mappings, which stay valid, and makes its own map).
static LEDGERS: Renewable<Mutex<HashMap<PathBuf, Arc<InUse>>>> =
    Renewable::new(|| Mutex::new(HashMap::new()), forget_ledgers_after_fork);

fn forget_ledgers_after_fork() {
    LEDGERS.renew();
}

#[cfg(test)]
mod tests;

//! Content-addressed native-binary cache.
//!
//! One file per key: `MAGIC | meta length (u32 LE) | meta JSON | binary | checksum`, the
//! checksum blake3 over the key and everything before it: an entry renamed onto another
//! key (by anyone who may write the directory) fails it, so it never answers for another
//! kernel.
//! Writes go to a temp file in the same directory and are renamed into place, so readers in
//! other processes see either nothing or a whole entry. A checksum mismatch means a torn or
//! tampered entry: it is removed and reported, and the caller recompiles. Nothing here may
//! fail a compile; every problem comes back as a note.

use crate::private;
use serde::{de::DeserializeOwned, Serialize};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

const MAGIC: &[u8; 8] = b"XZCACHE2";
const CHECKSUM_BYTES: usize = 32;
/// Environment variable for the cache directory (default: the user cache dir).
pub const CACHE_DIR_ENV: &str = "XPU_ZEBIN_CACHE_DIR";
/// Environment variable for the size bound in bytes (default 1 GiB).
pub const CACHE_MAX_ENV: &str = "XPU_ZEBIN_CACHE_MAX_BYTES";
const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// An entry being written; renamed into place when whole.
const TEMP_PREFIX: &str = ".tmp-";
/// A temp file untouched this long belongs to a writer that died (an entry is a few MB
/// written in one go); it is removed.
const ABANDONED_TEMP: Duration = Duration::from_secs(3600);
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
    max_bytes: u64,
    /// Why this directory is not used, when another user could write into it.
    refused: Option<String>,
}

/// What a lookup found.
pub enum Lookup<M> {
    Hit(M, Vec<u8>),
    Miss,
    /// The entry was unreadable or failed its checksum; it has been removed.
    Corrupt(String),
}

impl Cache {
    /// The cache in `dir` (default: [`default_dir`]). Its entries directory must belong to
    /// this user and not be world-writable (a group may share it); otherwise the cache is
    /// off for this request, said once as a warning: entries anyone may write are not
    /// trusted.
    pub fn open(dir: Option<&Path>) -> Cache {
        let (dir, refused) = match dir.map(Path::to_path_buf).map_or_else(default_dir, Ok) {
            Ok(base) => {
                let dir = base.join("zebin-v1");
                let refused = match std::fs::symlink_metadata(&dir) {
                    Err(_) => None, // made by the first put, 0700
                    Ok(_) => private::check_dir(&dir, 0o002).err(),
                };
                (dir, refused)
            }
            Err(why) => (private::base().join("cache").join("zebin-v1"), Some(why)),
        };
        if let Some(why) = &refused {
            crate::diag::warn_once(
                &format!("cache:{}", dir.display()),
                format!("the binary cache is off: {why}"),
            );
        }
        Cache {
            dir,
            max_bytes: max_bytes(),
            refused,
        }
    }

    pub fn with_max_bytes(mut self, max_bytes: u64) -> Cache {
        self.max_bytes = max_bytes;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// (entries, bytes) stored now.
    pub fn usage(&self) -> (u64, u64) {
        std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().extension().is_some_and(|x| x == "zeentry"))
                    .filter_map(|e| e.metadata().ok())
                    .fold((0, 0), |(n, b), m| (n + 1, b + m.len()))
            })
            .unwrap_or((0, 0))
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.zeentry"))
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

    pub fn get<M: DeserializeOwned>(&self, key: &str) -> Lookup<M> {
        if self.refused.is_some() {
            return Lookup::Miss;
        }
        let path = self.path(key);
        let bytes = match self.read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => {
                return Lookup::Corrupt(format!(
                    "cache entry {} not used: {e}; it is rebuilt",
                    path.display()
                ))
            }
        };
        match decode(key, &bytes) {
            Ok((meta, binary)) => {
                // Mark as recently used for eviction; failure to do so is harmless.
                let _ = private::open_file(&path, true, false)
                    .and_then(|f| f.set_modified(SystemTime::now()));
                Lookup::Hit(meta, binary)
            }
            Err(why) => {
                let _ = std::fs::remove_file(&path);
                Lookup::Corrupt(format!(
                    "cache entry {} was corrupt ({why}); removed",
                    path.display()
                ))
            }
        }
    }

    /// An entry's bytes as stored, when they are a valid entry of `key` (this user's,
    /// bounded, checksum over key and body): what a node shares with its fleet.
    pub fn raw(&self, key: &str) -> Option<Vec<u8>> {
        if self.refused.is_some() {
            return None;
        }
        let bytes = self.read(&self.path(key)).ok()?;
        decode::<serde::de::IgnoredAny>(key, &bytes).ok()?;
        Some(bytes)
    }

    /// Remove an entry (one the driver refused); false when there was none or it could
    /// not be removed (a directory that fails its check is never written to).
    pub fn remove(&self, key: &str) -> bool {
        if self.refused.is_some() || private::check_dir(&self.dir, 0o002).is_err() {
            return false;
        }
        std::fs::remove_file(self.path(key)).is_ok()
    }

    /// Store an entry; returns a note when it could not (the compile still succeeds).
    pub fn put<M: Serialize>(&self, key: &str, meta: &M, binary: &[u8]) -> Option<String> {
        self.put_with(key, meta, binary, true)
    }

    /// Store a copy of an entry that lives elsewhere (the fleet's store): not synced to
    /// disk, since one lost or torn by a crash is a checksum miss, fetched again.
    pub fn put_copy<M: Serialize>(&self, key: &str, meta: &M, binary: &[u8]) -> Option<String> {
        self.put_with(key, meta, binary, false)
    }

    fn put_with<M: Serialize>(
        &self,
        key: &str,
        meta: &M,
        binary: &[u8],
        durable: bool,
    ) -> Option<String> {
        if self.refused.is_some() {
            return None;
        }
        if binary.len() as u64 > MAX_ENTRY_BYTES {
            return Some(format!(
                "not cached: {} bytes is more than an entry may hold",
                binary.len()
            ));
        }
        let result = (|| -> std::io::Result<()> {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)?;
            // Checked again now, not only at open: a compile takes long enough for the
            // directory to be swapped for someone else's (or a link to it).
            private::check_dir(&self.dir, 0o002).map_err(std::io::Error::other)?;
            let mut tmp = tempfile::Builder::new()
                .prefix(TEMP_PREFIX)
                .tempfile_in(&self.dir)?;
            use std::io::Write;
            tmp.write_all(&encode(key, meta, binary)?)?;
            if durable {
                tmp.as_file().sync_data()?;
            }
            tmp.persist(self.path(key)).map_err(|e| e.error)?;
            Ok(())
        })();
        match result {
            Ok(()) => self.evict(),
            Err(e) => Some(format!("cache write to {} failed: {e}", self.dir.display())),
        }
    }

    /// Remove least recently used entries until the directory fits its bound, and the temp
    /// files of writers that died mid-write (killed workers, lost nodes of a shared cache).
    fn evict(&self) -> Option<String> {
        private::check_dir(&self.dir, 0o002).ok()?;
        let entries = std::fs::read_dir(&self.dir).ok()?;
        let now = SystemTime::now();
        let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        for entry in entries.filter_map(|e| e.ok()) {
            let (path, Ok(m)) = (entry.path(), entry.metadata()) else {
                continue;
            };
            let Ok(modified) = m.modified() else {
                continue;
            };
            if path.extension().is_some_and(|x| x == "zeentry") && m.file_type().is_file() {
                files.push((modified, m.len(), path));
            } else if entry
                .file_name()
                .as_encoded_bytes()
                .starts_with(TEMP_PREFIX.as_bytes())
                && now.duration_since(modified).unwrap_or_default() > ABANDONED_TEMP
            {
                let _ = std::fs::remove_file(&path);
            }
        }
        let mut total = files.iter().fold(0u64, |t, f| t.saturating_add(f.1));
        if total <= self.max_bytes {
            return None;
        }
        files.sort();
        let mut removed = 0;
        for (_, len, path) in files {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total = total.saturating_sub(len);
                removed += 1;
            }
        }
        Some(format!(
            "cache over {} bytes: evicted {removed} least recently used entries",
            self.max_bytes
        ))
    }
}

/// The bytes of an entry holding `meta` and `binary`.
pub fn encode<M: Serialize>(key: &str, meta: &M, binary: &[u8]) -> std::io::Result<Vec<u8>> {
    let meta = serde_json::to_vec(meta)?;
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + meta.len() + binary.len() + CHECKSUM_BYTES);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(binary);
    let sum = checksum(key, &out);
    out.extend_from_slice(sum.as_bytes());
    Ok(out)
}

/// An entry's metadata and binary; `Err` says why the bytes are not the whole entry of
/// `key`.
/// blake3 over the key, then the entry's body.
fn checksum(key: &str, body: &[u8]) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    hasher.update(key.as_bytes());
    hasher.update(body);
    hasher.finalize()
}

pub fn decode<M: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<(M, Vec<u8>), String> {
    let head = MAGIC.len() + 4;
    if bytes.len() < head + CHECKSUM_BYTES || &bytes[..MAGIC.len()] != MAGIC {
        return Err("bad header".into());
    }
    let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
    if checksum(key, body).as_bytes() != sum {
        return Err("checksum mismatch (a torn, altered or renamed entry)".into());
    }
    let len = &body[MAGIC.len()..head];
    let meta_len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if meta_len > body.len() - head {
        return Err("metadata runs past the end".into());
    }
    let meta = serde_json::from_slice(&body[head..head + meta_len])
        .map_err(|e| format!("metadata: {e}"))?;
    Ok((meta, body[head + meta_len..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_corruption_and_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(Some(dir.path())).with_max_bytes(10_000);
        assert!(matches!(cache.get::<String>("k"), Lookup::Miss));
        assert!(cache.put("k", &"meta".to_string(), b"binary").is_none());
        match cache.get::<String>("k") {
            Lookup::Hit(m, b) => assert_eq!((m.as_str(), b.as_slice()), ("meta", &b"binary"[..])),
            _ => panic!("expected a hit"),
        }
        // Flip one byte: the entry must be reported and removed, never returned.
        let path = cache.path("k");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[MAGIC.len() + 6] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        assert!(matches!(cache.get::<String>("k"), Lookup::Corrupt(_)));
        assert!(!path.exists());
        // Eviction keeps the directory under its bound.
        for i in 0..10 {
            cache.put(&format!("e{i}"), &"m".to_string(), &[0u8; 3000]);
        }
        let total: u64 = std::fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(total <= 10_000, "{total}");
    }

    #[test]
    fn an_entry_renamed_onto_another_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(Some(dir.path()));
        cache.put("a", &"meta a".to_string(), b"binary a");
        cache.put("b", &"meta b".to_string(), b"binary b");
        std::fs::rename(cache.path("a"), cache.path("b")).unwrap();
        assert!(matches!(cache.get::<String>("b"), Lookup::Corrupt(_)));
    }

    #[test]
    fn temp_files_of_dead_writers_are_removed_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(Some(dir.path()));
        std::fs::create_dir_all(cache.dir()).unwrap();
        let abandoned = cache.dir().join(format!("{TEMP_PREFIX}dead"));
        let writing = cache.dir().join(format!("{TEMP_PREFIX}live"));
        for path in [&abandoned, &writing] {
            std::fs::write(path, b"half an entry").unwrap();
        }
        let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
        std::fs::File::options()
            .append(true)
            .open(&abandoned)
            .and_then(|f| f.set_modified(two_hours_ago))
            .unwrap();
        assert!(cache.put("k", &"meta".to_string(), b"binary").is_none());
        assert!(!abandoned.exists(), "a dead writer's temp file stays");
        assert!(writing.exists(), "a live writer's temp file was removed");
    }
}

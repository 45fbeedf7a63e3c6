//! Every level of native code behind one lookup. A level holds entries (a key, and the
//! bytes of an entry: its record and native binary, `cache::encode`) and knows nothing
//! of requests, the GRF ladder or the compiler. The order of the levels, and what a hit
//! does, are decided here and nowhere else (`Levels::open`, `find`, `keep`): the local
//! cache first, then the fleet's store. A hit is verified once (its checksum over the
//! key; a slower level's entry also by its signature and by the caller's check), copied
//! into the faster levels, and counted once, at the level that answered, in the ledger of
//! the directory the request uses (`count`). A fresh build goes into every level this
//! node may write.

use super::accounts;
use super::format;
use super::remote::{self, Config, Wanted};
use crate::cache::{self, Cache, Counter};
use crate::error::{BuildError, ErrorKind, Result};
use crate::ladder::{Attempt, Record};

/// What an entry is built for, as the fleet's store signs it: the device and the
/// compiler's identity (the offline path: the ocloc device and IGC; Level Zero: no
/// device, the device and driver as the compiler).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub device: &'a str,
    pub compiler: &'a str,
}

/// An entry as a level answered it: the record and the native binary.
pub struct Entry {
    pub record: Record,
    pub binary: Vec<u8>,
}

/// One level of native code.
trait Level: Send + Sync {
    /// What a hit at this level counts as.
    fn hits(&self) -> Counter;
    /// The bytes this level holds for `key` built for `target`, not yet checked; why
    /// none could be read goes into `notes`.
    fn get(&self, key: &str, target: Target<'_>, notes: &mut Vec<String>) -> Option<Vec<u8>>;
    /// What `get` gave answered the request (this level's own count of hits, if any).
    fn answered(&self) {}
    /// What `get` gave (`len` bytes) is not `key`'s entry (`why`): dropped and counted.
    fn refuse(&self, key: &str, len: usize, why: &str, notes: &mut Vec<String>);
    /// Keep `entry` (the bytes of `key`'s entry); `fresh`: built here now, else a copy of
    /// a slower level's entry. True when kept; an error says why it could not be.
    fn put(&self, key: &str, target: Target<'_>, entry: &[u8], fresh: bool) -> Kept;
}

/// Whether a level kept an entry, or why it could not.
type Kept = std::result::Result<bool, String>;

/// The local cache: this user's own directory, entries checksummed over their key.
struct Local(Cache);

impl Level for Local {
    fn hits(&self) -> Counter {
        Counter::LocalHits
    }

    fn get(&self, key: &str, _: Target<'_>, notes: &mut Vec<String>) -> Option<Vec<u8>> {
        self.0.read_entry(key).unwrap_or_else(|note| {
            notes.push(note);
            None
        })
    }

    fn refuse(&self, key: &str, len: usize, why: &str, notes: &mut Vec<String>) {
        notes.push(self.0.refuse(key, len as u64, why));
    }

    fn put(&self, key: &str, _: Target<'_>, entry: &[u8], fresh: bool) -> Kept {
        match self.0.put_entry(key, entry, fresh) {
            None => Ok(true),
            Some(note) => Err(note),
        }
    }
}

/// The fleet's store: entries signed by a trusted key for this very key and target.
struct Store {
    cfg: Config,
    /// Refusals are counted in the ledger of the request's cache.
    cache: Cache,
}

impl Store {
    fn count_refused(&self, n: u64) {
        if let (true, Some(l)) = (n > 0, self.cache.ledger()) {
            l.count(Counter::RefusedUntrusted, n);
        }
    }
}

impl Level for Store {
    fn hits(&self) -> Counter {
        Counter::StoreHits
    }

    fn get(&self, key: &str, target: Target<'_>, _: &mut Vec<String>) -> Option<Vec<u8>> {
        let rkey = format!("{}{key}", format::PREFIX);
        let wanted = Wanted {
            rkey: rkey.as_bytes(),
            key,
            device: target.device,
            compiler: target.compiler,
        };
        // The trust setting was checked when the levels were opened.
        let (mut found, untrusted) = remote::signed_values(&self.cfg, &[wanted], false).ok()?;
        self.count_refused(untrusted);
        found.pop().flatten()
    }

    fn answered(&self) {
        remote::count_hit();
    }

    fn refuse(&self, _: &str, _: usize, why: &str, _: &mut Vec<String>) {
        remote::untrusted(why);
        self.count_refused(1);
    }

    fn put(&self, key: &str, target: Target<'_>, entry: &[u8], fresh: bool) -> Kept {
        if !fresh {
            return Ok(false); // the slowest level: nothing is copied into it
        }
        let rkey = format!("{}{key}", format::PREFIX);
        let (device, compiler) = (target.device, target.compiler);
        remote::put_signed(&self.cfg, rkey.as_bytes(), key, device, compiler, entry)
            .map_err(|e| e.message)
    }
}

/// A hit: the entry, and the level that answered.
pub struct Hit {
    pub entry: Entry,
    pub counter: Counter,
}

impl Hit {
    /// The answer is another node's, from the fleet's store.
    pub fn from_store(&self) -> bool {
        self.counter == Counter::StoreHits
    }
}

/// A request's answer, as it is counted.
pub enum Answered<'a> {
    /// From a level (its counter); `attempts`: the entry's own, the compile time saved.
    Hit(Counter, &'a [Attempt]),
    /// Compiled here: every attempt made.
    Built(&'a [Attempt]),
    /// Compiled here and failed: every attempt made (a retry that failed is no retry).
    Failed(&'a [Attempt]),
    /// Refused before any compile (a bad setting): a request, not a compile.
    Refused,
}

/// The levels a request asks, fastest first; none when its cache is off.
pub struct Levels {
    levels: Vec<Box<dyn Level>>,
    /// The request's cache, whose ledger counts its answer (made with the directory).
    cache: Option<Cache>,
}

impl Levels {
    /// The levels of a request whose cache is `cache` (None: off), in the order they are
    /// asked: the local cache, then the fleet's store when `XPU_ZEBIN_REMOTE` is set and
    /// `store` is true. A bad store or trust setting is the error.
    pub fn open(cache: Option<Cache>, store: bool) -> Result<Levels> {
        let Some(cache) = cache else {
            return Ok(Levels {
                levels: Vec::new(),
                cache: None,
            });
        };
        let mut levels: Vec<Box<dyn Level>> = vec![Box::new(Local(cache.clone()))];
        if let Some(cfg) = store.then(remote::config).transpose()?.flatten() {
            // Said once now, never a miss or a note per kernel.
            crate::signing::Trusted::from_env()?;
            if cfg.read_write {
                crate::signing::Signer::from_env()?;
            }
            levels.push(Box::new(Store {
                cfg,
                cache: cache.clone(),
            }));
        }
        Ok(Levels {
            levels,
            cache: Some(cache),
        })
    }

    /// The first level's entry of `key` that is whole and `key`'s: a slower level's entry
    /// must also pass `check` (what the caller needs of a binary it did not build), and is
    /// then copied into the faster levels. None on a miss everywhere; why an entry was not
    /// used goes into `notes`.
    pub fn find(
        &self,
        key: &str,
        target: Target<'_>,
        check: impl Fn(&Entry) -> std::result::Result<(), BuildError>,
        notes: &mut Vec<String>,
    ) -> Option<Hit> {
        for (at, level) in self.levels.iter().enumerate() {
            let Some(raw) = level.get(key, target, notes) else {
                continue;
            };
            let checked = cache::decode::<Record>(key, &raw)
                .map(|(record, binary)| Entry { record, binary })
                .and_then(|entry| match at {
                    0 => Ok(entry),
                    _ => check(&entry).map(|()| entry).map_err(|e| e.message),
                });
            let entry = match checked {
                Ok(entry) => entry,
                Err(why) => {
                    level.refuse(key, raw.len(), &why, notes);
                    continue;
                }
            };
            for faster in &self.levels[..at] {
                if let Err(note) = faster.put(key, target, &raw, false) {
                    notes.push(note);
                }
            }
            level.answered();
            return Some(Hit {
                entry,
                counter: level.hits(),
            });
        }
        None
    }

    /// A fresh build of `key`: into every level, the store's only where this node may
    /// write; none when an attempt failed in a way that may not repeat (`repeatable`
    /// false: a timeout, a cancel, a worker that died shaped the answer). Notes say what
    /// was not kept.
    pub fn keep(
        &self,
        key: &str,
        target: Target<'_>,
        record: &Record,
        binary: &[u8],
        repeatable: bool,
    ) -> Vec<String> {
        if self.levels.is_empty() {
            return Vec::new();
        }
        if !repeatable {
            return vec!["not cached: an attempt failed in a way that may not repeat".into()];
        }
        let entry = match cache::encode(key, record, binary) {
            Ok(entry) => entry,
            Err(e) => return vec![format!("not cached: {e}")],
        };
        self.levels
            .iter()
            .filter_map(|level| level.put(key, target, &entry, true).err())
            .collect()
    }

    /// The local entry of `key`, whole and `key`'s, into the slower levels (a farm
    /// publishing its cache); true when one was written.
    pub fn share(&self, key: &str, target: Target<'_>) -> Result<bool> {
        let Some((local, slower)) = self.levels.split_first() else {
            return Ok(false);
        };
        let mut notes = Vec::new();
        let Some(raw) = local.get(key, target, &mut notes) else {
            return Ok(false);
        };
        if let Err(why) = cache::decode::<serde::de::IgnoredAny>(key, &raw) {
            local.refuse(key, raw.len(), &why, &mut notes);
            return Ok(false);
        }
        let mut wrote = false;
        for level in slower {
            wrote |= level
                .put(key, target, &raw, true)
                .map_err(|why| BuildError::new(ErrorKind::InvalidArgument, why))?;
        }
        Ok(wrote)
    }

    /// Count the request's answer once, in its directory's ledger.
    pub fn count(&self, answered: Answered<'_>) {
        if let Some(l) = self.cache.as_ref().and_then(Cache::ledger) {
            accounts::count(&l, answered);
        }
    }
}

//! The levels themselves, each behind one trait: the local cache (this user's own
//! entries), bundles (built ahead of time, read only) and the fleet's store (signed
//! entries). What each holds, gives, refuses and keeps; their order is `Levels`'s.

use super::Entry;
use crate::attempt::{Attempt, Record};
use crate::bundle::search::{Missed, Query, Wanted as BundleWanted};
use crate::cache::{self, Cache, Counter};
use crate::error::Result;
use crate::options::Options;
use crate::store::format;
use crate::store::remote::{self, Config, Wanted};
use crate::zebin::Fits;

/// What an entry is built for, as the fleet's store signs it: the device and the
/// compiler's identity (the offline path: the ocloc device and IGC; Level Zero: no
/// device, the device and driver as the compiler).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub device: &'a str,
    pub compiler: &'a str,
}

/// One level of native code.
pub(super) trait Level: Send + Sync {
    /// What a hit at this level counts as.
    fn hits(&self) -> Counter;
    /// This user's own entries (the local cache): checked by checksum and section names.
    fn own(&self) -> bool {
        false
    }
    /// This level keeps failures that repeat beside its entries (the local cache, the
    /// store; never a bundle, which answers by its own keys).
    fn keeps_failures(&self) -> bool {
        false
    }
    /// The most bytes an entry of this level may hold uncompressed (a value of the store is
    /// bounded by its `XPU_ZEBIN_REMOTE_MAX_BYTES`, inflated too).
    fn most_inflated(&self) -> u64 {
        cache::MAX_ENTRY_BYTES
    }
    /// The bytes this level holds for `key` built for `target`, not yet checked; why
    /// none could be read goes into `notes`. An error is a bad setting of the level's.
    fn get(
        &self,
        key: &str,
        target: Target<'_>,
        notes: &mut Vec<String>,
    ) -> Result<Option<Vec<u8>>>;
    /// Whether `entry` (what `get` gave, decoded under its key) may answer: one this node
    /// did not build must fit the request (`fits`; None: the caller checks it by loading
    /// it). Why not is the error.
    fn check(&self, entry: &Entry, fits: Option<Fits<'_>>) -> std::result::Result<(), String> {
        let fits = fits.map(|fits| fits.check(&entry.binary, entry.record.spill));
        fits.unwrap_or(Ok(())).map_err(|e| e.message)
    }
    /// What `get` gave (`len` bytes) is not `key`'s entry (`why`): dropped and counted.
    fn refuse(&self, key: &str, len: usize, why: &str, notes: &mut Vec<String>);
    /// Keep `entry` (the bytes of `key`'s entry); `fresh`: built here now, else a copy of
    /// a slower level's entry. An error is a bad setting.
    fn put(&self, key: &str, target: Target<'_>, entry: &[u8], fresh: bool) -> Result<Put>;
}

/// What a level did with an entry it was given: kept it, left it (not a level that takes
/// it, or it said why itself), or could not (the note).
pub(super) enum Put {
    Yes,
    No,
    Failed(String),
}

impl Put {
    pub(super) fn note(self) -> Option<String> {
        match self {
            Put::Failed(note) => Some(note),
            Put::Yes | Put::No => None,
        }
    }
}

/// The local cache: this user's own directory, entries checksummed over their key.
pub(super) struct Local(pub(super) Cache);

impl Level for Local {
    fn hits(&self) -> Counter {
        Counter::LocalHits
    }

    fn own(&self) -> bool {
        true
    }

    fn keeps_failures(&self) -> bool {
        true
    }

    fn get(&self, key: &str, _: Target<'_>, notes: &mut Vec<String>) -> Result<Option<Vec<u8>>> {
        Ok(self.0.read_entry(key).unwrap_or_else(|note| {
            notes.push(note);
            None
        }))
    }

    /// Checksummed, not parsed (a hit's cost): a zebin lacking a section is refused
    /// (removed), then rebuilt, never a hit.
    fn check(&self, entry: &Entry, _: Option<Fits<'_>>) -> std::result::Result<(), String> {
        crate::zebin::has_zebin_sections(&entry.binary).map_err(|e| e.message)
    }

    fn refuse(&self, key: &str, len: usize, why: &str, notes: &mut Vec<String>) {
        notes.push(self.0.refuse(key, len as u64, why));
    }

    fn put(&self, key: &str, _: Target<'_>, entry: &[u8], fresh: bool) -> Result<Put> {
        Ok(match self.0.put_entry(key, entry, fresh) {
            None => Put::Yes,
            Some(note) => Put::Failed(note),
        })
    }
}

/// What a request looks for in the bundles: the caller's query, and what the bundles' own
/// keys are made of (the input, its kernel, the options).
pub struct BundleAsk<'a> {
    pub query: &'a Query,
    pub input: &'a [u8],
    pub kernel: &'a str,
    pub options: &'a Options,
}

impl BundleAsk<'_> {
    /// The bundles' keys for this kernel, one per target profile; None (why, at debug)
    /// when there is nothing to look for.
    pub(super) fn wanted(self) -> Option<BundleWanted> {
        BundleWanted::new(self.input, self.kernel, self.options, self.query)
            .map_err(|why| {
                let kernel = self.kernel;
                crate::diag::detail("bundle", format!("kernel {kernel:?}: compiled: {why}"));
            })
            .ok()
    }
}

/// Bundles: native code built ahead of time, looked up by their own keys (a bundle's
/// manifest checks its entries), read only. An entry is given as every level gives one:
/// encoded under the request's key, its record read from the binary.
pub(super) struct Bundle(pub(super) BundleWanted);

impl Level for Bundle {
    fn hits(&self) -> Counter {
        Counter::BundleHits
    }

    fn get(&self, key: &str, _: Target<'_>, notes: &mut Vec<String>) -> Result<Option<Vec<u8>>> {
        let kernel = &self.0.kernel;
        let build = match self.0.find() {
            Ok(build) => {
                let flags = &build.build_flags;
                crate::diag::detail(
                    "bundle",
                    format!("kernel {kernel:?}: from the bundle ({flags:?})"),
                );
                build
            }
            Err(Missed::Absent(why)) => {
                crate::diag::detail("bundle", format!("kernel {kernel:?}: compiled: {why}"));
                return Ok(None);
            }
            Err(Missed::Refused(why)) => {
                self.refuse(key, 0, &why, notes);
                return Ok(None);
            }
        };
        let spill = match crate::zebin::parse(&build.native).and_then(|i| i.kernel_spill(kernel)) {
            Ok(spill) => spill,
            Err(e) => {
                self.refuse(key, 0, &e.message, notes);
                return Ok(None);
            }
        };
        // One attempt, as loading a native binary makes: its flags, what it spills.
        let attempt = Attempt {
            build_flags: build.build_flags.clone(),
            ok: true,
            spill_size: Some(spill.bytes),
            seconds: 0.0,
            started: 0.0,
            error: None,
        };
        let record = Record {
            build_flags: build.build_flags,
            spill,
            attempts: vec![attempt],
            recovered: false,
            log: String::new(),
        };
        // Read at once and never kept here: not compressed for that.
        match cache::encode_plain(key, &record, &build.native) {
            Ok(entry) => Ok(Some(entry)),
            Err(e) => {
                self.refuse(key, 0, &e.to_string(), notes);
                Ok(None)
            }
        }
    }

    fn refuse(&self, _: &str, _: usize, why: &str, _: &mut Vec<String>) {
        let kernel = &self.0.kernel;
        let message =
            format!("kernel '{kernel}': bundle entry refused ({why}); trying the next level");
        crate::diag::warn_once(&format!("bundle:{message}"), message);
    }

    fn put(&self, _: &str, _: Target<'_>, _: &[u8], _: bool) -> Result<Put> {
        Ok(Put::No) // made ahead of time, never written here
    }
}

/// The fleet's store: entries signed by a trusted key for this very key and target.
pub(super) struct Store {
    pub(super) cfg: Config,
    /// Refusals are counted in the ledger of the request's cache.
    pub(super) cache: Cache,
}

impl Level for Store {
    fn hits(&self) -> Counter {
        Counter::StoreHits
    }

    fn most_inflated(&self) -> u64 {
        self.cfg.max_bytes
    }

    fn keeps_failures(&self) -> bool {
        true
    }

    fn get(&self, key: &str, target: Target<'_>, _: &mut Vec<String>) -> Result<Option<Vec<u8>>> {
        let rkey = format!("{}{key}", format::PREFIX);
        let wanted = Wanted {
            rkey: rkey.as_bytes(),
            key,
            device: target.device,
            compiler: target.compiler,
        };
        let ledger = self.cache.ledger_to_count();
        let mut found = remote::signed_values(&self.cfg, &[wanted], false, ledger.as_deref())?;
        Ok(found.pop().flatten())
    }

    fn refuse(&self, _: &str, _: usize, why: &str, _: &mut Vec<String>) {
        remote::untrusted(why, self.cache.ledger_to_count().as_deref());
    }

    fn put(&self, key: &str, target: Target<'_>, entry: &[u8], fresh: bool) -> Result<Put> {
        if !fresh {
            return Ok(Put::No); // the slowest level: nothing is copied into it
        }
        let rkey = format!("{}{key}", format::PREFIX);
        let (device, compiler) = (target.device, target.compiler);
        let ledger = self.cache.ledger_to_count();
        // A store that could not take it said so (once); a bad signing key is the error.
        let put = remote::put_signed(
            &self.cfg,
            (rkey.as_bytes(), key),
            (device, compiler),
            entry,
            ledger.as_deref(),
        );
        Ok(if put? { Put::Yes } else { Put::No })
    }
}

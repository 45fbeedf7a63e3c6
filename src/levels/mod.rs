//! Every level of native code behind one lookup. A level holds entries (a key, and the
//! bytes of an entry: its record and native binary, `cache::encode`) and knows nothing
//! of requests, the GRF ladder or the compiler. The order of the levels, and what a hit
//! does, are decided here and nowhere else (`Levels::open`, `find`, `keep`): bundles
//! first (native code built ahead of time, when the caller looks in them), then the local
//! cache, then the fleet's store. A hit is verified once (its checksum over the key; an
//! entry not of this user's own cache also by the caller's check, after its level's own:
//! a signature, a bundle's manifest), copied into the faster levels, and counted once, at
//! the level that answered, in the ledger of the directory the request uses (`count`). A
//! fresh build goes into every level this node may write.

pub mod accounts;
pub mod claims;
pub use accounts::Answered;

use crate::attempt::{Attempt, Record};
use crate::bundle::search::{Missed, Query, Wanted as BundleWanted};
use crate::cache::{self, Cache, Counter};
use crate::error::{BuildError, Result};
use crate::options::Options;
use crate::store::format;
use crate::store::remote::{self, Config, Wanted};
pub use crate::zebin::Fits;
use claims::{Claim, Claims, Waited};
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// What an entry is built for, as the fleet's store signs it: the device and the
/// compiler's identity (the offline path: the ocloc device and IGC; Level Zero: no
/// device, the device and driver as the compiler).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub device: &'a str,
    pub compiler: &'a str,
}

impl Target<'_> {
    /// No target: the local level keys entries by key alone.
    const NONE: Target<'static> = Target {
        device: "",
        compiler: "",
    };
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
    /// This user's own entries (the local cache): checked by checksum and section names.
    fn own(&self) -> bool {
        false
    }
    /// The bytes this level holds for `key` built for `target`, not yet checked; why
    /// none could be read goes into `notes`. An error is a bad setting of the level's.
    fn get(
        &self,
        key: &str,
        target: Target<'_>,
        notes: &mut Vec<String>,
    ) -> Result<Option<Vec<u8>>>;
    /// What `get` gave answered the request (this level's own count of hits, if any).
    fn answered(&self) {}
    /// What `get` gave (`len` bytes) is not `key`'s entry (`why`): dropped and counted.
    fn refuse(&self, key: &str, len: usize, why: &str, notes: &mut Vec<String>);
    /// Keep `entry` (the bytes of `key`'s entry); `fresh`: built here now, else a copy of
    /// a slower level's entry. An error is a bad setting.
    fn put(&self, key: &str, target: Target<'_>, entry: &[u8], fresh: bool) -> Result<Put>;
}

/// What a level did with an entry it was given: kept it, left it (not a level that takes
/// it, or it said why itself), or could not (the note).
enum Put {
    Yes,
    No,
    Failed(String),
}

impl Put {
    fn note(self) -> Option<String> {
        match self {
            Put::Failed(note) => Some(note),
            Put::Yes | Put::No => None,
        }
    }
}

/// The local cache: this user's own directory, entries checksummed over their key.
struct Local(Cache);

impl Level for Local {
    fn hits(&self) -> Counter {
        Counter::LocalHits
    }

    fn own(&self) -> bool {
        true
    }

    fn get(&self, key: &str, _: Target<'_>, notes: &mut Vec<String>) -> Result<Option<Vec<u8>>> {
        Ok(self.0.read_entry(key).unwrap_or_else(|note| {
            notes.push(note);
            None
        }))
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

/// Bundles: native code built ahead of time, looked up by their own keys (a bundle's
/// manifest checks its entries), read only. An entry is given as every level gives one:
/// encoded under the request's key, its record read from the binary.
struct Bundle(BundleWanted);

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
            error: None,
        };
        let record = Record {
            build_flags: build.build_flags,
            spill,
            attempts: vec![attempt],
            recovered: false,
            log: String::new(),
        };
        match cache::encode(key, &record, &build.native) {
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

    fn get(&self, key: &str, target: Target<'_>, _: &mut Vec<String>) -> Result<Option<Vec<u8>>> {
        let rkey = format!("{}{key}", format::PREFIX);
        let wanted = Wanted {
            rkey: rkey.as_bytes(),
            key,
            device: target.device,
            compiler: target.compiler,
        };
        let (mut found, untrusted) = remote::signed_values(&self.cfg, &[wanted], false)?;
        self.count_refused(untrusted);
        Ok(found.pop().flatten())
    }

    fn answered(&self) {
        remote::count_hit();
    }

    fn refuse(&self, _: &str, _: usize, why: &str, _: &mut Vec<String>) {
        remote::untrusted(why);
        self.count_refused(1);
    }

    fn put(&self, key: &str, target: Target<'_>, entry: &[u8], fresh: bool) -> Result<Put> {
        if !fresh {
            return Ok(Put::No); // the slowest level: nothing is copied into it
        }
        let rkey = format!("{}{key}", format::PREFIX);
        let (device, compiler) = (target.device, target.compiler);
        // A store that could not take it said so (once); a bad signing key is the error.
        let put = remote::put_signed(&self.cfg, rkey.as_bytes(), key, device, compiler, entry);
        Ok(if put? { Put::Yes } else { Put::No })
    }
}

/// A hit: the entry, the level that answered (what it counts as, and where it is in the
/// order: a caller that cannot use the entry asks again after it).
pub struct Hit {
    pub entry: Entry,
    pub counter: Counter,
    pub at: usize,
}

impl Hit {
    /// The answer is another node's, from the fleet's store.
    pub fn from_store(&self) -> bool {
        self.counter == Counter::StoreHits
    }
}

/// Where a fresh build is kept (`Levels::keep` decides).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Nowhere: an attempt failed in a way that may not repeat (a timeout, a cancel, a
    /// worker that died shaped the answer), so it is not the input's own.
    Nowhere,
    /// In this user's own cache only: an answer this request refuses (a binary that does
    /// not link) is never offered to the fleet.
    Here,
    /// In every level this node may write.
    Everywhere,
}

/// A level as a line says it (the counter of its hits names it).
pub fn said(level: Counter) -> &'static str {
    match level {
        Counter::BundleHits => "a bundle",
        Counter::StoreHits => "the fleet's store",
        _ => "the local cache",
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
    fn wanted(self) -> Option<BundleWanted> {
        BundleWanted::new(self.input, self.kernel, self.options, self.query)
            .map_err(|why| {
                let kernel = self.kernel;
                crate::diag::detail("bundle", format!("kernel {kernel:?}: compiled: {why}"));
            })
            .ok()
    }
}

/// Which levels a request asks: its cache (None: off), the fleet's store, the bundles.
pub struct Asked<'a> {
    pub cache: Option<Cache>,
    pub store: bool,
    pub bundle: Option<BundleAsk<'a>>,
}

/// The levels a request asks, fastest first (with its cache off, only the bundles it
/// looks in, if any).
pub struct Levels {
    levels: Vec<Box<dyn Level>>,
    /// The request's cache, whose ledger counts its answer (made with the directory).
    cache: Option<Cache>,
    /// The claims that make one build per key, and where failures that repeat are kept
    /// (None: the cache is off, or `XPU_ZEBIN_SHARE_BUILDS` is false).
    claims: Option<Claims>,
}

/// Whether builds are shared: one build per key, failures that repeat remembered.
pub const SHARE_BUILDS_ENV: &str = "XPU_ZEBIN_SHARE_BUILDS";

/// A failure that repeats, as the levels keep it for its key: the error (with the
/// compiler's log) and every attempt made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Refusal {
    pub error: BuildError,
    pub attempts: Vec<Attempt>,
}

impl Refusal {
    /// A build's failure: its error (with the compiler's log) and every attempt made.
    pub fn of(error: &BuildError, attempts: &[Attempt]) -> Refusal {
        Refusal {
            error: error.clone(),
            attempts: attempts.to_vec(),
        }
    }

    /// Would a build of the same key fail the same way again: every attempt failed in a
    /// way that repeats (`ErrorKind::is_repeatable`: not a timeout, a cancel, a crash).
    fn repeats(&self) -> bool {
        !self.attempts.is_empty()
            && self.error.kind.is_repeatable()
            && self
                .attempts
                .iter()
                .all(|a| a.error.as_ref().is_some_and(|e| e.kind.is_repeatable()))
    }
}

/// A request's turn after every level missed (`Levels::after_miss`).
pub enum Turn {
    /// Build: holding the key's claim (its waiters are answered from what is kept), or
    /// alone (claims off, or waiting gave up: the notes say why).
    Build(Option<Claim>),
    /// Another's build of the key was kept meanwhile: ask the levels again (waited this long).
    Ready(Duration),
    /// The key failed in a way that repeats: by an earlier build, or by the one this
    /// request waited for (how long).
    Remembered(Refusal, Option<Duration>),
    /// The request's cancel was set while it waited.
    Cancelled,
}

/// The error of a request cancelled while it waited for another's build.
pub fn cancelled_wait() -> BuildError {
    let why = "cancelled while waiting for another process's build of this kernel";
    BuildError::new(crate::error::ErrorKind::Cancelled, why)
}

/// The key a failure of `key` is kept under (a failure is never an entry of its key).
fn failure_key(key: &str) -> String {
    cache::key(&[b"a failure that repeats", key.as_bytes()])
}

impl Levels {
    /// The levels of a request, in the order they are asked: the bundles it looks in,
    /// the local cache (unless off), then the fleet's store when `XPU_ZEBIN_REMOTE` is set
    /// and the request asks it. A bad store setting is the error (whether the cache is on
    /// or not: no setting is ignored); the keys' settings are read when the store is.
    pub fn open(asked: Asked<'_>) -> Result<Levels> {
        let Asked {
            cache,
            store,
            bundle,
        } = asked;
        let cfg = store.then(remote::config).transpose()?.flatten();
        let mut levels: Vec<Box<dyn Level>> = Vec::new();
        if let Some(wanted) = bundle.and_then(BundleAsk::wanted) {
            levels.push(Box::new(Bundle(wanted)));
        }
        let Some(cache) = cache else {
            return Ok(Levels {
                levels,
                cache: None,
                claims: None,
            });
        };
        levels.push(Box::new(Local(cache.clone())));
        if let Some(cfg) = cfg {
            levels.push(Box::new(Store {
                cfg,
                cache: cache.clone(),
            }));
        }
        let shared = crate::knobs::bool_knob(SHARE_BUILDS_ENV, true)?;
        Ok(Levels {
            levels,
            claims: shared.then(|| Claims::of(cache.dir())),
            cache: Some(cache),
        })
    }

    /// After every level missed `key`: a failure of it that repeats, kept by an earlier
    /// build; else this request's turn: it takes the key's claim and builds, or waits for
    /// the build of the one that holds it (at most `bound`, None: as long as the holder
    /// lives and renews its claim) and asks the levels again.
    pub fn after_miss(
        &self,
        key: &str,
        bound: Option<Duration>,
        cancel: &AtomicBool,
        notes: &mut Vec<String>,
    ) -> Turn {
        let Some(claims) = &self.claims else {
            return Turn::Build(None);
        };
        if let Some(refusal) = self.remembered(key, notes) {
            return Turn::Remembered(refusal, None);
        }
        // Kept by another: an entry of the key in this user's own level, or its failure.
        let kept = |notes: &mut Vec<String>| -> Option<Option<Refusal>> {
            let local = self.levels.iter().find(|l| l.own())?;
            let entry = local.get(key, Target::NONE, notes).ok().flatten();
            match entry {
                Some(_) => Some(None),
                None => self.remembered(key, notes).map(Some),
            }
        };
        let mut seen = Vec::new();
        let waited = claims.wait(key, bound, cancel, || kept(&mut seen));
        seen.dedup();
        notes.append(&mut seen);
        match waited {
            Waited::Mine(claim) => Turn::Build(Some(claim)),
            Waited::Alone(why) => {
                notes.push(format!("built without waiting: {why}"));
                Turn::Build(None)
            }
            Waited::Answered(None, waited) => {
                let waited_s = waited.as_secs_f64();
                notes.push(format!(
                    "waited {waited_s:.2} s for another's build of this kernel: answered from it"
                ));
                Turn::Ready(waited)
            }
            Waited::Answered(Some(refusal), waited) => Turn::Remembered(refusal, Some(waited)),
            Waited::Cancelled => Turn::Cancelled,
        }
    }

    /// The failure of `key` kept as one that repeats, if any (one that does not decode
    /// under its key is removed, and said).
    fn remembered(&self, key: &str, notes: &mut Vec<String>) -> Option<Refusal> {
        let cache = self.cache.as_ref()?;
        let at = failure_key(key);
        let raw = cache.read_entry(&at).unwrap_or_else(|note| {
            notes.push(note);
            None
        })?;
        match cache::decode::<Refusal>(&at, &raw) {
            Ok((refusal, _)) if refusal.repeats() => Some(refusal),
            Ok(_) => {
                notes.push(cache.refuse(&at, raw.len() as u64, "not a failure that repeats"));
                None
            }
            Err(why) => {
                notes.push(cache.refuse(&at, raw.len() as u64, &why));
                None
            }
        }
    }

    /// Count the answer of a request whose key failed in a way that repeats (`counted`),
    /// and say so in `notes` (`after`: found after waiting this long for the build that
    /// failed).
    pub fn told_remembered(
        &self,
        refusal: &Refusal,
        after: Option<Duration>,
        counted: bool,
        notes: &mut Vec<String>,
    ) {
        notes.push(match after {
            Some(waited) => format!(
                "another process's build of this kernel failed, waited for ({:.1} s): not \
                 built again",
                waited.as_secs_f64()
            ),
            None => format!(
                "this kernel failed the same way before with this compiler: not built again \
                 ({SHARE_BUILDS_ENV}=0 builds it anyway)"
            ),
        });
        if counted {
            self.count(Answered::Remembered(&refusal.attempts));
        }
    }

    /// Keep a failure of `key`'s build when it repeats (`Refusal::repeats`), so that the
    /// next request for the key, in any process using this cache, is answered with it
    /// without a build. What it says is returned.
    pub fn remember(&self, key: &str, refusal: &Refusal) -> Option<String> {
        let (Some(cache), Some(_)) = (&self.cache, &self.claims) else {
            return None;
        };
        if !refusal.repeats() {
            return None;
        }
        let at = failure_key(key);
        match cache::encode(&at, refusal, &[]) {
            Ok(entry) => cache.put_entry(&at, &entry, false),
            Err(e) => Some(format!("failure not remembered: {e}")),
        }
    }

    /// The levels of a request (`open`) and their answer to `key` (`find`, from the
    /// first level on). A bad setting is the error, counted as a refused request when
    /// the request is `counted`.
    pub fn ask(
        asked: Asked<'_>,
        counted: bool,
        key: &str,
        target: Target<'_>,
        fits: Fits<'_>,
        notes: &mut Vec<String>,
    ) -> Result<(Levels, Option<Hit>)> {
        let cache = asked.cache.clone();
        let refused = || {
            if counted {
                Levels::count_refused(cache.as_ref());
            }
        };
        let levels = Levels::open(asked).inspect_err(|_| refused())?;
        let found = levels
            .find(0, key, target, Some(fits), notes)
            .inspect_err(|_| refused())?;
        Ok((levels, found))
    }

    /// The first level's entry of `key` that is whole and `key`'s, from the level at
    /// `from` on: one of this user's own cache must have a zebin's sections, one of
    /// another level must fit (`fits`: what the caller needs of a binary it did not build;
    /// None: the caller checks it by loading it), and is then copied into the faster
    /// levels.
    /// None on a miss everywhere; why an entry was not used goes into `notes`.
    pub fn find(
        &self,
        from: usize,
        key: &str,
        target: Target<'_>,
        fits: Option<Fits<'_>>,
        notes: &mut Vec<String>,
    ) -> Result<Option<Hit>> {
        for (at, level) in self.levels.iter().enumerate().skip(from) {
            let Some(raw) = level.get(key, target, notes)? else {
                continue;
            };
            let checked = cache::decode::<Record>(key, &raw)
                .map(|(record, binary)| Entry { record, binary })
                .and_then(|entry| match (level.own(), fits) {
                    (false, Some(fits)) => fits
                        .check(&entry.binary, entry.record.spill)
                        .map(|()| entry)
                        .map_err(|e| e.message),
                    // Own entries are checksummed, not parsed (a hit's cost): a zebin
                    // lacking a section is refused (removed), then rebuilt, never a hit.
                    (true, _) => crate::zebin::has_zebin_sections(&entry.binary)
                        .map(|()| entry)
                        .map_err(|e| e.message),
                    (false, None) => Ok(entry),
                });
            let entry = match checked {
                Ok(entry) => entry,
                Err(why) => {
                    level.refuse(key, raw.len(), &why, notes);
                    continue;
                }
            };
            for faster in &self.levels[..at] {
                notes.extend(faster.put(key, target, &raw, false)?.note());
            }
            level.answered();
            return Ok(Some(Hit {
                entry,
                counter: level.hits(),
                at,
            }));
        }
        Ok(None)
    }

    /// A fresh build of `key` into the levels this node may write: nowhere unless it is
    /// `repeatable` (no transient failure shaped it), and here only when it is not
    /// `linked` (it has symbols left for a link the request allowed: no other node takes
    /// it). What it says is returned. An error is a bad setting (a signing key that
    /// cannot be read).
    pub fn keep(
        &self,
        key: &str,
        target: Target<'_>,
        built: (&Record, &[u8]),
        repeatable: bool,
        linked: bool,
    ) -> Result<Vec<String>> {
        let (record, binary) = built;
        let entry = cache::encode(key, record, binary);
        let scope = match (repeatable, linked) {
            (false, _) => Keep::Nowhere,
            (true, false) => Keep::Here,
            (true, true) => Keep::Everywhere,
        };
        let mut notes = Vec::new();
        match (scope, entry) {
            // Only levels that are never written (bundles), or none.
            _ if self.cache.is_none() => {}
            (Keep::Nowhere, _) => {
                notes.push("not cached: an attempt failed in a way that may not repeat".into())
            }
            (_, Err(e)) => notes.push(format!("not cached: {e}")),
            (_, Ok(entry)) => {
                for level in &self.levels {
                    if scope == Keep::Everywhere || level.own() {
                        notes.extend(level.put(key, target, &entry, true)?.note());
                    }
                }
            }
        }
        Ok(notes)
    }

    /// The local entry of `key`, whole and `key`'s and fitting the request (`fits`: one
    /// kept here only, that does not link, is never offered), into the slower levels (a
    /// farm publishing its cache); true when one was written.
    pub fn share(&self, key: &str, target: Target<'_>, fits: Fits<'_>) -> Result<bool> {
        let Some(at) = self.levels.iter().position(|l| l.own()) else {
            return Ok(false);
        };
        let (local, slower) = (&self.levels[at], &self.levels[at + 1..]);
        let mut notes = Vec::new();
        let Some(raw) = local.get(key, target, &mut notes)? else {
            return Ok(false);
        };
        match cache::decode::<Record>(key, &raw) {
            Ok((record, binary)) => {
                if fits.check(&binary, record.spill).is_err() {
                    return Ok(false);
                }
            }
            Err(why) => {
                local.refuse(key, raw.len(), &why, &mut notes);
                return Ok(false);
            }
        }
        let mut wrote = false;
        for level in slower {
            wrote |= matches!(level.put(key, target, &raw, true)?, Put::Yes);
        }
        Ok(wrote)
    }

    /// Count a request refused before any level was asked (a bad setting), in the ledger
    /// of its cache (`cache`).
    fn count_refused(cache: Option<&Cache>) {
        if let Some(cache) = cache {
            if let Some(l) = cache.ledger_to_count() {
                accounts::count(&l, Answered::Refused);
                cache.publish_counts(&l, false);
            }
        }
    }

    /// Count the request's answer once, in its directory's ledger.
    pub fn count(&self, answered: Answered<'_>) {
        if let Some(cache) = self.cache.as_ref() {
            if let Some(l) = cache.ledger_to_count() {
                let urgent = matches!(answered, Answered::Built(_) | Answered::Failed(_));
                accounts::count(&l, answered);
                cache.publish_counts(&l, urgent);
            }
        }
    }
}

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
mod fleet_claim;
pub mod front_ends;
mod refusal;
pub use accounts::Answered;

mod level;

use crate::attempt::Record;
use crate::cache::{self, Cache, Counter};
use crate::error::Result;
use crate::pool::{free_core, reserve_core, CoreTurn, Reserved};
use crate::store::remote;
pub use crate::zebin::Fits;
pub use claims::Wait;
use claims::{Claim, Claims, Waited};
use fleet_claim::FleetClaim;
use level::{Bundle, Level, Local, Put, Store};
pub use level::{BundleAsk, Target};
pub use refusal::Refusal;
use std::time::Duration;

/// An entry as a level answered it: the record and the native binary.
pub struct Entry {
    pub record: Record,
    pub binary: Vec<u8>,
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
    /// The fleet's store, for its claims (with `claims` only).
    fleet: Option<remote::Config>,
    /// Whether this user's own level keeps fresh builds compressed (`COMPRESS_ENV`).
    compress_own: bool,
}

/// Whether builds are shared: one build per key, failures that repeat remembered.
pub const SHARE_BUILDS_ENV: &str = "XPU_ZEBIN_SHARE_BUILDS";

/// Whether the local cache keeps the entries this host builds compressed (the default:
/// about 4x smaller) or as built (the cheapest warm hit); the store's are compressed.
pub const COMPRESS_ENV: &str = "XPU_ZEBIN_CACHE_COMPRESS";

/// A request's hold on its key while it builds: the claim in the cache directory and the
/// one in the fleet's store (either may be missing: the request builds alone), and the
/// core of the host it reserved with its claim; let go when dropped, after its answer is
/// kept: the core first, so that a waiter of this process woken by the claim's let-go
/// finds it free.
pub struct Building {
    _core: Option<Reserved>,
    _local: Option<Box<Claim>>,
    _fleet: Option<Box<FleetClaim>>,
}

impl Building {
    /// No claim: building alone.
    pub fn alone() -> Building {
        Building {
            _local: None,
            _fleet: None,
            _core: None,
        }
    }
}

/// A request's turn after every level missed (`Levels::after_miss`).
pub enum Turn {
    /// Build, holding what it could claim; the notes say why it builds alone.
    Build(Building),
    /// Another's build of the key was kept meanwhile: ask the levels again.
    Ready,
    /// Another builds the key, and the request stepped aside (it has other work first).
    Later,
}

/// What the levels answer a request (`Levels::ask`).
pub enum Lookup {
    /// A level's entry; `waited`: kept by another's build this request waited for.
    Hit(Hit, bool),
    /// Build it (holding its claims).
    Build(Building),
    /// A failure that repeats, remembered (the answer).
    Failed(Refusal),
    /// Another builds it; the request stepped aside.
    Later,
}

/// The key a failure of `key` is kept under (a failure is never an entry of its key).
pub fn failure_key(key: &str) -> String {
    let mut hash = blake3::Hasher::new();
    hash.update(b"a failure that repeats\0");
    hash.update(key.as_bytes());
    hash.finalize().to_hex().to_string()
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
                fleet: None,
                compress_own: true,
            });
        };
        let compress_own = crate::knobs::bool_knob(COMPRESS_ENV, true)?;
        levels.push(Box::new(Local(cache.clone())));
        // A refused directory answers nothing: a waiter there would never be answered.
        let shared = crate::knobs::bool_knob(SHARE_BUILDS_ENV, true)? && cache.in_service();
        let fleet = cfg.as_ref().filter(|_| shared).cloned();
        if let Some(cfg) = cfg {
            levels.push(Box::new(Store {
                cfg,
                cache: cache.clone(),
            }));
        }
        Ok(Levels {
            levels,
            claims: shared.then(|| Claims::of(cache.dir())),
            fleet,
            cache: Some(cache),
            compress_own,
        })
    }

    /// After every level missed `key`: a failure of it that repeats, kept by an earlier
    /// build or by the build this request waited for (the error, counted as remembered
    /// when `counted`), or a cancel while it waited (the error); else this request's turn:
    /// it takes the key's claims (the cache directory's, then the store's) and builds, or
    /// waits for the build of the one that holds one (`wait`) and asks the levels again.
    pub fn after_miss(
        &self,
        (key, target): (&str, Target<'_>),
        wait: &Wait<'_>,
        counted: bool,
        notes: &mut Vec<String>,
    ) -> std::result::Result<Turn, Refusal> {
        let Some(claims) = &self.claims else {
            return Ok(Turn::Build(Building::alone()));
        };
        let start = std::time::Instant::now();
        // The answer is the failure: counted as remembered, or (a cancel) as a request.
        let told = |refusal: Refusal| {
            if counted {
                self.count(match refusal.attempts.is_empty() {
                    true => Answered::Refused,
                    false => Answered::Remembered(&refusal.attempts),
                });
            }
            Err(refusal)
        };
        // This user's own level here; the store's is seen by its turn (`fleet_turn`).
        if let Some(refusal) = self.remembered((key, target), false, notes) {
            notes.push(format!(
                "this kernel failed the same way before with this compiler: not built again \
                 ({SHARE_BUILDS_ENV}=0 builds it anyway)"
            ));
            return told(refusal);
        }
        // Kept by another: an entry of the key in this user's own level, or its failure;
        // what a look says is kept once, however many looks say it.
        let mut seen: Vec<String> = Vec::new();
        let mut kept = || -> Option<Option<Refusal>> {
            let mut said = Vec::new();
            let local = self.levels.iter().find(|l| l.own())?;
            let found = match local.get(key, target, &mut said).ok().flatten() {
                Some(_) => Some(None),
                None => self.remembered((key, target), false, &mut said).map(Some),
            };
            said.retain(|n| !seen.contains(n));
            seen.append(&mut said);
            found
        };
        // With the fleet's store a build on another node is seen only through the store's
        // claim, after this one: no wait for a core here (a free core is taken after).
        let core_turn: &dyn Fn(Duration) -> CoreTurn = match self.fleet {
            Some(_) => &|_| CoreTurn::Go,
            None => &reserve_core,
        };
        let turn = (wait.step_aside, core_turn);
        let waited = claims.wait(key, (wait.bound(), wait.cancel), turn, &mut kept);
        notes.append(&mut seen);
        let (local, core) = match waited {
            Waited::Mine(claim, core, cold) => {
                notes.extend(cold.map(claims::waited_for_core));
                (Some(claim), core)
            }
            Waited::Alone(why) => {
                notes.push(format!("built without waiting: {why}"));
                (None, None)
            }
            Waited::SteppedAside => return Ok(Turn::Later),
            Waited::Answered(found, waited, _) => {
                return self.waited_for(found, waited, notes).or_else(told)
            }
            Waited::Cancelled => return told(Refusal::cancelled()),
        };
        // The store's wait has what is left of the one bound.
        let left = wait.bound().map(|b| b.saturating_sub(start.elapsed()));
        let fleet = match self.fleet_turn((key, target), (left, wait.cancel), notes) {
            Ok(None) => return Ok(Turn::Ready),
            Ok(Some(fleet)) => fleet,
            Err(refusal) => return told(refusal),
        };
        Ok(Turn::Build(Building {
            _local: local.map(Box::new),
            _fleet: fleet.map(Box::new),
            _core: core.or_else(|| self.fleet.as_ref().and_then(|_| free_core())),
        }))
    }

    /// What a wait for another's build found (`found`: an entry, else its failure), said.
    fn waited_for(
        &self,
        found: Option<Refusal>,
        waited: Duration,
        notes: &mut Vec<String>,
    ) -> std::result::Result<Turn, Refusal> {
        let waited = waited.as_secs_f64();
        match found {
            None => {
                notes.push(format!(
                    "waited {waited:.2} s for another's build of this kernel: answered from it"
                ));
                Ok(Turn::Ready)
            }
            Some(refusal) => {
                notes.push(format!(
                    "another's build of this kernel failed, waited for ({waited:.1} s): not \
                     built again"
                ));
                Err(refusal)
            }
        }
    }

    /// The failure of `key` kept as one that repeats, if any: in this user's own level,
    /// and the store's too when `everywhere` (one that does not decode under its key, or
    /// does not repeat, is refused and said).
    fn remembered(
        &self,
        (key, target): (&str, Target<'_>),
        everywhere: bool,
        notes: &mut Vec<String>,
    ) -> Option<Refusal> {
        let at = failure_key(key);
        let keeping = self.levels.iter().filter(|l| l.keeps_failures());
        for level in keeping.filter(|l| everywhere || l.own()) {
            let Some(raw) = level.get(&at, target, notes).ok().flatten() else {
                continue;
            };
            match cache::decode_within::<Refusal>(&at, &raw, level.most_inflated()) {
                Ok((refusal, _)) if refusal.repeats() => return Some(refusal),
                Ok(_) => level.refuse(&at, raw.len(), "not a failure that repeats", notes),
                Err(why) => level.refuse(&at, raw.len(), &why, notes),
            }
        }
        None
    }

    /// Keep a failure of `key`'s build when it repeats (`Refusal::repeats`), in every
    /// level that keeps failures and this node may write, so that the next request for
    /// the key, in any process using this cache or the fleet's store, is answered with it
    /// without a build. What it says is returned.
    pub fn remember(&self, (key, target): (&str, Target<'_>), refusal: &Refusal) -> Vec<String> {
        if self.claims.is_none() || !refusal.repeats() {
            return Vec::new();
        }
        let at = failure_key(key);
        let entry = match cache::encode(&at, refusal, &[]) {
            Ok(entry) => entry,
            Err(e) => return vec![format!("failure not remembered: {e}")],
        };
        let keeping = self.levels.iter().filter(|l| l.keeps_failures());
        keeping
            .filter_map(|l| match l.put(&at, target, &entry, true) {
                Ok(put) => put.note(),
                Err(e) => Some(format!("failure not remembered: {e}")),
            })
            .collect()
    }

    /// The levels of a request (`open`) and their answer to `key` (`find`, from the
    /// first level on); on a miss everywhere, with `wait`, its turn (`after_miss`): a
    /// failure remembered, a build of another waited for, or its claims to build. A bad
    /// setting is the error, counted as a refused request when the request is `counted`.
    pub fn ask(
        asked: Asked<'_>,
        (counted, wait): (bool, Option<Wait<'_>>),
        (key, target): (&str, Target<'_>),
        fits: Fits<'_>,
        notes: &mut Vec<String>,
    ) -> Result<(Levels, Lookup)> {
        let cache = asked.cache.clone();
        let looked = (|| {
            let levels = Levels::open(asked)?;
            let find = |notes: &mut Vec<String>| levels.find(0, key, target, Some(fits), notes);
            let looked = match (find(notes)?, wait) {
                (Some(hit), _) => Lookup::Hit(hit, false),
                (None, None) => Lookup::Build(Building::alone()),
                (None, Some(wait)) => match levels.after_miss((key, target), &wait, counted, notes)
                {
                    Ok(Turn::Build(building)) => Lookup::Build(building),
                    Ok(Turn::Later) => Lookup::Later,
                    Ok(Turn::Ready) => match find(notes)? {
                        Some(hit) => Lookup::Hit(hit, true),
                        None => Lookup::Build(Building::alone()),
                    },
                    Err(refusal) => Lookup::Failed(refusal),
                },
            };
            Ok((levels, looked))
        })();
        // Counted once the lookup is over, whichever step refused it.
        if looked.is_err() && counted {
            accounts::count_in(cache.as_ref(), Answered::Refused);
        }
        looked
    }

    /// The first level's entry of `key` that is whole and `key`'s, from the level at
    /// `from` on, as its level checks it (`Level::check`: against `fits`, what the caller
    /// needs of a binary it did not build; None: the caller checks it by loading it); it
    /// is then copied into the faster levels.
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
            let checked = cache::decode_within::<Record>(key, &raw, level.most_inflated())
                .map(|(record, binary)| Entry { record, binary })
                .and_then(|entry| level.check(&entry, fits).map(|()| entry));
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
            self.compress_kept(level.as_ref(), (key, target), (&raw, &entry));
            return Ok(Some(Hit {
                entry,
                counter: level.hits(),
                at,
            }));
        }
        Ok(None)
    }

    /// An entry of this user's own level kept as built (by the last format, or with
    /// `XPU_ZEBIN_CACHE_COMPRESS` off), now kept compressed: when a hit has it in hand,
    /// synced as a fresh build is (nothing is rebuilt or lost, and a rewrite that fails
    /// leaves it as it was). Tried once per key in a process, whatever came of it: an
    /// entry that stays as built (it would inflate more than a reader takes, or the cache
    /// cannot be written) never costs a compression on every hit.
    fn compress_kept(
        &self,
        level: &dyn Level,
        (key, target): (&str, Target<'_>),
        (raw, entry): (&[u8], &Entry),
    ) {
        static TRIED: std::sync::Mutex<Option<std::collections::HashSet<String>>> =
            std::sync::Mutex::new(None);
        /// Past this many, no more are tried in this process (the set stays small).
        const MOST_TRIED: usize = 1 << 16;
        if !(level.own() && self.compress_own && cache::is_plain(raw)) {
            return;
        }
        {
            let mut tried = crate::sync::lock(&TRIED);
            let tried = tried.get_or_insert_with(Default::default);
            if tried.len() >= MOST_TRIED || !tried.insert(key.to_string()) {
                return;
            }
        }
        let lean = cache::encode(key, &entry.record, &entry.binary).ok();
        if let Some(lean) = lean.filter(|lean| cache::is_compressed(lean)) {
            let _ = level.put(key, target, &lean, true);
        }
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
        let scope = match (repeatable, linked) {
            (false, _) => Keep::Nowhere,
            (true, false) => Keep::Here,
            (true, true) => Keep::Everywhere,
        };
        // Only levels that are never written (bundles), or none: nothing is encoded (a
        // level-15 frame costs milliseconds to tens of them, on every native load too).
        if self.cache.is_none() {
            return Ok(Vec::new());
        }
        if scope == Keep::Nowhere {
            return Ok(vec![
                "not cached: an attempt failed in a way that may not repeat".into(),
            ]);
        }
        // This user's own level, when it keeps entries as built; the compressed entry is
        // made once, for the first level that takes it.
        let as_built = match self.compress_own {
            true => None,
            false => cache::encode_plain(key, record, binary).ok(),
        };
        let mut entry = None;
        let mut notes = Vec::new();
        for level in &self.levels {
            if !(scope == Keep::Everywhere || level.own()) {
                continue;
            }
            let bytes = match (level.own(), &as_built) {
                (true, Some(plain)) => plain,
                _ => match entry.get_or_insert_with(|| cache::encode(key, record, binary)) {
                    Ok(entry) => entry,
                    Err(e) => {
                        notes.push(format!("not cached: {e}"));
                        break;
                    }
                },
            };
            notes.extend(level.put(key, target, bytes, true)?.note());
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
        let (record, binary) = match cache::decode::<Record>(key, &raw) {
            Ok(entry) => entry,
            Err(why) => {
                local.refuse(key, raw.len(), &why, &mut notes);
                return Ok(false);
            }
        };
        if fits.check(&binary, record.spill).is_err() {
            return Ok(false);
        }
        // What this node kept as built (`COMPRESS_ENV`) goes out compressed, as every
        // node's does.
        let raw = match cache::is_plain(&raw) {
            true => match cache::encode(key, &record, &binary) {
                Ok(entry) => entry,
                Err(_) => return Ok(false),
            },
            false => raw,
        };
        let mut wrote = false;
        for level in slower {
            wrote |= matches!(level.put(key, target, &raw, true)?, Put::Yes);
        }
        Ok(wrote)
    }

    /// Count the request's answer once, in its directory's ledger.
    pub fn count(&self, answered: Answered<'_>) {
        accounts::count_in(self.cache.as_ref(), answered);
    }
}

//! The fleet's level: a remote store on Redis behind the local cache, every entry signed.
//!
//! `XPU_ZEBIN_REMOTE` turns it on (`address.rs` gives its forms); `XPU_ZEBIN_REMOTE_MODE`
//! is `read-only` (the default) or `read-write`. An entry from the store is taken only when
//! a key of `XPU_ZEBIN_TRUSTED_KEYS` signed it for this very request (`format.rs`); a
//! read-write node with `XPU_ZEBIN_SIGNING_KEY` publishes what it compiled. The store can
//! never hang, crash or poison a compile: every operation has a deadline, every reply a
//! bound (`client.rs`); a store that is down, slow, full or answers garbage means
//! compiling locally, with one warning, and the store is left alone for `BACKOFF` after.

use super::address::redacted;
use super::client::{self, StoreError};
use super::format;
use crate::cache::{Counter, Ledger};
use crate::diag::warn_once;
use crate::error::{BuildError, ErrorKind, Result};
use crate::knobs;
use crate::signing::{Signer, Trusted, SIGNING_KEY_ENV, TRUSTED_KEYS_ENV};
use crate::sync::{lock, Renewable};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const REMOTE_ENV: &str = "XPU_ZEBIN_REMOTE";
pub const MODE_ENV: &str = "XPU_ZEBIN_REMOTE_MODE";
pub const TIMEOUT_ENV: &str = "XPU_ZEBIN_REMOTE_TIMEOUT";
pub const TTL_ENV: &str = "XPU_ZEBIN_REMOTE_TTL";
pub const MAX_BYTES_ENV: &str = "XPU_ZEBIN_REMOTE_MAX_BYTES";
/// The local cache's own bound on an entry.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// After the store could not be used it is left alone this long (no timeout per kernel).
pub const BACKOFF: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub url: String,
    pub read_write: bool,
    pub timeout: Duration,
    /// Whole seconds (a TTL of 0.5 s lives a second, not for ever); 0: no expiry.
    pub ttl: u64,
    pub max_bytes: u64,
}

fn bad(name: &str, text: &str, expected: &str) -> BuildError {
    BuildError::new(
        ErrorKind::InvalidArgument,
        format!("{name}={text:?} is not valid: expected {expected}"),
    )
}

/// The store this process uses, from the environment; None when `XPU_ZEBIN_REMOTE` is
/// unset. A bad value is an `invalid_argument` naming it (never ignored).
pub fn config() -> Result<Option<Config>> {
    let Some(url) = knobs::text_knob(REMOTE_ENV)? else {
        return Ok(None);
    };
    let url = url.trim().to_string();
    if let Err(why) = super::address::Address::parse(&url) {
        // What does not parse may hold a password anywhere: only the reason of a URL
        // without user info is said.
        let why = if url.contains('@') {
            "it does not parse".into()
        } else {
            why
        };
        return Err(bad(
            REMOTE_ENV,
            &redacted(&url),
            &format!("redis://[user:password@]host:port/db (rediss:// for TLS; {why})"),
        ));
    }
    let mode = knobs::text_knob(MODE_ENV)?.unwrap_or_default();
    let read_write = match mode.trim().to_ascii_lowercase().as_str() {
        "" | "read-only" => false,
        "read-write" => true,
        _ => return Err(bad(MODE_ENV, &mode, "read-only or read-write")),
    };
    let timeout = knobs::seconds_knob(TIMEOUT_ENV, DEFAULT_TIMEOUT)?;
    let ttl = knobs::seconds_knob(TTL_ENV, DEFAULT_TTL)?;
    Ok(Some(Config {
        url,
        read_write,
        timeout: if timeout.is_zero() {
            DEFAULT_TIMEOUT
        } else {
            timeout
        },
        ttl: ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0),
        max_bytes: knobs::bytes_knob(MAX_BYTES_ENV, DEFAULT_MAX_BYTES)?,
    }))
}

// --- what this process saw --------------------------------------------------------------

/// Stores this process found failing, left alone until a moment (per address).
#[derive(Default)]
struct Seen {
    down_until: HashMap<String, Instant>,
}

fn forget_after_fork() {
    SEEN.renew();
}

static SEEN: Renewable<Mutex<Seen>> =
    Renewable::new(|| Mutex::new(Seen::default()), forget_after_fork);

/// What the store gave a request goes into the ledger of its cache (none: a cache refused
/// or off, so nothing is counted), as every other answer does.
fn count(ledger: Option<&Ledger>, c: Counter) {
    if let Some(l) = ledger {
        l.count(c, 1);
    }
}

/// Forget the stores left alone, the clients and what was said (each test a fresh node).
pub fn reset() {
    *lock(SEEN.get()) = Seen::default();
    client::forget_clients();
    lock(crate::diag::SAID.get()).retain(|k| !k.starts_with("remote:"));
}

pub fn usable(cfg: &Config) -> bool {
    let seen = lock(SEEN.get());
    seen.down_until
        .get(&cfg.url)
        .is_none_or(|until| *until <= Instant::now())
}

/// The store could not be used: one warning, then it is left alone for a while.
fn failed(cfg: &Config, e: &StoreError, ledger: Option<&Ledger>) {
    count(ledger, Counter::StoreErrors);
    lock(SEEN.get())
        .down_until
        .insert(cfg.url.clone(), Instant::now() + BACKOFF);
    warn_once(
        &format!("remote:down:{}", cfg.url),
        format!(
            "xpu-zebin: remote store {} unusable ({}: {e}); compiling locally",
            redacted(&cfg.url),
            e.name()
        ),
    );
}

/// An entry of the store refused (`why`), counted and said once.
pub(crate) fn untrusted(why: &str, ledger: Option<&Ledger>) {
    count(ledger, Counter::RefusedUntrusted);
    warn_once(
        "remote:untrusted",
        format!(
            "xpu-zebin: an entry of the remote store was not loaded ({why}); built locally \
             (xpu-zebin remote verify lists such entries)"
        ),
    );
}

/// What a value must have been signed as: its store key, entry key, device and compiler.
pub struct Wanted<'a> {
    pub rkey: &'a [u8],
    pub key: &'a str,
    pub device: &'a str,
    pub compiler: &'a str,
}

/// For each of `wanted`, the entry stored at its key when a trusted key signed it as
/// asked; None otherwise: absent (a miss), untrusted (counted, warned once), or the store
/// failing (one warning, then left alone). One read for all of them; with `all_or_none`,
/// all or none. Also how many were untrusted. A malformed `XPU_ZEBIN_TRUSTED_KEYS` is the
/// error. Misses, refusals and failures are counted in `ledger`.
pub fn signed_values(
    cfg: &Config,
    wanted: &[Wanted<'_>],
    all_or_none: bool,
    ledger: Option<&Ledger>,
) -> Result<Vec<Option<Vec<u8>>>> {
    let none = || vec![None; wanted.len()];
    let trust = Trusted::from_env()?;
    if trust.is_empty() {
        warn_once(
            "remote:no-trust",
            format!(
                "xpu-zebin: {REMOTE_ENV} is set but {TRUSTED_KEYS_ENV} is not: nothing from \
                 the store can be trusted, so nothing is loaded from it"
            ),
        );
        return Ok(none());
    }
    if !usable(cfg) {
        return Ok(none());
    }
    let keys: Vec<&[u8]> = wanted.iter().map(|w| w.rkey).collect();
    let read = client::client(&cfg.url, cfg.timeout)
        .and_then(|c| c.read(&keys, cfg.max_bytes, all_or_none));
    let values = match read {
        Ok(values) => values,
        Err(StoreError::TooLarge { key, size }) => {
            count(ledger, Counter::StoreTooLarge);
            warn_once(
                "remote:large",
                format!(
                    "xpu-zebin: remote entry {key} is {size} bytes or more, more than \
                     {MAX_BYTES_ENV}={}: not read",
                    cfg.max_bytes
                ),
            );
            return Ok(none());
        }
        Err(e) if e.about_the_key() => {
            untrusted(&e.to_string(), ledger);
            return Ok(none());
        }
        Err(e) => {
            failed(cfg, &e, ledger);
            return Ok(none());
        }
    };
    let mut found = Vec::with_capacity(wanted.len());
    for (value, w) in values.iter().zip(wanted) {
        let entry = match value {
            None => {
                count(ledger, Counter::StoreMisses);
                None
            }
            Some(v) => match format::signed_entry(&trust, v, w.key, w.device, w.compiler) {
                Ok(entry) => Some(entry.to_vec()),
                Err(why) => {
                    untrusted(&why, ledger);
                    None
                }
            },
        };
        if all_or_none && entry.is_none() {
            return Ok(none());
        }
        found.push(entry);
    }
    Ok(found)
}

/// `data`, signed as `key`'s built for `device` with `compiler`, at `rkey` with the
/// store's TTL (a read-write node with a signing key); true when written (counted in
/// `ledger`).
pub fn put_signed(
    cfg: &Config,
    (rkey, key): (&[u8], &str),
    (device, compiler): (&str, &str),
    data: &[u8],
    ledger: Option<&Ledger>,
) -> Result<bool> {
    if !cfg.read_write || !usable(cfg) {
        return Ok(false);
    }
    let Some(signer) = Signer::from_env()? else {
        warn_once(
            "remote:no-key",
            format!(
                "xpu-zebin: {MODE_ENV}=read-write but {SIGNING_KEY_ENV} is not set: nothing \
                 is published (an unsigned entry would never be loaded)"
            ),
        );
        return Ok(false);
    };
    let value = format::pack_signed(&signer, key, device, compiler, data);
    if value.len() as u64 > cfg.max_bytes {
        return Ok(false);
    }
    match client::client(&cfg.url, cfg.timeout).and_then(|c| c.set(rkey, &value, cfg.ttl)) {
        Ok(()) => {
            count(ledger, Counter::StorePublished);
            Ok(true)
        }
        Err(e) => {
            failed(cfg, &e, ledger);
            Ok(false)
        }
    }
}

/// Where the fleet's claims on keys being built live (`levels::claims`): beside the
/// entries, never among them (`remote verify` and `purge` never see one).
pub const CLAIM_PREFIX: &str = "xpu-zebin:claim:v1:";

/// What a claim in the store came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    Taken,
    /// Another node holds it (a claim that expires within its expiry, as ours do).
    Held,
    /// A claim there that is not one of ours: it lives for ever or longer than a claim
    /// may (set by hand, or by a stray client): not waited for.
    Foreign,
    /// No claim: this node does not publish (read-only, no signing key) and nobody holds
    /// it, or the store failed (said once, then left alone).
    No,
}

/// Whether this node publishes what it builds: read-write, with a signing key.
fn publishes(cfg: &Config) -> bool {
    cfg.read_write && matches!(Signer::from_env(), Ok(Some(_)))
}

/// Take `key`'s claim in the store for `token`, living `expiry` unless renewed; only a
/// node that publishes takes one (its waiters are answered by what it publishes), but any
/// node learns that another holds it.
pub fn take_claim(
    cfg: &Config,
    (key, token): (&str, &str),
    expiry: Duration,
    ledger: Option<&Ledger>,
) -> Claimed {
    if !usable(cfg) {
        return Claimed::No;
    }
    let rkey = format!("{CLAIM_PREFIX}{key}");
    let take = publishes(cfg);
    let asked = client::client(&cfg.url, cfg.timeout)
        .and_then(|c| c.claim(rkey.as_bytes(), token.as_bytes(), expiry, take));
    let most = i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX);
    match asked {
        Ok(None) => Claimed::Taken,
        Ok(Some(-2)) => Claimed::No, // gone meanwhile, or never there
        Ok(Some(ms)) if (0..=most).contains(&ms) => Claimed::Held,
        Ok(Some(_)) => Claimed::Foreign,
        Err(e) => {
            failed(cfg, &e, ledger);
            Claimed::No
        }
    }
}

/// Live `expiry` more, `key`'s claim while it is `token`'s; false when it is not (expired,
/// taken over) or the store failed.
pub fn renew_claim(cfg: &Config, key: &str, token: &str, expiry: Duration) -> bool {
    let rkey = format!("{CLAIM_PREFIX}{key}");
    client::client(&cfg.url, cfg.timeout)
        .and_then(|c| c.renew_claim(rkey.as_bytes(), token.as_bytes(), expiry))
        .unwrap_or(false)
}

/// Let go of `key`'s claim, while it is still `token`'s.
pub fn release_claim(cfg: &Config, key: &str, token: &str) {
    let rkey = format!("{CLAIM_PREFIX}{key}");
    let _ = client::client(&cfg.url, cfg.timeout)
        .and_then(|c| c.delete_if_unchanged(rkey.as_bytes(), Some(token.as_bytes())));
}

/// Whether the store holds a value at `key` (an entry's or a failure's), asked without
/// reading it; false when the store failed.
pub fn holds(cfg: &Config, key: &str) -> bool {
    let rkey = format!("{}{key}", format::PREFIX);
    usable(cfg)
        && client::client(&cfg.url, cfg.timeout)
            .and_then(|c| c.exists(rkey.as_bytes()))
            .unwrap_or(false)
}

/// Triton's own entries: the bytes at each of `rkeys` when a trusted key signed them for
/// that key and `identity` (what they were built with); each key read once. Their hits
/// are counted where they are used (`Counter::TritonHits`), the rest in `ledger`.
pub fn fetch_signed(
    cfg: &Config,
    (rkeys, identity): (&[String], &str),
    all_or_none: bool,
    ledger: Option<&Ledger>,
) -> Result<Vec<Option<Vec<u8>>>> {
    let mut unique: Vec<&String> = Vec::new();
    for k in rkeys {
        if !unique.contains(&k) {
            unique.push(k);
        }
    }
    let wanted: Vec<Wanted<'_>> = unique
        .iter()
        .map(|k| Wanted {
            rkey: k.as_bytes(),
            key: k,
            device: "",
            compiler: identity,
        })
        .collect();
    let got = signed_values(cfg, &wanted, all_or_none, ledger)?;
    let found: Vec<Option<Vec<u8>>> = rkeys
        .iter()
        .map(|k| {
            unique
                .iter()
                .position(|u| *u == k)
                .and_then(|i| got[i].clone())
        })
        .collect();
    Ok(found)
}

/// Triton's entry `data` signed for `rkey` and `identity`, into the store.
pub fn publish_signed(
    cfg: &Config,
    (rkey, identity): (&str, &str),
    data: &[u8],
    ledger: Option<&Ledger>,
) -> Result<bool> {
    put_signed(cfg, (rkey.as_bytes(), rkey), ("", identity), data, ledger)
}

/// What the store holds, for `xpu-zebin remote stats | verify | purge`: streamed a SCAN
/// page at a time (bounded memory at any size), each value read within the bound.
#[derive(Debug, Default, serde::Serialize)]
pub struct Survey {
    pub entries: u64,
    pub bytes: u64,
    pub bad: Vec<BadEntry>,
    pub purged: u64,
}

#[derive(Debug, serde::Serialize)]
pub struct BadEntry {
    pub key: String,
    pub why: String,
}

/// At most this many bad entries are listed (all are counted and purged), each key shown
/// up to this many bytes.
pub const MAX_LISTED: usize = 10_000;
pub const MAX_LISTED_KEY: usize = 1024;
/// A SCAN ends when the server says so; one that never does is refused after this many
/// keys (a store a hundred times larger than any fleet's).
pub const MAX_SURVEYED: u64 = 100_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Stats,
    Verify,
    Purge,
}

pub fn survey(
    cfg: &Config,
    action: Action,
    cancel: &std::sync::atomic::AtomicBool,
) -> std::result::Result<Survey, String> {
    let trust = Trusted::from_env().map_err(|e| e.message)?;
    if action != Action::Stats && trust.is_empty() {
        // With no key trusted every entry fails: purge would empty the store.
        return Err(format!(
            "{action:?} needs {TRUSTED_KEYS_ENV}: the keys whose entries are good"
        ));
    }
    let store = client::client(&cfg.url, cfg.timeout).map_err(|e| format!("{}: {e}", e.name()))?;
    let said = |e: StoreError| format!("{}: {e}", e.name());
    let mut report = Survey::default();
    for prefix in format::NAMESPACES {
        let pattern = format!("{prefix}*");
        let mut cursor = 0;
        let mut seen = std::collections::HashSet::new();
        loop {
            let (next, names) = store.scan(cursor, pattern.as_bytes()).map_err(said)?;
            if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                return Err("cancelled".into());
            }
            for chunk in names.chunks(PIPELINED) {
                survey_chunk(&store, cfg, &trust, action, chunk, &mut report).map_err(said)?;
            }
            // Redis's cursors end at 0; one seen before would go round for ever.
            if next == 0 || !seen.insert(next) || report.entries > MAX_SURVEYED {
                if next != 0 {
                    return Err(format!("the store's SCAN did not end (cursor {next})"));
                }
                break;
            }
            cursor = next;
        }
    }
    Ok(report)
}

/// Keys whose values one pipelined read asks for: what a hostile store may answer each of
/// them with (a 64 KiB error line) stays a few MiB whatever a SCAN page's size.
const PIPELINED: usize = 64;

/// Keys of a SCAN page: their values read in one pipelined round (all of them within the
/// bound of one value), each counted, checked, purged when bad; keys that cannot be read
/// that way (a value over the bound, a key of another type) are read one by one.
fn survey_chunk(
    store: &client::Client,
    cfg: &Config,
    trust: &Trusted,
    action: Action,
    names: &[Vec<u8>],
    report: &mut Survey,
) -> std::result::Result<(), StoreError> {
    let keys: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
    let values = match store.read(&keys, cfg.max_bytes, false) {
        Ok(values) if values.len() == names.len() => values,
        Err(e) if !matches!(e, StoreError::TooLarge { .. }) && !e.about_the_key() => return Err(e),
        _ => {
            for name in names {
                survey_one(store, cfg, trust, action, name, report)?;
            }
            return Ok(());
        }
    };
    for (name, value) in names.iter().zip(values) {
        if let Some((value, why)) = as_read(store, name, value)? {
            account(store, trust, action, name, value, why, report)?;
        }
    }
    Ok(())
}

/// A key as a survey read it: its value, or why it is bad.
type Read = (Option<Vec<u8>>, Option<String>);

/// A key's value as read (`None`: empty or gone): the value, or why it is bad; `None` when
/// the key is gone since SCAN listed it.
fn as_read(
    store: &client::Client,
    name: &[u8],
    value: Option<Vec<u8>>,
) -> std::result::Result<Option<Read>, StoreError> {
    Ok(match value {
        Some(value) => Some((Some(value), None)),
        None if !store.exists(name)? => None,
        None => Some((None, Some("malformed (an empty value)".to_string()))),
    })
}

/// One key of the survey, read alone: counted, checked, purged when bad.
fn survey_one(
    store: &client::Client,
    cfg: &Config,
    trust: &Trusted,
    action: Action,
    name: &[u8],
    report: &mut Survey,
) -> std::result::Result<(), StoreError> {
    let (value, why) = match store.read(&[name], cfg.max_bytes, false) {
        Ok(mut v) => match as_read(store, name, v.pop().flatten())? {
            Some(read) => read,
            None => return Ok(()),
        },
        Err(StoreError::TooLarge { .. }) => (None, Some("larger than the bound".into())),
        Err(e) if e.about_the_key() => (None, Some("not a string value".into())),
        Err(e) => return Err(e),
    };
    account(store, trust, action, name, value, why, report)
}

/// A key read: counted, checked, purged when bad (`why`: what its read already found).
fn account(
    store: &client::Client,
    trust: &Trusted,
    action: Action,
    name: &[u8],
    value: Option<Vec<u8>>,
    why: Option<String>,
    report: &mut Survey,
) -> std::result::Result<(), StoreError> {
    report.entries += 1;
    report.bytes += value.as_ref().map_or(0, |v| v.len() as u64);
    if action == Action::Stats {
        return Ok(());
    }
    let Some(why) = why.or_else(|| format::check(trust, name, value.as_deref())) else {
        return Ok(());
    };
    if action == Action::Purge && (value.is_some() || why == "not a string value") {
        report.purged += u64::from(store.delete_if_unchanged(name, value.as_deref())?);
    }
    if report.bad.len() < MAX_LISTED {
        let mut key = String::from_utf8_lossy(&name[..name.len().min(MAX_LISTED_KEY)]).into_owned();
        if name.len() > MAX_LISTED_KEY {
            key.push_str("...");
        }
        report.bad.push(BadEntry { key, why });
    }
    Ok(())
}

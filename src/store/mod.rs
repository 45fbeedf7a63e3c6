//! Every level of native code behind one lookup: the local cache (`crate::cache`, under
//! `engine::Slot`), then the fleet's remote store (`remote`: a bounded Redis client of
//! its own, `client`, `connection`, `resp`, `address`; signed values, `format`). A compile
//! goes through `through_levels`: the local level answers first, then a trusted entry of
//! the store (taken into the local cache), then the compiler, whose fresh build a
//! read-write node publishes. The compile path never knows which level answered but by
//! the result's `from_store`.

pub mod accounts;
pub mod address;
mod any_cert;
pub mod client;
pub mod connection;
pub mod format;
pub mod remote;
pub mod resp;

use crate::engine::{self, CompileRequest, Compiled, Outcome, Slot};
use crate::error::Result;

use crate::cache::{Counter, Ledger};
use remote::{Config, Wanted};
use std::sync::atomic::AtomicBool;

/// Compile `req` through every level: the store's, then this process's compiler.
pub fn compile(req: &CompileRequest, cancel: &AtomicBool) -> Outcome {
    through_levels(req, |slot| {
        engine::compile_in_slot(slot, req, cancel, &|| true)
    })
}

/// `engine::compile_many`, each request through every level.
pub fn compile_many(
    reqs: &[CompileRequest],
    jobs: usize,
    cancel: &AtomicBool,
    on_done: &(dyn Fn(usize) + Sync),
) -> Vec<Outcome> {
    engine::compile_many_through(reqs, jobs, cancel, on_done, &|req, may_speculate| {
        through_levels(req, |slot| {
            engine::compile_in_slot(slot, req, cancel, may_speculate)
        })
    })
}

/// `build(slot)` with the store's levels in front of it: the answer of the first level
/// that has one, the request checked once for all of them. A bad store setting is the
/// error.
pub fn through_levels(req: &CompileRequest, build: impl FnOnce(&Slot) -> Outcome) -> Outcome {
    let slot = engine::prepare(req)?;
    let outcome = answer(req, &slot, build);
    accounts::count(&slot, &outcome);
    outcome
}

fn answer(req: &CompileRequest, slot: &Slot, build: impl FnOnce(&Slot) -> Outcome) -> Outcome {
    let cfg = match remote::config() {
        Ok(Some(cfg)) if req.options.cache => cfg,
        Ok(_) => return build(slot),
        Err(e) => return Err(Box::new(e.into())),
    };
    if slot.local().is_none() {
        if let Some(found) = fetch(&cfg, slot).map_err(|e| Box::new(e.into()))? {
            return Ok(found);
        }
    }
    let built = build(slot)?;
    if !built.cached {
        publish(&cfg, slot, Some(&built.binary))?;
    }
    Ok(built)
}

/// The store's trusted entry for `slot`, taken into the local cache; None when there is
/// none (or it is not this request's: counted as untrusted, never loaded).
pub fn fetch(cfg: &Config, slot: &Slot) -> Result<Option<Compiled>> {
    let ledger = slot.ledger();
    let found = signed_entry(
        cfg,
        slot.key(),
        slot.device(),
        slot.compiler(),
        ledger.as_deref(),
    )?;
    let Some(entry) = found else {
        return Ok(None);
    };
    match slot.adopt(&entry) {
        Ok(mut compiled) => {
            remote::count_hit();
            compiled.from_store = true;
            Ok(Some(compiled))
        }
        Err(e) => {
            refused(ledger.as_deref(), &e.message);
            Ok(None)
        }
    }
}

/// The entry the store holds under `key` when a trusted key signed it as `key`'s, built
/// for `device` with `compiler`; the untrusted ones counted in `ledger`.
fn signed_entry(
    cfg: &Config,
    key: &str,
    device: &str,
    compiler: &str,
    ledger: Option<&Ledger>,
) -> Result<Option<Vec<u8>>> {
    let rkey = format!("{}{key}", format::PREFIX);
    let wanted = Wanted {
        rkey: rkey.as_bytes(),
        key,
        device,
        compiler,
    };
    let (mut found, untrusted) = remote::signed_values(cfg, &[wanted], false)?;
    if let (true, Some(l)) = (untrusted > 0, ledger) {
        l.count(Counter::RefusedUntrusted, untrusted);
    }
    Ok(found.pop().flatten())
}

/// A signed entry that is not the request's own after all: said once, counted, not taken.
fn refused(ledger: Option<&Ledger>, why: &str) {
    remote::untrusted(why);
    if let Some(l) = ledger {
        l.count(Counter::RefusedUntrusted, 1);
    }
}

/// `entry`, signed as `key`'s built for `device` with `compiler`, into the store.
fn put(cfg: &Config, key: &str, device: &str, compiler: &str, entry: &[u8]) -> Result<bool> {
    let rkey = format!("{}{key}", format::PREFIX);
    remote::put_signed(cfg, rkey.as_bytes(), key, device, compiler, entry)
}

/// After a fresh build of `binary` on a read-write node with a signing key: the slot's
/// local entry, signed, into the store; never an entry that does not hold `binary` (the
/// local cache is read back, and it is shared). `binary` None: whatever entry it holds
/// (a farm publishing its cache).
pub fn publish(cfg: &Config, slot: &Slot, binary: Option<&[u8]>) -> Result<bool> {
    if !cfg.read_write {
        return Ok(false);
    }
    let Some(entry) = slot.local() else {
        return Ok(false);
    };
    match crate::cache::decode::<crate::ladder::Record>(slot.key(), &entry) {
        Ok((_, held)) if binary.is_none_or(|b| held == b) => {}
        _ => return Ok(false),
    }
    put(cfg, slot.key(), slot.device(), slot.compiler(), &entry)
}

/// A Level Zero load's levels around the driver's JIT (`ze::load`): on a local miss, the
/// store's trusted entry for `key` (built for `target`: device and driver) is taken into
/// the local cache, where the load then finds it and trial-loads it in a worker, as any
/// cached binary. True when it was taken. A bad store setting is the error.
pub fn before_jit(cache: &crate::cache::Cache, key: &str, target: &str) -> Result<bool> {
    let Some(cfg) = remote::config()? else {
        return Ok(false);
    };
    if cache.raw(key).is_some() {
        return Ok(false); // the local level answers first
    }
    let ledger = cache.ledger();
    let Some(entry) = signed_entry(&cfg, key, "", target, ledger.as_deref())? else {
        return Ok(false);
    };
    match crate::cache::decode::<crate::ladder::Record>(key, &entry) {
        Ok((record, binary)) => {
            cache.put_copy(key, &record, &binary);
            remote::count_hit();
            Ok(true)
        }
        Err(why) => {
            refused(ledger.as_deref(), &why);
            Ok(false)
        }
    }
}

/// After a fresh JIT build of a read-write node: its local entry, signed for `target`,
/// into the store; true when written.
pub fn after_jit(cache: &crate::cache::Cache, key: &str, target: &str) -> Result<bool> {
    let Some(cfg) = remote::config()? else {
        return Ok(false);
    };
    let Some(entry) = cache.raw(key).filter(|_| cfg.read_write) else {
        return Ok(false);
    };
    put(&cfg, key, "", target, &entry)
}

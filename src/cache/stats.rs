//! `xpu-zebin stats`: what a cache directory holds and what every process that used it
//! counted (`ledger.rs`), as ccache's `-s` and sccache's `--show-stats` report theirs.

use super::Cache;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Serialize)]
pub struct Stats {
    pub cache_dir: String,
    pub entries: u64,
    pub bytes: u64,
    pub max_bytes: u64,
    /// Counters by name (`Counter::name`).
    pub counters: BTreeMap<&'static str, u64>,
    /// Other hosts whose counts are in these (each publishes its own in the directory).
    pub other_hosts: u64,
    /// A cleaning in progress (done a slice per write): the next of its shards.
    pub cleaning: Option<Cleaning>,
}

#[derive(Debug, Serialize)]
pub struct Cleaning {
    pub next_shard: usize,
    pub shards: usize,
}

/// The stats of `cache` (zeros for a directory never written); `zero`: its counters are
/// set back to zero after they are read (the entries' accounts stay); `recount`: every
/// shard is counted again first.
pub fn stats(cache: &Cache, zero: bool, recount: bool) -> Stats {
    if recount {
        cache.recount();
    }
    let (entries, bytes) = cache.usage();
    let ledger = cache.ledger();
    let counters = cache
        .counters(zero)
        .into_iter()
        .map(|(c, n)| (c.name(), n))
        .collect();
    let other_hosts = ledger.as_ref().map_or(0, |l| l.other_hosts());
    Stats {
        cache_dir: cache.dir().display().to_string(),
        entries,
        bytes,
        max_bytes: cache.max_bytes,
        counters,
        other_hosts,
        cleaning: ledger.and_then(|l| l.round()).map(|r| Cleaning {
            next_shard: r.next / super::ledger::PARTS,
            shards: super::ledger::SHARDS,
        }),
    }
}

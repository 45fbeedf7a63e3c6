//! Keeping a cache directory within its bound, at any size: no write lists the directory.
//! The ledger (`ledger.rs`) says how large the cache is; when it is over its bound, the
//! least recently used entries of the whole cache are removed until it holds nine tenths
//! of it, a slice per write, so a cleaning comes once per tenth of the bound written, and
//! neither its cost per entry removed nor the entries one write stats and removes grow
//! with the cache (a slice reads the names of the shards it is in: a 256th of the cache's
//! each). Upkeep runs under the directory's upkeep lock (`keeper.rs`), taken without
//! waiting: a process that finds it taken leaves the work to the one holding it.

use super::ledger::{Counter, Ledger, Round, PARTS, ROUND_PARTS, SHARDS};
use super::{ABANDONED_TEMP, MAX_ENTRY_BYTES, TEMP_PREFIX};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The name of shard `shard`'s directory.
pub fn shard_name(shard: usize) -> String {
    format!("{:02x}", shard % SHARDS)
}

/// The shard of `key`: its first two hex digits (keys are blake3 in hex), else a hash's.
pub fn shard_of(key: &str) -> usize {
    match key.get(..2).and_then(|h| u8::from_str_radix(h, 16).ok()) {
        Some(s) => s as usize % SHARDS,
        None => blake3::hash(key.as_bytes()).as_bytes()[0] as usize % SHARDS,
    }
}

/// One entry on disk: when last used, its size, where.
type Found = (SystemTime, u64, PathBuf);

/// The entries of shard `shard` (a dead writer's temp file is removed on the way), and
/// the ledger set to what they hold. Only this user's regular files of an entry's size
/// are entries; a shard that is not this user's private directory holds none.
pub fn recount(dir: &Path, ledger: &Ledger, shard: usize) -> Vec<Found> {
    let found = list(&dir.join(shard_name(shard)));
    let bytes = found.iter().fold(0u64, |t, f| t.saturating_add(f.1));
    ledger.set_shard(shard, bytes, found.len() as u64);
    found
}

/// A shard's entries.
fn list(shard: &Path) -> Vec<Found> {
    found(names(shard).into_iter().flatten())
}

/// A shard's directory read (names only: no system call per entry), by part
/// (`part_of`); nothing when it is not this user's private directory.
fn names(shard: &Path) -> [Vec<std::fs::DirEntry>; PARTS] {
    let mut by_part: [Vec<std::fs::DirEntry>; PARTS] = Default::default();
    if crate::private::check_dir(shard, 0o002).is_ok() {
        for entry in std::fs::read_dir(shard).into_iter().flatten().flatten() {
            by_part[part_of(&entry.file_name())].push(entry);
        }
    }
    by_part
}

/// Which of `entries` are entries: this user's regular files of an entry's size, with
/// their last use (a dead writer's temp file is removed on the way).
fn found(entries: impl Iterator<Item = std::fs::DirEntry>) -> Vec<Found> {
    let now = SystemTime::now();
    let uid = crate::private::uid();
    let mut found = Vec::new();
    for entry in entries {
        // DirEntry::metadata does not follow a link.
        let (path, Ok(m)) = (entry.path(), entry.metadata()) else {
            continue;
        };
        let Ok(modified) = m.modified() else { continue };
        if !m.file_type().is_file() || m.uid() != uid {
            continue;
        }
        if path.extension().is_some_and(|x| x == "zeentry") && m.len() <= MAX_ENTRY_BYTES {
            found.push((modified, m.len(), path));
        } else if abandoned(&entry.file_name(), modified, now) {
            let _ = std::fs::remove_file(&path);
        }
    }
    found
}

/// The parts of a round from `next` on, within `budget` entries (at least one part): a
/// shard's directory is read once, and only the parts taken are stat'ed. Each part's
/// entries go to `each` (the part, its entries); the part after the last one taken.
fn parts(dir: &Path, next: usize, budget: usize, mut each: impl FnMut(usize, Vec<Found>)) -> usize {
    let (mut next, mut seen) = (next, 0usize);
    while next < ROUND_PARTS && seen < budget {
        let shard = next / PARTS;
        let mut by_part = names(&dir.join(shard_name(shard)));
        while seen < budget {
            let part = std::mem::take(&mut by_part[next % PARTS]);
            seen += part.len();
            each(next, found(part.into_iter()));
            next += 1;
            if next.is_multiple_of(PARTS) {
                break;
            }
        }
    }
    next
}

/// Whether a file is a temp file of a writer that died (`.tmp-`, untouched for an hour).
pub fn abandoned(name: &std::ffi::OsStr, modified: SystemTime, now: SystemTime) -> bool {
    name.as_encoded_bytes().starts_with(TEMP_PREFIX.as_bytes())
        && now.duration_since(modified).unwrap_or_default() > ABANDONED_TEMP
}

/// Remove the temp files of dead writers directly in `dir` (a ledger being made, an
/// entry of a last layout), when it is this user's private directory.
pub fn sweep(dir: &Path) {
    if crate::private::check_dir(dir, 0o002).is_err() {
        return;
    }
    let now = SystemTime::now();
    let uid = crate::private::uid();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(m) = entry.metadata() else { continue };
        let ours = m.file_type().is_file() && m.uid() == uid;
        if ours
            && m.modified()
                .is_ok_and(|t| abandoned(&entry.file_name(), t, now))
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// (entries, bytes) of every shard, listed (when there is no ledger).
pub fn listed(dir: &Path) -> (u64, u64) {
    (0..SHARDS)
        .flat_map(|s| list(&dir.join(shard_name(s))))
        .fold((0, 0), |(n, b), f| (n + 1, b + f.1))
}

/// The bound held without a ledger: every shard listed, the least recently used entries
/// removed until the cache fits; a note when any was.
pub fn evict_listed(dir: &Path, max_bytes: u64) -> Option<String> {
    let mut all: Vec<Found> = (0..SHARDS)
        .flat_map(|s| list(&dir.join(shard_name(s))))
        .collect();
    let mut total = all.iter().fold(0u64, |t, f| t.saturating_add(f.1));
    if total <= max_bytes {
        return None;
    }
    all.sort();
    let mut removed = 0;
    for (_, len, path) in all {
        if total <= max_bytes {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total = total.saturating_sub(len);
            removed += 1;
        }
    }
    Some(format!(
        "cache over {max_bytes} bytes: evicted {removed} least recently used entries"
    ))
}

/// Entries listed to plan a round: every part of a cache this small; of a larger one, a
/// sample of whole parts (keys spread evenly over them), scaled up.
const SAMPLE_ENTRIES: usize = 16_384;
/// Names taken per slice of a round (its entries stat'ed, the old ones removed): what one
/// write pays for, whatever the cache's size, besides reading its shards' names.
pub const SLICE_ENTRIES: usize = 2048;
/// A whole cleaning in one call (tests: writes clean a slice each).
#[cfg(test)]
pub const WHOLE: usize = usize::MAX;

/// The part of its shard an entry is in, for a round's slices: its key's third hex digit,
/// else a hash's (a file that is no entry is in part 0), so that a slice stays a few
/// hundred entries at a million entries' cache.
fn part_of(name: &std::ffi::OsStr) -> usize {
    let Some(key) = name.to_str().and_then(|n| n.strip_suffix(".zeentry")) else {
        return 0;
    };
    match key.get(2..3).and_then(|h| u8::from_str_radix(h, 16).ok()) {
        Some(d) => d as usize % PARTS,
        None => blake3::hash(key.as_bytes()).as_bytes()[1] as usize % PARTS,
    }
}

/// Remove the least recently used entries of the whole cache until it holds nine tenths of
/// `max_bytes` (the oldest go first, whichever shard they are in), a slice at a time: a
/// round is planned when the cache is over its bound, then each call lists parts of
/// shards until it has seen `slice` entries, removing those last used before the round's
/// cutoff, then as many of the entries last used at that very time as it takes (they tie:
/// time stamps are coarse), and setting each shard's accounts to what it left there. The
/// round lives in the ledger, so whichever process next keeps the directory up goes on
/// with it, and no write pays for a cleaning of the whole cache; it ends once the cache is
/// down to its target, and a process whose bound is larger leaves it alone once the cache
/// is within its own nine tenths. An entry used meanwhile is newer, and stays. The number
/// removed.
pub fn clean(dir: &Path, ledger: &Ledger, max_bytes: u64, slice: usize) -> u64 {
    let target = max_bytes - max_bytes / 10;
    let round = match ledger.round() {
        // A round the ledger cannot have planned (its words are shared) is dropped.
        Some(r) if !sane(&r, ledger) => {
            ledger.set_round(None);
            return 0;
        }
        // A walk ends at the last shard, never early: until then the ledger is not known.
        Some(r) if r.only_walks() => r,
        // Done: down to the target it was planned for.
        Some(r) if ledger.bytes() <= r.target => {
            ledger.set_round(None);
            return 0;
        }
        // A round for a smaller bound than this process's: left to the processes that have
        // it (this one never cleans below its own nine tenths, nor ends their round).
        Some(_) if ledger.bytes() <= target => return 0,
        Some(r) => r,
        None if ledger.bytes() <= max_bytes => return 0,
        None => match plan(dir, ledger, target) {
            Some(r) => r,
            None => return 0,
        },
    };
    let Round {
        cut,
        mut tied,
        mut kept,
        ..
    } = round;
    let mut removed = 0;
    let next = parts(dir, round.next, slice, |part, found| {
        let shard = part / PARTS;
        for (used, len, path) in found {
            let at = nanos(used);
            let old = at < cut || (at == cut && tied > 0);
            match old.then(|| std::fs::remove_file(&path)) {
                Some(Ok(())) => {
                    ledger.add(shard, -(len as i64), -1);
                    removed += 1;
                    if at == cut {
                        tied = tied.saturating_sub(len);
                    }
                }
                Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {} // gone meanwhile
                _ => kept = (kept.0.saturating_add(len), kept.1.saturating_add(1)),
            }
        }
        if (part + 1).is_multiple_of(PARTS) {
            ledger.set_shard(shard, kept.0, kept.1); // listed whole: its true accounts
            kept = (0, 0);
        }
    });
    let target = round.target;
    ledger.set_round(Some(&Round {
        cut,
        tied,
        next,
        kept,
        target,
    })); // ends it past the last part
    if next >= ROUND_PARTS {
        // Every shard's accounts set: a new ledger's are known now; otherwise the next
        // plan trusts them (a walk it planned found them wrong).
        match ledger.unknown_generation() {
            0 => ledger.set_walked(),
            unknown => ledger.counted_whole(unknown),
        }
    }
    ledger.count(Counter::Evictions, removed);
    removed
}

/// Whether a round is one a cleaning could have planned: cut no later than a day from now
/// (clocks differ), tied bytes no more than the cache holds.
fn sane(round: &Round, ledger: &Ledger) -> bool {
    const DAY: u64 = 86_400_000_000_000;
    round.cut <= nanos(SystemTime::now()).saturating_add(DAY)
        && round.tied <= ledger.bytes()
        && (!round.next.is_multiple_of(PARTS) || round.kept == (0, 0))
}

/// A round for a cache over its bound, down to `target` bytes, set in the ledger: the
/// last use before which entries go, and the bytes of those used then that go too. The
/// first parts are listed, keeping each entry's last use and size (16 bytes an entry),
/// until `SAMPLE_ENTRIES` are seen: when that is every part, the round is exact (and every
/// shard's accounts set); otherwise it takes the sample's share of what the cache must
/// lose, the cache's size being the ledger's when the sample bears it out (within a fifth
/// of the sample's estimate) or the last round walked every shard. Otherwise the round
/// planned removes nothing and sets each shard's accounts as it passes it (a ledger set
/// wrong by external removals, another host's writes over NFS, a stray word).
fn plan(dir: &Path, ledger: &Ledger, target: u64) -> Option<Round> {
    let mut uses: Vec<(u64, u64)> = Vec::new();
    let mut shard_total = (0u64, 0u64);
    let listed = parts(dir, 0, SAMPLE_ENTRIES, |part, found| {
        for (used, len, _) in found {
            uses.push((nanos(used), len));
            shard_total = (shard_total.0.saturating_add(len), shard_total.1 + 1);
        }
        if (part + 1).is_multiple_of(PARTS) {
            ledger.set_shard(part / PARTS, shard_total.0, shard_total.1); // counted whole
            shard_total = (0, 0);
        }
    });
    let share = |bytes: u64, of: u64, whole: u64| {
        u64::try_from(bytes as u128 * of as u128 / whole.max(1) as u128).unwrap_or(u64::MAX)
    };
    let sample = uses.iter().fold(0u64, |t, u| t.saturating_add(u.1));
    let estimate = share(sample, ROUND_PARTS as u64, listed as u64);
    let (said, walked) = (ledger.bytes(), ledger.take_walked());
    let near = |a: u64, b: u64| a as u128 * 5 >= b as u128 * 4; // within a fifth
    let total = match said {
        _ if listed == ROUND_PARTS => sample,
        _ if walked || (near(said, estimate) && near(estimate, said)) => said,
        _ => {
            // The ledger and the sample disagree: a round that removes nothing first, and
            // sets each shard's accounts as it passes it; the next plan trusts them.
            ledger.set_round(Some(&Round::walk()));
            return None;
        }
    };
    if total <= target {
        return None;
    }
    // The sample's share of what must go: all of it, when the sample is the cache.
    let go = share(sample, total - target, total);
    uses.sort_unstable();
    // The last use at which enough is gone, and the bytes of the entries used before it.
    let (mut gone, mut cut, mut older) = (0u64, 0, 0u64);
    for &(used, len) in &uses {
        if gone >= go {
            break;
        }
        if used != cut {
            (cut, older) = (used, gone);
        }
        gone = gone.saturating_add(len);
    }
    let tied = share(go - older, ROUND_PARTS as u64, listed as u64);
    let round = Round {
        cut,
        tied,
        target,
        ..Round::default()
    };
    ledger.set_round(Some(&round));
    Some(round)
}

/// A last use as nanoseconds since 1970 (0 before it).
fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Count every shard now (the caller holds the upkeep lock): the accounts are known and
/// right, and a round that only walks to set them has nothing left to do.
pub fn recount_all(dir: &Path, ledger: &Ledger) {
    let unknown = ledger.unknown_generation();
    sweep(dir);
    sweep(&dir.join(super::hosts::DIR));
    for shard in 0..SHARDS {
        recount(dir, ledger, shard);
    }
    if ledger.round().is_some_and(|r| r.only_walks()) {
        // The walk is done: the next plan trusts the accounts, as at a walk's end.
        ledger.set_round(None);
        if unknown == 0 {
            ledger.set_walked();
        }
    }
    ledger.counted_whole(unknown);
}

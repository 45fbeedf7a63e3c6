//! The files of hosts that are gone, folded into one. A host's file outlives the host (a
//! finished job's node, a pod, a container with its own `/dev/shm`), and every step lists
//! the hosts' names, so the upkeep lock's holder, when it recounts a shard, folds the
//! files not written for `FOLD_AFTER` into `folded.counts` (their words summed, read by
//! every pass like one more host's), `FOLD_STEP` at a time. A host that comes back finds
//! its file gone and goes on from zero (`publish_own`): what it did is in the fold.
//!
//! Each file is first renamed out of the hosts' names (`<id>.folding`), so that its host,
//! back meanwhile, makes a new one rather than write into it. The fold's new version is
//! written whole and renamed into place, naming the files it took: a holder killed before
//! it removed them leaves them to the next, which removes them without adding them again;
//! one killed before it wrote the fold leaves them renamed, and the next adds them.

use super::{read_kind, Kind, HOST, OWN_WORDS};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

/// The fold, in the hosts' directory.
pub const FOLDED: &str = "folded.counts";
/// A host's file is folded once it has not been written for this long.
pub const FOLD_AFTER: Duration = Duration::from_secs(24 * 3600);
pub use crate::cache::ledger::FOLD_CURSOR;
/// Files folded at most per fold: what one upkeep pays.
const FOLD_STEP: usize = 64;
/// The fold's words, then how many files it took last and their ids.
const FOLD: Kind = Kind {
    magic: b"XZFOLDS1",
    words: OWN_WORDS + 1 + FOLD_STEP,
};
const FOLDING: &str = ".folding";

/// The fold's words (zeros when there is none), and the ids of the files it took last;
/// `InvalidData` when something else is at its name (never written over: it may hold
/// every gone host's words).
pub fn read_fold(hosts: &Path) -> std::io::Result<(Vec<u64>, Vec<u64>)> {
    let words = match read_kind(hosts, FOLDED, 0, &FOLD)? {
        Some(words) => words,
        None if std::fs::symlink_metadata(hosts.join(FOLDED))
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) =>
        {
            vec![0; FOLD.words]
        }
        None => {
            let why = format!("{FOLDED} is not a fold of this user's");
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, why));
        }
    };
    let taken = usize::try_from(words[OWN_WORDS]).map_or(0, |n| n.min(FOLD_STEP));
    let ids = words[OWN_WORDS + 1..OWN_WORDS + 1 + taken].to_vec();
    Ok((words[..OWN_WORDS].to_vec(), ids))
}

/// The host id a name in the hosts' directory is of, with its suffix (`.counts`,
/// `.folding`); not the zero's, nor a name of another form.
pub(super) fn id_of(name: &std::ffi::OsStr, suffix: &str) -> Option<u64> {
    let hex = name.to_str()?.strip_suffix(suffix)?;
    let id = (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())??;
    (id > FOLD_CURSOR).then_some(id)
}

fn folding_name(id: u64) -> String {
    format!("{id:016x}{FOLDING}")
}

/// Fold what hosts that are gone left in `hosts` (the caller holds the upkeep lock, so
/// one fold runs at a time; `own`, this host, is never folded): the files the last fold
/// took and did not remove, removed; those a fold renamed and did not take, and up to
/// `FOLD_STEP` in all not written for `FOLD_AFTER`, taken. How many were taken.
pub fn fold(hosts: &Path, own: u64) -> std::io::Result<usize> {
    let (mut words, last) = read_fold(hosts)?;
    let before = words.clone();
    if !last.is_empty() {
        for &id in &last {
            remove(&hosts.join(folding_name(id)))?;
        }
        // The list cleared before anything is renamed again: a file of the same host,
        // renamed by this fold, is never taken for one the last fold took.
        write_fold(hosts, &[&words[..], &[0]].concat())?;
    }
    let taken = take(hosts, own)?;
    let mut added = Vec::new();
    for id in taken {
        // Not a host's file (never whole, not of its size): nothing to add, removed all
        // the same; one that cannot be read now is put back, for the next fold.
        match read_kind(hosts, &folding_name(id), id, &HOST) {
            Ok(Some(theirs)) => {
                for (w, t) in words.iter_mut().zip(theirs) {
                    *w = w.wrapping_add(t);
                }
            }
            Ok(None) => {}
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {}
            Err(_) => {
                put_back(hosts, id); // read by the next fold
                continue;
            }
        }
        added.push(id);
    }
    if added.is_empty() {
        return Ok(0);
    }
    // Another fold since this one read it (two holders: a lease taken over) would be
    // written over: this one gives way, and puts back what it renamed.
    if read_fold(hosts)? != (before, Vec::new()) {
        for id in added {
            put_back(hosts, id);
        }
        return Ok(0);
    }
    words.push(added.len() as u64);
    words.extend_from_slice(&added);
    write_fold(hosts, &words)?;
    for &id in &added {
        remove(&hosts.join(folding_name(id)))?;
    }
    Ok(added.len())
}

/// The files to fold, renamed out of the hosts' names: those a fold renamed and did not
/// take, then those not written for `FOLD_AFTER` (by the file server's clock: a file made
/// now says what time it is there), up to `FOLD_STEP` in all.
fn take(hosts: &Path, own: u64) -> std::io::Result<Vec<u64>> {
    let now = tempfile::Builder::new()
        .prefix(crate::cache::TEMP_PREFIX)
        .tempfile_in(hosts)?
        .as_file()
        .metadata()?
        .modified()?;
    let uid = crate::private::uid();
    let mut taken = Vec::new();
    // Listed whole first: a name renamed now may be listed again, under its new name.
    let listed = std::fs::read_dir(hosts)?
        .take(super::MAX_HOSTS)
        .collect::<std::io::Result<Vec<_>>>()?;
    for entry in listed {
        if taken.len() >= FOLD_STEP {
            break;
        }
        let name = entry.file_name();
        let Ok(meta) = entry.metadata() else { continue }; // not followed
        if !meta.file_type().is_file() || meta.uid() != uid {
            continue;
        }
        if let Some(id) = id_of(&name, FOLDING) {
            taken.push(id); // renamed by a fold that did not take it
            continue;
        }
        let Some(id) = id_of(&name, ".counts").filter(|&id| id != own) else {
            continue;
        };
        let idle = meta
            .modified()
            .ok()
            .and_then(|t| now.duration_since(t).ok());
        // A file of this host renamed before and not taken is not replaced: taken first.
        let renamed = std::fs::symlink_metadata(hosts.join(folding_name(id))).is_ok();
        if idle.is_some_and(|idle| idle >= FOLD_AFTER) && !renamed {
            match std::fs::rename(entry.path(), hosts.join(folding_name(id))) {
                Ok(()) => taken.push(id),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    taken.sort_unstable();
    taken.dedup();
    Ok(taken)
}

/// The fold's new version, written whole (and to the disk) beside it and renamed into
/// place.
fn write_fold(hosts: &Path, words: &[u64]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = tempfile::Builder::new()
        .prefix(crate::cache::TEMP_PREFIX)
        .tempfile_in(hosts)?;
    tmp.write_all(&FOLD.encode(0, words))?;
    tmp.as_file().sync_all()?;
    tmp.persist(hosts.join(FOLDED)).map_err(|e| e.error)?;
    Ok(())
}

/// A renamed file not taken, back at its host's name (unless its host made a new file
/// meanwhile: then it stays renamed, for the next fold).
fn put_back(hosts: &Path, id: u64) {
    let renamed = hosts.join(folding_name(id));
    if std::fs::hard_link(&renamed, hosts.join(super::file_name(id))).is_ok() {
        let _ = std::fs::remove_file(renamed);
    }
}

fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

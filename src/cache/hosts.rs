//! Accounts across hosts, with no memory shared between them: each host's ledger
//! (`ledger.rs`, in memory only that host's processes share) publishes its own words in
//! the directory, `hosts/<host id>.counts`, and reads the other hosts' files into its
//! `others` words, a step of at most `STEP_HOSTS` files at a time. The cache's size, its
//! bound and `xpu-zebin stats` are then judged on the sum of every host's words, on NFS,
//! Lustre or GPFS as on one machine.
//!
//! A host's file has one writer at a time: whichever process of the host has its turn
//! (`Ledger::turn`), which publishes whatever was asked for before it lets go, so no
//! change is left unpublished and no older version lands after a newer one. It is written
//! in place and closed (NFS sends it to the server at close), with a checksum: a reader
//! that meets a version half written reads it again, and skips a file that is never
//! whole (or not this user's, or not of its size).

use super::ledger::{Counter, Ledger, Turn, OWN_WORDS};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The hosts' files, in the cache directory.
pub const DIR: &str = "hosts";
const MAGIC: &[u8; 8] = b"XZHOSTS1";
/// Other hosts' files read per step: what one write pays, besides listing the hosts'
/// names (a pass over a thousand hosts takes 16 steps).
pub const STEP_HOSTS: usize = 64;
/// A step is taken by a write at most this often on one host (a write with the upkeep
/// lock takes one whenever: it may set accounts from what the others' words say).
const STEP_EVERY: Duration = Duration::from_millis(50);
/// Host files read at most (more is someone's mistake): the rest are not read.
const MAX_HOSTS: usize = 65_536;
/// Counts a request made are published at least this often (a write publishes at once).
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// The counters' zero (`xpu-zebin stats --zero`): every host's counts when it was set.
const ZERO: &str = "zero.counts";
/// How long a reader that wants every host's latest words (`stats`, the upkeep lock's
/// holder) waits for its host's turn.
const TURN_WAIT: Duration = Duration::from_secs(2);
/// Steps in a row a host file may fail to be read before a pass goes on without it.
const GIVE_UP_STEPS: u64 = 16;

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn file_name(id: u64) -> String {
    format!("{id:016x}.counts")
}

/// The hosts' directory of a cache directory, as a step finds it.
enum Hosts {
    Here(PathBuf),
    /// None, and none can be made (a read-only directory): no other host published.
    Absent,
    /// Not this user's private directory (never read): said once, no other host counted.
    Refused(String),
    /// Could not be looked at now (NFS: ESTALE, EIO): the pass waits.
    Unknown,
}

/// The hosts' directory of `dir`, made (0700) when missing.
fn hosts_dir(dir: &Path) -> Hosts {
    let hosts = dir.join(DIR);
    match std::fs::symlink_metadata(&hosts) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let made = std::fs::DirBuilder::new().mode(0o700).create(&hosts);
            if made.is_err() && std::fs::symlink_metadata(&hosts).is_err() {
                return Hosts::Absent;
            }
        }
        Err(_) => return Hosts::Unknown,
        Ok(_) => {}
    }
    match crate::private::check_dir(&hosts, 0o002) {
        Ok(()) => Hosts::Here(hosts),
        Err(why) => Hosts::Refused(why),
    }
}

/// Publish this host's own words: now when `urgent` (a compile), else when they were
/// last published `PUBLISH_EVERY` ago (a hit; otherwise the next turn's holder publishes
/// them). Done by this process, or by the one that has the turn, before it lets go; a
/// failure is harmless (the next one tries again).
pub fn publish(dir: &Path, ledger: &Ledger, urgent: bool) {
    if ledger.host_id() == 0 {
        return;
    }
    ledger.want_published();
    let due = || ledger.publish_due(nanos(SystemTime::now()), PUBLISH_EVERY.as_nanos() as u64);
    if urgent || due() {
        with_turn(dir, ledger, |_| {});
    }
}

/// Publish this host's words now, waiting up to `TURN_WAIT` for the turn: the upkeep
/// lock's holder, before it lets go, so that the next holder (of any host) reads them.
pub fn publish_now(dir: &Path, ledger: &Ledger) {
    ledger.want_published();
    let deadline = std::time::Instant::now() + TURN_WAIT;
    // Once this process had the turn it tried (a read-only directory fails every time).
    while with_turn(dir, ledger, |_| {}).is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2)); // another process's turn: short
    }
}

/// Run `work` with this host's turn, when no one else has it, then publish what was
/// asked for (by this process or others meanwhile) before letting go, and again while
/// more is asked for after (a process that found the turn taken left it to this one).
fn with_turn<T>(dir: &Path, ledger: &Ledger, work: impl FnOnce(&Turn) -> T) -> Option<T> {
    let turn = ledger.turn()?;
    // A new ledger of a host that published before: nothing is published (over its file)
    // until its words go on from that file.
    let seeded = !turn.seed_pending() || seed(dir, ledger, &turn);
    if seeded {
        folded_away(dir, ledger, &turn); // before a pass reads the fold
    }
    let done = work(&turn);
    let (mut turn, mut failed) = (Some(turn), false);
    for _ in 0..8 {
        let Some(held) = turn.take() else { break };
        while seeded && !failed && held.take_wanted() {
            if let Err(e) = publish_own(dir, ledger, &held) {
                ledger.want_published(); // the next turn tries again
                crate::diag::detail("cache", format!("this host's accounts not published: {e}"));
                failed = true;
            }
        }
        drop(held);
        if failed || !seeded || !ledger.published_wanted() {
            break;
        }
        turn = ledger.turn(); // asked for again as this one let go, by one that found it taken
    }
    Some(done)
}

/// A host that wrote its file and finds it gone was folded while it was away (`fold.rs`),
/// or the file was removed: what it said is in the fold, or gone with it, so it is taken
/// out of this host's own words (before a pass can read the fold, or a recount take it in).
fn folded_away(dir: &Path, ledger: &Ledger, turn: &Turn) {
    if !turn.has_published() {
        return;
    }
    let own = dir.join(DIR).join(file_name(ledger.host_id()));
    if std::fs::symlink_metadata(own).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        turn.forget_own();
        let why = "this host's file was folded while it was away: what it said is in the fold";
        crate::diag::detail("cache", why);
    }
}

/// Write this host's file (the caller has the turn); gone since the turn began, it was
/// folded (`folded_away`).
fn publish_own(dir: &Path, ledger: &Ledger, turn: &Turn) -> std::io::Result<()> {
    let Hosts::Here(hosts) = hosts_dir(dir) else {
        return Err(std::io::Error::other("no private hosts directory"));
    };
    let (id, name) = (ledger.host_id(), file_name(ledger.host_id()));
    if turn.has_published() {
        let words = ledger.own_words();
        match write_in(&hosts, &name, id, &words, false) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => folded_away(dir, ledger, turn),
            Ok(()) => {
                turn.published(&words);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
    let words = ledger.own_words();
    write_in(&hosts, &name, id, &words, true)?;
    turn.published(&words);
    Ok(())
}

/// Fold the files of hosts that are gone (`fold.rs`); the caller holds the upkeep lock.
pub fn fold_gone(dir: &Path, ledger: &Ledger) {
    let Hosts::Here(hosts) = hosts_dir(dir) else {
        return;
    };
    match fold::fold(&hosts, ledger.host_id()) {
        Ok(0) => {}
        Ok(n) => {
            let why = format!(
                "{n} files of hosts gone for a day folded into {}",
                fold::FOLDED
            );
            crate::diag::detail("cache", why);
        }
        Err(e) => crate::diag::detail("cache", format!("gone hosts' files not folded: {e}")),
    }
}

/// A new ledger of a host that published before (its ledger was lost): its words go on
/// from its file, so what it did is counted once. Whether that is settled (its file read,
/// or there is none).
fn seed(dir: &Path, ledger: &Ledger, turn: &Turn) -> bool {
    let Hosts::Here(hosts) = hosts_dir(dir) else {
        turn.seeded(); // nothing this host published can be read here
        return true;
    };
    match read(&hosts, &file_name(ledger.host_id()), ledger.host_id()) {
        Ok(words) => {
            if let Some(words) = words {
                turn.seed(&words);
                turn.published(&words); // its file gone from now on: folded
            }
            turn.seeded();
            true
        }
        Err(_) => false, // read again by the next turn
    }
}

/// A kind of file of words: its magic and its words (a host's file; `fold.rs`'s).
pub(super) struct Kind {
    pub magic: &'static [u8; 8],
    pub words: usize,
}

const HOST: Kind = Kind {
    magic: MAGIC,
    words: OWN_WORDS,
};

impl Kind {
    /// Its size: magic, id, the words, blake3 of all before it.
    pub fn bytes(&self) -> usize {
        8 + 8 + self.words * 8 + 32
    }

    /// A file of this kind for `id`, of `words` (zeros past their end).
    pub fn encode(&self, id: u64, words: &[u64]) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.bytes());
        bytes.extend_from_slice(self.magic);
        bytes.extend_from_slice(&id.to_le_bytes());
        for i in 0..self.words {
            bytes.extend_from_slice(&words.get(i).copied().unwrap_or(0).to_le_bytes());
        }
        let sum = blake3::hash(&bytes);
        bytes.extend_from_slice(sum.as_bytes());
        bytes
    }
}

/// Write file `id` (a host's, or 0: the zero) of `dir`'s hosts in place: its size is
/// fixed, so a reader sees the whole of one version, or a mix its checksum refuses.
fn write(dir: &Path, id: u64, words: &[u64]) -> std::io::Result<()> {
    let Hosts::Here(hosts) = hosts_dir(dir) else {
        return Err(std::io::Error::other("no private hosts directory"));
    };
    let name = if id == 0 {
        ZERO.to_string()
    } else {
        file_name(id)
    };
    write_in(&hosts, &name, id, words, true)
}

/// `write`, in the hosts' directory `hosts`; `create`: made when missing (else missing
/// is `NotFound`).
fn write_in(hosts: &Path, name: &str, id: u64, words: &[u64], create: bool) -> std::io::Result<()> {
    let bytes = HOST.encode(id, words);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(hosts.join(name))?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || meta.uid() != crate::private::uid() {
        return Err(std::io::Error::other("not this user's regular file"));
    }
    file.write_all_at(&bytes, 0)?;
    if meta.len() > HOST.bytes() as u64 {
        file.set_len(HOST.bytes() as u64)?;
    }
    Ok(()) // closed here: on NFS, sent to the server
}

/// The words of file `name` of host `id` (0: the zero): Ok(None) when it is not one (not
/// this user's readable regular file of its size, magic and id); an error when it could
/// not be read whole (it may be a host's file: the pass does not go past it yet).
fn read(hosts: &Path, name: &str, id: u64) -> std::io::Result<Option<Vec<u64>>> {
    read_kind(hosts, name, id, &HOST)
}

/// `read`, of a file of `kind`.
pub(super) fn read_kind(
    hosts: &Path,
    name: &str,
    id: u64,
    kind: &Kind,
) -> std::io::Result<Option<Vec<u64>>> {
    let file_bytes = kind.bytes();
    let file = match crate::private::open_file(&hosts.join(name), false, false) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // A link, not a regular file, not readable: not a host's file.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ELOOP | libc::EACCES | libc::EPERM)
            ) =>
        {
            return Ok(None)
        }
        Err(e) if e.kind() == std::io::ErrorKind::Other => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if meta.uid() != crate::private::uid() || meta.len() != file_bytes as u64 {
        return Ok(None);
    }
    let mut bytes = vec![0u8; file_bytes];
    for _ in 0..3 {
        (&file).take(file_bytes as u64).read_exact(&mut bytes)?;
        let (body, sum) = bytes.split_at(file_bytes - 32);
        if &body[..8] != kind.magic || body[8..16] != id.to_le_bytes() {
            return Ok(None);
        }
        if blake3::hash(body) == *sum {
            let words = body[16..].chunks_exact(8);
            return Ok(Some(
                words
                    .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
                    .collect(),
            ));
        }
        std::io::Seek::rewind(&mut &file)?; // a version half written: read again
    }
    // The next step reads again (`InvalidData`: a fold takes it as no host's file).
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "never whole in three reads",
    ))
}

/// The ids of the hosts that published in `hosts`, sorted (at most `MAX_HOSTS`); an
/// error when the directory could not be listed whole.
fn ids(hosts: &Path) -> std::io::Result<Vec<u64>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(hosts)? {
        if let Some(id) = fold::id_of(&entry?.file_name(), ".counts") {
            ids.push(id);
            if ids.len() >= MAX_HOSTS {
                break;
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// Who steps on with a host's pass over the other hosts' files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A write: at most one step every `STEP_EVERY` on this host.
    Write,
    /// A step now, whenever the last was (tests).
    #[cfg(test)]
    Now,
    /// A reader that wants every host's latest words (`stats`): a pass begun now and taken
    /// to its end, waiting up to `FRESH_WAIT` for the turn.
    Fresh,
}

/// A step of this host's pass over the other hosts' files (`Step`); whether a pass ended.
pub fn step(dir: &Path, ledger: &Ledger, who: Step) -> bool {
    let fresh = who == Step::Fresh;
    let due = || ledger.step_due(nanos(SystemTime::now()), STEP_EVERY.as_nanos() as u64);
    if who == Step::Write && !due() {
        return false;
    }
    let deadline = std::time::Instant::now() + TURN_WAIT;
    loop {
        if let Some(ended) = with_turn(dir, ledger, |turn| step_with(dir, ledger, turn, fresh)) {
            return ended;
        }
        if !fresh || std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2)); // another process's turn: short
    }
}

fn step_with(dir: &Path, ledger: &Ledger, turn: &Turn, fresh: bool) -> bool {
    let hosts = match hosts_dir(dir) {
        Hosts::Here(hosts) => hosts,
        Hosts::Unknown => return false,
        found @ (Hosts::Absent | Hosts::Refused(_)) => {
            if let Hosts::Refused(why) = found {
                crate::diag::warn_once(&why, format!("{why}: other hosts' counts not read"));
            }
            turn.restart();
            turn.end(); // this host's words are the accounts
            return true;
        }
    };
    if fresh {
        turn.restart();
    }
    let Ok(ids) = ids(&hosts) else {
        return false; // not listed whole: the pass waits
    };
    if turn.after() == 0 {
        // The pass begins with the fold: the words of hosts that are gone.
        match fold::read_fold(&hosts) {
            Ok((words, _)) => {
                turn.read_ok(FOLD_CURSOR);
                turn.read_fold(&words);
            }
            Err(_) if turn.failed(fold::FOLD_CURSOR) >= GIVE_UP_STEPS => turn.read_fold(&[]),
            Err(_) => return false, // read again by the next step
        }
    }
    let own = ledger.host_id();
    let mut left = ids
        .iter()
        .filter(|&&id| id != own && id > turn.after())
        .peekable();
    let budget = if fresh { MAX_HOSTS } else { STEP_HOSTS };
    for _ in 0..budget {
        let Some(&&id) = left.peek() else { break };
        match read_whole(&hosts, id, fresh) {
            Ok(words) => {
                turn.read_ok(id);
                turn.read(id, words.as_deref());
            }
            // A file that cannot be read for many steps in a row is not waited for.
            Err(_) if turn.failed(id) >= GIVE_UP_STEPS => turn.read(id, None),
            Err(_) => return false, // read again by the next step
        }
        left.next();
    }
    let ended = left.peek().is_none();
    if ended {
        turn.end();
    }
    ended
}

/// Host `id`'s file read by a step; `fresh`: a pass that must end now (the upkeep lock's
/// holder) reads a file another host is writing again, a moment later, for up to 100 ms.
fn read_whole(hosts: &Path, id: u64, fresh: bool) -> std::io::Result<Option<Vec<u64>>> {
    let mut tries = if fresh { 50 } else { 1 };
    loop {
        match read(hosts, &file_name(id), id) {
            Err(_) if tries > 1 => tries -= 1,
            done => return done,
        }
        std::thread::sleep(Duration::from_millis(2)); // its writer is mid-write: short
    }
}

/// The counters as every host counted them, less the zero last set; `zero`: set the zero
/// to them now (nothing counted meanwhile is lost).
pub fn counters(dir: &Path, ledger: &Ledger, zero: bool) -> Vec<(Counter, u64)> {
    let base = match hosts_dir(dir) {
        Hosts::Here(h) => read(&h, ZERO, 0).ok().flatten(),
        _ => None,
    };
    let at = |c: Counter| 2 * super::ledger::SHARDS + c as usize;
    let now: Vec<(Counter, u64)> = Counter::ALL
        .iter()
        .map(|&c| (c, ledger.counter(c)))
        .collect();
    if zero {
        let mut words = vec![0u64; OWN_WORDS];
        for &(c, n) in &now {
            words[at(c)] = n;
        }
        if let Err(e) = write(dir, 0, &words) {
            crate::diag::detail("cache", format!("counters not set to zero: {e}"));
        }
    }
    now.into_iter()
        .map(|(c, n)| {
            let since = base.as_ref().map_or(0, |b| b[at(c)]);
            (c, n.saturating_sub(since))
        })
        .collect()
}

mod fold;
pub use fold::FOLD_CURSOR;
#[cfg(test)]
mod tests;

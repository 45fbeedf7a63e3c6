//! A cache directory's accounts, kept in one small file that every process using the
//! directory maps (`MAP_SHARED`): the bytes and entries of each shard and of the whole,
//! and the counters `xpu-zebin stats` reads. Each change is one atomic add on the mapped
//! page, so a write or a hit costs nanoseconds whatever the cache's size, and no lock is
//! held: two processes adding at once both count, and a process killed between two adds
//! leaves each add whole. What can drift (a writer killed between its rename and its add)
//! is set right by recounting: one shard every `RECOUNT_EVERY` writes, a shard as it is
//! cleaned, everything when the file is new or when asked (`xpu-zebin stats --recount`).
//!
//! The file is one host's (its memory is shared by that host's processes only): its own
//! words count what this host did, and each write publishes them beside the entries
//! (`hosts.rs`), where every other host reads them into its `others` words. The cache's
//! accounts are the sum of both, so they hold across hosts with no memory shared.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

mod turn;
use turn::host_id_for;
pub use turn::Turn;

/// Shards of a cache directory, each made on its first entry: 256, so that a shard of a
/// million entries' cache (3,900 each) still has a one-level ext4 name index (a shard of
/// 62,500, a 16th, needs two, and every create in it then costs more).
pub const SHARDS: usize = 256;
/// Parts of a shard a cleaning round goes through one at a time (by the key's third hex
/// digit), and so the parts of a round.
pub const PARTS: usize = 16;
pub const ROUND_PARTS: usize = SHARDS * PARTS;
const MAGIC: u64 = u64::from_le_bytes(*b"XZLEDGR6");
/// Words: a header; this host's own words (bytes and entries of each shard, counters),
/// what it publishes; the sum of the other hosts' own words, as last read.
const HEADER: usize = 24;
const COUNTERS: usize = 64;
pub const OWN_WORDS: usize = 2 * SHARDS + COUNTERS;
const OTHERS: usize = HEADER + OWN_WORDS;
/// Other hosts' words summed while a pass over their files is under way.
const PARTIAL: usize = OTHERS + OWN_WORDS;
/// This host's own words as it last published them (what a fold of its file took).
const LAST: usize = PARTIAL + OWN_WORDS;
const WORDS: usize = LAST + OWN_WORDS;
/// The file's size: whole pages.
pub const FILE_BYTES: usize = 20480;
const _: () = assert!(WORDS * 8 <= FILE_BYTES);
/// Where a pass over the hosts' files is once it read the fold (`hosts/fold.rs`): host
/// ids are above it (`host_id_for`).
pub const FOLD_CURSOR: u64 = 1;
/// One shard is recounted every this many writes (round robin: each shard every 262,144
/// writes; a write pays a 1024th of a shard's listing).
pub const RECOUNT_EVERY: u64 = 1024;

// Header words.
const W_MAGIC: usize = 0;
const W_WRITES: usize = 3;
const W_NEXT_RECOUNT: usize = 4;
/// Nonzero: the accounts are not known yet (a new file): recount everything.
const W_UNKNOWN: usize = 5;
/// A cleaning round (`Round`): its next part plus one (0: none), cutoff, tied bytes, and
/// what it kept so far of the shard it is in.
const W_ROUND_NEXT: usize = 1;
const W_ROUND_CUT: usize = 2;
const W_ROUND_TIED: usize = 6;
const W_ROUND_KEPT_BYTES: usize = 7;
const W_ROUND_KEPT_ENTRIES: usize = 8;
const W_ROUND_TARGET: usize = 9;
/// Nonzero: the last round walked every shard and set its accounts (the ledger's total is
/// then trusted by the next plan, whatever its sample shows).
const W_WALKED: usize = 10;
/// This host's id (random, never 0): the name of the file it publishes.
const W_HOST: usize = 11;
/// When this host last published (nanoseconds since 1970).
const W_PUBLISHED: usize = 12;
/// The pass over the other hosts' files: the last host id read (its cursor), and the
/// passes ended (the others' words are known once one has).
const W_PASS_AFTER: usize = 13;
const W_PASSES: usize = 14;
/// Other hosts read in the last pass, and so far in this one.
const W_HOSTS: usize = 15;
const W_PASS_READ: usize = 16;
/// Nonzero: this host's words changed and are to be published (by whoever has the turn).
const W_WANT: usize = 17;
/// Nonzero while a turn changes several of the pass's words: a turn that finds it set (its
/// holder was killed) begins the pass again.
const W_PASS_DIRTY: usize = 18;
/// Nonzero: a new ledger whose host may have published before (it lost its ledger): its
/// words go on from its file.
const W_SEED: usize = 19;
/// When the last step of a pass was taken (nanoseconds since 1970).
const W_STEPPED: usize = 20;
/// A host file the pass could not read (its id), and how many steps in a row.
const W_FAILED_ID: usize = 21;
const W_FAILED_STEPS: usize = 22;
/// Nonzero: this ledger wrote its host's file, or went on from it.
const W_WRITTEN: usize = 23;

/// A cleaning in progress, done a slice at a time by whichever process keeps the
/// directory up: entries last used before `cut` (nanoseconds since 1970) go, and `tied`
/// more bytes of those last used at `cut`, part by part from `next` (`ROUND_PARTS`);
/// `kept` (bytes, entries) is what it left of `next`'s shard in the parts before `next`,
/// so that each shard's accounts are set as the round passes it; `target`, the bytes the
/// round cleans down to (the bound of the process that planned it, less a tenth).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Round {
    pub cut: u64,
    pub tied: u64,
    pub next: usize,
    pub kept: (u64, u64),
    pub target: u64,
}

impl Round {
    /// A round that removes nothing (no entry is older than `cut` 0, none tied): a walk that
    /// sets every shard's accounts, planned when the ledger and its sample disagree.
    pub fn walk() -> Round {
        Round::default()
    }

    /// Whether this round only walks: it goes on to the last shard whatever the ledger
    /// says meanwhile (each shard it sets may bring the total under any bound).
    pub fn only_walks(&self) -> bool {
        self.cut == 0 && self.tied == 0
    }
}

/// The counters `xpu-zebin stats` reports, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    Requests,
    LocalHits,
    StoreHits,
    BundleHits,
    TritonHits,
    Compiles,
    RetriesPtss,
    RetriesSpill,
    RetriesFailure,
    RefusedUntrusted,
    RefusedChecksum,
    RefusedDriver,
    Evictions,
    CompileMicros,
    SavedMicros,
    Waits,
    WaitSavedMicros,
    RememberedFailures,
    StoreMisses,
    StoreTooLarge,
    StoreErrors,
    StorePublished,
    WrittenBytes,
    WrittenUncompressedBytes,
    TritonWaits,
    TritonWaitSavedMicros,
}

impl Counter {
    pub const ALL: [Counter; 26] = [
        Counter::Requests,
        Counter::LocalHits,
        Counter::StoreHits,
        Counter::BundleHits,
        Counter::TritonHits,
        Counter::Compiles,
        Counter::RetriesPtss,
        Counter::RetriesSpill,
        Counter::RetriesFailure,
        Counter::RefusedUntrusted,
        Counter::RefusedChecksum,
        Counter::RefusedDriver,
        Counter::Evictions,
        Counter::CompileMicros,
        Counter::SavedMicros,
        Counter::Waits,
        Counter::WaitSavedMicros,
        Counter::RememberedFailures,
        Counter::StoreMisses,
        Counter::StoreTooLarge,
        Counter::StoreErrors,
        Counter::StorePublished,
        Counter::WrittenBytes,
        Counter::WrittenUncompressedBytes,
        Counter::TritonWaits,
        Counter::TritonWaitSavedMicros,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Counter::Requests => "requests",
            Counter::LocalHits => "hits_local",
            Counter::StoreHits => "hits_store",
            Counter::BundleHits => "hits_bundle",
            Counter::TritonHits => "hits_triton_cache",
            Counter::Compiles => "compiles",
            Counter::RetriesPtss => "large_grf_retries_ptss",
            Counter::RetriesSpill => "large_grf_retries_spill",
            Counter::RetriesFailure => "large_grf_retries_other_failure",
            Counter::RefusedUntrusted => "refused_untrusted",
            Counter::RefusedChecksum => "refused_checksum",
            Counter::RefusedDriver => "refused_driver",
            Counter::Evictions => "evictions",
            Counter::CompileMicros => "compiler_microseconds",
            Counter::SavedMicros => "saved_microseconds",
            Counter::Waits => "waits",
            Counter::WaitSavedMicros => "wait_saved_microseconds",
            Counter::RememberedFailures => "remembered_failures",
            Counter::StoreMisses => "misses_store",
            Counter::StoreTooLarge => "refused_too_large",
            Counter::StoreErrors => "store_errors",
            Counter::StorePublished => "published_store",
            Counter::WrittenBytes => "written_bytes",
            Counter::WrittenUncompressedBytes => "written_uncompressed_bytes",
            Counter::TritonWaits => "waits_triton_front_end",
            Counter::TritonWaitSavedMicros => "wait_saved_triton_front_end_microseconds",
        }
    }
}

pub struct Ledger {
    words: *const AtomicU64,
    /// The file mapped: (device, inode).
    file: (u64, u64),
    /// The file, open for the host's turn (`turn.rs`), a POSIX record lock on it: never
    /// closed while the process runs, since closing any descriptor of the file lets go of
    /// the process's lock.
    open: std::mem::ManuallyDrop<File>,
}

// SAFETY: the mapping is shared memory used only through atomics, unmapped only when the
// last owner drops it.
unsafe impl Send for Ledger {}
unsafe impl Sync for Ledger {}

impl Drop for Ledger {
    fn drop(&mut self) {
        // SAFETY: mapped by `open` with this length; no reference outlives `self`.
        unsafe { libc::munmap(self.words as *mut libc::c_void, FILE_BYTES) };
    }
}

/// A count that went below zero for a moment (adds of two processes crossing, or a host's
/// own words after it removed what another wrote) reads 0.
fn clamp(v: u64) -> u64 {
    if v > u64::MAX / 2 {
        0
    } else {
        v
    }
}

impl Ledger {
    /// The ledger of the cache in `dir` (made when missing or not one: then unknown, and
    /// recounted by the next write). `dir` was checked as this user's, private to others.
    pub fn open(dir: &Path) -> std::io::Result<Ledger> {
        Ledger::open_at(&location(dir)?)
    }

    /// The ledger file at `path` (a host's; tests open two for one directory).
    pub fn open_at(path: &Path) -> std::io::Result<Ledger> {
        let home = path.parent().unwrap_or(path);
        let file = match open_checked(path) {
            Ok(f) => f,
            Err(_) => {
                make(home, path)?;
                open_checked(path)?
            }
        };
        let meta = file.metadata()?;
        // SAFETY: a shared, read-write mapping of a file of FILE_BYTES (checked); the
        // file is never truncated (a new ledger replaces it by rename, this mapping
        // keeps the old inode).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ledger = Ledger {
            words: ptr as *const AtomicU64,
            file: (meta.dev(), meta.ino()),
            open: std::mem::ManuallyDrop::new(file),
        };
        if ledger.word(W_MAGIC).load(Ordering::Acquire) != MAGIC {
            for i in 1..WORDS {
                ledger.word(i).store(0, Ordering::Relaxed);
            }
            ledger.word(W_UNKNOWN).store(1, Ordering::Release);
            ledger.word(W_SEED).store(1, Ordering::Release);
            ledger
                .word(W_HOST)
                .store(host_id_for(path), Ordering::Release);
            ledger.word(W_MAGIC).store(MAGIC, Ordering::Release);
        }
        Ok(ledger)
    }

    /// Whether this is the ledger file of `dir` now (not one removed or replaced since).
    pub fn is_at(&self, dir: &Path) -> bool {
        // Only a file gone or another in its place is another ledger (not a failed stat
        // on NFS: a second mapping of one file would take the host's turn twice).
        match location(dir).and_then(std::fs::symlink_metadata) {
            Ok(m) => (m.dev(), m.ino()) == self.file,
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < WORDS);
        // SAFETY: i < WORDS, within the mapping (FILE_BYTES), aligned (page start).
        unsafe { &*self.words.add(i) }
    }

    fn load(&self, i: usize) -> u64 {
        self.word(i).load(Ordering::Relaxed)
    }

    /// This host's own word `i` plus the other hosts' (signed, as wrapping sums).
    fn total(&self, i: usize) -> u64 {
        clamp(self.load(HEADER + i).wrapping_add(self.load(OTHERS + i)))
    }

    fn add_word(&self, i: usize, delta: i64) {
        self.word(i).fetch_add(delta as u64, Ordering::Relaxed);
    }

    /// An entry of `bytes` came (`entries` 1), went (-1) or changed size (0) in `shard`.
    pub fn add(&self, shard: usize, bytes: i64, entries: i64) {
        let shard = shard % SHARDS;
        self.add_word(HEADER + shard, bytes);
        self.add_word(HEADER + SHARDS + shard, entries);
    }

    /// A shard's true size, found by counting it: this host's own words take what the
    /// other hosts' (as last read) do not account for.
    pub fn set_shard(&self, shard: usize, bytes: u64, entries: u64) {
        let shard = shard % SHARDS;
        for (i, v) in [(shard, bytes), (SHARDS + shard, entries)] {
            let own = v.wrapping_sub(self.load(OTHERS + i));
            self.word(HEADER + i).store(own, Ordering::Relaxed);
        }
    }

    /// The whole cache: the sum of its shards (never a total of its own, which a process
    /// killed between two adds would leave wrong for good).
    pub fn bytes(&self) -> u64 {
        (0..SHARDS)
            .map(|s| self.shard_bytes(s))
            .fold(0, u64::saturating_add)
    }

    pub fn entries(&self) -> u64 {
        (0..SHARDS)
            .map(|s| self.shard_entries(s))
            .fold(0, u64::saturating_add)
    }

    pub fn shard_entries(&self, shard: usize) -> u64 {
        self.total(SHARDS + shard % SHARDS)
    }

    pub fn shard_bytes(&self, shard: usize) -> u64 {
        self.total(shard % SHARDS)
    }

    /// The generation of unknown accounts (a new ledger), 0 when they are known. Cleared
    /// by `counted_whole` only after a whole recount, so a process killed while recounting
    /// leaves them unknown.
    pub fn unknown_generation(&self) -> u64 {
        self.word(W_UNKNOWN).load(Ordering::Acquire)
    }

    /// The accounts counted whole as of `generation` (unknown again if marked since).
    pub fn counted_whole(&self, generation: u64) {
        let _ = self.word(W_UNKNOWN).compare_exchange(
            generation,
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Count a write; every `RECOUNT_EVERY`th returns the shard to recount now.
    pub fn shard_due_after_write(&self) -> Option<usize> {
        let n = self.word(W_WRITES).fetch_add(1, Ordering::Relaxed) + 1;
        n.is_multiple_of(RECOUNT_EVERY)
            .then(|| self.word(W_NEXT_RECOUNT).fetch_add(1, Ordering::Relaxed) as usize % SHARDS)
    }

    /// The cleaning round in progress, if any (changed only under the upkeep lock).
    pub fn round(&self) -> Option<Round> {
        let next = self.word(W_ROUND_NEXT).load(Ordering::Acquire);
        (1..=ROUND_PARTS as u64).contains(&next).then(|| Round {
            cut: self.load(W_ROUND_CUT),
            tied: self.load(W_ROUND_TIED),
            next: (next - 1) as usize,
            kept: (
                self.load(W_ROUND_KEPT_BYTES),
                self.load(W_ROUND_KEPT_ENTRIES),
            ),
            target: self.load(W_ROUND_TARGET),
        })
    }

    /// Where the round is now: `None`, or a round past its last part, ends it.
    pub fn set_round(&self, round: Option<&Round>) {
        match round.filter(|r| r.next < ROUND_PARTS) {
            Some(r) => {
                self.word(W_ROUND_CUT).store(r.cut, Ordering::Relaxed);
                self.word(W_ROUND_TIED).store(r.tied, Ordering::Relaxed);
                self.word(W_ROUND_KEPT_BYTES)
                    .store(r.kept.0, Ordering::Relaxed);
                self.word(W_ROUND_KEPT_ENTRIES)
                    .store(r.kept.1, Ordering::Relaxed);
                self.word(W_ROUND_TARGET).store(r.target, Ordering::Relaxed);
                self.word(W_ROUND_NEXT)
                    .store(r.next as u64 + 1, Ordering::Release);
            }
            None => self.word(W_ROUND_NEXT).store(0, Ordering::Release),
        }
    }

    /// Whether the last round walked every shard (and so set the ledger right); the plan
    /// after the next checks the ledger against its sample again.
    pub fn take_walked(&self) -> bool {
        self.word(W_WALKED).swap(0, Ordering::Relaxed) != 0
    }

    pub fn set_walked(&self) {
        self.word(W_WALKED).store(1, Ordering::Relaxed);
    }

    pub fn count(&self, c: Counter, n: u64) {
        self.word(HEADER + 2 * SHARDS + c as usize)
            .fetch_add(n, Ordering::Relaxed);
    }

    /// A counter, as every host counted it (this host's, and the others' as last read).
    pub fn counter(&self, c: Counter) -> u64 {
        self.total(2 * SHARDS + c as usize)
    }

    /// This host's id: its file among the hosts' (`hosts.rs`).
    pub fn host_id(&self) -> u64 {
        self.word(W_HOST).load(Ordering::Acquire)
    }

    /// This host's own words, to publish.
    pub fn own_words(&self) -> Vec<u64> {
        (0..OWN_WORDS).map(|i| self.load(HEADER + i)).collect()
    }

    /// Whether this host's words are due to be published (`every` nanoseconds since they
    /// last were): the process that says so asks for it.
    pub fn publish_due(&self, now: u64, every: u64) -> bool {
        self.due(W_PUBLISHED, now, every)
    }

    /// Whether a step of the pass is due (`every` nanoseconds since the last): the process
    /// that says so takes it.
    pub fn step_due(&self, now: u64, every: u64) -> bool {
        self.due(W_STEPPED, now, every)
    }

    /// Whether `every` nanoseconds passed since the time in word `i` (or the clock went
    /// back), then set to `now` by this process, which says so (one process of many).
    fn due(&self, i: usize, now: u64, every: u64) -> bool {
        let last = self.load(i);
        (now < last || now - last >= every)
            && self
                .word(i)
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Passes over the other hosts' files ended: until one has, their words are unknown.
    pub fn passes(&self) -> u64 {
        self.word(W_PASSES).load(Ordering::Acquire)
    }

    /// Other hosts read by the last pass.
    pub fn other_hosts(&self) -> u64 {
        self.load(W_HOSTS)
    }
}

/// The ledger's name: `ledger2` since it holds other hosts' words (a release before, still
/// running, keeps its `ledger`, and neither replaces the other's).
const NAME: &str = "ledger2";
const LAST_NAME: &str = "ledger";

/// Where the ledger of `dir` is: beside its entries on a file system that never needs new
/// space to write a page already written (ext4, tmpfs); elsewhere (btrfs, ZFS, XFS with
/// reflinks copy on write, and a full disk would turn a counter's store into SIGBUS; NFS
/// shares no memory between hosts) in this host's shared memory, named by the
/// directory's device and inode, so that every process using the directory finds it.
fn location(dir: &Path) -> std::io::Result<std::path::PathBuf> {
    const EXT4: i64 = 0xEF53;
    const TMPFS: i64 = 0x0102_1994;
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
        .map_err(std::io::Error::other)?;
    // SAFETY: statfs fills the zeroed struct for a NUL-terminated path.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut fs) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if matches!(fs.f_type as i64, EXT4 | TMPFS) {
        return Ok(dir.join(NAME));
    }
    let meta = std::fs::metadata(dir)?;
    let name = format!(
        "xpu-zebin-{}-{}-{}.{NAME}",
        crate::private::uid(),
        meta.dev(),
        meta.ino()
    );
    Ok(Path::new("/dev/shm").join(name))
}

/// Remove the ledger of `dir` (a layout no longer used), wherever it lives.
pub fn remove(dir: &Path) {
    if let Ok(path) = location(dir) {
        let _ = std::fs::remove_file(&path);
        // The last releases' ledger, named `ledger` (a directory they used goes whole).
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let _ = std::fs::remove_file(path.with_file_name(name.replace(NAME, LAST_NAME)));
    }
}

/// The ledger file, when it is one: a regular file of this user's, of its size.
fn open_checked(path: &Path) -> std::io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file()
        || meta.uid() != crate::private::uid()
        || meta.len() != FILE_BYTES as u64
    {
        return Err(std::io::Error::other("not a ledger"));
    }
    Ok(file)
}

/// A new ledger (zeros, accounts unknown) in place of whatever is at `path`; a ledger
/// another process made meanwhile is kept.
fn make(dir: &Path, path: &Path) -> std::io::Result<()> {
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-ledger-")
        .tempfile_in(dir)?;
    let mut page = vec![0u8; FILE_BYTES];
    page[..8].copy_from_slice(&MAGIC.to_le_bytes());
    page[W_UNKNOWN * 8] = 1;
    page[W_SEED * 8] = 1;
    page[W_HOST * 8..W_HOST * 8 + 8].copy_from_slice(&host_id_for(path).to_le_bytes());
    tmp.write_all(&page)?;
    // Its blocks allocated now: a page written later through the mapping needs none.
    tmp.as_file().sync_all()?;
    if let Ok(bad) = std::fs::symlink_metadata(path) {
        if open_checked(path).is_err() {
            // Not a ledger (a stray file or directory, a crash of an old build): moved
            // aside, by its own inode, never another process's new ledger.
            let aside = dir.join(format!(".bad-ledger-{}-{}", bad.ino(), std::process::id()));
            let same = std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == bad.ino());
            if same {
                let _ = std::fs::rename(path, &aside);
                let _ = std::fs::remove_file(&aside).or_else(|_| std::fs::remove_dir_all(&aside));
            }
        }
    }
    // Never over another process's new ledger: both would map different files.
    match tmp.persist_noclobber(path) {
        Ok(_) => Ok(()),
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e.error),
    }
}

//! A host's turn at its hosts' files (`hosts.rs`): one process of the host at a time
//! publishes its words and reads the other hosts'; and the host's id, which names its file.

use super::*;
use crate::sync::Renewable;

/// The host id of the ledger at `path`, never 0 or 1 (the zero's, the fold's): the same
/// when the ledger is lost and made again (`/dev/shm` purged by a job's epilog, a reboot
/// that mounts it alike), so that the host's file goes on from where it was; another for
/// each machine (its id and name) and each memory that holds a ledger (the device of its
/// directory: a container's or a mount namespace's own `/dev/shm`). Random where the
/// machine has no id.
pub(super) fn host_id_for(path: &Path) -> u64 {
    let machine = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    if machine.trim().is_empty() {
        return u64::from_le_bytes(crate::cache::lease::random_bytes("ledger")).max(2);
    }
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most the buffer's length into it.
    unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    let home = path.parent().and_then(|p| std::fs::metadata(p).ok());
    let mut hash = blake3::Hasher::new();
    hash.update(machine.trim().as_bytes());
    hash.update(&name);
    hash.update(&home.map_or(0, |m| m.dev()).to_le_bytes());
    hash.update(&crate::private::uid().to_le_bytes());
    hash.update(path.as_os_str().as_encoded_bytes());
    let mut id = [0u8; 8];
    id.copy_from_slice(&hash.finalize().as_bytes()[..8]);
    u64::from_le_bytes(id).max(2)
}

/// The turn of one process of this host at its hosts' files (publishing its words,
/// reading the others'): this process's mutex, and a POSIX record lock on the ledger file
/// (the process's own: a forked child does not keep it, and it goes with the process).
pub struct Turn<'a> {
    ledger: &'a Ledger,
}

/// Ledger files whose turn a thread of this process has, by device and inode: one thread
/// at a time (the record lock is the process's), however many mappings of one file it has.
static TURNS: Renewable<std::sync::Mutex<Vec<(u64, u64)>>> = Renewable::new(
    || std::sync::Mutex::new(Vec::new()),
    forget_turns_after_fork,
);

fn forget_turns_after_fork() {
    TURNS.renew();
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let _ = self.ledger.record_lock(libc::F_UNLCK);
        crate::sync::lock(TURNS.get()).retain(|f| *f != self.ledger.file);
    }
}

impl Ledger {
    /// Ask that this host's words be published (by this process, or whoever has the turn).
    pub fn want_published(&self) {
        self.word(W_WANT).store(1, Ordering::Release);
    }

    pub fn published_wanted(&self) -> bool {
        self.word(W_WANT).load(Ordering::Acquire) != 0
    }

    fn record_lock(&self, kind: i32) -> bool {
        // SAFETY: flock is plain data; zeroed, then set, locks the file's first byte.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = kind as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_len = 1;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*self.open);
        // SAFETY: fcntl on the ledger's own open file, never waiting.
        unsafe { libc::fcntl(fd, libc::F_SETLK, &lock) == 0 }
    }

    /// This process's turn (and this host's) at its hosts' files, when no one else has it.
    pub fn turn(&self) -> Option<Turn<'_>> {
        {
            let mut turns = crate::sync::lock(TURNS.get());
            if turns.contains(&self.file) {
                return None;
            }
            turns.push(self.file);
        }
        let turn = Turn { ledger: self };
        if !self.record_lock(libc::F_WRLCK) {
            return None; // dropped: the (not taken) lock let go, the entry removed
        }
        if self.word(W_PASS_DIRTY).load(Ordering::Acquire) != 0 {
            turn.restart(); // a turn's holder was killed while changing the pass
        }
        Some(turn)
    }
}

impl Turn<'_> {
    /// Whether this host's words are to be published; asked again by the next change.
    pub fn take_wanted(&self) -> bool {
        self.ledger.word(W_WANT).swap(0, Ordering::AcqRel) != 0
    }

    /// Whether this is a new ledger whose words are to go on from its host's file (until
    /// `seeded`: nothing is published before).
    pub fn seed_pending(&self) -> bool {
        self.ledger.word(W_SEED).load(Ordering::Acquire) != 0
    }

    pub fn seeded(&self) {
        self.ledger.word(W_SEED).store(0, Ordering::Release);
    }

    /// Host file `id` could not be read again: the steps in a row it failed so far.
    pub fn failed(&self, id: u64) -> u64 {
        let l = self.ledger;
        if l.word(W_FAILED_ID).swap(id, Ordering::Relaxed) != id {
            l.word(W_FAILED_STEPS).store(0, Ordering::Relaxed);
        }
        l.word(W_FAILED_STEPS).fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Host file `id` (or the fold) was read: a failure before does not count any more.
    pub fn read_ok(&self, id: u64) {
        let l = self.ledger;
        if l.word(W_FAILED_ID).load(Ordering::Relaxed) == id {
            l.word(W_FAILED_STEPS).store(0, Ordering::Relaxed);
        }
    }

    /// Words this host published before its ledger was lost, taken as its own again.
    pub fn seed(&self, words: &[u64]) {
        for (i, w) in words.iter().enumerate().take(OWN_WORDS) {
            self.ledger
                .word(HEADER + i)
                .fetch_add(*w, Ordering::Relaxed);
        }
    }

    /// Whether this ledger wrote its host's file (or went on from it): a file gone since
    /// was folded.
    pub fn has_published(&self) -> bool {
        self.ledger.load(W_WRITTEN) != 0
    }

    /// `words` are what this host's file says now.
    pub fn published(&self, words: &[u64]) {
        for (i, w) in words.iter().enumerate().take(OWN_WORDS) {
            self.ledger.word(LAST + i).store(*w, Ordering::Relaxed);
        }
        self.ledger.word(W_WRITTEN).store(1, Ordering::Release);
    }

    /// This host's file was folded: what it said is in the fold, so this host's own words
    /// go on without it (what was counted since stays).
    pub fn forget_own(&self) {
        for i in 0..OWN_WORDS {
            let last = self.ledger.word(LAST + i).swap(0, Ordering::Relaxed);
            self.ledger
                .word(HEADER + i)
                .fetch_sub(last, Ordering::Relaxed);
        }
    }

    /// The fold's words (`hosts/fold.rs`) read: added to the pass's sum, not a host.
    pub fn read_fold(&self, words: &[u64]) {
        self.dirty(true);
        self.add_to_pass(words);
        let cursor = super::FOLD_CURSOR;
        self.ledger
            .word(W_PASS_AFTER)
            .store(cursor, Ordering::Relaxed);
        self.dirty(false);
    }

    /// `words` added to the pass's sum.
    fn add_to_pass(&self, words: &[u64]) {
        for (i, w) in words.iter().enumerate().take(OWN_WORDS) {
            self.ledger
                .word(PARTIAL + i)
                .fetch_add(*w, Ordering::Relaxed);
        }
    }

    /// The last host id the pass read (0: the pass begins).
    pub fn after(&self) -> u64 {
        self.ledger.load(W_PASS_AFTER)
    }

    fn dirty(&self, dirty: bool) {
        self.ledger
            .word(W_PASS_DIRTY)
            .store(dirty as u64, Ordering::Release);
    }

    /// Host `id`'s words read (None: its file was not one), added to the pass's sum.
    pub fn read(&self, id: u64, words: Option<&[u64]>) {
        self.dirty(true);
        if let Some(words) = words {
            self.add_to_pass(words);
            self.ledger
                .word(W_PASS_READ)
                .fetch_add(1, Ordering::Relaxed);
        }
        self.ledger.word(W_PASS_AFTER).store(id, Ordering::Relaxed);
        self.dirty(false);
    }

    /// The pass read every host: its sum becomes the others' words, and a new pass begins.
    pub fn end(&self) {
        let l = self.ledger;
        self.dirty(true);
        for i in 0..OWN_WORDS {
            let sum = l.word(PARTIAL + i).swap(0, Ordering::Relaxed);
            l.word(OTHERS + i).store(sum, Ordering::Relaxed);
        }
        let read = l.word(W_PASS_READ).swap(0, Ordering::Relaxed);
        l.word(W_HOSTS).store(read, Ordering::Relaxed);
        l.word(W_PASS_AFTER).store(0, Ordering::Relaxed);
        l.word(W_PASSES).fetch_add(1, Ordering::Release);
        self.dirty(false);
    }

    /// Begin the pass again (a reader that wants every host's latest words, or a turn
    /// whose holder was killed mid-way).
    pub fn restart(&self) {
        let l = self.ledger;
        self.dirty(true);
        for i in 0..OWN_WORDS {
            l.word(PARTIAL + i).store(0, Ordering::Relaxed);
        }
        l.word(W_PASS_READ).store(0, Ordering::Relaxed);
        l.word(W_PASS_AFTER).store(0, Ordering::Relaxed);
        self.dirty(false);
    }
}

//! Which cores of the host are running compilers, counted across processes: a speculative
//! large-GRF build takes a core only when one is idle on the whole host. Counted per process,
//! two processes on one machine (Dask workers on a node, parallel test runners, two Triton
//! jobs) each see a core free and start a twin: four compilers on two cores, every build
//! slower (measured on a 2-worker Dask batch: up to 18% over the same batch run locally).
//!
//! A running compiler holds a slot: an exclusive `flock` on one of `cores` files in a
//! per-user directory. The kernel releases the lock when its holder closes it or dies,
//! however it dies, so a crash never leaks a slot. A compiler that finds every slot taken
//! runs anyway (the host is already full): no twin starts. A shared build asks for a core
//! before it claims its key, and may wait for one (`pool::reserve_core`). Without a usable
//! directory nothing is counted across processes, and speculation falls back to this
//! process's own count.
//!
//! The directory is private (`private.rs`): one another user made first, world-writable or
//! holding FIFOs, is refused with a warning, never waited on.

use crate::private;
use crate::sync::Renewable;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

/// Where the slot files are: `XPU_ZEBIN_CORE_SLOTS_DIR`, else `cores` in the package's
/// private directory (every process of a user on a host shares it).
pub const SLOTS_DIR_ENV: &str = "XPU_ZEBIN_CORE_SLOTS_DIR";

/// The host's slots, set up once per process; `None` when they cannot be (said once).
static HOST: Renewable<Option<Slots>> = Renewable::new(
    || {
        let opened = slots_dir().and_then(|dir| {
            Slots::open(&dir, crate::batch::default_jobs())
                .map_err(|e| format!("{}: {e}", dir.display()))
        });
        opened
            .map_err(|why| {
                crate::diag::warn_once(
                    "core-slots",
                    format!(
                        "host-wide core slots are off ({why}); speculation counts only this \
                     process's compilers"
                    ),
                )
            })
            .ok()
    },
    forget_after_fork,
);

/// The directory holding the slot files, made and checked as private.
pub fn slots_dir() -> Result<PathBuf, String> {
    match std::env::var_os(SLOTS_DIR_ENV) {
        Some(dir) if !dir.to_string_lossy().trim().is_empty() => {
            let dir = PathBuf::from(dir);
            private::ensure_dir(&dir).map(|()| dir)
        }
        _ => private::subdir("cores"),
    }
}

/// One core held while alive (the lock goes with the file).
#[derive(Debug)]
pub struct Slot(File);

/// The descriptors of the slots this process holds (-1: none), so that a forked child lets
/// go of its copies: an `flock` belongs to the open file, which the child shares, and a
/// child that kept them would hold its parent's cores until it exits. Beyond this many
/// held at once a slot is not tracked (the child then holds it until it exits or execs).
static HELD: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];

impl Slot {
    fn new(file: File) -> Self {
        let fd = file.as_raw_fd();
        let _ = HELD.iter().find(|h| {
            h.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
        Slot(file)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let fd = self.0.as_raw_fd();
        let _ = HELD.iter().find(|h| {
            h.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
    }
}

/// In a forked child: the parent's slots are not the child's. Each held descriptor is
/// pointed at /dev/null (the number stays valid for whatever still owns it), which lets go
/// of the child's reference to the locked file; the slot files are opened again on use.
pub(crate) fn forget_after_fork() {
    // SAFETY: open, dup3 and close on this process's own descriptors (async-signal-safe).
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        for held in &HELD {
            let fd = held.swap(-1, Ordering::AcqRel);
            if fd >= 0 && null >= 0 {
                libc::dup3(null, fd, libc::O_CLOEXEC);
            }
        }
        if null >= 0 {
            libc::close(null);
        }
    }
    HOST.renew();
}

/// What taking a slot found.
#[derive(Debug)]
pub enum Taken {
    Slot(Slot),
    /// Every core of the host is running a compiler.
    Full,
    /// No slot files: nothing is counted across processes.
    Uncounted,
}

/// Take a free slot of the host without waiting.
pub fn try_take() -> Taken {
    HOST.get()
        .as_ref()
        .map_or(Taken::Uncounted, Slots::try_take)
}

/// For diagnostics: the host's slot directory, how many slots it has and how many are held
/// right now (by any process); `None` when slots are not counted.
pub fn census() -> Option<(PathBuf, usize, usize)> {
    let slots = HOST.get().as_ref()?;
    let held = slots
        .0
        .iter()
        .filter(|path| open(path).is_ok_and(|f| f.try_lock().is_err()))
        .count();
    Some((slots.1.clone(), slots.0.len(), held))
}

/// `count` slot files in one (checked, private) directory.
struct Slots(Vec<PathBuf>, PathBuf);

impl Slots {
    fn open(dir: &Path, count: usize) -> std::io::Result<Self> {
        let paths: Vec<PathBuf> = (0..count).map(|i| dir.join(format!("core-{i}"))).collect();
        for path in &paths {
            open(path)?;
        }
        Ok(Slots(paths, dir.to_path_buf()))
    }

    /// Each take opens its own file description: `flock` locks belong to one, so two
    /// threads of a process never share a slot.
    fn try_take(&self) -> Taken {
        for path in &self.0 {
            let Ok(file) = open(path) else {
                return Taken::Uncounted;
            };
            if file.try_lock().is_ok() {
                return Taken::Slot(Slot::new(file));
            }
        }
        Taken::Full
    }
}

fn open(path: &Path) -> std::io::Result<File> {
    private::open_file(path, true, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_held_until_dropped_and_the_count_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let slots = Slots::open(dir.path(), 2).unwrap();
        let a = slots.try_take();
        let b = slots.try_take();
        assert!(matches!((&a, &b), (Taken::Slot(_), Taken::Slot(_))));
        assert!(matches!(slots.try_take(), Taken::Full));
        // Another process's view: the same files opened anew.
        let other = Slots::open(dir.path(), 2).unwrap();
        assert!(matches!(other.try_take(), Taken::Full));
        drop(a);
        assert!(matches!(other.try_take(), Taken::Slot(_)));
        drop(b);
    }
}

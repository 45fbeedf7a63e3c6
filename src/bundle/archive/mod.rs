//! A bundle as one file: a tar archive of its manifest and the files it lists, to ship
//! as an artifact. Packing streams every listed file from disk into a temporary archive
//! (checked as it goes: size, checksum, what it must be), renamed into place at the end,
//! with reproducible headers (no owner, no time); unpacking takes an archive as hostile:
//! only regular files at the paths a bundle has (`manifest.json`, `native/<key>.zebin`,
//! `triton/<target>/<hash>/<file>`) that its manifest lists, each bounded, none twice, no
//! link of any kind, streamed into a new directory; members and bytes are bounded in all.
//! Memory stays flat whatever the bundle's size: a file is streamed, or (stored compressed,
//! when packed) checked whole, one at a time, within its bounds.
//!
//! This file owns the bounds on an archive, for both directions. The rest, by concern:
//! - `layout.rs`: what an archive holds: a bundle's own paths (each with its size bound),
//!   the paths a manifest lists, and the reproducible header of a member;
//! - `pack.rs`: a bundle directory into an archive (`pack`);
//! - `unpack.rs`: an archive, taken as hostile, into a new bundle directory (`unpack`);
//! - `tests.rs`: their tests.

use crate::bundle::MAX_ENTRY_BYTES;

mod layout;
mod pack;
mod unpack;

#[cfg(test)]
mod tests;

pub use pack::pack;
pub use unpack::unpack;

/// The most members (headers of any kind: files, directories, name records) an archive
/// may have: room for some 200,000 native entries with a Triton entry each (a Triton
/// file's long path is two headers), and a bound on a hostile one's work.
const MAX_MEMBERS: u64 = 1 << 20;

/// The most bytes an archive's files may unpack to, all together (disk, not memory).
const MAX_TOTAL_BYTES: u64 = 16 << 30;

/// Bounds on what an archive may unpack to (tests lower them).
#[derive(Clone, Copy, Debug)]
struct Limits {
    members: u64,
    total_bytes: u64,
    /// One file's bytes (the manifest's own bound is lower).
    entry_bytes: u64,
}

const LIMITS: Limits = Limits {
    members: MAX_MEMBERS,
    total_bytes: MAX_TOTAL_BYTES,
    entry_bytes: MAX_ENTRY_BYTES,
};

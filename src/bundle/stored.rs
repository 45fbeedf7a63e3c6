//! How a bundle keeps a file: compressed (one zstd frame, `compressed.rs`), listed in its
//! manifest with the size and blake3 of what it holds and, as `stored`, of the bytes on
//! disk, so the signature over the manifest covers what is stored. A file of a bundle
//! written before (no `stored`) is read as it is. Reading checks the stored bytes first
//! (size, checksum), then inflates them, bounded by the listed size before anything is
//! allocated, and checks what they hold too.

use super::MAX_ENTRY_BYTES;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The bytes of a file as the bundle stores them (compressed).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Stored {
    pub size: u64,
    pub blake3: String,
}

/// A file as a manifest lists it: what it holds, and how it is stored (None: as it is).
pub struct Listed<'a> {
    pub size: u64,
    pub blake3: &'a str,
    pub stored: Option<&'a Stored>,
}

impl Listed<'_> {
    /// The bytes and checksum of the file on disk.
    pub fn on_disk(&self) -> (u64, &str) {
        self.stored
            .map_or((self.size, self.blake3), |s| (s.size, s.blake3.as_str()))
    }
}

/// A file of a bundle read and checked: its bytes as stored, and what they hold.
pub struct Member {
    pub stored: Vec<u8>,
    /// None: stored as it is.
    inflated: Option<Vec<u8>>,
}

impl Member {
    /// What the file holds.
    pub fn plain(&self) -> &[u8] {
        self.inflated.as_deref().unwrap_or(&self.stored)
    }

    pub fn into_plain(self) -> Vec<u8> {
        self.inflated.unwrap_or(self.stored)
    }
}

/// `plain` as the bundle stores it, and how the manifest lists that (None: as it is, when
/// it would inflate more than a reader takes).
pub fn store(plain: &[u8]) -> std::io::Result<(Vec<u8>, Option<Stored>)> {
    let mut out = Vec::with_capacity(plain.len() / 3 + 64);
    crate::compressed::compress_into(&mut out, &[plain])?;
    if !crate::compressed::within_ratio(out.len(), plain.len() as u64) {
        return Ok((plain.to_vec(), None));
    }
    let listed = Stored {
        size: out.len() as u64,
        blake3: blake3::hash(&out).to_hex().to_string(),
    };
    Ok((out, Some(listed)))
}

fn matches(bytes: &[u8], (size, sum): (u64, &str)) -> bool {
    bytes.len() as u64 == size && blake3::hash(bytes).to_hex().as_str() == sum
}

/// The file at `path`, if it is what `listed` says: as stored (size and checksum), and
/// what it holds (inflated within `MAX_ENTRY_BYTES`: size and checksum). `Err` says why not.
pub fn read(path: &Path, listed: &Listed<'_>) -> Result<Member, String> {
    let on_disk = listed.on_disk();
    let unreadable = |e: std::io::Error| format!("cannot be read: {e}");
    let file = crate::private::open_file(path, false, false).map_err(unreadable)?;
    // A file of another size is refused unread.
    let len = file.metadata().map_err(unreadable)?.len();
    if len != on_disk.0 {
        return Err(format!("is {len} bytes, its manifest says {}", on_disk.0));
    }
    let stored = crate::bounded::read(file, MAX_ENTRY_BYTES.min(on_disk.0)).map_err(unreadable)?;
    if !matches(&stored, on_disk) {
        return Err("does not match its checksum".into());
    }
    if listed.stored.is_none() {
        return Ok(Member {
            stored,
            inflated: None,
        });
    }
    crate::compressed::inflate(&stored, listed.size, MAX_ENTRY_BYTES)
        .and_then(
            |plain| match matches(&plain, (listed.size, listed.blake3)) {
                true => Ok(plain),
                false => Err("inflates to bytes that do not match their checksum".into()),
            },
        )
        .map(|plain| Member {
            stored,
            inflated: Some(plain),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bytes` at a new file, and a test directory that holds it.
    fn file(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    #[test]
    fn a_stored_file_reads_back_and_every_lie_is_named() {
        // As compressible as a zebin: runs of zeros between bytes of little variety.
        let mut x = 12345u32;
        let mut plain: Vec<u8> = Vec::new();
        for i in 0..100_000u32 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            plain.push(if i % 4 == 0 {
                0
            } else {
                (x >> 24) as u8 & 0x0f
            });
        }
        let sum = blake3::hash(&plain).to_hex().to_string();
        let (on_disk, stored) = store(&plain).unwrap();
        assert!(on_disk.len() * 2 < plain.len() && on_disk.len() * 64 > plain.len());
        let (_dir, path) = file(&on_disk);
        let listed = |size, blake3, stored| Listed {
            size,
            blake3,
            stored,
        };
        let read_as = |l: &Listed<'_>| read(&path, l).map(Member::into_plain);
        let stored = stored.unwrap();
        let good = listed(plain.len() as u64, &sum, Some(&stored));
        assert_eq!(read_as(&good).unwrap(), plain);
        // What it holds lies: another checksum, or another length.
        let other = "0".repeat(64);
        let said = read_as(&listed(plain.len() as u64, &other, Some(&stored)));
        assert!(said
            .unwrap_err()
            .contains("inflates to bytes that do not match"));
        let said = read_as(&listed(plain.len() as u64 - 1, &sum, Some(&stored)));
        assert!(said.unwrap_err().contains("its frame states"));
        // What is stored lies: its size (refused unread), its checksum.
        let short = Stored {
            size: stored.size - 1,
            ..stored.clone()
        };
        let said = read_as(&listed(plain.len() as u64, &sum, Some(&short)));
        assert!(said.unwrap_err().contains("its manifest says"));
        let forged = Stored {
            blake3: other.clone(),
            ..stored.clone()
        };
        let said = read_as(&listed(plain.len() as u64, &sum, Some(&forged)));
        assert!(said.unwrap_err().contains("does not match its checksum"));
        // What inflates more than a reader takes is stored as it is.
        assert!(store(&vec![7u8; 100_000]).unwrap().1.is_none());
        // A skippable frame holds nothing of ours, even where nothing is listed.
        let skippable = [0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0];
        let (_dir, empty) = file(&skippable);
        let nothing = Stored {
            size: 8,
            blake3: blake3::hash(&skippable).to_hex().to_string(),
        };
        let empty_sum = blake3::hash(b"").to_hex().to_string();
        let said = read(&empty, &listed(0, &empty_sum, Some(&nothing))).err();
        assert!(said.unwrap().contains("not zstd"));
        // Listed as stored as it is (format 1): the compressed bytes are not its zebin.
        let said = read_as(&listed(on_disk.len() as u64, &sum, None));
        assert!(said.unwrap_err().contains("does not match its checksum"));
    }
}

//! Reading what another process or user wrote, bounded: one reader for every file and
//! stream the package takes in (bundle files and archives, cache entries, the compiler's
//! output and log), so a huge or endless input is an error, never a huge allocation.

use std::io::Read;
use std::path::Path;

/// At most `limit` bytes of `reader`; more is an error (the buffer grows only as bytes
/// arrive).
pub fn read(reader: impl Read, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::other(format!("larger than {limit} bytes")));
    }
    Ok(bytes)
}

/// At most the last `max` bytes of a file, as text (a compiler's log: its errors are at
/// its end); nothing when it cannot be read.
pub fn tail(path: &Path, max: u64) -> String {
    use std::io::{Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut bytes = Vec::new();
    let _ = file.take(max).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn more_than_the_limit_is_an_error_and_the_tail_is_the_end() {
        assert_eq!(super::read(&b"abc"[..], 3).unwrap(), b"abc");
        assert!(super::read(&b"abcd"[..], 3).is_err());
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        std::fs::write(&log, "warning\nerror: the end").unwrap();
        assert_eq!(super::tail(&log, 9), ": the end");
        assert_eq!(super::tail(&dir.path().join("none"), 9), "");
    }
}

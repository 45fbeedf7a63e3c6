//! Triton cache entries inside a bundle: for one compiled kernel, the files Triton's cache
//! holds under its key (metadata `<name>.json`, IRs, the binary), so that an import hands
//! them to Triton's cache manager and Triton finds the kernel compiled. Stored as
//! `triton/<hash>/<file>`; every file is listed with its size and blake3, and read back
//! only if it still matches.

use super::{bad, is_key, persist, read_file, MAX_ENTRY_BYTES};
use crate::error::Result;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One Triton cache entry of the bundle.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TritonEntry {
    /// Triton's cache key for it (the `hash` its metadata holds): 64 hex digits.
    pub hash: String,
    pub kernel: String,
    #[serde(default)]
    pub config: String,
    /// The target profile's id.
    pub target: String,
    /// Its binary is native code (Triton's `generate_native_code`), else SPIR-V.
    pub native: bool,
    pub files: Vec<TritonFile>,
}

/// A file of a Triton cache entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TritonFile {
    pub name: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub blake3: String,
}

/// A name Triton gives its cache files (`<kernel>.<ext>`): no path, no hidden file, no
/// group file (those hold absolute paths of the machine that wrote them; the import
/// writes its own).
pub(super) fn plain_file_name(name: &str) -> bool {
    (1..=200).contains(&name.len())
        && !name.starts_with('.')
        && !name.starts_with("__grp__")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Why `entry` is malformed, if it is: its hash, file names (one `.json`, its metadata),
/// checksums.
pub(super) fn malformed(entry: &TritonEntry) -> Option<&'static str> {
    let mut names = std::collections::HashSet::new();
    if !is_key(&entry.hash) {
        Some("its hash is not 64 lowercase hex digits")
    } else if entry
        .files
        .iter()
        .any(|f| !plain_file_name(&f.name) || !names.insert(f.name.as_str()))
    {
        Some("a file name is not a plain Triton cache file name, or is listed twice")
    } else if entry.files.iter().any(|f| !is_key(&f.blake3)) {
        Some("a file's blake3 is not 64 lowercase hex digits")
    } else if entry
        .files
        .iter()
        .filter(|f| f.name.ends_with(".json"))
        .count()
        != 1
    {
        Some("it has no single metadata (.json) file")
    } else {
        None
    }
}

/// `dir/triton/<hash>`, when `triton/` and it are directories of their own (a link could
/// lead reads and writes anywhere).
fn entry_dir(dir: &Path, hash: &str) -> std::result::Result<PathBuf, String> {
    let top = dir.join("triton");
    let here = top.join(hash);
    for d in [&top, &here] {
        match std::fs::symlink_metadata(d) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "{} is not a directory (a link is not followed)",
                    d.display()
                ))
            }
            Err(e) => return Err(format!("{}: {e}", d.display())),
        }
    }
    Ok(here)
}

/// The files of a Triton entry, if each is what the manifest says (size and checksum).
pub fn triton_files(
    dir: &Path,
    entry: &TritonEntry,
) -> std::result::Result<Vec<(String, Vec<u8>)>, String> {
    let here = entry_dir(dir, &entry.hash)?;
    entry
        .files
        .iter()
        .map(|f| {
            let bytes = read_file(&here.join(&f.name), MAX_ENTRY_BYTES.min(f.size))
                .map_err(|e| format!("triton/{}/{} cannot be read: {e}", entry.hash, f.name))?;
            if bytes.len() as u64 != f.size || blake3::hash(&bytes).to_hex().as_str() != f.blake3 {
                return Err(format!(
                    "triton/{}/{} does not match its checksum",
                    entry.hash, f.name
                ));
            }
            Ok((f.name.clone(), bytes))
        })
        .collect()
}

/// Write a Triton entry's files under `dir/triton/<hash>/` and fill in their sizes and
/// checksums.
pub(super) fn write_entry(
    dir: &Path,
    entry: &mut TritonEntry,
    files: &[(String, Vec<u8>)],
) -> Result<()> {
    let io = |e: std::io::Error| bad(dir, e);
    for d in [dir.join("triton"), dir.join("triton").join(&entry.hash)] {
        if std::fs::symlink_metadata(&d).is_err() {
            std::fs::create_dir(&d).map_err(io)?;
        }
    }
    let here = entry_dir(dir, &entry.hash).map_err(|why| bad(dir, why))?;
    entry.files = files
        .iter()
        .map(|(name, bytes)| TritonFile {
            name: name.clone(),
            size: bytes.len() as u64,
            blake3: blake3::hash(bytes).to_hex().to_string(),
        })
        .collect();
    if let Some(why) = malformed(entry) {
        return Err(bad(dir, format!("Triton entry {}: {why}", entry.hash)));
    }
    for (name, bytes) in files {
        persist(&here, &here.join(name), bytes).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triton_file_names_are_plain() {
        for good in ["softmax_kernel.json", "k.spv", "k.ttgir", "a-b_c.llir"] {
            assert!(plain_file_name(good), "{good}");
        }
        for hostile in [
            "",
            "../x",
            "a/b",
            ".hidden",
            "__grp__k.json",
            "k\0",
            "é.json",
        ] {
            assert!(!plain_file_name(hostile), "{hostile:?}");
        }
        assert!(!plain_file_name(&"a".repeat(201)));
    }
}

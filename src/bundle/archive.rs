//! A bundle as one file: a tar archive of its manifest and the files it lists, to ship
//! as an artifact. Packing checks every entry first and writes reproducible headers (no
//! owner, no time); unpacking takes an archive as hostile: only regular files at the
//! paths a bundle has (`manifest.json`, `native/<key>.zebin`, `triton/<hash>/<file>`),
//! each bounded, none twice, no link of any kind, into a new directory.

use super::{bad, entry_bytes, is_key, persist, read, triton, triton_files, MANIFEST};
use super::{MAX_ENTRY_BYTES, MAX_MANIFEST_BYTES};
use crate::error::Result;
use std::io::Read;
use std::path::Path;

/// Write the bundle at `dir` as the archive `out` (replaced atomically); every entry is
/// checked first. Returns how many files it holds.
pub fn pack(dir: &Path, out: &Path) -> Result<usize> {
    let manifest = read(dir)?;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for e in &manifest.entries {
        files.push((
            e.file.clone(),
            entry_bytes(dir, e).map_err(|why| bad(dir, why))?,
        ));
    }
    for t in &manifest.triton_cache {
        for (name, bytes) in triton_files(dir, t).map_err(|why| bad(dir, why))? {
            files.push((format!("triton/{}/{name}", t.hash), bytes));
        }
    }
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| bad(dir, e))?;
    files.insert(0, (MANIFEST.to_string(), text));
    let mut builder = tar::Builder::new(Vec::new());
    for (path, bytes) in &files {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_size(bytes.len() as u64);
        builder
            .append_data(&mut header, path, bytes.as_slice())
            .map_err(|e| bad(dir, e))?;
    }
    let archive = builder.into_inner().map_err(|e| bad(dir, e))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    persist(parent, out, &archive).map_err(|e| bad(out, e))?;
    Ok(files.len())
}

/// Where a path of the archive goes, and its size limit: only a bundle's own paths.
fn place(path: &str) -> Option<(Vec<&str>, u64)> {
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        [m] if *m == MANIFEST => Some((parts, MAX_MANIFEST_BYTES)),
        ["native", f] if f.strip_suffix(".zebin").is_some_and(is_key) => {
            Some((parts, MAX_ENTRY_BYTES))
        }
        ["triton", h, f] if is_key(h) && triton::plain_file_name(f) => {
            Some((parts, MAX_ENTRY_BYTES))
        }
        _ => None,
    }
}

/// Unpack the archive `archive` into `dest` (a new directory) and return its checked
/// manifest; the caller then checks the entries as in any bundle directory.
pub fn unpack(archive: &Path, dest: &Path) -> Result<super::Manifest> {
    let file = crate::private::open_file(archive, false, false).map_err(|e| bad(archive, e))?;
    std::fs::create_dir(dest).map_err(|e| bad(dest, e))?;
    let mut seen = std::collections::HashSet::new();
    let mut tar = tar::Archive::new(file);
    let entries = tar
        .entries()
        .map_err(|e| bad(archive, format!("not a tar archive: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| bad(archive, format!("not a tar archive: {e}")))?;
        let kind = entry.header().entry_type();
        let path = entry.path().map_err(|e| bad(archive, e))?;
        let path = path.to_string_lossy().into_owned();
        if kind.is_dir() {
            continue;
        }
        let Some((parts, limit)) = place(&path).filter(|_| kind == tar::EntryType::Regular) else {
            return Err(bad(
                archive,
                format!("{path:?} is not a bundle's file ({kind:?})"),
            ));
        };
        if !seen.insert(path.clone()) {
            return Err(bad(archive, format!("{path:?} is in it twice")));
        }
        let mut bytes = Vec::new();
        entry
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| bad(archive, e))?;
        if bytes.len() as u64 > limit {
            return Err(bad(
                archive,
                format!("{path:?} is larger than {limit} bytes"),
            ));
        }
        let mut here = dest.to_path_buf();
        for d in &parts[..parts.len() - 1] {
            here.push(d);
            if !here.is_dir() {
                std::fs::create_dir(&here).map_err(|e| bad(dest, e))?;
            }
        }
        persist(&here, &dest.join(&path), &bytes).map_err(|e| bad(dest, e))?;
    }
    read(dest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A tar holding one regular file at `path`, written byte by byte (the tar crate's
    /// own builder refuses paths with `..`, which a hostile archive would not).
    fn tar_with(path: &str, data: &[u8]) -> Vec<u8> {
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_size(data.len() as u64);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_cksum();
        let mut out = header.as_bytes().to_vec();
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
        out
    }

    #[test]
    fn only_a_bundles_paths_have_a_place() {
        let key = "a".repeat(64);
        assert!(place("manifest.json").is_some());
        assert!(place(&format!("native/{key}.zebin")).is_some());
        assert!(place(&format!("triton/{key}/k.spv")).is_some());
        for hostile in [
            "../manifest.json".to_string(),
            format!("native/../{key}.zebin"),
            format!("native/{key}.so"),
            format!("triton/{key}/__grp__k.json"),
            format!("triton/{key}/../../x"),
            "/etc/passwd".to_string(),
            "native".to_string(),
        ] {
            assert!(place(&hostile).is_none(), "{hostile}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any bytes as an archive: an error or a checked bundle, never a panic, and
        /// nothing written outside the new directory.
        #[test]
        fn any_bytes_unpack_safely(bytes in proptest::collection::vec(any::<u8>(), 0..3000)) {
            let dir = tempfile::tempdir().unwrap();
            let archive = dir.path().join("a.tar");
            std::fs::write(&archive, &bytes).unwrap();
            let _ = unpack(&archive, &dir.path().join("out"));
            let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
            prop_assert!(names.len() <= 2);
        }

        /// Any path in a well-formed archive: refused unless it is a bundle's, and never
        /// written outside the new directory.
        #[test]
        fn archive_paths_stay_inside(path in "[a-z0-9_./]{1,60}") {
            let dir = tempfile::tempdir().unwrap();
            let archive = dir.path().join("a.tar");
            std::fs::write(&archive, tar_with(&path, b"{}")).unwrap();
            let result = unpack(&archive, &dir.path().join("out"));
            if place(&path).is_none() {
                prop_assert!(result.is_err());
            }
            let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
            prop_assert!(names.len() <= 2, "{names:?}");
        }
    }
}

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

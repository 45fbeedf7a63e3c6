//! What an archive holds: a bundle's own paths (each with its size bound), the paths a
//! manifest lists, and the header of a member, with nothing of the machine that wrote it.

use crate::bundle::{is_key, triton, Manifest, TritonEntry, MANIFEST};
use crate::bundle::{MAX_ENTRY_BYTES, MAX_MANIFEST_BYTES};
use std::collections::HashSet;

/// A header with nothing of the machine that wrote it: no owner, no time.
pub(super) fn header(size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header.set_size(size);
    header
}

/// Where a path of the archive goes, and its size limit: only a bundle's own paths.
pub(super) fn place(path: &str) -> Option<(Vec<&str>, u64)> {
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        [m] if *m == MANIFEST => Some((parts, MAX_MANIFEST_BYTES)),
        ["native", f] if f.strip_suffix(".zebin").is_some_and(is_key) => {
            Some((parts, MAX_ENTRY_BYTES))
        }
        ["triton", t, h, f] if is_key(t) && is_key(h) && triton::plain_file_name(f) => {
            Some((parts, MAX_ENTRY_BYTES))
        }
        _ => None,
    }
}

/// Where a Triton entry's file is in a bundle (and in its archive).
pub(super) fn triton_path(entry: &TritonEntry, name: &str) -> String {
    format!("triton/{}/{}/{name}", entry.target_id, entry.hash)
}

/// The paths of the files `manifest` lists, itself included: all an archive may hold.
pub(super) fn listed(manifest: &Manifest) -> HashSet<String> {
    let natives = manifest.entries.iter().map(|e| e.file.clone());
    let triton = (manifest.triton_cache.iter())
        .flat_map(|t| t.files.iter().map(|f| triton_path(t, &f.name)));
    std::iter::once(MANIFEST.to_string())
        .chain(natives)
        .chain(triton)
        .collect()
}

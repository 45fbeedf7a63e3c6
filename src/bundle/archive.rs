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
    if !dir.is_dir() {
        return Err(bad(dir, "pack takes a bundle directory"));
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let cannot_write = |why: String| {
        crate::error::BuildError::new(
            crate::error::ErrorKind::InvalidArgument,
            format!("cannot write the archive {}: {why}", out.display()),
        )
    };
    let (Ok(inside), Ok(bundle)) = (parent.canonicalize(), dir.canonicalize()) else {
        return Err(cannot_write(format!(
            "{} is not a directory",
            parent.display()
        )));
    };
    if inside.starts_with(&bundle) {
        return Err(cannot_write("it would be inside the bundle".to_string()));
    }
    let manifest = read(dir)?;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for e in &manifest.entries {
        files.push((
            e.file.clone(),
            entry_bytes(dir, e).map_err(|why| bad(dir, why))?,
        ));
    }
    for t in &manifest.triton_cache {
        for (name, bytes) in triton_files(dir, &manifest.entries, t).map_err(|why| bad(dir, why))? {
            files.push((format!("triton/{}/{}/{name}", t.target, t.hash), bytes));
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
    persist(parent, out, &archive).map_err(|e| cannot_write(e.to_string()))?;
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
        ["triton", t, h, f] if is_key(t) && is_key(h) && triton::plain_file_name(f) => {
            Some((parts, MAX_ENTRY_BYTES))
        }
        _ => None,
    }
}

/// The longest GNU long name (or pax global header) read: a bundle's paths are short, and
/// the tar crate would otherwise read such records whole, however large.
const MAX_NAME_RECORD_BYTES: u64 = 4096;

/// Unpack the archive `archive` into `dest` (a new directory) and return its checked
/// manifest; the caller then checks the entries as in any bundle directory. Entries are
/// read raw: a GNU long name is read bounded and names the next entry, a pax global header
/// (`git archive` writes one) is skipped bounded, per-file pax headers are refused.
pub fn unpack(archive: &Path, dest: &Path) -> Result<super::Manifest> {
    let file = crate::private::open_file(archive, false, false).map_err(|e| bad(archive, e))?;
    std::fs::create_dir(dest).map_err(|e| bad(dest, e))?;
    let not_tar = |e: std::io::Error| bad(archive, format!("not a tar archive: {e}"));
    let mut seen = std::collections::HashSet::new();
    let mut long_name: Option<String> = None;
    let mut tar = tar::Archive::new(file);
    let mut entries = tar.entries().map_err(not_tar)?;
    entries = entries.raw(true);
    for entry in entries {
        let mut entry = entry.map_err(not_tar)?;
        let kind = entry.header().entry_type();
        if kind.is_gnu_longname() || kind.is_pax_global_extensions() {
            let record = read_bounded(&mut entry, MAX_NAME_RECORD_BYTES)
                .map_err(|e| bad(archive, format!("a name record: {e}")))?;
            if long_name.is_some() {
                return Err(bad(archive, "a long name names no entry"));
            }
            if kind.is_gnu_longname() {
                long_name = Some(
                    String::from_utf8_lossy(&record)
                        .trim_end_matches('\0')
                        .to_string(),
                );
            }
            continue;
        }
        let raw = match long_name.take() {
            Some(name) => name,
            None => String::from_utf8_lossy(&entry.path_bytes()).into_owned(),
        };
        let path = raw
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string();
        if kind.is_dir() {
            continue;
        }
        if path.is_empty() || path == "." {
            return Err(bad(archive, format!("an entry has no name ({kind:?})")));
        }
        let Some((parts, limit)) = place(&path).filter(|_| kind == tar::EntryType::Regular) else {
            return Err(bad(
                archive,
                format!("{raw:?} is not a bundle's file ({kind:?})"),
            ));
        };
        if !seen.insert(path.clone()) {
            return Err(bad(archive, format!("{path:?} is in it twice")));
        }
        let bytes =
            read_bounded(&mut entry, limit).map_err(|e| bad(archive, format!("{path:?}: {e}")))?;
        let mut here = dest.to_path_buf();
        for d in &parts[..parts.len() - 1] {
            here.push(d);
            if std::fs::symlink_metadata(&here).is_err() {
                std::fs::create_dir(&here).map_err(|e| bad(dest, e))?;
            }
        }
        persist(&here, &dest.join(&path), &bytes).map_err(|e| bad(dest, e))?;
    }
    if long_name.is_some() {
        return Err(bad(archive, "a long name names no entry"));
    }
    read(dest)
}

/// At most `limit` bytes of `reader`; more is an error.
fn read_bounded(reader: &mut impl Read, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::other(format!("larger than {limit} bytes")));
    }
    Ok(bytes)
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
        assert!(place(&format!("triton/{key}/{key}/k.spv")).is_some());
        assert!(place(&format!("triton/{key}/k.spv")).is_none());
        for hostile in [
            "../manifest.json".to_string(),
            format!("native/../{key}.zebin"),
            format!("native/{key}.so"),
            format!("triton/{key}/{key}/__grp__k.json"),
            format!("triton/{key}/{key}/../../x"),
            "/etc/passwd".to_string(),
            "native".to_string(),
        ] {
            assert!(place(&hostile).is_none(), "{hostile}");
        }
    }

    /// A bundle with one Triton entry whose file names are long (paths past tar's 100
    /// bytes: GNU long names) packs, unpacks and verifies.
    #[test]
    fn long_names_round_trip_and_huge_name_records_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let stem = "k".repeat(150);
        let entry = super::super::TritonEntry {
            hash: "b".repeat(64),
            kernel: stem.clone(),
            config: String::new(),
            target: "c".repeat(64),
            native: false,
            files: Vec::new(),
        };
        let files = vec![
            (format!("{stem}.json"), b"{}".to_vec()),
            (
                format!("{stem}.spv"),
                vec![0x03, 0x02, 0x23, 0x07, 0, 0, 1, 0],
            ),
        ];
        let additions = super::super::Additions {
            triton: vec![(entry, files)],
            ..Default::default()
        };
        let bundle = dir.path().join("b");
        super::super::write(&bundle, super::super::Manifest::default(), additions).unwrap();
        let archive = dir.path().join("b.tar");
        assert_eq!(pack(&bundle, &archive).unwrap(), 3);
        unpack(&archive, &dir.path().join("u")).unwrap();
        let report = super::super::verify(&dir.path().join("u")).unwrap();
        assert!(report.bad.is_empty() && report.ok.len() == 1, "{report:?}");
        assert!(pack(&bundle, &bundle.join("inside.tar")).is_err());

        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::GNULongName);
        header.set_size(1 << 20);
        header.set_cksum();
        let mut huge = header.as_bytes().to_vec();
        huge.resize(512 + (1 << 20) + 1024, b'a');
        std::fs::write(dir.path().join("huge.tar"), huge).unwrap();
        let err = unpack(&dir.path().join("huge.tar"), &dir.path().join("h")).unwrap_err();
        assert!(err.message.contains("larger than"), "{}", err.message);
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

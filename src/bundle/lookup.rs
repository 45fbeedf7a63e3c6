//! Looking kernels up in bundles: manifests read once per process and change, indexed by
//! key; the first bundle with a good entry answers. The same index says whether a bundle
//! can be used at all here (`unusable`): a bundle made from another Triton version's SPIR-V
//! is not.

use super::{bad, entry_bytes, read, Entry, Manifest, MANIFEST};
use crate::error::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A manifest read once per process and change (device, inode, size, modification and
/// change times: the last cannot be set back) and trusted keys, with its entries by key: a
/// model's loads read it once, not once per kernel. What lookups need is all it keeps: the
/// entries and the Triton release, and whether a trusted key signed it (asked as it is
/// read: that serializes the whole manifest). A manifest that cannot be used is remembered
/// too.
struct Indexed {
    stamp: (u64, u64, u64, i64, i64),
    /// `XPU_ZEBIN_TRUSTED_KEYS` when it was read: another setting reads it again.
    trusted_keys: Option<std::ffi::OsString>,
    manifest: Result<Manifest>,
    trust: std::result::Result<(), String>,
    /// Entries by their key's 32 bytes.
    by_key: std::collections::HashMap<[u8; 32], usize>,
}

/// A key's 32 bytes, when it is 64 lowercase hex digits (as every key of a manifest is).
fn key_bytes(key: &str) -> Option<[u8; 32]> {
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    let hex = key.as_bytes();
    let mut out = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = digit(hex[2 * i])? << 4 | digit(hex[2 * i + 1])?;
    }
    Some(out)
}

type Manifests = BTreeMap<PathBuf, std::sync::Arc<Indexed>>;
static MANIFESTS: std::sync::Mutex<Manifests> = std::sync::Mutex::new(BTreeMap::new());

fn read_indexed(dir: &Path) -> Result<std::sync::Arc<Indexed>> {
    use std::os::unix::fs::MetadataExt;
    let dir = std::fs::canonicalize(dir).map_err(|e| bad(dir, e))?;
    let meta = std::fs::symlink_metadata(dir.join(MANIFEST)).map_err(|e| bad(&dir, e))?;
    let stamp = (
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime().saturating_mul(1_000_000_000) + meta.mtime_nsec(),
        meta.ctime().saturating_mul(1_000_000_000) + meta.ctime_nsec(),
    );
    let trusted_keys = std::env::var_os(crate::signing::TRUSTED_KEYS_ENV);
    if let Some(known) = crate::sync::lock(&MANIFESTS).get(&dir) {
        if known.stamp == stamp && known.trusted_keys == trusted_keys {
            return Ok(known.clone());
        }
    }
    let mut manifest = read(&dir);
    let (mut trust, mut by_key) = (Ok(()), std::collections::HashMap::new());
    if let Ok(m) = &mut manifest {
        trust = super::check_trusted(&dir, m).map_err(|e| e.message);
        // Kept for lookups: the entries and the Triton release, nothing else.
        (m.targets, m.failures, m.triton_cache) = Default::default();
        m.entries.shrink_to_fit();
        let keys = m.entries.iter().enumerate();
        by_key = keys
            .filter_map(|(i, e)| Some((key_bytes(&e.key)?, i)))
            .collect();
    }
    let indexed = std::sync::Arc::new(Indexed {
        stamp,
        trusted_keys,
        manifest,
        trust,
        by_key,
    });
    crate::sync::lock(&MANIFESTS).insert(dir, indexed.clone());
    Ok(indexed)
}

/// What a lookup found.
pub enum Found {
    /// The entry and its checked bytes.
    Native(Box<Entry>, Vec<u8>),
    /// Not in any bundle; `other_target_ids` names the targets that have this kernel.
    Missing { other_target_ids: Vec<String> },
    /// In a bundle, but not usable: its bytes are not what its manifest says, or it is
    /// for another kernel or target than its key claims.
    Refused(String),
}

/// What a lookup found in the bundles, and the bundles it could not use (each with why).
pub struct Lookup {
    pub found: Found,
    pub skipped: Vec<String>,
}

/// Why the bundle at `dir` was made from another Triton's SPIR-V than `triton` (this
/// process's), if it was: a manifest that names no Triton, or no Triton here, says nothing.
fn other_triton(dir: &Path, manifest: &Manifest, triton: Option<&str>) -> Option<String> {
    let theirs = manifest.triton.as_deref().filter(|t| !t.is_empty())?;
    let ours = triton.filter(|t| !t.is_empty())?;
    (theirs != ours).then(|| {
        format!(
            "bundle {} was built from Triton {theirs}'s SPIR-V; this is Triton {ours}: not used",
            dir.display()
        )
    })
}

/// Why the bundle at `dir` cannot be used here, or `None` when it can, answered from the
/// index `lookup` reads (a manifest is read once per change): a file (an archive, used
/// once imported), a directory with no manifest, a manifest that cannot be read, or one
/// made from another Triton's SPIR-V than `triton` (this process's, when it has one).
pub fn unusable(dir: &Path, triton: Option<&str>) -> Option<String> {
    if std::fs::metadata(dir.join(MANIFEST)).is_err() {
        let d = dir.display();
        return Some(match dir.is_file() {
            true => format!(
                "{d} is a file (a bundle archive?): archives are used once imported \
                 (xpu-zebin bundle import); skipped"
            ),
            false => format!("{d} holds no bundle (no {MANIFEST}); skipped"),
        });
    }
    match read_indexed(dir) {
        Ok(indexed) => match &indexed.manifest {
            Ok(manifest) => {
                other_triton(dir, manifest, triton).or_else(|| indexed.trust.clone().err())
            }
            Err(e) => Some(e.message.clone()),
        },
        Err(e) => Some(e.message),
    }
}

/// The zebin of the native entry `key` of the bundle at `dir`, checked as a lookup checks
/// it (whoever asks has chosen the bundle: its Triton release and signer are not asked).
pub fn native(dir: &Path, key: &str) -> std::result::Result<Vec<u8>, String> {
    let indexed = read_indexed(dir).map_err(|e| e.message)?;
    let manifest = indexed.manifest.as_ref().map_err(|e| e.message.clone())?;
    let found = key_bytes(key).and_then(|k| indexed.by_key.get(&k));
    match found.and_then(|&i| manifest.entries.get(i)) {
        Some(entry) => entry_bytes(dir, entry),
        None => Err(format!("{}: no entry {key:?}", dir.display())),
    }
}

/// Look `key` up in `dirs` (the first bundle with a good entry answers) for `kernel` on
/// the target profile `target_id`; a bundle that cannot be read, or that was made from
/// another Triton's SPIR-V than `triton` (this process's, when it has one), is skipped, and
/// said in `skipped`; an entry that fails its checks is refused only when no other bundle
/// has a good one.
pub fn lookup(
    dirs: &[PathBuf],
    key: &str,
    kernel: &str,
    target_id: &str,
    triton: Option<&str>,
) -> Lookup {
    let mut other_target_ids = Vec::new();
    let mut skipped = Vec::new();
    let mut refused = None;
    for dir in dirs {
        let indexed = match read_indexed(dir) {
            Ok(i) => i,
            Err(e) => {
                skipped.push(e.message);
                continue;
            }
        };
        let manifest = match &indexed.manifest {
            Ok(m) => m,
            Err(e) => {
                skipped.push(e.message.clone());
                continue;
            }
        };
        if let Some(why) = other_triton(dir, manifest, triton) {
            skipped.push(why);
            continue;
        }
        if let Err(why) = &indexed.trust {
            skipped.push(why.clone());
            continue;
        }
        let found = key_bytes(key).and_then(|k| indexed.by_key.get(&k));
        if let Some(entry) = found.and_then(|&i| manifest.entries.get(i)) {
            if entry.kernel != kernel || entry.target_id != target_id {
                refused.get_or_insert(format!(
                    "{}: entry {} is for kernel {:?} on target {}, not {kernel:?} here",
                    dir.display(),
                    &entry.key[..12],
                    entry.kernel,
                    entry.target_id.get(..12).unwrap_or(&entry.target_id)
                ));
                continue;
            }
            match entry_bytes(dir, entry) {
                Ok(bytes) => {
                    let found = Found::Native(Box::new(entry.clone()), bytes);
                    return Lookup { found, skipped };
                }
                // Another bundle may hold a good copy: the refusal is said if none does.
                Err(why) => {
                    refused.get_or_insert(format!("{}: {why}", dir.display()));
                    continue;
                }
            }
        }
        for e in manifest.entries.iter().filter(|e| e.kernel == kernel) {
            if !other_target_ids.contains(&e.target_id) {
                other_target_ids.push(e.target_id.clone());
            }
        }
    }
    let found = match refused {
        Some(why) => Found::Refused(why),
        None => Found::Missing { other_target_ids },
    };
    Lookup { found, skipped }
}

#[cfg(test)]
mod tests {
    use super::super::{write, Additions};
    use super::*;

    /// A bundle at `dir` whose manifest names `triton`, with one entry for kernel `k` on
    /// target `t1` (its bytes are never read here).
    fn bundle_from(dir: &Path, triton: Option<&str>) {
        let entry = Entry {
            key: "a".repeat(64),
            kernel: "k".to_string(),
            config: String::new(),
            target_id: "t1".to_string(),
            build_flags: String::new(),
            spill_bytes: 0,
            n_spills: 0,
            compiler: String::new(),
            file: String::new(),
            blake3: String::new(),
            size: 0,
            stored: None,
        };
        let header = Manifest {
            triton: triton.map(str::to_string),
            ..Default::default()
        };
        let additions = Additions {
            built: vec![(entry, b"not read".to_vec())],
            ..Default::default()
        };
        write(dir, header, additions).unwrap();
    }

    /// Look kernel `k` up on target `t2` (the bundle has it for `t1` only).
    fn look(dir: &Path, triton: Option<&str>) -> (Vec<String>, Vec<String>) {
        let key = "b".repeat(64);
        let Lookup { found, skipped } = lookup(&[dir.to_path_buf()], &key, "k", "t2", triton);
        match found {
            Found::Missing { other_target_ids } => (other_target_ids, skipped),
            _ => panic!("found what the bundle does not hold"),
        }
    }

    /// A bundle made from another Triton's SPIR-V is unusable and skipped by a lookup,
    /// said by name; the same Triton, no Triton here, or a manifest that names none: used.
    #[test]
    fn a_bundle_from_another_triton_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("b");
        bundle_from(&bundle, Some("3.1.0"));
        let why = format!(
            "bundle {} was built from Triton 3.1.0's SPIR-V; this is Triton 3.2.0: not used",
            bundle.display()
        );
        assert_eq!(unusable(&bundle, Some("3.2.0")), Some(why.clone()));
        assert_eq!(look(&bundle, Some("3.2.0")), (vec![], vec![why]));
        for ours in [Some("3.1.0"), None, Some("")] {
            assert_eq!(unusable(&bundle, ours), None, "{ours:?}");
            assert_eq!(look(&bundle, ours), (vec!["t1".to_string()], vec![]));
        }
        let unnamed = dir.path().join("u");
        bundle_from(&unnamed, None);
        assert_eq!(unusable(&unnamed, Some("3.2.0")), None);
        assert_eq!(look(&unnamed, Some("3.2.0")).1, Vec::<String>::new());
    }

    /// A manifest changed since it was indexed is read again: the answer follows it.
    #[test]
    fn a_changed_manifest_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("b");
        bundle_from(&bundle, Some("3.1.0"));
        assert!(unusable(&bundle, Some("3.2.0")).is_some());
        bundle_from(&bundle, Some("3.2.0"));
        assert_eq!(unusable(&bundle, Some("3.2.0")), None);
        assert_eq!(look(&bundle, Some("3.2.0")).1, Vec::<String>::new());
        // Rewritten in place: the same file, another size (its times may not have moved).
        let text = std::fs::read_to_string(bundle.join(MANIFEST)).unwrap();
        // The format's field names, whatever the Rust ones (`target_id` is `target`).
        assert!(text.contains(r#""target": "t1""#), "{text}");
        std::fs::write(bundle.join(MANIFEST), text.replace("3.2.0", "3.2.10")).unwrap();
        let why = unusable(&bundle, Some("3.2.0")).unwrap();
        assert!(why.contains("Triton 3.2.10's"), "{why}");
        std::fs::write(bundle.join(MANIFEST), "{").unwrap();
        let why = unusable(&bundle, None).unwrap();
        assert!(why.contains("is not a usable xpu-zebin bundle"), "{why}");
        assert_eq!(look(&bundle, None).1, vec![why]);
    }

    /// A file, a directory with no manifest, a path that is not there: each said as such.
    #[test]
    fn what_is_no_bundle_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("b.tar");
        std::fs::write(&file, b"an archive").unwrap();
        let d = file.display();
        assert_eq!(
            unusable(&file, None),
            Some(format!(
                "{d} is a file (a bundle archive?): archives are used once imported \
                 (xpu-zebin bundle import); skipped"
            ))
        );
        for empty in [dir.path().to_path_buf(), dir.path().join("none")] {
            let d = empty.display();
            let why = format!("{d} holds no bundle (no manifest.json); skipped");
            assert_eq!(unusable(&empty, None), Some(why));
        }
    }
}

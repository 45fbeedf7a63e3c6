//! Looking kernels up in bundles: manifests read once per process and change, indexed by
//! key; the first bundle with a good entry answers.

use super::{bad, entry_bytes, read, Entry, Manifest, MANIFEST};
use crate::error::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A manifest read once per process and change (device, inode, size, modification and
/// change times: the last cannot be set back), with its entries by key: a model's loads
/// read it once, not once per kernel. A manifest that cannot be used is remembered too.
struct Indexed {
    stamp: (u64, u64, u64, i64, i64),
    manifest: Result<Manifest>,
    by_key: std::collections::HashMap<String, usize>,
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
    if let Some(known) = crate::sync::lock(&MANIFESTS).get(&dir) {
        if known.stamp == stamp {
            return Ok(known.clone());
        }
    }
    let manifest = read(&dir);
    let by_key = match &manifest {
        Ok(m) => m
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.key.clone(), i))
            .collect(),
        Err(_) => Default::default(),
    };
    let indexed = std::sync::Arc::new(Indexed {
        stamp,
        manifest,
        by_key,
    });
    crate::sync::lock(&MANIFESTS).insert(dir, indexed.clone());
    Ok(indexed)
}

/// What a lookup found.
pub enum Found {
    /// The entry and its checked bytes.
    Native(Box<Entry>, Vec<u8>),
    /// Not in any bundle; `other_targets` names targets that have this kernel.
    Missing { other_targets: Vec<String> },
    /// In a bundle, but not usable: its bytes are not what its manifest says, or it is
    /// for another kernel or target than its key claims.
    Refused(String),
}

/// What a lookup found in the bundles, and the bundles it could not use (each with why).
pub struct Lookup {
    pub found: Found,
    pub skipped: Vec<String>,
}

/// Look `key` up in `dirs` (the first bundle with a good entry answers) for `kernel` on
/// `target`; a bundle that cannot be read is skipped, and said in `skipped`; an entry that
/// fails its checks is refused only when no other bundle has a good one.
pub fn lookup(dirs: &[PathBuf], key: &str, kernel: &str, target: &str) -> Lookup {
    let mut other_targets = Vec::new();
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
        if let Some(entry) = indexed.by_key.get(key).map(|&i| &manifest.entries[i]) {
            if entry.kernel != kernel || entry.target != target {
                refused.get_or_insert(format!(
                    "{}: entry {} is for kernel {:?} on target {}, not {kernel:?} here",
                    dir.display(),
                    &entry.key[..12],
                    entry.kernel,
                    entry.target.get(..12).unwrap_or(&entry.target)
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
            if !other_targets.contains(&e.target) {
                other_targets.push(e.target.clone());
            }
        }
    }
    let found = match refused {
        Some(why) => Found::Refused(why),
        None => Found::Missing { other_targets },
    };
    Lookup { found, skipped }
}

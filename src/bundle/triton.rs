//! Triton cache entries inside a bundle: for one compiled kernel, the files Triton's cache
//! holds under its key (metadata `<name>.json`, IRs, the binary), so that an import hands
//! them to Triton's cache manager and Triton finds the kernel compiled. Stored as
//! `triton/<target>/<hash>/<file>` (Triton's key does not hold the driver a profile names,
//! so two profiles may share a hash); every file is listed with its size and blake3, and
//! read back only if it still matches. An entry is its metadata and its binary, nothing
//! else; a native binary must be one of the bundle's own checked native entries for that
//! kernel and target (Triton loads it with no trial of its own).

use super::stored::{self, Listed, Member, Stored};
use super::{bad, is_key, persist, Entry};
use crate::error::Result;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
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
    #[serde(rename = "target")]
    pub target_id: String,
    /// Its binary is native code (Triton's `generate_native_code`), else SPIR-V.
    pub native: bool,
    pub files: Vec<TritonFile>,
    /// A native entry's binary is the bundle's native entry of this key (built for the
    /// same config): not any entry of the same kernel.
    #[serde(default)]
    pub native_key: String,
}

/// A file of a Triton cache entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TritonFile {
    pub name: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub blake3: String,
    /// The file's own bytes, compressed (None: as it is: a bundle of format 1, or a file
    /// that would inflate more than a reader takes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<Stored>,
}

impl TritonFile {
    /// As the manifest lists it.
    pub(super) fn listed(&self) -> Listed<'_> {
        Listed {
            size: self.size,
            blake3: &self.blake3,
            stored: self.stored.as_ref(),
        }
    }
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

const SPIRV_MAGIC: &[u8] = &[0x03, 0x02, 0x23, 0x07];
const ELF_MAGIC: &[u8] = b"\x7fELF";

/// Why `entry` is malformed, if it is: its hash and target, its files (exactly
/// `<name>.json`, the metadata, and `<name>.spv`, the binary), their checksums.
pub(super) fn malformed(entry: &TritonEntry) -> Option<&'static str> {
    let names: Vec<&str> = entry.files.iter().map(|f| f.name.as_str()).collect();
    let stem = names
        .iter()
        .find_map(|n| n.strip_suffix(".json"))
        .unwrap_or_default();
    let mut wanted = [format!("{stem}.json"), format!("{stem}.spv")];
    wanted.sort();
    let mut given: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    given.sort();
    if !is_key(&entry.hash) || !is_key(&entry.target_id) {
        Some("its hash or target is not 64 lowercase hex digits")
    } else if names.iter().any(|n| !plain_file_name(n)) {
        Some("a file name is not a plain Triton cache file name")
    } else if stem.is_empty() || given != wanted {
        Some("its files are not <name>.json and <name>.spv")
    } else if (entry.files.iter())
        .any(|f| !is_key(&f.blake3) || f.stored.as_ref().is_some_and(|s| !is_key(&s.blake3)))
    {
        Some("a file's blake3 is not 64 lowercase hex digits")
    } else {
        None
    }
}

/// `dir/triton/<target>/<hash>`, when each step is a directory of its own (a link could
/// lead reads and writes anywhere).
pub(super) fn entry_dir(dir: &Path, entry: &TritonEntry) -> std::result::Result<PathBuf, String> {
    let top = dir.join("triton");
    let by_target = top.join(&entry.target_id);
    let here = by_target.join(&entry.hash);
    for d in [&top, &by_target, &here] {
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

/// A bundle's native entries as a Triton entry's native binary is matched against them:
/// by key (its `native_key`), and by kernel, target and config (bundles written before
/// `native_key`: the `make_zebin` build of its config), each looked up at once, never
/// searched for among entries (that would grow with the bundle, for each Triton entry,
/// and entries of the same bytes would all be searched). Owned, so that it can outlive the
/// manifest it was made from (a stream of checked entries keeps it).
#[derive(Default)]
pub struct Natives {
    /// Key: (checksum, kernel, target).
    by_key: HashMap<String, (String, String, String)>,
    /// (kernel, target, config): the checksums of its entries.
    by_config: HashMap<(String, String, String), HashSet<String>>,
}

impl Natives {
    pub fn of(entries: &[Entry]) -> Natives {
        let mut natives = Natives::default();
        for e in entries {
            let what = (e.blake3.clone(), e.kernel.clone(), e.target_id.clone());
            natives.by_key.insert(e.key.clone(), what);
            let slot = (e.kernel.clone(), e.target_id.clone(), e.config.clone());
            natives
                .by_config
                .entry(slot)
                .or_default()
                .insert(e.blake3.clone());
        }
        natives
    }

    /// Is `sum` the checksum of the native entry of `entry`'s own config, for its kernel
    /// and target: its `native_key`, or (bundles written before it) the `make_zebin` build
    /// of the same config?
    fn own_build(&self, entry: &TritonEntry, sum: &str) -> bool {
        if entry.native_key.is_empty() {
            let slot = (
                entry.kernel.clone(),
                entry.target_id.clone(),
                format!("{} (make_zebin)", entry.config),
            );
            self.by_config
                .get(&slot)
                .is_some_and(|sums| sums.contains(sum))
        } else {
            self.by_key
                .get(&entry.native_key)
                .is_some_and(|(s, kernel, target)| {
                    s == sum && *kernel == entry.kernel && *target == entry.target_id
                })
        }
    }
}

/// The files of a Triton entry, if each is what the manifest says (size and checksum)
/// and its binary is SPIR-V, or native code the bundle holds as a checked entry for the
/// same kernel and target (`natives`: the manifest's entries).
pub fn triton_files(
    dir: &Path,
    natives: &Natives,
    entry: &TritonEntry,
) -> std::result::Result<Vec<(String, Vec<u8>)>, String> {
    let members = triton_members(dir, natives, entry)?;
    Ok(members
        .into_iter()
        .map(|(name, m)| (name, m.into_plain()))
        .collect())
}

/// `triton_files`, each with its bytes as stored.
pub(super) fn triton_members(
    dir: &Path,
    natives: &Natives,
    entry: &TritonEntry,
) -> std::result::Result<Vec<(String, Member)>, String> {
    let here = entry_dir(dir, entry)?;
    let name = |f: &TritonFile| {
        format!(
            "triton/{}/{}/{}",
            &entry.target_id[..12],
            &entry.hash[..12],
            f.name
        )
    };
    let mut files = Vec::new();
    for f in &entry.files {
        let member = stored::read(&here.join(&f.name), &f.listed())
            .map_err(|why| format!("{} {why}", name(f)))?;
        let (bytes, sum) = (member.plain(), f.blake3.as_str());
        let holds_kernel = || {
            crate::zebin::parse(bytes)
                .and_then(|info| info.kernel_spill(&entry.kernel))
                .is_ok()
        };
        if f.name.ends_with(".spv") && !binary_allowed(natives, entry, bytes, sum, holds_kernel) {
            return Err(not_allowed(&name(f), entry));
        }
        if f.name.ends_with(".spv") && bytes.starts_with(SPIRV_MAGIC) {
            // The same validator as any SPIR-V: Triton hands it to the driver's JIT.
            crate::spirv::validate(bytes)
                .and_then(|module| module.select_kernel(Some(&entry.kernel)))
                .map_err(|e| format!("{} is not valid SPIR-V of its kernel: {e}", name(f)))?;
        }
        files.push((f.name.clone(), member));
    }
    Ok(files)
}

/// Whether a Triton entry's binary (its first bytes `head`, its blake3 `sum`) may be used:
/// SPIR-V, or one of the bundle's native entries (`natives`) for the same kernel and
/// target that holds the kernel (`holds_kernel`, asked last: it reads the binary).
pub(super) fn binary_allowed(
    natives: &Natives,
    entry: &TritonEntry,
    head: &[u8],
    sum: &str,
    holds_kernel: impl FnOnce() -> bool,
) -> bool {
    head.starts_with(SPIRV_MAGIC)
        || (head.starts_with(ELF_MAGIC) && natives.own_build(entry, sum) && holds_kernel())
}

/// Why `binary_allowed` refused the file `name`.
pub(super) fn not_allowed(name: &str, entry: &TritonEntry) -> String {
    format!(
        "{name} is neither SPIR-V nor the bundle's native entry of its own config for {:?}",
        entry.kernel
    )
}

/// `dir/triton/<target>/<hash>/`, made where missing (`entry_dir`'s checks).
pub(super) fn make_entry_dir(dir: &Path, entry: &TritonEntry) -> Result<PathBuf> {
    let io = |e: std::io::Error| bad(dir, e);
    if !is_key(&entry.hash) || !is_key(&entry.target_id) {
        return Err(bad(
            dir,
            "a Triton entry's hash or target is not 64 hex digits",
        ));
    }
    let by_target = dir.join("triton").join(&entry.target_id);
    for d in [
        dir.join("triton"),
        by_target.clone(),
        by_target.join(&entry.hash),
    ] {
        if std::fs::symlink_metadata(&d).is_err() {
            std::fs::create_dir(&d).map_err(io)?;
        }
    }
    entry_dir(dir, entry).map_err(|why| bad(dir, why))
}

/// Write a Triton entry's files, compressed, under `dir/triton/<target>/<hash>/` and fill
/// in their sizes and checksums.
pub(super) fn write_entry(
    dir: &Path,
    entry: &mut TritonEntry,
    files: &[(String, Vec<u8>)],
) -> Result<()> {
    let io = |e: std::io::Error| bad(dir, e);
    let here = make_entry_dir(dir, entry)?;
    let mut stored = Vec::with_capacity(files.len());
    entry.files.clear();
    for (name, bytes) in files {
        let (on_disk, listed) = stored::store(bytes).map_err(io)?;
        entry.files.push(TritonFile {
            name: name.clone(),
            size: bytes.len() as u64,
            blake3: blake3::hash(bytes).to_hex().to_string(),
            stored: listed,
        });
        stored.push(on_disk);
    }
    if let Some(why) = malformed(entry) {
        return Err(bad(dir, format!("Triton entry {}: {why}", entry.hash)));
    }
    for ((name, _), on_disk) in files.iter().zip(&stored) {
        persist(&here, &here.join(name), on_disk).map_err(io)?;
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

//! Ahead-of-time bundles: native binaries built on a farm for named target profiles, with a
//! manifest, so that a machine of that profile loads them with no compile at all.
//!
//! A bundle is a directory: `manifest.json` and `native/<key>.zebin`. Everything in it is
//! untrusted input: the manifest is read bounded and checked (format, keys, file names), an
//! entry's bytes must match its checksum and parse as a zebin holding its kernel, and the
//! caller still trial-loads a native binary in a worker before its driver sees it.

use crate::error::{BuildError, ErrorKind, Result};
use crate::key::{KeyInputs, Purpose};
use crate::options::Options;
use crate::spill::Path as SpillPath;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "xpu-zebin-bundle/1";
const MANIFEST: &str = "manifest.json";
const MAX_MANIFEST_BYTES: u64 = 64 << 20;
const MAX_ENTRY_BYTES: u64 = 256 << 20;

/// One native binary of the bundle.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    /// What it answers (`key.rs`, purpose `Bundle`): SPIR-V, kernel, flags, rule, target.
    pub key: String,
    pub kernel: String,
    /// The autotune config it was built for, as text ("" when none).
    #[serde(default)]
    pub config: String,
    /// The target profile's id.
    pub target: String,
    pub build_flags: String,
    pub spill_bytes: u64,
    pub n_spills: i64,
    /// The compiler that built it (`ocloc` identity).
    pub compiler: String,
    /// `native/<key>.zebin`, and its blake3 and size.
    pub file: String,
    pub blake3: String,
    pub size: u64,
}

/// A kernel that could not be built for a target: listed, never loaded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Unbuilt {
    pub kernel: String,
    #[serde(default)]
    pub config: String,
    pub target: String,
    pub kind: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Manifest {
    pub format: String,
    /// The package version that wrote it.
    pub package: String,
    /// The Triton version its SPIR-V came from, when it came from Triton.
    #[serde(default)]
    pub triton: Option<String>,
    /// Target profiles by id, as their JSON.
    #[serde(default)]
    pub targets: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub entries: Vec<Entry>,
    #[serde(default)]
    pub failures: Vec<Unbuilt>,
}

fn bad(dir: &Path, why: impl std::fmt::Display) -> BuildError {
    BuildError::new(
        ErrorKind::InvalidArgument,
        format!("{} is not a usable xpu-zebin bundle: {why}", dir.display()),
    )
}

fn is_key(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The key of a native build of `kernel` in `spirv` with `options`, for a device of
/// `arch`, on the target profile `target`: the same on the farm that builds it and on the
/// machine that looks it up.
pub fn key(
    spirv: &[u8],
    kernel: &str,
    arch: &str,
    options: &Options,
    target: &str,
) -> Result<String> {
    let flags = options.ladder(options.device_arch.as_deref().unwrap_or(arch))?;
    Ok(KeyInputs {
        purpose: Purpose::Bundle,
        input: spirv,
        kernel,
        flags: &flags,
        rule: Some(options.rule(SpillPath::Jit)?),
        target: &[target],
    }
    .key())
}

/// Read a file of the bundle: a regular file (no link followed), at most `limit` bytes.
fn read_file(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = crate::private::open_file(path, false, false)?;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::other(format!("larger than {limit} bytes")));
    }
    Ok(bytes)
}

/// The bundle's manifest, checked: its format, and every entry's key and file name (a
/// file name is `native/<key>.zebin`, never a path of the manifest's choosing).
pub fn read(dir: &Path) -> Result<Manifest> {
    let bytes = read_file(&dir.join(MANIFEST), MAX_MANIFEST_BYTES).map_err(|e| bad(dir, e))?;
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(dir, e))?;
    if manifest.format != FORMAT {
        return Err(bad(
            dir,
            format!(
                "format {:?}, this package reads {FORMAT:?}",
                manifest.format
            ),
        ));
    }
    for e in &manifest.entries {
        if !is_key(&e.key) || e.file != format!("native/{}.zebin", e.key) || !is_key(&e.blake3) {
            return Err(bad(dir, format!("entry {:?} is malformed", e.key)));
        }
    }
    Ok(manifest)
}

/// An entry's bytes, if they are what the manifest says: its size, its checksum, a zebin
/// that holds its kernel.
pub fn entry_bytes(dir: &Path, entry: &Entry) -> std::result::Result<Vec<u8>, String> {
    let bytes = read_file(&dir.join(&entry.file), MAX_ENTRY_BYTES.min(entry.size))
        .map_err(|e| format!("{} cannot be read: {e}", entry.file))?;
    if bytes.len() as u64 != entry.size || blake3::hash(&bytes).to_hex().as_str() != entry.blake3 {
        return Err(format!("{} does not match its checksum", entry.file));
    }
    crate::zebin::parse(&bytes)
        .and_then(|info| info.kernel_spill(&entry.kernel))
        .map_err(|e| format!("{}: {e}", entry.file))?;
    Ok(bytes)
}

/// Write `built` (entries and their native binaries) and `failures` into the bundle at
/// `dir`, keeping what it already holds for other keys; `header` gives the format fields
/// and the targets. The manifest is replaced atomically, last.
pub fn write(
    dir: &Path,
    header: Manifest,
    built: Vec<(Entry, Vec<u8>)>,
    failures: Vec<Unbuilt>,
) -> Result<Manifest> {
    let io = |e: std::io::Error| bad(dir, e);
    std::fs::create_dir_all(dir.join("native")).map_err(io)?;
    let mut manifest = if dir.join(MANIFEST).exists() {
        read(dir)?
    } else {
        Manifest::default()
    };
    manifest.format = FORMAT.to_string();
    manifest.package = header.package;
    manifest.triton = header.triton.or(manifest.triton);
    manifest.targets.extend(header.targets);
    for (mut entry, bytes) in built {
        entry.file = format!("native/{}.zebin", entry.key);
        entry.blake3 = blake3::hash(&bytes).to_hex().to_string();
        entry.size = bytes.len() as u64;
        let mut tmp = tempfile::NamedTempFile::new_in(dir.join("native")).map_err(io)?;
        std::io::Write::write_all(&mut tmp, &bytes).map_err(io)?;
        tmp.persist(dir.join(&entry.file))
            .map_err(|e| io(e.error))?;
        manifest.entries.retain(|e| e.key != entry.key);
        manifest.failures.retain(|f| {
            (&f.kernel, &f.config, &f.target) != (&entry.kernel, &entry.config, &entry.target)
        });
        manifest.entries.push(entry);
    }
    for f in failures {
        manifest
            .failures
            .retain(|g| (&g.kernel, &g.config, &g.target) != (&f.kernel, &f.config, &f.target));
        manifest.failures.push(f);
    }
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| bad(dir, e))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    std::io::Write::write_all(&mut tmp, &text).map_err(io)?;
    tmp.persist(dir.join(MANIFEST)).map_err(|e| io(e.error))?;
    Ok(manifest)
}

/// What `verify` found: entries whose bytes are what the manifest says, and the others.
#[derive(Debug, Default, Serialize)]
pub struct Verified {
    pub ok: Vec<String>,
    pub bad: Vec<(String, String)>,
}

/// Check every entry of the bundle.
pub fn verify(dir: &Path) -> Result<Verified> {
    let manifest = read(dir)?;
    let mut report = Verified::default();
    for e in &manifest.entries {
        match entry_bytes(dir, e) {
            Ok(_) => report.ok.push(e.key.clone()),
            Err(why) => report.bad.push((e.key.clone(), why)),
        }
    }
    Ok(report)
}

/// What a lookup found in the bundles.
pub enum Found {
    /// The entry and its checked bytes.
    Native(Box<Entry>, Vec<u8>),
    /// Not in any bundle; `other_targets` names targets that have this kernel.
    Missing { other_targets: Vec<String> },
    /// In a bundle, but its bytes are not what its manifest says.
    Refused(String),
}

/// A manifest read once per process and change (its size and modification time), with
/// its entries by key: a model's loads read it once, not once per kernel.
struct Indexed {
    stamp: (u64, Option<std::time::SystemTime>),
    manifest: Manifest,
    by_key: std::collections::HashMap<String, usize>,
}

static MANIFESTS: std::sync::Mutex<BTreeMap<PathBuf, std::sync::Arc<Indexed>>> =
    std::sync::Mutex::new(BTreeMap::new());

fn read_indexed(dir: &Path) -> Result<std::sync::Arc<Indexed>> {
    let meta = std::fs::symlink_metadata(dir.join(MANIFEST)).map_err(|e| bad(dir, e))?;
    let stamp = (meta.len(), meta.modified().ok());
    if let Some(known) = crate::sync::lock(&MANIFESTS).get(dir) {
        if known.stamp == stamp {
            return Ok(known.clone());
        }
    }
    let manifest = read(dir)?;
    let by_key = manifest
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.key.clone(), i))
        .collect();
    let indexed = std::sync::Arc::new(Indexed {
        stamp,
        manifest,
        by_key,
    });
    crate::sync::lock(&MANIFESTS).insert(dir.to_path_buf(), indexed.clone());
    Ok(indexed)
}

/// Look `key` up in `dirs` (the first bundle that has it answers); `kernel` names, for a
/// miss, the targets that have the kernel under another key.
pub fn lookup(dirs: &[PathBuf], key: &str, kernel: &str) -> Result<Found> {
    let mut other_targets = Vec::new();
    for dir in dirs {
        let indexed = read_indexed(dir)?;
        let manifest = &indexed.manifest;
        if let Some(entry) = indexed.by_key.get(key).map(|&i| &manifest.entries[i]) {
            return Ok(match entry_bytes(dir, entry) {
                Ok(bytes) => Found::Native(Box::new(entry.clone()), bytes),
                Err(why) => Found::Refused(why),
            });
        }
        for e in manifest.entries.iter().filter(|e| e.kernel == kernel) {
            if !other_targets.contains(&e.target) {
                other_targets.push(e.target.clone());
            }
        }
    }
    Ok(Found::Missing { other_targets })
}

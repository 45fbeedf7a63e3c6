//! Ahead-of-time bundles: native binaries built on a farm for named target profiles, with a
//! manifest, so that a machine of that profile loads them with no compile at all.
//!
//! A bundle is a directory: `manifest.json`, `native/<key>.zebin`, and Triton cache
//! entries under `triton/<target>/<hash>/` (`triton.rs`); or one archive file of them
//! (`archive/`). Everything in it is untrusted input: the manifest is read bounded and
//! checked (format, keys, file names), an entry's bytes must match its checksum and parse
//! as a zebin holding its kernel, and the caller still trial-loads a native binary in a
//! worker before its driver sees it. Looking kernels up in bundles is `lookup.rs`.

use crate::error::{BuildError, ErrorKind, Result};
use crate::key::{KeyInputs, Purpose};
use crate::options::Options;
use crate::spill::Path as SpillPath;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

/// The format this package writes: every file compressed (`stored.rs`).
pub const FORMAT: &str = "xpu-zebin-bundle/2";
/// The formats it reads: the last one's files are stored as they are.
const FORMATS: [&str; 2] = ["xpu-zebin-bundle/1", FORMAT];
const MANIFEST: &str = "manifest.json";
/// Room for some 200,000 native entries with a Triton entry each (about 1.4 KB the pair,
/// as written); parsed, the records take about as much again.
const MAX_MANIFEST_BYTES: u64 = 256 << 20;
/// Target profiles are a few small objects; read as text first, so that a manifest's
/// size is never multiplied by JSON values built from it.
const MAX_TARGETS: usize = 1024;
const MAX_TARGETS_BYTES: usize = 4 << 20;
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
    #[serde(rename = "target")]
    pub target_id: String,
    pub build_flags: String,
    pub spill_bytes: u64,
    pub n_spills: i64,
    /// The compiler that built it (`ocloc` identity).
    pub compiler: String,
    /// `native/<key>.zebin`, and the blake3 and size of the zebin it holds.
    pub file: String,
    pub blake3: String,
    pub size: u64,
    /// The file's own bytes, compressed (None: the zebin as it is: a bundle of format 1,
    /// or a zebin that would inflate more than a reader takes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<Stored>,
}

impl Entry {
    /// Its file, as the manifest lists it.
    pub(super) fn listed(&self) -> Listed<'_> {
        Listed {
            size: self.size,
            blake3: &self.blake3,
            stored: self.stored.as_ref(),
        }
    }
}

/// A kernel that could not be built for a target: listed, never loaded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Unbuilt {
    pub kernel: String,
    #[serde(default)]
    pub config: String,
    /// The target profile's id.
    #[serde(rename = "target")]
    pub target_id: String,
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
    /// The sha256 of the Triton build's cache-key prefix (`triton_key()`) its Triton cache
    /// entries were made with: another build would never find them.
    #[serde(default)]
    pub triton_key: Option<String>,
    /// Target profiles by id, as their JSON.
    #[serde(default, deserialize_with = "bounded_targets")]
    pub targets: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub entries: Vec<Entry>,
    #[serde(default)]
    pub failures: Vec<Unbuilt>,
    /// Triton cache entries (`triton.rs`), for Triton's own cache.
    #[serde(default)]
    pub triton_cache: Vec<TritonEntry>,
    /// An Ed25519 signature over the rest of the manifest (`signing.rs`): with every
    /// file's checksum listed, it covers every byte of the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<BundleSignature>,
}

/// A manifest's targets, read as text and bounded before any is made a JSON value.
fn bounded_targets<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<BTreeMap<String, serde_json::Value>, D::Error> {
    use serde::de::Error;
    let raw: BTreeMap<String, Box<serde_json::value::RawValue>> = BTreeMap::deserialize(d)?;
    let text = raw
        .values()
        .fold(0usize, |n, r| n.saturating_add(r.get().len()));
    if raw.len() > MAX_TARGETS || text > MAX_TARGETS_BYTES {
        return Err(D::Error::custom(format!(
            "{} targets of {text} bytes: more than a manifest may hold ({MAX_TARGETS}, \
             {MAX_TARGETS_BYTES} bytes)",
            raw.len()
        )));
    }
    raw.into_iter()
        .map(|(id, r)| Ok((id, serde_json::from_str(r.get()).map_err(D::Error::custom)?)))
        .collect()
}

/// Who signed a bundle's manifest, and the signature (hex).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BundleSignature {
    pub signer: String,
    pub signature: String,
}

const SIGNED_TAG: &[u8] = b"xpu-zebin/bundle-manifest/v1\0";

/// A manifest's fields but its signature, borrowed, in its order: what a signature
/// covers, serialized with no copy of the manifest (a bundle's may be a million entries).
#[derive(Serialize)]
struct Unsigned<'a> {
    format: &'a String,
    package: &'a String,
    triton: &'a Option<String>,
    triton_key: &'a Option<String>,
    targets: &'a BTreeMap<String, serde_json::Value>,
    entries: &'a Vec<Entry>,
    failures: &'a Vec<Unbuilt>,
    triton_cache: &'a Vec<TritonEntry>,
}

/// What a bundle's signature covers: its manifest without the signature, as serialized.
fn signed_message(m: &Manifest) -> Vec<u8> {
    let unsigned = Unsigned {
        format: &m.format,
        package: &m.package,
        triton: &m.triton,
        triton_key: &m.triton_key,
        targets: &m.targets,
        entries: &m.entries,
        failures: &m.failures,
        triton_cache: &m.triton_cache,
    };
    let mut message = SIGNED_TAG.to_vec();
    let _ = serde_json::to_writer(&mut message, &unsigned); // to memory: cannot fail
    message
}

/// Signed by `signer` (the manifest's signature set, or dropped without a key): a manifest
/// that changes is signed again or not at all, never left with a stale signature.
fn signed_by(mut manifest: Manifest, signer: Option<&crate::signing::Signer>) -> Manifest {
    manifest.signature = None;
    if let Some(signer) = signer {
        let signature = signer.sign(&signed_message(&manifest));
        manifest.signature = Some(BundleSignature {
            signer: signer.public(),
            signature,
        });
    }
    manifest
}

/// When keys are trusted (`XPU_ZEBIN_TRUSTED_KEYS`), a bundle is used only when one of them
/// signed its manifest; with none trusted, every bundle is (as before signatures).
pub fn check_trusted(dir: &Path, manifest: &Manifest) -> Result<()> {
    let trusted = crate::signing::Trusted::from_env()?;
    if trusted.is_empty() {
        return Ok(());
    }
    match &manifest.signature {
        None => Err(bad(
            dir,
            format!(
                "it is not signed, and {} is set: only bundles a trusted key signed are used \
                 (xpu-zebin bundle sign)",
                crate::signing::TRUSTED_KEYS_ENV
            ),
        )),
        Some(s) if trusted.verify(&s.signer, &signed_message(manifest), &s.signature) => Ok(()),
        Some(s) => Err(bad(
            dir,
            format!(
                "its signature ({}) is not a trusted key's, or does not match its manifest",
                s.signer
            ),
        )),
    }
}

/// Sign the bundle at `dir` with `XPU_ZEBIN_SIGNING_KEY`; returns the signer's public key.
pub fn sign(dir: &Path) -> Result<String> {
    let signer = crate::signing::Signer::from_env()?.ok_or_else(|| {
        bad(
            dir,
            format!(
                "{} is not set: no key to sign with",
                crate::signing::SIGNING_KEY_ENV
            ),
        )
    })?;
    let _lock = lock_for_writing(dir).map_err(|e| bad(dir, e))?;
    let manifest = signed_by(read(dir)?, Some(&signer));
    persist_manifest(dir, &manifest).map_err(|e| bad(dir, e))?;
    Ok(signer.public())
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
/// `arch`, on the target profile `target_id`: the same on the farm that builds it and on the
/// machine that looks it up.
pub fn key(
    spirv: &[u8],
    kernel: &str,
    arch: &str,
    options: &Options,
    target_id: &str,
) -> Result<String> {
    let flags = options.ladder(options.device_arch.as_deref().unwrap_or(arch))?;
    Ok(KeyInputs {
        purpose: Purpose::Bundle,
        input: spirv,
        kernel,
        flags: &flags,
        rule: Some(options.rule(SpillPath::Jit)?),
        target: &[target_id],
    }
    .key())
}

/// Read a file of the bundle: a regular file (no link followed), at most `limit` bytes.
fn read_file(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    crate::bounded::read(crate::private::open_file(path, false, false)?, limit)
}

/// The bundle's manifest, checked: its format, every entry's key, checksum and file name
/// (a file name is `native/<key>.zebin`, never a path of the manifest's choosing; a key is
/// listed once), and every target is a JSON object.
pub fn read(dir: &Path) -> Result<Manifest> {
    let bytes = read_file(&dir.join(MANIFEST), MAX_MANIFEST_BYTES).map_err(|e| bad(dir, e))?;
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(dir, e))?;
    if !FORMATS.contains(&manifest.format.as_str()) {
        return Err(bad(
            dir,
            format!(
                "format {:?}, this package reads {FORMATS:?}",
                manifest.format
            ),
        ));
    }
    // Format 1 stored its files as built: one that says otherwise is not of format 1.
    let stores = manifest.entries.iter().any(|e| e.stored.is_some())
        || (manifest.triton_cache.iter()).any(|t| t.files.iter().any(|f| f.stored.is_some()));
    if stores && manifest.format != FORMAT {
        return Err(bad(
            dir,
            format!("format {:?} lists compressed files", manifest.format),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for e in &manifest.entries {
        let why = if !is_key(&e.key) {
            "its key is not 64 lowercase hex digits"
        } else if e.file != format!("native/{}.zebin", e.key) {
            "its file is not native/<key>.zebin"
        } else if !is_key(&e.blake3) || e.stored.as_ref().is_some_and(|s| !is_key(&s.blake3)) {
            "its blake3 is not 64 lowercase hex digits"
        } else if !seen.insert(e.key.as_str()) {
            "its key is listed twice"
        } else {
            continue;
        };
        return Err(bad(dir, format!("entry {:?} is malformed: {why}", e.key)));
    }
    let mut hashes = std::collections::HashSet::new();
    for t in &manifest.triton_cache {
        let why = triton::malformed(t).or_else(|| {
            (!hashes.insert((t.target_id.as_str(), t.hash.as_str())))
                .then_some("its hash is listed twice for its target")
        });
        if let Some(why) = why {
            return Err(bad(
                dir,
                format!("Triton entry {:?} is malformed: {why}", t.hash),
            ));
        }
    }
    if let Some((id, _)) = manifest.targets.iter().find(|(_, t)| !t.is_object()) {
        return Err(bad(dir, format!("target {id:?} is not a JSON object")));
    }
    Ok(manifest)
}

/// The bundle's `native/` directory, when it is a directory of its own (a link could lead
/// reads and writes anywhere).
fn native_dir(dir: &Path) -> Result<PathBuf> {
    let native = dir.join("native");
    match std::fs::symlink_metadata(&native) {
        Ok(m) if m.file_type().is_dir() => Ok(native),
        Ok(_) => Err(bad(
            dir,
            "native/ is not a directory (a link is not followed)",
        )),
        Err(e) => Err(bad(dir, format!("native/: {e}"))),
    }
}

/// An entry's zebin, if it is what the manifest says: its size and checksum as stored and
/// as it holds them, a zebin that holds its kernel.
pub fn entry_bytes(dir: &Path, entry: &Entry) -> std::result::Result<Vec<u8>, String> {
    entry_member(dir, entry).map(Member::into_plain)
}

/// `entry_bytes`, with the file's bytes as stored.
fn entry_member(dir: &Path, entry: &Entry) -> std::result::Result<Member, String> {
    native_dir(dir).map_err(|e| e.message)?;
    let member = stored::read(&dir.join(&entry.file), &entry.listed())
        .map_err(|why| format!("{} {why}", entry.file))?;
    crate::zebin::parse(member.plain())
        .and_then(|info| info.kernel_spill(&entry.kernel))
        .map_err(|e| format!("{}: {e}", entry.file))?;
    Ok(member)
}

/// Write `bytes` to `path` atomically (a temp file in `dir`, renamed), readable by all: a
/// bundle is an artifact to ship, not a private file.
fn persist(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, bytes)?;
    publish(tmp, path)
}

/// Write `manifest` to `dir`'s manifest file atomically, serialized as it is written (a
/// large bundle's text is never held whole beside it).
fn persist_manifest(dir: &Path, manifest: &Manifest) -> std::io::Result<()> {
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    let mut out = std::io::BufWriter::new(AtMost {
        inner: tmp.as_file_mut(),
        left: MAX_MANIFEST_BYTES,
    });
    serde_json::to_writer_pretty(&mut out, manifest)?;
    std::io::Write::flush(&mut out)?;
    drop(out);
    publish(tmp, &dir.join(MANIFEST))
}

/// A writer of at most `left` bytes: a manifest is never written larger than it can be
/// read back (the bundle would be stuck: neither used nor added to).
struct AtMost<W> {
    inner: W,
    left: u64,
}

impl<W: std::io::Write> std::io::Write for AtMost<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(std::io::Error::other(format!(
                "its manifest would be larger than a manifest may be ({MAX_MANIFEST_BYTES} \
                 bytes): split the bundle"
            )));
        }
        let n = self.inner.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Put a written temp file at `path` (renamed: never half there), readable by all.
fn publish(tmp: tempfile::NamedTempFile, path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Hold the bundle's writer lock (the manifest is read, merged and replaced).
fn lock_for_writing(dir: &Path) -> std::io::Result<std::fs::File> {
    let lock = crate::private::open_file(&dir.join(".lock"), true, true)?;
    // SAFETY: flock on a file descriptor this function owns.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(lock)
}

/// Files by name, with their bytes.
pub type NamedFiles = Vec<(String, Vec<u8>)>;

/// What one write adds to a bundle.
#[derive(Default)]
pub struct Additions {
    /// Entries and their native binaries.
    pub built: Vec<(Entry, Vec<u8>)>,
    pub failures: Vec<Unbuilt>,
    /// Triton cache entries and their files.
    pub triton: Vec<(TritonEntry, NamedFiles)>,
}

/// What the bundle at `dir` holds, to add to (nothing when it has no manifest yet). A
/// farm signs what it adds to, so what is there must be its own signed work: a manifest
/// someone seeded would otherwise be laundered under the farm's key.
fn to_add_to(dir: &Path, signer: Option<&crate::signing::Signer>) -> Result<Manifest> {
    if !dir.join(MANIFEST).exists() {
        return Ok(Manifest::default());
    }
    let existing = read(dir)?;
    if let Some(signer) = signer {
        let own = existing.signature.as_ref().is_some_and(|s| {
            s.signer == signer.public()
                && crate::signing::Trusted::parse(&s.signer, "signer")
                    .is_ok_and(|t| t.verify(&s.signer, &signed_message(&existing), &s.signature))
        });
        let empty = existing.entries.is_empty() && existing.triton_cache.is_empty();
        if !(own || empty) {
            return Err(bad(
                dir,
                format!(
                    "it holds entries this farm's key ({}) did not sign: add to a new \
                     bundle, or sign it first (xpu-zebin bundle sign) if you vouch for it",
                    signer.public()
                ),
            ));
        }
    }
    Ok(existing)
}

/// Write `additions` into the bundle at `dir`, keeping what it already holds for other
/// keys; `header` gives the format fields and the targets. One writer at a time; the
/// manifest is replaced atomically, last.
pub fn write(dir: &Path, header: Manifest, additions: Additions) -> Result<Manifest> {
    let Additions {
        built,
        failures,
        triton,
    } = additions;
    let io = |e: std::io::Error| bad(dir, e);
    std::fs::create_dir_all(dir).map_err(io)?;
    if std::fs::symlink_metadata(dir.join("native")).is_err() {
        std::fs::create_dir(dir.join("native")).map_err(io)?;
    }
    let native = native_dir(dir)?;
    let _lock = lock_for_writing(dir).map_err(io)?;
    let signer = crate::signing::Signer::from_env()?;
    let mut manifest = to_add_to(dir, signer.as_ref())?;
    manifest.format = FORMAT.to_string();
    manifest.package = header.package;
    manifest.triton = header.triton.or(manifest.triton);
    manifest.triton_key = header.triton_key.or(manifest.triton_key);
    manifest.targets.extend(header.targets);
    // What this write replaces is found by key and by slot in one pass over what the
    // bundle holds (a per-entry search would grow with the bundle, quadratically).
    let slot = |k: &str, c: &str, t: &str| (k.to_string(), c.to_string(), t.to_string());
    let built_keys: HashSet<String> = built.iter().map(|(e, _)| e.key.clone()).collect();
    let built_slots: HashSet<_> = built
        .iter()
        .map(|(e, _)| slot(&e.kernel, &e.config, &e.target_id))
        .collect();
    let failed_slots: HashSet<_> = failures
        .iter()
        .map(|f| slot(&f.kernel, &f.config, &f.target_id))
        .collect();
    manifest.entries.retain(|e| !built_keys.contains(&e.key));
    manifest.failures.retain(|f| {
        let s = slot(&f.kernel, &f.config, &f.target_id);
        !built_slots.contains(&s) && !failed_slots.contains(&s)
    });
    for (mut entry, bytes) in last_of_each(built, |(e, _)| e.key.clone()) {
        let (stored, listed) = stored::store(&bytes).map_err(io)?;
        entry.file = format!("native/{}.zebin", entry.key);
        entry.blake3 = blake3::hash(&bytes).to_hex().to_string();
        entry.size = bytes.len() as u64;
        entry.stored = listed;
        persist(&native, &dir.join(&entry.file), &stored).map_err(io)?;
        manifest.entries.push(entry);
    }
    let by_slot = |f: &Unbuilt| slot(&f.kernel, &f.config, &f.target_id);
    manifest.failures.extend(last_of_each(failures, by_slot));
    let written: HashSet<(String, String)> = triton
        .iter()
        .map(|(t, _)| (t.target_id.clone(), t.hash.clone()))
        .collect();
    manifest
        .triton_cache
        .retain(|t| !written.contains(&(t.target_id.clone(), t.hash.clone())));
    let by_hash = |(t, _): &(TritonEntry, NamedFiles)| (t.target_id.clone(), t.hash.clone());
    for (mut entry, files) in last_of_each(triton, by_hash) {
        triton::write_entry(dir, &mut entry, &files)?;
        manifest.triton_cache.push(entry);
    }
    // A farm with a signing key signs what it writes; a change without one drops the old
    // signature (it would no longer match).
    let manifest = signed_by(manifest, signer.as_ref());
    persist_manifest(dir, &manifest).map_err(io)?;
    Ok(manifest)
}

/// `items` less any that a later one of the same `id` replaces, in their order.
fn last_of_each<T, K: std::hash::Hash + Eq>(items: Vec<T>, id: impl Fn(&T) -> K) -> Vec<T> {
    let last: HashMap<K, usize> = items.iter().enumerate().map(|(i, t)| (id(t), i)).collect();
    let keep: HashSet<usize> = last.into_values().collect();
    let kept = items.into_iter().enumerate();
    kept.filter(|(i, _)| keep.contains(i))
        .map(|(_, t)| t)
        .collect()
}

mod archive;
mod checked;
mod lookup;
pub mod search;
mod stored;
mod triton;

pub use checked::{copy_verified, verify, Verified};
pub use stored::Stored;
use stored::{Listed, Member};

pub use archive::{pack, unpack};
pub use lookup::{lookup, native, unusable, Found, Lookup};
pub use triton::{triton_files, Natives, TritonEntry, TritonFile};

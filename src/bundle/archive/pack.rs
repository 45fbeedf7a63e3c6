//! Packing: a bundle directory into one archive file, only the files its manifest lists,
//! each streamed from disk and checked as it goes, into a temporary file renamed into place.

use super::layout::{header, triton_path};
use super::{MAX_MEMBERS, MAX_TOTAL_BYTES};
use crate::bundle::stored::{self, Listed};
use crate::bundle::MAX_ENTRY_BYTES;
use crate::bundle::{
    bad, native_dir, publish, read, triton, Manifest, Natives, TritonEntry, MANIFEST,
};
use crate::error::{BuildError, ErrorKind, Result};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

fn cannot_write(out: &Path, why: impl std::fmt::Display) -> BuildError {
    BuildError::new(
        ErrorKind::InvalidArgument,
        format!("cannot write the archive {}: {why}", out.display()),
    )
}

/// The directory the archive `out` is written in: not inside the bundle `dir`.
fn archive_parent<'a>(dir: &Path, out: &'a Path) -> Result<&'a Path> {
    if !dir.is_dir() {
        return Err(bad(dir, "pack takes a bundle directory"));
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let (Ok(inside), Ok(bundle)) = (parent.canonicalize(), dir.canonicalize()) else {
        let why = format!("{} is not a directory", parent.display());
        return Err(cannot_write(out, why));
    };
    if inside.starts_with(&bundle) {
        return Err(cannot_write(out, "it would be inside the bundle"));
    }
    Ok(parent)
}

/// A file of the bundle to pack, as its manifest says it is.
struct Member<'a> {
    /// Its path in the bundle and in the archive.
    path: String,
    /// Where it is on disk (its directories checked: no link).
    file: PathBuf,
    listed: Listed<'a>,
    check: Check<'a>,
}

/// What a member must be beyond its size and checksum.
enum Check<'a> {
    /// A native entry: a zebin holding this kernel.
    Zebin(&'a str),
    /// A Triton entry's binary (`triton::binary_allowed`).
    TritonBinary(&'a TritonEntry),
    Nothing,
}

/// The files the manifest lists, as members to pack (nothing else of the directory).
fn members<'a>(dir: &Path, manifest: &'a Manifest) -> Result<Vec<Member<'a>>> {
    let mut out = Vec::new();
    if !manifest.entries.is_empty() {
        native_dir(dir)?;
    }
    for e in &manifest.entries {
        out.push(Member {
            path: e.file.clone(),
            file: dir.join(&e.file),
            listed: e.listed(),
            check: Check::Zebin(&e.kernel),
        });
    }
    for t in &manifest.triton_cache {
        let here = triton::entry_dir(dir, t).map_err(|why| bad(dir, why))?;
        for f in &t.files {
            out.push(Member {
                path: triton_path(t, &f.name),
                file: here.join(&f.name),
                listed: f.listed(),
                check: match f.name.ends_with(".spv") {
                    true => Check::TritonBinary(t),
                    false => Check::Nothing,
                },
            });
        }
    }
    Ok(out)
}

/// Write the bundle at `dir` as the archive `out`: only the files its manifest lists, each
/// streamed from disk and checked as it goes (size, checksum, a zebin holding its kernel,
/// a Triton binary as `triton_files` wants it; a compressed file is checked whole first,
/// `check`), into a temporary file beside `out`
/// renamed into place last (a failure leaves `out` as it was). Returns how many files it
/// holds.
pub fn pack(dir: &Path, out: &Path) -> Result<usize> {
    let parent = archive_parent(dir, out)?;
    let manifest = read(dir)?;
    let members = members(dir, &manifest)?;
    // What unpacking would refuse is refused here: a GNU long name is one more header.
    let headers = members
        .iter()
        .fold(1u64, |n, m| n + if m.path.len() >= 100 { 2 } else { 1 });
    let total = (members.iter()).fold(0u64, |t, m| t.saturating_add(m.listed.on_disk().0));
    if headers > MAX_MEMBERS || total > MAX_TOTAL_BYTES {
        return Err(bad(
            dir,
            format!(
                "{headers} archive members of {total} bytes: more than an archive may hold \
             ({MAX_MEMBERS} members, {MAX_TOTAL_BYTES} bytes)"
            ),
        ));
    }
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| bad(dir, e))?;
    let mut tmp = tempfile::NamedTempFile::new_in(parent).map_err(|e| cannot_write(out, e))?;
    let mut tar = tar::Builder::new(BufWriter::new(tmp.as_file_mut()));
    tar.append_data(&mut header(text.len() as u64), MANIFEST, text.as_slice())
        .map_err(|e| cannot_write(out, e))?;
    let natives = Natives::of(&manifest.entries);
    for m in &members {
        append_member(&mut tar, m, &natives, dir, out)?;
    }
    tar.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(|e| cannot_write(out, e))?;
    publish(tmp, out).map_err(|e| cannot_write(out, e))?;
    Ok(members.len() + 1)
}

/// A reader that hashes and counts what passes through it, and keeps its own error (a
/// copy's error could be the writer's).
struct Hashing<R> {
    inner: R,
    hasher: blake3::Hasher,
    count: u64,
    failed: Option<String>,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf).inspect_err(|e| {
            self.failed = Some(e.to_string());
        })?;
        let read = buf.get(..n).unwrap_or_default();
        self.hasher.update(read);
        self.count += n as u64;
        Ok(n)
    }
}

/// Append `m` to `tar`, streamed from its file in bounded pieces: refused unless it is
/// what the manifest says (size and checksum, checked as it is copied).
fn append_member(
    tar: &mut tar::Builder<impl Write>,
    m: &Member,
    natives: &Natives,
    dir: &Path,
    out: &Path,
) -> Result<()> {
    let unreadable =
        |e: &dyn std::fmt::Display| bad(dir, format!("{} cannot be read: {e}", m.path));
    let mut file = crate::private::open_file(&m.file, false, false).map_err(|e| unreadable(&e))?;
    let len = file.metadata().map_err(|e| unreadable(&e))?.len();
    let (size, sum) = m.listed.on_disk();
    if len != size || len > MAX_ENTRY_BYTES {
        let why = format!(
            "{} is {len} bytes, its manifest says {size} (at most {MAX_ENTRY_BYTES})",
            m.path
        );
        return Err(bad(dir, why));
    }
    check(&mut file, m, natives).map_err(|why| bad(dir, why))?;
    file.rewind().map_err(|e| unreadable(&e))?;
    let mut reader = Hashing {
        inner: BufReader::with_capacity(1 << 16, file).take(size),
        hasher: blake3::Hasher::new(),
        count: 0,
        failed: None,
    };
    let copied = tar.append_data(&mut header(size), &m.path, &mut reader);
    if let Some(e) = reader.failed.take() {
        return Err(unreadable(&e));
    }
    copied.map_err(|e| cannot_write(out, e))?;
    // A file that changed since it was opened is caught here (the archive is dropped).
    if reader.count != size || reader.hasher.finalize().to_hex().as_str() != sum {
        return Err(bad(dir, format!("{} does not match its checksum", m.path)));
    }
    Ok(())
}

/// The checks of `m` beyond size and checksum, reading only what they need of `file`; a
/// file stored compressed is read whole (one at a time, within `MAX_ENTRY_BYTES`),
/// inflated and checked as every reader of a bundle checks it, then as a plain one is.
fn check(file: &mut File, m: &Member, natives: &Natives) -> std::result::Result<(), String> {
    match m.listed.stored {
        Some(_) => {
            let member =
                stored::read(&m.file, &m.listed).map_err(|why| format!("{} {why}", m.path))?;
            check_held(&mut std::io::Cursor::new(member.plain()), m, natives)
        }
        None => check_held(file, m, natives),
    }
}

/// `check`'s own checks, of what the file holds (`held`, from its start).
fn check_held(
    held: &mut (impl Read + Seek),
    m: &Member,
    natives: &Natives,
) -> std::result::Result<(), String> {
    fn holds_kernel(
        held: impl Read + Seek,
        kernel: &str,
        path: &str,
    ) -> std::result::Result<(), String> {
        crate::zebin::parse_reader(BufReader::new(held))
            .and_then(|info| info.kernel_spill(kernel))
            .map(|_| ())
            .map_err(|e| format!("{path}: {}", e.message))
    }
    match m.check {
        Check::Zebin(kernel) => holds_kernel(held, kernel, &m.path),
        Check::TritonBinary(entry) => {
            let mut head = Vec::with_capacity(4);
            let read = (&mut *held)
                .take(4)
                .read_to_end(&mut head)
                .and_then(|_| held.rewind());
            read.map_err(|e| format!("{} cannot be read: {e}", m.path))?;
            let zebin = || holds_kernel(held, &entry.kernel, &m.path).is_ok();
            match triton::binary_allowed(natives, entry, &head, m.listed.blake3, zebin) {
                true => Ok(()),
                false => Err(triton::not_allowed(&m.path, entry)),
            }
        }
        Check::Nothing => Ok(()),
    }
}

//! A bundle as one file: a tar archive of its manifest and the files it lists, to ship
//! as an artifact. Packing streams every listed file from disk into a temporary archive
//! (checked as it goes: size, checksum, what it must be), renamed into place at the end,
//! with reproducible headers (no owner, no time); unpacking takes an archive as hostile:
//! only regular files at the paths a bundle has (`manifest.json`, `native/<key>.zebin`,
//! `triton/<hash>/<file>`) that its manifest lists, each bounded, none twice, no link of
//! any kind, streamed into a new directory; members and bytes are bounded in all. Memory
//! stays flat whatever the bundle's size: no file is ever held whole.

use super::{bad, is_key, native_dir, publish, read, triton, Manifest, TritonEntry, MANIFEST};
use super::{MAX_ENTRY_BYTES, MAX_MANIFEST_BYTES};
use crate::error::{BuildError, ErrorKind, Result};
use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The most members (headers of any kind: files, directories, name records) an archive
/// may have: room for tens of thousands of kernels, and a bound on a hostile one's work.
const MAX_MEMBERS: u64 = 1 << 16;

/// The most bytes an archive's files may unpack to, all together (disk, not memory).
const MAX_TOTAL_BYTES: u64 = 16 << 30;

/// Bounds on what an archive may unpack to (tests lower them).
#[derive(Clone, Copy, Debug)]
struct Limits {
    members: u64,
    total_bytes: u64,
    /// One file's bytes (the manifest's own bound is lower).
    entry_bytes: u64,
}

const LIMITS: Limits = Limits {
    members: MAX_MEMBERS,
    total_bytes: MAX_TOTAL_BYTES,
    entry_bytes: MAX_ENTRY_BYTES,
};

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
    size: u64,
    blake3: &'a str,
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
            size: e.size,
            blake3: &e.blake3,
            check: Check::Zebin(&e.kernel),
        });
    }
    for t in &manifest.triton_cache {
        let here = triton::entry_dir(dir, t).map_err(|why| bad(dir, why))?;
        for f in &t.files {
            out.push(Member {
                path: triton_path(t, &f.name),
                file: here.join(&f.name),
                size: f.size,
                blake3: &f.blake3,
                check: match f.name.ends_with(".spv") {
                    true => Check::TritonBinary(t),
                    false => Check::Nothing,
                },
            });
        }
    }
    Ok(out)
}

/// A header with nothing of the machine that wrote it: no owner, no time.
fn header(size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header.set_size(size);
    header
}

/// Write the bundle at `dir` as the archive `out`: only the files its manifest lists, each
/// streamed from disk and checked as it goes (size, checksum, a zebin holding its kernel,
/// a Triton binary as `triton_files` wants it), into a temporary file beside `out`
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
    let total = members.iter().fold(0u64, |t, m| t.saturating_add(m.size));
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
    for m in &members {
        append_member(&mut tar, m, &manifest, dir, out)?;
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
    manifest: &Manifest,
    dir: &Path,
    out: &Path,
) -> Result<()> {
    let unreadable =
        |e: &dyn std::fmt::Display| bad(dir, format!("{} cannot be read: {e}", m.path));
    let mut file = crate::private::open_file(&m.file, false, false).map_err(|e| unreadable(&e))?;
    let len = file.metadata().map_err(|e| unreadable(&e))?.len();
    if len != m.size || len > MAX_ENTRY_BYTES {
        let why = format!(
            "{} is {len} bytes, its manifest says {} (at most {MAX_ENTRY_BYTES})",
            m.path, m.size
        );
        return Err(bad(dir, why));
    }
    check(&mut file, m, manifest).map_err(|why| bad(dir, why))?;
    file.rewind().map_err(|e| unreadable(&e))?;
    let mut reader = Hashing {
        inner: BufReader::with_capacity(1 << 16, file).take(m.size),
        hasher: blake3::Hasher::new(),
        count: 0,
        failed: None,
    };
    let copied = tar.append_data(&mut header(m.size), &m.path, &mut reader);
    if let Some(e) = reader.failed.take() {
        return Err(unreadable(&e));
    }
    copied.map_err(|e| cannot_write(out, e))?;
    // A file that changed since it was opened is caught here (the archive is dropped).
    if reader.count != m.size || reader.hasher.finalize().to_hex().as_str() != m.blake3 {
        return Err(bad(dir, format!("{} does not match its checksum", m.path)));
    }
    Ok(())
}

/// The checks of `m` beyond size and checksum, reading only what they need of `file`.
fn check(file: &mut File, m: &Member, manifest: &Manifest) -> std::result::Result<(), String> {
    let holds_kernel = |file: &mut File, kernel: &str| {
        crate::zebin::parse_reader(BufReader::new(file))
            .and_then(|info| info.kernel_spill(kernel))
            .map(|_| ())
            .map_err(|e| format!("{}: {}", m.path, e.message))
    };
    match m.check {
        Check::Zebin(kernel) => holds_kernel(file, kernel),
        Check::TritonBinary(entry) => {
            let mut head = Vec::with_capacity(4);
            let read = file
                .take(4)
                .read_to_end(&mut head)
                .and_then(|_| file.rewind());
            read.map_err(|e| format!("{} cannot be read: {e}", m.path))?;
            let zebin = || holds_kernel(file, &entry.kernel).is_ok();
            match triton::binary_allowed(&manifest.entries, entry, &head, m.blake3, zebin) {
                true => Ok(()),
                false => Err(triton::not_allowed(&m.path, entry)),
            }
        }
        Check::Nothing => Ok(()),
    }
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

/// Where a Triton entry's file is in a bundle (and in its archive).
fn triton_path(entry: &TritonEntry, name: &str) -> String {
    format!("triton/{}/{}/{name}", entry.target, entry.hash)
}

/// The paths of the files `manifest` lists, itself included: all an archive may hold.
fn listed(manifest: &Manifest) -> HashSet<String> {
    let natives = manifest.entries.iter().map(|e| e.file.clone());
    let triton = (manifest.triton_cache.iter())
        .flat_map(|t| t.files.iter().map(|f| triton_path(t, &f.name)));
    std::iter::once(MANIFEST.to_string())
        .chain(natives)
        .chain(triton)
        .collect()
}

/// The longest GNU long name (or pax global header) read: a bundle's paths are short, and
/// the tar crate would otherwise read such records whole, however large.
const MAX_NAME_RECORD_BYTES: u64 = 4096;

/// Unpack the archive `archive` into `dest` (a new directory) and return its checked
/// manifest; the caller then checks the entries as in any bundle directory. Members are
/// read raw and streamed, each file copied in bounded pieces to a temporary file renamed
/// into place: a GNU long name is read bounded and names the next member, a pax global
/// header (`git archive` writes one) is skipped bounded, per-file pax headers are refused.
/// At most `MAX_MEMBERS` members, `MAX_TOTAL_BYTES` in all, `MAX_ENTRY_BYTES` a file.
/// A file at a bundle's path that the manifest does not list is refused with an error
/// naming it (before any of it is written when the manifest comes first, as `pack` writes
/// it; else once the manifest is read). On any error `dest` is removed: nothing of a
/// refused archive stays.
pub fn unpack(archive: &Path, dest: &Path) -> Result<Manifest> {
    unpack_with_limits(archive, dest, LIMITS)
}

fn unpack_with_limits(archive: &Path, dest: &Path, limits: Limits) -> Result<Manifest> {
    let file = crate::private::open_file(archive, false, false).map_err(|e| bad(archive, e))?;
    std::fs::create_dir(dest).map_err(|e| bad(dest, e))?;
    let mut unpacker = Unpacker {
        archive,
        dest,
        limits,
        members: 0,
        total: 0,
        written: BTreeSet::new(),
        manifest: None,
    };
    let result = unpacker.run(file);
    if result.is_err() {
        // This call's own new directory (`remove_dir_all` follows no link).
        let _ = std::fs::remove_dir_all(dest);
    }
    result
}

/// One unpacking: what it has counted and written.
struct Unpacker<'a> {
    archive: &'a Path,
    dest: &'a Path,
    limits: Limits,
    members: u64,
    /// Bytes of the files so far.
    total: u64,
    /// The files written, by path.
    written: BTreeSet<String>,
    /// The manifest, once read, and the paths it lists.
    manifest: Option<(Manifest, HashSet<String>)>,
}

impl Unpacker<'_> {
    fn run(&mut self, file: File) -> Result<Manifest> {
        let archive = self.archive;
        let not_tar = |e: std::io::Error| bad(archive, format!("not a tar archive: {e}"));
        let mut long_name: Option<String> = None;
        let mut tar = tar::Archive::new(BufReader::new(file));
        for entry in tar.entries().map_err(not_tar)?.raw(true) {
            let mut entry = entry.map_err(not_tar)?;
            self.members += 1;
            if self.members > self.limits.members {
                let why = format!("it has more than {} members", self.limits.members);
                return Err(bad(archive, why));
            }
            let kind = entry.header().entry_type();
            if kind.is_gnu_longname() || kind.is_pax_global_extensions() {
                let record = crate::bounded::read(&mut entry, MAX_NAME_RECORD_BYTES)
                    .map_err(|e| bad(archive, format!("a name record: {e}")))?;
                if long_name.is_some() {
                    return Err(bad(archive, "a long name names no entry"));
                }
                if kind.is_gnu_longname() {
                    let name = String::from_utf8_lossy(&record);
                    long_name = Some(name.trim_end_matches('\0').to_string());
                }
                continue;
            }
            let raw = match long_name.take() {
                Some(name) => name,
                None => String::from_utf8_lossy(&entry.path_bytes()).into_owned(),
            };
            if !kind.is_dir() {
                self.file(&mut entry, kind, &raw)?;
            }
        }
        if long_name.is_some() {
            return Err(bad(archive, "a long name names no entry"));
        }
        let Some((manifest, listed)) = self.manifest.take() else {
            return Err(bad(archive, format!("it holds no {MANIFEST}")));
        };
        // Files before the manifest were written before it could be asked.
        if let Some(stray) = self.written.iter().find(|p| !listed.contains(*p)) {
            return Err(unlisted(archive, stray));
        }
        Ok(manifest)
    }

    /// Stream one file member (`raw`, its name) to where a bundle has it, if it may be.
    fn file(
        &mut self,
        entry: &mut tar::Entry<'_, BufReader<File>>,
        kind: tar::EntryType,
        raw: &str,
    ) -> Result<()> {
        let archive = self.archive;
        let path = raw.trim_start_matches("./").trim_end_matches('/');
        if path.is_empty() || path == "." {
            return Err(bad(archive, format!("an entry has no name ({kind:?})")));
        }
        let place = place(path).filter(|_| kind == tar::EntryType::Regular);
        let Some((parts, limit)) = place else {
            let why = format!("{raw:?} is not a bundle's file ({kind:?})");
            return Err(bad(archive, why));
        };
        if !self.written.insert(path.to_string()) {
            return Err(bad(archive, format!("{path:?} is in it twice")));
        }
        if let Some((_, listed)) = &self.manifest {
            if !listed.contains(path) {
                return Err(unlisted(archive, path));
            }
        }
        let size = (entry.header().size()).map_err(|e| bad(archive, format!("{path:?}: {e}")))?;
        let limit = limit.min(self.limits.entry_bytes);
        if size > limit {
            let why = format!("{path:?} is {size} bytes: larger than {limit} bytes");
            return Err(bad(archive, why));
        }
        self.total = self.total.saturating_add(size);
        if self.total > self.limits.total_bytes {
            let all = self.limits.total_bytes;
            let why = format!("its files are more than {all} bytes in all (at {path:?})");
            return Err(bad(archive, why));
        }
        let mut here = self.dest.to_path_buf();
        for d in parts.iter().take(parts.len().saturating_sub(1)) {
            here.push(d);
            if std::fs::symlink_metadata(&here).is_err() {
                std::fs::create_dir(&here).map_err(|e| bad(self.dest, e))?;
            }
        }
        copy_exact(entry, &here, &self.dest.join(path), size)
            .map_err(|e| bad(archive, format!("{path:?}: {e}")))?;
        if path == MANIFEST {
            let manifest = read(self.dest)?;
            let listed = listed(&manifest);
            self.manifest = Some((manifest, listed));
        }
        Ok(())
    }
}

fn unlisted(archive: &Path, path: &str) -> BuildError {
    bad(
        archive,
        format!("{path:?} is not a file its manifest lists"),
    )
}

/// Copy exactly `size` bytes of `reader` (more or fewer is an error) to `path`, in
/// bounded pieces, through a temporary file in `dir` renamed into place.
fn copy_exact(reader: &mut impl Read, dir: &Path, path: &Path, size: u64) -> std::io::Result<()> {
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    let mut writer = BufWriter::with_capacity(1 << 16, tmp.as_file_mut());
    let copied = std::io::copy(&mut reader.take(size.saturating_add(1)), &mut writer)?;
    writer.flush()?;
    drop(writer);
    if copied != size {
        let why = format!("{copied} bytes where its header says {size}");
        return Err(std::io::Error::other(why));
    }
    publish(tmp, path)
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
            native_key: String::new(),
        };
        let files = vec![
            (format!("{stem}.json"), b"{}".to_vec()),
            (format!("{stem}.spv"), spirv_of(&stem)),
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

    /// A minimal ELF64 zebin holding kernel `k` (as `tests/properties.rs` builds one).
    fn zebin() -> Vec<u8> {
        let ze_info = b"version: '1.20'\nkernels:\n  - name: k\n    execution_env:\n      grf_count: 128\n      simd_size: 32\n";
        let names = b"\0.text.k\0.symtab\0.ze_info\0.shstrtab\0";
        let mut data = vec![0u8; 64 + 16 + 24]; // header, .text.k, one null symbol
        data.extend_from_slice(ze_info);
        data.extend_from_slice(names);
        data.resize(data.len().div_ceil(8) * 8, 0);
        let sh_off = data.len();
        let section = |out: &mut Vec<u8>, name: u32, kind: u32, off: usize, size: usize| {
            for word in [name, kind] {
                out.extend_from_slice(&word.to_le_bytes());
            }
            let entsize = if kind == 2 { 24 } else { 0 };
            for word in [0, 0, off as u64, size as u64] {
                out.extend_from_slice(&word.to_le_bytes());
            }
            out.extend_from_slice(&[0u8; 8]); // link, info
            out.extend_from_slice(&8u64.to_le_bytes());
            out.extend_from_slice(&(entsize as u64).to_le_bytes());
        };
        data.extend_from_slice(&[0u8; 64]); // null section
        section(&mut data, 1, 1, 64, 16);
        section(&mut data, 9, 2, 80, 24);
        section(&mut data, 17, 0xff00_0001, 104, ze_info.len());
        section(&mut data, 26, 3, 104 + ze_info.len(), names.len());
        data[..4].copy_from_slice(b"\x7fELF");
        data[4..7].copy_from_slice(&[2, 1, 1]); // 64-bit, little-endian, version
        data[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
        data[18..20].copy_from_slice(&0xcdu16.to_le_bytes()); // Intel GEN
        data[20..24].copy_from_slice(&1u32.to_le_bytes());
        data[40..48].copy_from_slice(&(sh_off as u64).to_le_bytes());
        for (at, half) in [(52, 64u16), (58, 64), (60, 5), (62, 4)] {
            data[at..at + 2].copy_from_slice(&half.to_le_bytes());
        }
        data
    }

    /// `head` at `path`, the file then `len` bytes long (a sparse tail: no disk, no time);
    /// returns its blake3, read streaming.
    fn sparse_file(path: &Path, head: &[u8], len: u64) -> String {
        std::fs::write(path, head).unwrap();
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len)
            .unwrap();
        let mut hasher = blake3::Hasher::new();
        hasher
            .update_reader(std::fs::File::open(path).unwrap())
            .unwrap();
        hasher.finalize().to_hex().to_string()
    }

    /// A SPIR-V module with one kernel, `name`: what a Triton entry's binary must be.
    fn spirv_of(name: &str) -> Vec<u8> {
        use rspirv::binary::Assemble;
        use rspirv::spirv;
        let mut b = rspirv::dr::Builder::new();
        b.set_version(1, 2);
        b.capability(spirv::Capability::Kernel);
        b.capability(spirv::Capability::Addresses);
        b.memory_model(
            spirv::AddressingModel::Physical64,
            spirv::MemoryModel::OpenCL,
        );
        let void = b.type_void();
        let fn_type = b.type_function(void, vec![]);
        let f = b
            .begin_function(void, None, spirv::FunctionControl::NONE, fn_type)
            .unwrap();
        b.begin_block(None).unwrap();
        b.ret().unwrap();
        b.end_function().unwrap();
        b.entry_point(spirv::ExecutionModel::Kernel, f, name, vec![]);
        b.module()
            .assemble()
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect()
    }

    /// A bundle at `dir` with `natives` native entries for `k` (zebins `native_len` bytes
    /// long) and one Triton entry with a SPIR-V module of `k`, written file by file (no
    /// large file in memory).
    fn bundle_of(dir: &Path, natives: usize, native_len: u64) -> Manifest {
        let (hash, target) = ("b".repeat(64), "c".repeat(64));
        std::fs::create_dir_all(dir.join("native")).unwrap();
        let entries = (0..natives)
            .map(|i| {
                let key = ["a", "5", "6", "7"][i % 4].repeat(64);
                let file = format!("native/{key}.zebin");
                let blake3 = sparse_file(&dir.join(&file), &zebin(), native_len);
                super::super::Entry {
                    key,
                    kernel: "k".to_string(),
                    config: String::new(),
                    target: target.clone(),
                    build_flags: String::new(),
                    spill_bytes: 0,
                    n_spills: 0,
                    compiler: String::new(),
                    file,
                    blake3,
                    size: native_len,
                }
            })
            .collect();
        let here = dir.join("triton").join(&target).join(&hash);
        std::fs::create_dir_all(&here).unwrap();
        let spirv = spirv_of("k");
        let files = [("k.json", &b"{}"[..]), ("k.spv", &spirv[..])].map(|(name, bytes)| {
            super::super::TritonFile {
                name: name.to_string(),
                size: bytes.len() as u64,
                blake3: sparse_file(&here.join(name), bytes, bytes.len() as u64),
            }
        });
        let manifest = Manifest {
            format: super::super::FORMAT.to_string(),
            entries,
            triton_cache: vec![TritonEntry {
                hash,
                kernel: "k".to_string(),
                config: String::new(),
                target,
                native: false,
                files: files.to_vec(),
                native_key: String::new(),
            }],
            ..Default::default()
        };
        let text = serde_json::to_vec_pretty(&manifest).unwrap();
        std::fs::write(dir.join(MANIFEST), text).unwrap();
        manifest
    }

    /// This process's peak resident memory so far, in bytes (`VmHWM`).
    fn peak_rss() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kb << 10
    }

    const MEMORY_CHILD: &str = "XPU_ZEBIN_ARCHIVE_MEMORY_CHILD";

    /// Packing and unpacking a 1 GiB bundle (four 256 MiB files, the most one may be)
    /// costs far less memory than one of its files: every file is streamed. Run in a child
    /// process of its own (this test binary again, filtered), so that its peak is this
    /// work's alone.
    #[test]
    fn a_large_bundle_packs_and_unpacks_in_flat_memory() {
        if std::env::var_os(MEMORY_CHILD).is_none() {
            let module = module_path!().split_once("::").unwrap().1;
            let name = format!("{module}::a_large_bundle_packs_and_unpacks_in_flat_memory");
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
                .env(MEMORY_CHILD, "1")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            println!("{stdout}");
            assert!(out.status.success(), "{stdout}\n{stderr}");
            assert!(
                stdout.contains("peak memory"),
                "the child ran no test: {stdout}"
            );
            return;
        }
        let before = peak_rss();
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("b");
        let big = MAX_ENTRY_BYTES;
        bundle_of(&bundle, 4, big);
        let archive = dir.path().join("b.tar");
        assert_eq!(pack(&bundle, &archive).unwrap(), 7);
        let after_pack = peak_rss();
        let unpacked = dir.path().join("u");
        let manifest = unpack(&archive, &unpacked).unwrap();
        let after = peak_rss();
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        println!(
            "peak memory: {:.1} MiB before, {:.1} MiB after pack, {:.1} MiB after unpack \
             ({:.0} MiB bundle, {:.0} MiB archive)",
            mib(before),
            mib(after_pack),
            mib(after),
            mib(4 * big),
            mib(std::fs::metadata(&archive).unwrap().len()),
        );
        assert!(
            after - before < 64 << 20,
            "peak grew by {:.1} MiB",
            mib(after - before)
        );
        // Whole and as listed (`verify` reads entries whole: after the measure).
        assert_eq!(manifest.entries[0].size, big);
        let report = super::super::verify(&unpacked).unwrap();
        assert!(report.bad.is_empty() && report.ok.len() == 5, "{report:?}");
    }

    /// An archive of `members` (path, bytes), in order, through the tar crate.
    fn archive_of(path: &Path, members: &[(&str, &[u8])]) {
        let mut tar = tar::Builder::new(std::fs::File::create(path).unwrap());
        for (name, bytes) in members {
            tar.append_data(&mut header(bytes.len() as u64), name, *bytes)
                .unwrap();
        }
        tar.finish().unwrap();
    }

    /// A file at a bundle's own path that the manifest does not list is refused, naming it,
    /// whether it comes after the manifest or before, and nothing of the archive stays.
    #[test]
    fn files_the_manifest_does_not_list_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("b");
        bundle_of(&bundle, 1, 4096);
        let manifest = std::fs::read(bundle.join(MANIFEST)).unwrap();
        let stray = format!("native/{}.zebin", "d".repeat(64));
        let listed = format!("native/{}.zebin", "a".repeat(64));
        let native = std::fs::read(bundle.join(&listed)).unwrap();
        // Packing takes only what the manifest lists, whatever else is in the directory.
        std::fs::write(bundle.join(&stray), &native).unwrap();
        let archive = dir.path().join("b.tar");
        assert_eq!(pack(&bundle, &archive).unwrap(), 4);
        unpack(&archive, &dir.path().join("ok")).unwrap();
        assert!(!dir.path().join("ok").join(&stray).exists());

        let after: &[(&str, &[u8])] =
            &[(MANIFEST, &manifest), (&listed, &native), (&stray, &native)];
        let before: &[(&str, &[u8])] = &[(&stray, &native), (MANIFEST, &manifest)];
        for (i, members) in [after, before].into_iter().enumerate() {
            let archive = dir.path().join(format!("{i}.tar"));
            archive_of(&archive, members);
            let dest = dir.path().join(format!("u{i}"));
            let err = unpack(&archive, &dest).unwrap_err();
            assert!(
                err.message
                    .contains(&format!("{stray:?} is not a file its manifest lists")),
                "{}",
                err.message
            );
            assert!(!dest.exists(), "a refused archive left {}", dest.display());
        }
    }

    /// More members than the bound (directories count too), more bytes in all than the
    /// bound, a file larger than the bound: each a clear error, nothing left.
    #[test]
    fn members_and_bytes_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = format!(
            r#"{{"format": "{}", "package": "0"}}"#,
            super::super::FORMAT
        );
        let mut bytes = tar_with(MANIFEST, manifest.as_bytes());
        bytes.truncate(bytes.len() - 1024);
        let mut dir_header = tar::Header::new_gnu();
        dir_header.set_entry_type(tar::EntryType::Directory);
        dir_header.set_path("native/").unwrap();
        dir_header.set_size(0);
        dir_header.set_mode(0o755);
        dir_header.set_cksum();
        for _ in 0..MAX_MEMBERS {
            bytes.extend_from_slice(dir_header.as_bytes());
        }
        bytes.resize(bytes.len() + 1024, 0);
        let flood = dir.path().join("flood.tar");
        std::fs::write(&flood, &bytes).unwrap();
        let err = unpack(&flood, &dir.path().join("f")).unwrap_err();
        assert!(
            err.message.contains("more than 65536 members"),
            "{}",
            err.message
        );
        assert!(!dir.path().join("f").exists());

        let bundle = dir.path().join("b");
        bundle_of(&bundle, 1, 4096);
        let archive = dir.path().join("b.tar");
        pack(&bundle, &archive).unwrap();
        let size = |p: &Path| std::fs::metadata(p).unwrap().len();
        let total = size(&bundle.join(MANIFEST)) + 4096 + 2 + spirv_of("k").len() as u64;
        // The manifest, the native entry, two Triton files each with its GNU long name.
        let tight = Limits {
            members: 6,
            total_bytes: total,
            entry_bytes: 4096,
        };
        unpack_with_limits(&archive, &dir.path().join("ok"), tight).unwrap();
        // A member cut short (the archive ends inside it) is no file of the bundle.
        let bytes = std::fs::read(&archive).unwrap();
        let cut = dir.path().join("cut.tar");
        std::fs::write(&cut, &bytes[..size(&bundle.join(MANIFEST)) as usize + 2048]).unwrap();
        let err = unpack(&cut, &dir.path().join("c")).unwrap_err();
        assert!(
            err.message.contains("where its header says 4096"),
            "{}",
            err.message
        );
        assert!(!dir.path().join("c").exists());
        let fewer = |members, total_bytes, entry_bytes| Limits {
            members,
            total_bytes,
            entry_bytes,
        };
        for (limits, why) in [
            (fewer(5, total, 4096), "more than 5 members".to_string()),
            (
                fewer(6, total - 1, 4096),
                format!("more than {} bytes in all", total - 1),
            ),
            (
                fewer(6, total, 4095),
                "4096 bytes: larger than 4095 bytes".to_string(),
            ),
        ] {
            let dest = dir.path().join("u");
            let err = unpack_with_limits(&archive, &dest, limits).unwrap_err();
            assert!(err.message.contains(&why), "{why}: {}", err.message);
            assert!(!dest.exists());
        }
    }

    /// A pack that fails (a file no longer what the manifest says) leaves the archive it
    /// would have replaced as it was, and no temporary file beside it.
    #[test]
    fn a_failed_pack_leaves_the_old_archive() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("b");
        let manifest = bundle_of(&bundle, 1, 4096);
        let out_dir = dir.path().join("out");
        std::fs::create_dir(&out_dir).unwrap();
        let archive = out_dir.join("b.tar");
        std::fs::write(&archive, b"old").unwrap();
        let spv = bundle.join(triton_path(&manifest.triton_cache[0], "k.spv"));
        let mut changed = std::fs::read(&spv).unwrap();
        changed[40] ^= 1;
        std::fs::write(&spv, changed).unwrap();
        let err = pack(&bundle, &archive).unwrap_err();
        assert!(
            err.message.contains("does not match its checksum"),
            "{}",
            err.message
        );
        assert_eq!(std::fs::read(&archive).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 1);
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

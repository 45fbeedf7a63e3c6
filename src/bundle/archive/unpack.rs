//! Unpacking: an archive, taken as hostile, into a new bundle directory: members read raw
//! and bounded, only a bundle's own paths that its manifest lists, each streamed to a
//! temporary file renamed into place; nothing of a refused archive stays.

use super::layout::{listed, place};
use super::{Limits, LIMITS};
use crate::bundle::{bad, publish, read, Manifest, MANIFEST};
use crate::error::{BuildError, Result};
use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

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

pub(super) fn unpack_with_limits(archive: &Path, dest: &Path, limits: Limits) -> Result<Manifest> {
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

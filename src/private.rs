//! Directories and files only this user may touch, made and checked so that another local
//! user cannot plant them first: core slots, the record of native binaries that loaded
//! safely, the simulated device's capture files, the cache when there is no home.
//!
//! A directory is created 0700, then checked without following links: it must be a real
//! directory, owned by this user, that nobody else may write into. One that fails (a
//! neighbour made it first, or a link) is refused: the caller goes on without what it was
//! for, and says so once. Files in it are opened without following links and without
//! blocking (a FIFO planted there must not hang an open), and must be regular files.

use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// This process's user.
pub fn uid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory.
    unsafe { libc::getuid() }
}

/// The package's private directory on this host: `$TMPDIR/xpu-zebin-<uid>`.
pub fn base() -> PathBuf {
    std::env::temp_dir().join(format!("xpu-zebin-{}", uid()))
}

/// Create `dir` (0700, parents as needed) if missing, and check only this user may write
/// into it (one named by the user, read-only for others, is fine).
pub fn ensure_dir(dir: &Path) -> Result<(), String> {
    let _ = DirBuilder::new().recursive(true).mode(0o700).create(dir);
    check_dir(dir, 0o022)
}

/// `dir` is a directory (not a link to one) owned by this user, with none of the `loose`
/// permission bits set.
pub fn check_dir(dir: &Path, loose: u32) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("{} cannot be used: {e}", dir.display()))?;
    if !meta.file_type().is_dir() {
        return Err(format!(
            "{} is not a directory (a link or a file put there by someone)",
            dir.display()
        ));
    }
    if meta.uid() != uid() {
        return Err(format!(
            "{} belongs to user {}, not to this user ({}): another local user may have made \
             it; remove it or point the package elsewhere",
            dir.display(),
            meta.uid(),
            uid()
        ));
    }
    if meta.mode() & loose != 0 {
        return Err(format!(
            "{} has mode {:o}: others may write there (expected no {:o} bits)",
            dir.display(),
            meta.mode() & 0o7777,
            loose
        ));
    }
    Ok(())
}

/// A subdirectory of [`base`], made and checked (the base too).
pub fn subdir(name: &str) -> Result<PathBuf, String> {
    let base = base();
    ensure_dir(&base)?;
    let dir = base.join(name);
    ensure_dir(&dir)?;
    Ok(dir)
}

/// Open (creating if `create`) a regular file, never following a link and never blocking
/// on a FIFO or device someone put in its place.
pub fn open_file(path: &Path, write: bool, create: bool) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn loose_linked_and_fifo_paths_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let ok = root.path().join("ok");
        ensure_dir(&ok).unwrap();
        assert_eq!(std::fs::metadata(&ok).unwrap().mode() & 0o777, 0o700);

        let loose = root.path().join("loose");
        std::fs::create_dir(&loose).unwrap();
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(ensure_dir(&loose).unwrap_err().contains("mode"));

        let link = root.path().join("link");
        std::os::unix::fs::symlink(&ok, &link).unwrap();
        assert!(ensure_dir(&link).unwrap_err().contains("not a directory"));

        let fifo = ok.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string for the duration of the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        assert!(
            open_file(&fifo, true, true).is_err(),
            "a FIFO must not open"
        );
        let target = ok.join("target");
        std::fs::write(&target, b"x").unwrap();
        let file_link = ok.join("file-link");
        std::os::unix::fs::symlink(&target, &file_link).unwrap();
        assert!(open_file(&file_link, true, true).is_err());
        assert!(open_file(&target, true, false).is_ok());
    }
}

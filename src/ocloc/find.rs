//! Finding the compiler and telling what it is: discovery (an explicit path,
//! `$XPU_ZEBIN_OCLOC`, PATH), its identity (part of every cache key), and the libocloc a
//! persistent worker for it loads (its worker kind, or why it has none).

use super::missing;
use super::process::{spawn_in_own_group, wait_for, MAX_LOG_BYTES};
use crate::classify::{classify_failure, Exit};
use crate::error::Result;
use crate::pool;
use crate::sync::Renewable;
use serde::Deserialize;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Environment variable naming the ocloc to use when no explicit path is given.
pub const OCLOC_ENV: &str = "XPU_ZEBIN_OCLOC";

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn search_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

/// Resolve a user-given ocloc (a path, or a bare command name looked up on PATH).
fn resolve(given: &Path, origin: &str) -> Result<PathBuf> {
    let found = if given.components().count() == 1 && !given.is_absolute() {
        search_path(&given.to_string_lossy())
    } else {
        Some(given.to_path_buf()).filter(|p| is_executable(p))
    };
    found.ok_or_else(|| {
        missing(format!(
            "ocloc from {origin} ('{}') does not exist or is not executable",
            given.display()
        ))
    })
}

/// Find ocloc: an explicit argument, then `$XPU_ZEBIN_OCLOC`, then `ocloc` on PATH.
pub fn discover(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(given) = explicit {
        return resolve(given, "the explicit argument");
    }
    if let Some(env) =
        std::env::var_os(OCLOC_ENV).filter(|v| !v.to_string_lossy().trim().is_empty())
    {
        return resolve(Path::new(&env), &format!("${OCLOC_ENV}"));
    }
    search_path("ocloc").ok_or_else(|| {
        missing(format!(
            "no ocloc found: pass one explicitly (ocloc=... / --ocloc), set ${OCLOC_ENV}, or put `ocloc` on PATH \
             (Debian: apt-get install intel-opencl-icd)"
        ))
    })
}

/// (path, size, mtime) of an ocloc -> its identity string, so `query` runs once per compiler.
type IdentityCache = Mutex<HashMap<(PathBuf, u64, i64), String>>;
pub(crate) static IDENTITIES: Renewable<IdentityCache> =
    Renewable::new(|| Mutex::new(HashMap::new()), forget_after_fork);

/// Each ocloc's worker kind, or why it has none.
type WorkerSpecs = Mutex<HashMap<PathBuf, std::result::Result<pool::WorkerSpec, String>>>;
pub(crate) static SPECS: Renewable<WorkerSpecs> =
    Renewable::new(|| Mutex::new(HashMap::new()), forget_after_fork);

/// In a forked child: its locks start afresh (`sync::Renewable`).
pub(crate) fn forget_after_fork() {
    IDENTITIES.renew();
    SPECS.renew();
}

/// A string that changes whenever the compiler does: its path, size, mtime and the driver
/// version it reports (`ocloc query OCL_DRIVER_VERSION`). Part of every cache key.
pub fn identity(ocloc: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(ocloc)
        .map_err(|e| missing(format!("cannot stat ocloc '{}': {e}", ocloc.display())))?;
    let key = (ocloc.to_path_buf(), meta.len(), meta.mtime());
    if let Some(found) = crate::sync::lock(IDENTITIES.get()).get(&key) {
        return Ok(found.clone());
    }
    let dir = tempfile::Builder::new()
        .prefix("xpu-zebin-query-")
        .tempdir()
        .map_err(|e| missing(format!("cannot create a temp dir: {e}")))?;
    let log_path = dir.path().join("query.log");
    let log = File::create(&log_path).map_err(|e| missing(format!("cannot create a log: {e}")))?;
    let mut command = Command::new(ocloc);
    command
        .args(["query", "OCL_DRIVER_VERSION"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(
            log.try_clone()
                .map_err(|e| missing(format!("cannot share a log: {e}")))?,
        )
        .stderr(log);
    let child = spawn_in_own_group(&mut command)
        .map_err(|e| missing(format!("cannot run ocloc '{}': {e}", ocloc.display())))?;
    let exit = wait_for(child, Instant::now(), Some(QUERY_TIMEOUT), &[])
        .map_err(|e| missing(format!("cannot wait for ocloc query: {e}")))?;
    let said = crate::bounded::tail(&log_path, MAX_LOG_BYTES);
    let version = std::fs::read(dir.path().join("OCL_DRIVER_VERSION"))
        .map(|v| String::from_utf8_lossy(&v[..v.len().min(4096)]).into_owned())
        .unwrap_or_else(|_| said.clone());
    // ocloc writes the version C-string with its terminating NUL.
    let version = version.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    if exit != Exit::Code(0) || version.is_empty() {
        return Err(classify_failure(exit, &said));
    }
    let id = format!(
        "{}|{}|{}|{}",
        ocloc.display(),
        meta.len(),
        meta.mtime(),
        version
    );
    crate::sync::lock(IDENTITIES.get()).insert(key, id.clone());
    Ok(id)
}

/// How long `ocloc query` may take (it loads the compiler's libraries, ~0.2 s here).
const QUERY_TIMEOUT: Duration = Duration::from_secs(60);

/// `<ocloc>.toolchain`: how to load a compiler that needs its own glibc.
#[derive(Debug, Clone, Deserialize)]
struct Descriptor {
    libocloc: PathBuf,
    #[serde(default)]
    loader: Option<PathBuf>,
    #[serde(default)]
    library_path: Option<String>,
}

/// Find libocloc for an ocloc: a descriptor beside it, else the usual library dirs.
fn descriptor(ocloc: &Path) -> std::result::Result<Descriptor, String> {
    let mut beside = ocloc.as_os_str().to_owned();
    beside.push(".toolchain");
    if let Ok(text) = std::fs::read_to_string(&beside) {
        let d: Descriptor = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} is not a valid descriptor: {e}",
                beside.to_string_lossy()
            )
        })?;
        // Relative paths are the descriptor's own (workers run in another directory).
        let here = Path::new(&beside).parent().unwrap_or(Path::new("/"));
        return Ok(Descriptor {
            libocloc: here.join(d.libocloc),
            loader: d.loader.map(|l| here.join(l)),
            library_path: d.library_path.map(|lp| {
                std::env::split_paths(&lp)
                    .map(|p| here.join(p).display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            }),
        });
    }
    let real = std::fs::canonicalize(ocloc).map_err(|e| e.to_string())?;
    let prefix = real
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/"));
    ["lib/x86_64-linux-gnu", "lib64", "lib"]
        .iter()
        .map(|d| prefix.join(d).join("libocloc.so"))
        .find(|p| p.is_file())
        .map(|libocloc| Descriptor {
            libocloc,
            loader: None,
            library_path: None,
        })
        .ok_or_else(|| {
            format!(
                "no libocloc.so beside {} (looked in {}/lib*) and no {} descriptor",
                real.display(),
                prefix.display(),
                beside.to_string_lossy()
            )
        })
}

/// The persistent worker kind for one ocloc, or why it has none.
pub(super) fn worker_spec(ocloc: &Path) -> std::result::Result<pool::WorkerSpec, String> {
    let mut specs = crate::sync::lock(SPECS.get());
    specs
        .entry(ocloc.to_path_buf())
        .or_insert_with(|| {
            let d = descriptor(ocloc)?;
            Ok(pool::WorkerSpec {
                key: format!("ocloc:{}", ocloc.display()),
                args: vec!["ocloc".into(), d.libocloc.into_os_string()],
                loader: d.loader.map(|l| (l, d.library_path)),
                // Old IGC writes a legacy patch-token binary for pvc unless asked for zebin.
                env: vec![("IGC_EnableZEBinary".into(), "1".into())],
            })
        })
        .clone()
}

/// The libocloc a persistent worker for this ocloc loads, or why there is none.
pub fn worker_library(ocloc: &Path) -> std::result::Result<PathBuf, String> {
    descriptor(ocloc).map(|d| d.libocloc)
}

/// Why an ocloc has no persistent worker (it then runs one process per compile), if so.
pub fn worker_unavailable(ocloc: &Path) -> Option<String> {
    match worker_spec(ocloc) {
        Err(why) => Some(why),
        Ok(spec) => pool::unavailable(&spec.key),
    }
}

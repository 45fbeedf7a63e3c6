//! The simulated device: `XPU_ZEBIN_SIMULATED_DEVICE=pvc` puts the Intel driver's debug
//! keys in the environment before the loader is opened, so the real driver and IGC run
//! without a GPU (AUB capture mode, docs/design.md §4). Owns the capture files' private
//! directory (removed at exit, or by the next process when this one was killed) and the
//! environment this process's Level Zero workers get to share it.

use super::no_device;
use crate::error::{BuildError, Result};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// Environment switch for the simulated device (a product name such as `pvc`).
pub const SIMULATED_DEVICE_ENV: &str = "XPU_ZEBIN_SIMULATED_DEVICE";
static SIMULATION_DIR: Mutex<Option<tempfile::TempDir>> = Mutex::new(None);

extern "C" fn remove_simulation_dir() {
    if let Ok(mut dir) = SIMULATION_DIR.lock() {
        dir.take();
    }
}

/// Set by a caller for its Level Zero workers: the simulated device's capture files go into
/// the caller's temp dir, removed when the caller exits, even if a worker is killed.
const WORKER_AUB_DIR_ENV: &str = "XPU_ZEBIN_WORKER_AUB_DIR";

/// The simulated product (`XPU_ZEBIN_SIMULATED_DEVICE`) this process set up, once.
static SIMULATION: OnceLock<std::result::Result<Option<String>, BuildError>> = OnceLock::new();

/// Set up the simulated device if `XPU_ZEBIN_SIMULATED_DEVICE` asks for one: the driver
/// reads its debug keys from the environment in `zeInit`, so they are put there once:
/// when the package is imported if the variable is set by then (the bindings call this
/// with the GIL held, before any build thread of ours exists), else before the driver is
/// first opened. Never while builds run.
pub fn prepare_simulation() -> std::result::Result<Option<String>, BuildError> {
    SIMULATION
        .get_or_init(|| {
            let product = std::env::var(SIMULATED_DEVICE_ENV)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty());
            if let Some(product) = &product {
                enable_simulation(product)?;
            }
            Ok(product)
        })
        .clone()
}

/// Held (locked) for as long as this process lives: its capture dir is in use.
static CAPTURE_ALIVE: Mutex<Option<std::fs::File>> = Mutex::new(None);
const ALIVE: &str = ".alive";

/// A private directory for this process's capture files: `aub/<pid>-*` in the package's
/// private directory, where those of processes that died (SIGKILL skips `atexit`) are
/// removed by the next one, so they do not pile up. A directory is in use while its
/// `.alive` file is locked (the kernel drops the lock when its process dies, in whatever
/// PID namespace it ran).
fn capture_dir() -> Result<tempfile::TempDir> {
    let made = match crate::private::subdir("aub") {
        Ok(aub) => {
            sweep_dead_captures(&aub);
            tempfile::Builder::new()
                .prefix(&format!("{}-", std::process::id()))
                .tempdir_in(aub)
                .inspect(|dir| {
                    let alive = crate::private::open_file(&dir.path().join(ALIVE), true, true);
                    if let Ok(file) =
                        alive.and_then(|f| f.try_lock().map(|()| f).map_err(std::io::Error::other))
                    {
                        *crate::sync::lock(&CAPTURE_ALIVE) = Some(file);
                    }
                })
        }
        Err(why) => {
            crate::diag::warn_once("aub", format!("simulated-device captures: {why}"));
            tempfile::Builder::new().prefix("xpu-zebin-aub-").tempdir()
        }
    };
    made.map_err(|e| {
        no_device(format!(
            "cannot create the simulated device's temp dir: {e}"
        ))
    })
}

fn sweep_dead_captures(aub: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(aub) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        // Its owner is gone when its `.alive` lock can be taken (a directory without one
        // is half-made: left alone).
        let alive = crate::private::open_file(&entry.path().join(ALIVE), true, false);
        if alive.is_ok_and(|f| f.try_lock().is_ok()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Put the driver's debug keys for a simulated device into the environment, once, before
/// the loader is opened. The AUB capture file lives in a private dir removed at exit.
fn enable_simulation(product: &str) -> Result<()> {
    let capture = match std::env::var_os(WORKER_AUB_DIR_ENV) {
        Some(dir) => PathBuf::from(dir).join(format!("worker-{}.aub", std::process::id())),
        None => {
            let dir = capture_dir()?;
            let capture = dir.path().join("capture.aub");
            *crate::sync::lock(&SIMULATION_DIR) = Some(dir);
            // SAFETY: registers a plain extern "C" function with no captured state.
            unsafe { libc::atexit(remove_simulation_dir) };
            capture
        }
    };
    // These variables are read by the driver in zeInit; set once, before any thread of ours
    // uses Level Zero (see `prepare_simulation`).
    for (key, value) in [
        ("NEOReadDebugKeys", "1"),
        ("SetCommandStreamReceiver", "1"),
        ("ProductFamilyOverride", product),
        ("HardwareInfoOverride", "1x4x8"),
        ("AUBDumpCaptureFileName", &capture.to_string_lossy()),
    ] {
        std::env::set_var(key, value);
    }
    // This (old) driver's IGC writes a legacy patch-token binary for pvc unless asked for
    // zebin; a modern driver writes zebin anyway. Respect a user's own setting.
    if std::env::var_os("IGC_EnableZEBinary").is_none() {
        std::env::set_var("IGC_EnableZEBinary", "1");
    }
    Ok(())
}

/// Environment for this process's Level Zero workers: they open the same driver with the
/// same settings (inherited), and keep simulated-device captures in this process's dir.
pub fn worker_env() -> Vec<(OsString, OsString)> {
    match crate::sync::lock(&SIMULATION_DIR).as_ref() {
        Some(dir) => vec![(WORKER_AUB_DIR_ENV.into(), dir.path().as_os_str().to_owned())],
        None => Vec::new(),
    }
}

//! The worker pool's bindings: how workers start, their main loop, and diagnostics.

use pyo3::prelude::*;
use std::path::PathBuf;

/// Let the engine start persistent compiler workers with this interpreter and path; at
/// import, with the GIL held: a simulated device's driver keys go into the environment
/// now, never while builds run.
#[pyfunction]
pub fn configure_workers(executable: PathBuf, pythonpath: String) {
    crate::pool::configure(crate::pool::PythonRuntime {
        executable,
        pythonpath,
    });
    // Its error (no temp dir) is the Level Zero runtime's error at first use.
    if std::env::var_os(crate::ze::SIMULATED_DEVICE_ENV).is_some() {
        let _ = crate::ze::prepare_simulation();
    }
}

/// A boolean `XPU_ZEBIN_*` knob, parsed as the engine parses every knob: `default` when
/// unset, `InvalidArgumentError` naming the variable when it holds something else.
#[pyfunction]
pub fn bool_knob(py: Python<'_>, name: &str, default: bool) -> PyResult<bool> {
    crate::knobs::bool_knob(name, default).map_err(|e| super::to_pyerr(py, e.into()))
}

/// A worker process's main loop: `python -m xpu_zebin._worker ocloc LIBOCLOC` or
/// `python -m xpu_zebin._worker ze`.
#[pyfunction]
#[pyo3(signature = (kind, libocloc=None))]
pub fn serve_worker(py: Python<'_>, kind: String, libocloc: Option<PathBuf>) -> PyResult<()> {
    let served = py.detach(|| match (kind.as_str(), libocloc) {
        ("ocloc", Some(lib)) => crate::libocloc::serve(&lib),
        ("ze", None) => crate::ze::build::serve(),
        _ => Err(std::io::Error::other(format!(
            "unknown worker kind '{kind}': use `ocloc LIBOCLOC` or `ze`"
        ))),
    });
    served.map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))
}

/// Stop idle persistent workers; they restart on demand.
#[pyfunction]
pub fn shutdown_workers() {
    crate::pool::shutdown();
}

/// This process runs tasks of a batch spread over several processes (Dask workers, a
/// process pool): its speculative builds let the other processes' tasks take cores first.
#[pyfunction]
pub fn join_multiprocess_batch() {
    crate::pool::join_multiprocess_batch();
}

/// Worker kinds that could not start, and why (`ocloc:<path>`, `ze`).
#[pyfunction]
pub fn broken_workers() -> Vec<(String, String)> {
    crate::pool::broken()
}

/// Why this ocloc has no persistent worker (one process per compile then), if so.
#[pyfunction]
pub fn ocloc_worker_unavailable(ocloc: PathBuf) -> Option<String> {
    crate::ocloc::worker_unavailable(&ocloc)
}

/// What the engine would use here: ocloc, libocloc, worker mode, Level Zero, the cache.
#[pyfunction]
#[pyo3(signature = (ocloc=None))]
pub fn doctor<'py>(py: Python<'py>, ocloc: Option<PathBuf>) -> PyResult<Bound<'py, PyAny>> {
    let report = py.detach(|| crate::doctor::report(ocloc.as_deref()));
    Ok(pythonize::pythonize(py, &report)?)
}

/// What the cache in `cache_dir` (default: the user's) holds and what every process that
/// used it counted; `zero`: the counters are set back to zero after they are read;
/// `recount`: every shard is counted again first.
#[pyfunction]
#[pyo3(signature = (cache_dir=None, zero=false, recount=false))]
pub fn cache_stats<'py>(
    py: Python<'py>,
    cache_dir: Option<PathBuf>,
    zero: bool,
    recount: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let stats = py.detach(|| {
        let cache = crate::cache::Cache::open(cache_dir.as_deref());
        crate::cache::stats::stats(&cache, zero, recount)
    });
    super::emit_warnings(py);
    Ok(pythonize::pythonize(py, &stats)?)
}

/// Count one of Triton's own cache entries (a kernel's group) taken from the fleet's
/// store (`FleetCacheManager`), in the ledger of the cache in `cache_dir` (default: the
/// user's). Never fails: a directory that cannot be used counts nothing.
#[pyfunction]
#[pyo3(signature = (cache_dir=None))]
pub fn count_triton_cache_hit(py: Python<'_>, cache_dir: Option<PathBuf>) {
    // Off the GIL: a first use of the directory may move a slice of the last layouts in.
    py.detach(|| {
        if let Some(l) = crate::cache::Cache::open(cache_dir.as_deref()).ledger() {
            l.count(crate::cache::Counter::TritonHits, 1);
        }
    });
    super::emit_warnings(py);
}

/// Has this host's driver (its version) refused native code of this compiler (an `ocloc`
/// identity) before? (`trusted.rs`)
#[pyfunction]
pub fn compiler_refused(compiler: &str, driver: &str) -> bool {
    crate::trusted::compiler_refused(compiler, driver)
}

/// Remember, on this host, that the driver refuses native code of this compiler, and why.
/// Only a build this process's compiler has just made may say so, never bytes read from a
/// cache, a bundle or anything another user can write.
#[pyfunction]
#[pyo3(signature = (compiler, driver, why = ""))]
pub fn remember_compiler_refused(compiler: &str, driver: &str, why: &str) {
    crate::trusted::remember_compiler_refused(compiler, driver, why)
}

/// Every (compiler, driver) refusal remembered on this host: compiler, driver, when, why.
#[pyfunction]
pub fn compiler_refusals(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    Ok(pythonize::pythonize(py, &crate::trusted::refusals())?)
}

/// Forget every remembered refusal on this host; returns how many there were.
#[pyfunction]
pub fn forget_compiler_refusals() -> usize {
    crate::trusted::forget_refusals()
}

/// Every environment variable the package reads (`knobs/table.rs`): name, kind, who reads
/// it, default, meaning, and what an unusable value gets; the documentation is made of it.
#[pyfunction]
pub fn knobs(py: Python<'_>) -> PyResult<Vec<Bound<'_, pyo3::types::PyDict>>> {
    use crate::knobs::{Reader, KNOBS};
    KNOBS
        .iter()
        .map(|k| {
            let d = pyo3::types::PyDict::new(py);
            d.set_item("name", k.name)?;
            d.set_item("kind", k.kind.name())?;
            let reader = match k.reader {
                Reader::Engine => "engine",
                Reader::Python => "python",
                Reader::Triton => "triton",
                Reader::Internal => "internal",
                Reader::System => "system",
            };
            d.set_item("reader", reader)?;
            d.set_item("default", k.default)?;
            d.set_item("meaning", k.meaning)?;
            d.set_item("unusable", k.unusable)?;
            Ok(d)
        })
        .collect()
}

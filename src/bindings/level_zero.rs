//! Level Zero bindings: `compile_and_load`, `compile_and_load_many`, `LoadedKernel`, devices.

use super::{
    attempts, emit_warnings, field, interruptible, run_batch, timeout_of, to_pyerr, Attempt,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::path::PathBuf;

/// A kernel loaded through Level Zero. Owns its module and kernel handles and releases
/// them exactly once: on `close()`, on leaving a `with` block, or when collected.
#[pyclass(frozen, module = "xpu_zebin._core")]
pub struct LoadedKernel {
    loaded: std::sync::Mutex<Option<crate::ze::load::Loaded>>,
    #[pyo3(get)]
    kernel_name: String,
    #[pyo3(get)]
    build_flags: String,
    #[pyo3(get)]
    n_regs: u32,
    #[pyo3(get)]
    n_spills: u64,
    #[pyo3(get)]
    n_max_threads: u32,
    #[pyo3(get)]
    private_mem_size: u32,
    #[pyo3(get)]
    simd_size: u32,
    #[pyo3(get)]
    build_log: String,
    #[pyo3(get)]
    attempts: Vec<Attempt>,
    #[pyo3(get)]
    recovered: bool,
    #[pyo3(get)]
    cached: bool,
    #[pyo3(get)]
    native_binary: Py<PyBytes>,
    #[pyo3(get)]
    notes: Vec<String>,
}

#[pymethods]
impl LoadedKernel {
    /// `ze_module_handle_t` as an integer (0 once closed).
    #[getter]
    fn module_handle(&self) -> usize {
        crate::sync::lock(&self.loaded)
            .as_ref()
            .map_or(0, |l| l.module.handle as usize)
    }

    /// `ze_kernel_handle_t` as an integer (0 once closed).
    #[getter]
    fn kernel_handle(&self) -> usize {
        crate::sync::lock(&self.loaded)
            .as_ref()
            .map_or(0, |l| l.kernel.handle as usize)
    }

    #[getter]
    fn closed(&self) -> bool {
        crate::sync::lock(&self.loaded).is_none()
    }

    /// Destroy the kernel and module now; later calls do nothing.
    fn close(&self, py: Python<'_>) {
        let taken = crate::sync::lock(&self.loaded).take();
        py.detach(|| drop(taken));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) {
        self.close(py);
    }

    fn __repr__(&self) -> String {
        format!(
            "LoadedKernel(kernel_name={:?}, build_flags={:?}, n_regs={}, n_spills={}, n_max_threads={}, recovered={}, cached={}, closed={})",
            self.kernel_name, self.build_flags, self.n_regs, self.n_spills,
            self.n_max_threads, self.recovered, self.cached, self.closed()
        )
    }
}

fn loaded_kernel(py: Python<'_>, mut loaded: crate::ze::load::Loaded) -> LoadedKernel {
    let native = std::mem::take(&mut loaded.native_binary);
    LoadedKernel {
        kernel_name: loaded.kernel_name.clone(),
        build_flags: loaded.build_flags.clone(),
        n_regs: loaded.n_regs,
        n_spills: loaded.n_spills,
        n_max_threads: loaded.n_max_threads,
        private_mem_size: loaded.private_mem_size,
        simd_size: loaded.simd_size,
        build_log: std::mem::take(&mut loaded.build_log),
        attempts: attempts(&loaded.attempts),
        recovered: loaded.recovered,
        cached: loaded.cached,
        native_binary: PyBytes::new(py, &native).unbind(),
        notes: std::mem::take(&mut loaded.notes),
        loaded: std::sync::Mutex::new(Some(loaded)),
    }
}

#[allow(clippy::too_many_arguments)]
fn load_request(
    py: Python<'_>,
    binary: Vec<u8>,
    kernel_name: String,
    build_flags: String,
    is_spv: bool,
    device: usize,
    device_arch: Option<String>,
    cache: bool,
    cache_dir: Option<PathBuf>,
    spill_threshold: u64,
    isolated: bool,
    timeout: Option<f64>,
    speculative: Option<bool>,
) -> PyResult<crate::ze::load::LoadRequest> {
    Ok(crate::ze::load::LoadRequest {
        binary,
        kernel_name,
        build_flags,
        is_spv,
        device,
        device_arch,
        cache,
        cache_dir,
        spill_threshold,
        isolated,
        timeout: timeout_of(py, timeout)?,
        speculative,
    })
}

/// Build a module through Level Zero and load one kernel, retrying SPIR-V without an
/// explicit GRF flag in large GRF mode on failure or spills (upstream `load_binary`).
/// SPIR-V is built, and a handed native binary first loaded, in a worker process unless
/// `isolated` is false.
#[pyfunction]
#[pyo3(signature = (binary, kernel_name, *, build_flags=String::new(), is_spv=true,
    device=0, device_arch=None, cache=true, cache_dir=None, spill_threshold=0,
    isolated=true, timeout=None, speculative=None))]
#[allow(clippy::too_many_arguments)]
pub fn compile_and_load(
    py: Python<'_>,
    binary: Vec<u8>,
    kernel_name: String,
    build_flags: String,
    is_spv: bool,
    device: usize,
    device_arch: Option<String>,
    cache: bool,
    cache_dir: Option<PathBuf>,
    spill_threshold: u64,
    isolated: bool,
    timeout: Option<f64>,
    speculative: Option<bool>,
) -> PyResult<LoadedKernel> {
    let req = load_request(
        py,
        binary,
        kernel_name,
        build_flags,
        is_spv,
        device,
        device_arch,
        cache,
        cache_dir,
        spill_threshold,
        isolated,
        timeout,
        speculative,
    )?;
    let outcome = interruptible(py, |cancel| crate::ze::load::compile_and_load(&req, cancel));
    emit_warnings(py);
    match outcome? {
        Ok(loaded) => Ok(loaded_kernel(py, loaded)),
        Err(f) => Err(to_pyerr(py, *f)),
    }
}

/// Load many kernels (dicts with `compile_and_load`'s keyword names, all present) with
/// at most `jobs` at once. Returns, in input order, a LoadedKernel or a BuildError each.
#[pyfunction]
#[pyo3(signature = (requests, *, jobs=None, progress=None))]
pub fn compile_and_load_many(
    py: Python<'_>,
    requests: Vec<Bound<'_, PyDict>>,
    jobs: Option<usize>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Vec<Py<PyAny>>> {
    let reqs = requests
        .iter()
        .map(|d| {
            load_request(
                py,
                field(d, "binary")?.extract()?,
                field(d, "kernel_name")?.extract()?,
                field(d, "build_flags")?.extract()?,
                field(d, "is_spv")?.extract()?,
                field(d, "device")?.extract()?,
                field(d, "device_arch")?.extract()?,
                field(d, "cache")?.extract()?,
                field(d, "cache_dir")?.extract()?,
                field(d, "spill_threshold")?.extract()?,
                field(d, "isolated")?.extract()?,
                field(d, "timeout")?.extract()?,
                field(d, "speculative")?.extract()?,
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    run_batch(
        py,
        jobs,
        progress,
        |jobs, cancel, on_done| {
            crate::ze::load::compile_and_load_many(&reqs, jobs, cancel, on_done)
        },
        |py, loaded| Ok(Py::new(py, loaded_kernel(py, loaded))?.into_any()),
    )
}

/// The Level Zero devices (initialising the driver on first use).
#[pyfunction]
pub fn devices<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
    let list = py
        .detach(crate::ze::devices)
        .map_err(|e| to_pyerr(py, e.into()))?;
    Ok(pythonize::pythonize(py, &list)?)
}

/// (modules created, modules destroyed, kernels created, kernels destroyed).
#[pyfunction]
pub fn ze_handle_counts() -> (u64, u64, u64, u64) {
    crate::ze::handle_counts()
}

//! Level Zero bindings: `compile_and_load`, `compile_and_load_many`, `LoadedKernel`, devices.

use super::bundle::{bundle_query, BundleQuery};
use super::options::PyOptions;
use super::{attempts, emit_warnings, field, interruptible, run_batch, to_pyerr, Attempt};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

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
    /// Upstream's `n_spills`: `spillMemSize / (4 * simd_size)`, 32-bit slots per lane
    /// (-1: SIMD width unknown).
    #[pyo3(get)]
    n_spills: i64,
    /// `spillMemSize`: bytes per hardware thread.
    #[pyo3(get)]
    spill_bytes: u64,
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
    /// Where its native code came from: `compiled` (here, from SPIR-V), `cache`,
    /// `native` (handed in), or what the caller says (`bundle`, by the Triton drop-in).
    source: &'static str,
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
    fn source(&self) -> &'static str {
        self.source
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
            "LoadedKernel(kernel_name={:?}, build_flags={:?}, n_regs={}, n_spills={}, spill_bytes={}, n_max_threads={}, recovered={}, cached={}, closed={})",
            self.kernel_name, self.build_flags, self.n_regs, self.n_spills, self.spill_bytes,
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
        n_spills: loaded.spill.slots(),
        spill_bytes: loaded.spill.bytes,
        n_max_threads: loaded.n_max_threads,
        private_mem_size: loaded.private_mem_size,
        simd_size: loaded.spill.simd,
        build_log: std::mem::take(&mut loaded.build_log),
        attempts: attempts(&loaded.attempts),
        recovered: loaded.recovered,
        cached: loaded.cached,
        native_binary: PyBytes::new(py, &native).unbind(),
        notes: std::mem::take(&mut loaded.notes),
        source: match (loaded.level, loaded.from_spirv) {
            (Some(crate::cache::Counter::StoreHits), _) => "remote",
            (Some(crate::cache::Counter::BundleHits), _) => "bundle",
            (Some(_), _) => "cache",
            (None, true) => "compiled",
            (None, false) => "native",
        },
        loaded: std::sync::Mutex::new(Some(loaded)),
    }
}

/// Build a module through Level Zero and load one kernel, retrying SPIR-V without an
/// explicit GRF flag in large GRF mode on failure or spills (upstream `load_binary`).
/// SPIR-V is built, and a handed native binary first loaded, in a worker process unless
/// the options turn isolation off. `bundle` (Triton's release, the device's target
/// profiles as `(ocloc device, id)`): the bundles are asked first.
#[pyfunction]
#[pyo3(signature = (binary, kernel_name, is_spv, device, options, bundle=None))]
pub fn compile_and_load(
    py: Python<'_>,
    binary: Vec<u8>,
    kernel_name: String,
    is_spv: bool,
    device: usize,
    options: PyRef<'_, PyOptions>,
    bundle: Option<BundleQuery>,
) -> PyResult<LoadedKernel> {
    let req = crate::ze::load::LoadRequest {
        binary,
        kernel_name,
        is_spv,
        device,
        options: options.inner.clone(),
        bundle: bundle.map(bundle_query),
    };
    let outcome = interruptible(py, |cancel| crate::ze::load::compile_and_load(&req, cancel));
    emit_warnings(py);
    match outcome? {
        Ok(loaded) => Ok(loaded_kernel(py, loaded)),
        Err(f) => Err(to_pyerr(py, *f)),
    }
}

/// Load many kernels (dicts with `binary`, `kernel_name`, `is_spv`, `device` and
/// `options`) with at most `jobs` at once. Returns, in input order, a LoadedKernel or a
/// BuildError each.
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
            Ok(crate::ze::load::LoadRequest {
                binary: field(d, "binary")?.extract()?,
                kernel_name: field(d, "kernel_name")?.extract()?,
                is_spv: field(d, "is_spv")?.extract()?,
                device: field(d, "device")?.extract()?,
                options: field(d, "options")?
                    .extract::<PyRef<PyOptions>>()?
                    .inner
                    .clone(),
                bundle: None,
            })
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

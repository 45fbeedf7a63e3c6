//! The offline engine's bindings: `compile`, `compile_many` and the SPIR-V/zebin helpers.

use super::{
    attempts, emit_warnings, field, interruptible, run_batch, timeout_of, to_pyerr, Attempt,
};
use crate::engine::{self, CompileRequest, Compiled};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::path::PathBuf;

/// A successful compile: the zebin and how it was obtained.
#[pyclass(frozen, get_all, module = "xpu_zebin._core")]
pub struct CompileResult {
    binary: Py<PyBytes>,
    kernel: String,
    device: String,
    build_flags: String,
    grf_mode: String,
    n_regs: u32,
    spill_size: u64,
    recovered: bool,
    cached: bool,
    attempts: Vec<Attempt>,
    log: String,
    notes: Vec<String>,
}

type ResultFields = (
    Py<PyBytes>,
    String,
    String,
    String,
    String,
    u32,
    u64,
    bool,
    bool,
    Vec<Attempt>,
    String,
    Vec<String>,
);

#[pymethods]
impl CompileResult {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        binary: Py<PyBytes>,
        kernel: String,
        device: String,
        build_flags: String,
        grf_mode: String,
        n_regs: u32,
        spill_size: u64,
        recovered: bool,
        cached: bool,
        attempts: Vec<Attempt>,
        log: String,
        notes: Vec<String>,
    ) -> Self {
        CompileResult {
            binary,
            kernel,
            device,
            build_flags,
            grf_mode,
            n_regs,
            spill_size,
            recovered,
            cached,
            attempts,
            log,
            notes,
        }
    }

    /// Picklable, so results can come back from process pools, Ray or Dask.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> (Bound<'py, pyo3::types::PyType>, ResultFields) {
        let r = slf.get();
        let py = slf.py();
        (
            slf.get_type(),
            (
                r.binary.clone_ref(py),
                r.kernel.clone(),
                r.device.clone(),
                r.build_flags.clone(),
                r.grf_mode.clone(),
                r.n_regs,
                r.spill_size,
                r.recovered,
                r.cached,
                r.attempts.clone(),
                r.log.clone(),
                r.notes.clone(),
            ),
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "CompileResult(kernel={:?}, device={:?}, build_flags={:?}, n_regs={}, spill_size={}, recovered={}, cached={}, attempts={})",
            self.kernel, self.device, self.build_flags, self.n_regs, self.spill_size,
            self.recovered, self.cached, self.attempts.len()
        )
    }
}

fn to_result(py: Python<'_>, c: Compiled) -> CompileResult {
    CompileResult {
        binary: PyBytes::new(py, &c.binary).unbind(),
        kernel: c.kernel,
        device: c.device,
        build_flags: c.build_flags,
        grf_mode: c.grf_mode,
        n_regs: c.n_regs,
        spill_size: c.spill_size,
        recovered: c.recovered,
        cached: c.cached,
        attempts: attempts(&c.attempts),
        log: c.log,
        notes: c.notes,
    }
}

#[allow(clippy::too_many_arguments)]
fn request(
    py: Python<'_>,
    spirv: Vec<u8>,
    device: String,
    build_flags: String,
    grf_mode: String,
    num_warps: Option<u32>,
    kernel_name: Option<String>,
    ocloc: Option<PathBuf>,
    timeout: Option<f64>,
    cache: bool,
    cache_dir: Option<PathBuf>,
    spill_threshold: u64,
    speculative: Option<bool>,
) -> PyResult<CompileRequest> {
    let timeout = timeout_of(py, timeout)?;
    Ok(CompileRequest {
        spirv,
        device,
        build_flags,
        grf_mode,
        num_warps,
        kernel_name,
        ocloc,
        timeout,
        cache,
        cache_dir,
        spill_threshold,
        speculative,
    })
}

/// Compile SPIR-V to a zebin with ocloc, retrying in large GRF mode when needed.
#[pyfunction]
#[pyo3(signature = (spirv, *, device, build_flags=String::new(), grf_mode="default".to_string(),
    num_warps=None, kernel_name=None, ocloc=None, timeout=None, cache=true, cache_dir=None,
    spill_threshold=0, speculative=None))]
#[allow(clippy::too_many_arguments)]
pub fn compile(
    py: Python<'_>,
    spirv: Vec<u8>,
    device: String,
    build_flags: String,
    grf_mode: String,
    num_warps: Option<u32>,
    kernel_name: Option<String>,
    ocloc: Option<PathBuf>,
    timeout: Option<f64>,
    cache: bool,
    cache_dir: Option<PathBuf>,
    spill_threshold: u64,
    speculative: Option<bool>,
) -> PyResult<CompileResult> {
    let req = request(
        py,
        spirv,
        device,
        build_flags,
        grf_mode,
        num_warps,
        kernel_name,
        ocloc,
        timeout,
        cache,
        cache_dir,
        spill_threshold,
        speculative,
    )?;
    let outcome = interruptible(py, |cancel| engine::compile(&req, cancel));
    emit_warnings(py);
    match outcome? {
        Ok(c) => Ok(to_result(py, c)),
        Err(f) => Err(to_pyerr(py, *f)),
    }
}

/// Compile many requests (dicts with `compile`'s keyword names, all present) with at
/// most `jobs` at once. Returns, in input order, a CompileResult or a BuildError each.
#[pyfunction]
#[pyo3(signature = (requests, *, jobs=None, progress=None))]
pub fn compile_many(
    py: Python<'_>,
    requests: Vec<Bound<'_, PyDict>>,
    jobs: Option<usize>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Vec<Py<PyAny>>> {
    let reqs = requests
        .iter()
        .map(|d| {
            request(
                py,
                field(d, "spirv")?.extract()?,
                field(d, "device")?.extract()?,
                field(d, "build_flags")?.extract()?,
                field(d, "grf_mode")?.extract()?,
                field(d, "num_warps")?.extract()?,
                field(d, "kernel_name")?.extract()?,
                field(d, "ocloc")?.extract()?,
                field(d, "timeout")?.extract()?,
                field(d, "cache")?.extract()?,
                field(d, "cache_dir")?.extract()?,
                field(d, "spill_threshold")?.extract()?,
                field(d, "speculative")?.extract()?,
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    run_batch(
        py,
        jobs,
        progress,
        |jobs, cancel, on_done| engine::compile_many(&reqs, jobs, cancel, on_done),
        |py, compiled| Ok(Py::new(py, to_result(py, compiled))?.into_any()),
    )
}

/// Validate SPIR-V; returns its kernel entry points or raises InvalidSpirvError.
#[pyfunction]
pub fn validate_spirv(py: Python<'_>, spirv: &[u8]) -> PyResult<Vec<String>> {
    crate::spirv::validate(spirv)
        .map(|i| i.kernels)
        .map_err(|e| to_pyerr(py, e.into()))
}

/// Summarise a zebin's `.ze_info` as a dict.
#[pyfunction]
pub fn zebin_info<'py>(py: Python<'py>, binary: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let info = crate::zebin::parse(binary).map_err(|e| to_pyerr(py, e.into()))?;
    Ok(pythonize::pythonize(py, &info)?)
}

/// Resolve ocloc as `compile` would: explicit path, $XPU_ZEBIN_OCLOC, PATH.
#[pyfunction]
#[pyo3(signature = (ocloc=None))]
pub fn find_ocloc(py: Python<'_>, ocloc: Option<PathBuf>) -> PyResult<PathBuf> {
    crate::ocloc::discover(ocloc.as_deref()).map_err(|e| to_pyerr(py, e.into()))
}

/// OpenCL C to SPIR-V with `ocloc -spv_only` (samples, fixtures).
#[pyfunction]
#[pyo3(signature = (source, *, device="pvc".to_string(), options=String::new(), ocloc=None))]
pub fn opencl_to_spirv(
    py: Python<'_>,
    source: String,
    device: String,
    options: String,
    ocloc: Option<PathBuf>,
) -> PyResult<Py<PyBytes>> {
    let result = interruptible(py, |cancel| {
        let path = crate::ocloc::discover(ocloc.as_deref())?;
        crate::ocloc::opencl_to_spirv(&path, &source, &device, &options, cancel)
    });
    emit_warnings(py);
    match result? {
        Ok(spirv) => Ok(PyBytes::new(py, &spirv).unbind()),
        Err(e) => Err(to_pyerr(py, e.into())),
    }
}

//! The offline engine's bindings: `compile`, `compile_many` and the SPIR-V/zebin helpers.

use super::options::PyOptions;
use super::{attempts, emit_warnings, field, interruptible, run_batch, to_pyerr, Attempt};
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
    /// The kernel's spills, bytes per hardware thread (`.ze_info` `spill_size`).
    spill_size: u64,
    /// The same in upstream's unit: 32-bit slots per lane (-1: SIMD width unknown).
    n_spills: i64,
    simd_size: u32,
    recovered: bool,
    cached: bool,
    /// Where the native code came from: `compiled`, `cache` (this node's) or `remote`
    /// (the fleet's store, signed by a trusted key).
    source: String,
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
    (u64, u32),
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
    #[pyo3(signature = (binary, kernel, device, build_flags, grf_mode, n_regs, spill, recovered,
                        cached, attempts, log, notes, source = None))]
    fn new(
        binary: Py<PyBytes>,
        kernel: String,
        device: String,
        build_flags: String,
        grf_mode: String,
        n_regs: u32,
        spill: (u64, u32),
        recovered: bool,
        cached: bool,
        attempts: Vec<Attempt>,
        log: String,
        notes: Vec<String>,
        source: Option<String>,
    ) -> Self {
        let (spill_size, simd_size) = spill;
        let slots = crate::spill::Spill {
            bytes: spill_size,
            simd: simd_size,
        }
        .slots();
        CompileResult {
            binary,
            kernel,
            device,
            build_flags,
            grf_mode,
            n_regs,
            spill_size,
            n_spills: slots,
            simd_size,
            recovered,
            cached,
            source: source.unwrap_or_else(|| source_of(cached)),
            attempts,
            log,
            notes,
        }
    }

    /// The same result, said to come from `source` (the remote store's entry, say).
    fn with_source(&self, py: Python<'_>, source: String) -> Self {
        CompileResult {
            binary: self.binary.clone_ref(py),
            kernel: self.kernel.clone(),
            device: self.device.clone(),
            build_flags: self.build_flags.clone(),
            grf_mode: self.grf_mode.clone(),
            source,
            attempts: self.attempts.clone(),
            log: self.log.clone(),
            notes: self.notes.clone(),
            ..*self
        }
    }

    /// Picklable, so results can come back from process pools, Ray or Dask (a pickle of
    /// an older release, the class and its twelve fields, still loads).
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (ResultFields, String))> {
        let r = slf.get();
        let py = slf.py();
        let rebuild = py.import("xpu_zebin._core")?.getattr("_compile_result")?;
        let fields = (
            r.binary.clone_ref(py),
            r.kernel.clone(),
            r.device.clone(),
            r.build_flags.clone(),
            r.grf_mode.clone(),
            r.n_regs,
            (r.spill_size, r.simd_size),
            r.recovered,
            r.cached,
            r.attempts.clone(),
            r.log.clone(),
            r.notes.clone(),
        );
        Ok((rebuild, (fields, r.source.clone())))
    }

    fn __repr__(&self) -> String {
        format!(
            "CompileResult(kernel={:?}, device={:?}, build_flags={:?}, n_regs={}, spill_size={}, n_spills={}, recovered={}, source={:?}, attempts={})",
            self.kernel, self.device, self.build_flags, self.n_regs, self.spill_size, self.n_spills,
            self.recovered, self.source, self.attempts.len()
        )
    }
}

impl CompileResult {
    /// The same result, said to come from `source`.
    pub(crate) fn with_source_of(mut self, source: &str) -> Self {
        self.source = source.to_string();
        self
    }
}

/// A result from its pickled fields (`CompileResult.__reduce__`).
#[pyfunction]
pub fn _compile_result(fields: ResultFields, source: String) -> CompileResult {
    let (
        binary,
        kernel,
        device,
        build_flags,
        grf_mode,
        n_regs,
        spill,
        recovered,
        cached,
        attempts,
        log,
        notes,
    ) = fields;
    CompileResult::new(
        binary,
        kernel,
        device,
        build_flags,
        grf_mode,
        n_regs,
        spill,
        recovered,
        cached,
        attempts,
        log,
        notes,
        Some(source),
    )
}

/// Where a result of this node's engine came from.
fn source_of(cached: bool) -> String {
    if cached { "cache" } else { "compiled" }.to_string()
}

pub(crate) fn to_result(py: Python<'_>, c: Compiled) -> CompileResult {
    CompileResult {
        binary: PyBytes::new(py, &c.binary).unbind(),
        kernel: c.kernel,
        device: c.device,
        build_flags: c.build_flags,
        grf_mode: c.grf_mode,
        n_regs: c.n_regs,
        spill_size: c.spill.bytes,
        n_spills: c.spill.slots(),
        simd_size: c.spill.simd,
        recovered: c.recovered,
        cached: c.cached,
        source: match c.level {
            Some(crate::cache::Counter::StoreHits) => "remote".to_string(),
            Some(crate::cache::Counter::BundleHits) => "bundle".to_string(),
            _ => source_of(c.cached),
        },
        attempts: attempts(&c.attempts),
        log: c.log,
        notes: c.notes,
    }
}

/// Compile SPIR-V to a zebin with ocloc, retrying in large GRF mode when needed; the
/// levels answer first: `bundle` (Triton's release, the device's target profiles as
/// `(ocloc device, id)`, the bundles' directories) when given, the local cache, the
/// fleet's store unless `store` is False. With `bundle`, a host without ocloc is still
/// answered from the bundles. `counted` False: the request was counted once already (a
/// level's answer to it did not load here).
#[pyfunction]
#[pyo3(signature = (spirv, device, options, *, store=true, bundle=None, counted=true))]
pub fn compile(
    py: Python<'_>,
    spirv: Vec<u8>,
    device: String,
    options: PyRef<'_, PyOptions>,
    store: bool,
    bundle: Option<Bound<'_, PyAny>>,
    counted: bool,
) -> PyResult<CompileResult> {
    let bundle = super::bundle::bundle_arg(py, bundle.as_ref(), "bundle")?;
    let req = CompileRequest {
        spirv,
        device,
        options: options.inner.clone(),
        bundle,
        counted,
    };
    let outcome = interruptible(py, |cancel| engine::compile(&req, store, cancel));
    emit_warnings(py);
    match outcome? {
        Ok(c) => Ok(to_result(py, c)),
        Err(f) => Err(to_pyerr(py, *f)),
    }
}

/// Remove the cache entry `compile` would answer this request from (a build the driver
/// refused); False when there was none or it could not be removed.
#[pyfunction]
pub fn forget_cached(
    py: Python<'_>,
    spirv: Vec<u8>,
    device: String,
    options: PyRef<'_, PyOptions>,
) -> PyResult<bool> {
    let req = CompileRequest {
        spirv,
        device,
        options: options.inner.clone(),
        bundle: None,
        counted: true,
    };
    engine::forget_cached(&req).map_err(|e| to_pyerr(py, e.into()))
}

/// Compile many requests (dicts with `spirv`, `device` and `options`) with at most `jobs`
/// at once. Returns, in input order, a CompileResult or a BuildError each.
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
        .enumerate()
        .map(|(i, d)| {
            Ok(CompileRequest {
                spirv: field(d, "spirv")?.extract()?,
                device: field(d, "device")?.extract()?,
                options: field(d, "options")?
                    .extract::<PyRef<PyOptions>>()?
                    .inner
                    .clone(),
                // What to ask the bundles first, if anything (an autotune precompile's).
                bundle: super::bundle::bundle_arg(
                    py,
                    d.get_item("bundle")?.as_ref(),
                    &format!("requests[{i}]['bundle']"),
                )?,
                counted: true,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    run_batch(
        py,
        jobs,
        progress,
        |jobs, cancel, on_done| engine::compile_many(&reqs, true, jobs, cancel, on_done),
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

//! xpu-zebin: SPIR-V to Intel GPU zebin with automatic large-GRF fallback.
//!
//! The engine lives in its own modules (one concern each); this file only declares them and,
//! with the `python` feature (maturin turns it on), binds them as `xpu_zebin._core`.

pub mod batch;
pub mod cache;
pub mod classify;
pub mod engine;
pub mod error;
pub mod grf;
pub mod ladder;
pub mod libocloc;
pub mod ocloc;
pub mod pool;
pub mod spirv;
pub mod ze;
pub mod zebin;

#[cfg(feature = "python")]
#[pyo3::pymodule]
mod _core {
    use crate::engine::{self, CompileRequest, Compiled, Failure};
    use crate::error::ErrorKind;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyDict};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// One build of the GRF ladder.
    #[pyclass(frozen, get_all, from_py_object, module = "xpu_zebin._core")]
    #[derive(Clone)]
    pub struct Attempt {
        build_flags: String,
        ok: bool,
        spill_size: Option<u64>,
        seconds: f64,
        error: Option<String>,
    }

    #[pymethods]
    impl Attempt {
        #[new]
        fn new(
            build_flags: String,
            ok: bool,
            spill_size: Option<u64>,
            seconds: f64,
            error: Option<String>,
        ) -> Self {
            Attempt {
                build_flags,
                ok,
                spill_size,
                seconds,
                error,
            }
        }

        /// Picklable, so results can come back from process pools, Ray or Dask.
        #[allow(clippy::type_complexity)]
        fn __reduce__<'py>(
            slf: &Bound<'py, Self>,
        ) -> (
            Bound<'py, pyo3::types::PyType>,
            (String, bool, Option<u64>, f64, Option<String>),
        ) {
            let a = slf.get();
            (
                slf.get_type(),
                (
                    a.build_flags.clone(),
                    a.ok,
                    a.spill_size,
                    a.seconds,
                    a.error.clone(),
                ),
            )
        }

        fn __repr__(&self) -> String {
            format!(
                "Attempt(build_flags={:?}, ok={}, spill_size={:?}, seconds={:.3}, error={:?})",
                self.build_flags, self.ok, self.spill_size, self.seconds, self.error
            )
        }
    }

    fn attempts(list: &[engine::Attempt]) -> Vec<Attempt> {
        list.iter()
            .map(|a| Attempt {
                build_flags: a.build_flags.clone(),
                ok: a.ok,
                spill_size: a.spill_size,
                seconds: a.seconds,
                error: a.error.clone(),
            })
            .collect()
    }

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
        fn __reduce__<'py>(
            slf: &Bound<'py, Self>,
        ) -> (Bound<'py, pyo3::types::PyType>, ResultFields) {
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

    /// Build the Python exception (a subclass of `xpu_zebin.BuildError`) for a failure.
    fn to_exception(py: Python<'_>, f: Failure) -> PyResult<Bound<'_, PyAny>> {
        let Failure {
            error: e,
            attempts: tried,
            notes,
        } = f;
        py.import("xpu_zebin.errors")?
            .getattr("_from_core")?
            .call1((
                e.kind.name(),
                e.message,
                e.log,
                e.required,
                e.limit,
                attempts(&tried),
                notes,
            ))
    }

    fn to_pyerr(py: Python<'_>, f: Failure) -> PyErr {
        match to_exception(py, f) {
            Ok(value) => PyErr::from_value(value),
            Err(e) => e,
        }
    }

    /// Run `work` on another thread with the GIL released, checking for Ctrl-C meanwhile;
    /// on a signal, `cancel` is raised so running compilers are killed, and the signal's
    /// exception propagates.
    fn interruptible<T: Send>(
        py: Python<'_>,
        work: impl FnOnce(&AtomicBool) -> T + Send,
    ) -> PyResult<T> {
        let cancel = AtomicBool::new(false);
        let done = (std::sync::Mutex::new(false), std::sync::Condvar::new());
        std::thread::scope(|scope| {
            let handle = scope.spawn(|| {
                let out = work(&cancel);
                *done.0.lock().unwrap() = true;
                done.1.notify_all();
                out
            });
            let mut interrupted = None;
            // Wake at once when the work ends; every 20 ms otherwise, to look for Ctrl-C.
            let finished = || {
                let guard = done.0.lock().unwrap();
                let (guard, _) = done
                    .1
                    .wait_timeout_while(guard, Duration::from_millis(20), |d| !*d)
                    .unwrap();
                *guard
            };
            while !py.detach(finished) {
                if interrupted.is_none() {
                    if let Err(e) = py.check_signals() {
                        cancel.store(true, Ordering::Relaxed);
                        interrupted = Some(e);
                    }
                }
            }
            let out = py.detach(|| handle.join()).map_err(|_| {
                PyErr::new::<pyo3::exceptions::PyRuntimeError, _>("compile worker panicked")
            })?;
            match interrupted {
                Some(e) => Err(e),
                None => Ok(out),
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn request(
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
        let timeout = match timeout {
            Some(t) if !t.is_finite() || t < 0.0 => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "timeout must be a non-negative number of seconds, got {t}"
                )))
            }
            Some(t) => Some(Duration::from_secs_f64(t)),
            None => None,
        };
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
    fn compile(
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
        match interruptible(py, |cancel| engine::compile(&req, cancel))? {
            Ok(c) => Ok(to_result(py, c)),
            Err(f) => Err(to_pyerr(py, *f)),
        }
    }

    /// Compile many requests (dicts with `compile`'s keyword names, all present) with at
    /// most `jobs` at once. Returns, in input order, a CompileResult or a BuildError each.
    #[pyfunction]
    #[pyo3(signature = (requests, *, jobs=None, progress=None))]
    fn compile_many(
        py: Python<'_>,
        requests: Vec<Bound<'_, PyDict>>,
        jobs: Option<usize>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let mut reqs = Vec::with_capacity(requests.len());
        for d in &requests {
            let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
                d.get_item(k)?.ok_or_else(|| {
                    pyo3::exceptions::PyKeyError::new_err(format!("request lacks '{k}'"))
                })
            };
            reqs.push(request(
                get("spirv")?.extract()?,
                get("device")?.extract()?,
                get("build_flags")?.extract()?,
                get("grf_mode")?.extract()?,
                get("num_warps")?.extract()?,
                get("kernel_name")?.extract()?,
                get("ocloc")?.extract()?,
                get("timeout")?.extract()?,
                get("cache")?.extract()?,
                get("cache_dir")?.extract()?,
                get("spill_threshold")?.extract()?,
                get("speculative")?.extract()?,
            )?);
        }
        let jobs = jobs.unwrap_or_else(engine::default_jobs);
        if jobs == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "jobs must be at least 1",
            ));
        }
        let on_done = |i: usize| {
            if let Some(cb) = &progress {
                Python::attach(|py| {
                    if let Err(e) = cb.call1(py, (i,)) {
                        e.write_unraisable(py, None);
                    }
                });
            }
        };
        let results = interruptible(py, |cancel| {
            engine::compile_many(&reqs, jobs, cancel, &on_done)
        })?;
        results
            .into_iter()
            .map(|r| match r {
                Ok(c) => Ok(Py::new(py, to_result(py, c))?.into_any()),
                Err(f) => Ok(to_exception(py, *f)?.unbind()),
            })
            .collect()
    }

    /// Validate SPIR-V; returns its kernel entry points or raises InvalidSpirvError.
    #[pyfunction]
    fn validate_spirv(py: Python<'_>, spirv: &[u8]) -> PyResult<Vec<String>> {
        crate::spirv::validate(spirv)
            .map(|i| i.kernels)
            .map_err(|e| to_pyerr(py, e.into()))
    }

    /// Summarise a zebin's `.ze_info` as a dict.
    #[pyfunction]
    fn zebin_info<'py>(py: Python<'py>, binary: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        let info = crate::zebin::parse(binary).map_err(|e| to_pyerr(py, e.into()))?;
        Ok(pythonize::pythonize(py, &info)?)
    }

    /// Resolve ocloc as `compile` would: explicit path, $XPU_ZEBIN_OCLOC, PATH.
    #[pyfunction]
    #[pyo3(signature = (ocloc=None))]
    fn find_ocloc(py: Python<'_>, ocloc: Option<PathBuf>) -> PyResult<PathBuf> {
        crate::ocloc::discover(ocloc.as_deref()).map_err(|e| to_pyerr(py, e.into()))
    }

    /// OpenCL C to SPIR-V with `ocloc -spv_only` (samples, fixtures).
    #[pyfunction]
    #[pyo3(signature = (source, *, device="pvc".to_string(), options=String::new(), ocloc=None))]
    fn opencl_to_spirv(
        py: Python<'_>,
        source: String,
        device: String,
        options: String,
        ocloc: Option<PathBuf>,
    ) -> PyResult<Py<PyBytes>> {
        let result = py.detach(|| {
            let path = crate::ocloc::discover(ocloc.as_deref())?;
            crate::ocloc::opencl_to_spirv(&path, &source, &device, &options)
        });
        match result {
            Ok(spirv) => Ok(PyBytes::new(py, &spirv).unbind()),
            Err(e) => Err(to_pyerr(py, e.into())),
        }
    }

    /// Let the engine start persistent compiler workers with this interpreter and path.
    #[pyfunction]
    fn configure_workers(executable: PathBuf, pythonpath: String) {
        crate::pool::configure(crate::pool::PythonRuntime {
            executable,
            pythonpath,
        });
    }

    /// A worker process's main loop: `python -m xpu_zebin._worker ocloc LIBOCLOC` or
    /// `python -m xpu_zebin._worker ze`.
    #[pyfunction]
    #[pyo3(signature = (kind, libocloc=None))]
    fn serve_worker(py: Python<'_>, kind: String, libocloc: Option<PathBuf>) -> PyResult<()> {
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
    fn shutdown_workers() {
        crate::pool::shutdown();
    }

    /// Worker kinds that could not start, and why (`ocloc:<path>`, `ze`).
    #[pyfunction]
    fn broken_workers() -> Vec<(String, String)> {
        crate::pool::broken()
    }

    /// Pids of the idle workers (tests kill one mid-build).
    #[pyfunction]
    fn idle_worker_pids() -> Vec<u32> {
        crate::pool::idle_pids()
    }

    /// Why this ocloc has no persistent worker (one process per compile then), if so.
    #[pyfunction]
    fn ocloc_worker_unavailable(ocloc: PathBuf) -> Option<String> {
        crate::ocloc::worker_unavailable(&ocloc)
    }

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
            self.loaded
                .lock()
                .unwrap()
                .as_ref()
                .map_or(0, |l| l.module.handle as usize)
        }

        /// `ze_kernel_handle_t` as an integer (0 once closed).
        #[getter]
        fn kernel_handle(&self) -> usize {
            self.loaded
                .lock()
                .unwrap()
                .as_ref()
                .map_or(0, |l| l.kernel.handle as usize)
        }

        #[getter]
        fn closed(&self) -> bool {
            self.loaded.lock().unwrap().is_none()
        }

        /// Destroy the kernel and module now; later calls do nothing.
        fn close(&self, py: Python<'_>) {
            let taken = self.loaded.lock().unwrap().take();
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

    fn timeout_of(timeout: Option<f64>) -> PyResult<Option<Duration>> {
        match timeout {
            Some(t) if !t.is_finite() || t < 0.0 => Err(pyo3::exceptions::PyValueError::new_err(
                format!("timeout must be a non-negative number of seconds, got {t}"),
            )),
            Some(t) => Ok(Some(Duration::from_secs_f64(t))),
            None => Ok(None),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn load_request(
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
            timeout: timeout_of(timeout)?,
            speculative,
        })
    }

    /// Build a module through Level Zero and load one kernel, retrying SPIR-V without an
    /// explicit GRF flag in large GRF mode on failure or spills (upstream `load_binary`).
    /// SPIR-V is built in a worker process unless `isolated` is false.
    #[pyfunction]
    #[pyo3(signature = (binary, kernel_name, *, build_flags=String::new(), is_spv=true,
        device=0, device_arch=None, cache=true, cache_dir=None, spill_threshold=0,
        isolated=true, timeout=None, speculative=None))]
    #[allow(clippy::too_many_arguments)]
    fn compile_and_load(
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
        match interruptible(py, |cancel| crate::ze::load::compile_and_load(&req, cancel))? {
            Ok(loaded) => Ok(loaded_kernel(py, loaded)),
            Err(f) => Err(to_pyerr(py, *f)),
        }
    }

    /// Load many kernels (dicts with `compile_and_load`'s keyword names, all present) with
    /// at most `jobs` at once. Returns, in input order, a LoadedKernel or a BuildError each.
    #[pyfunction]
    #[pyo3(signature = (requests, *, jobs=None, progress=None))]
    fn compile_and_load_many(
        py: Python<'_>,
        requests: Vec<Bound<'_, PyDict>>,
        jobs: Option<usize>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let mut reqs = Vec::with_capacity(requests.len());
        for d in &requests {
            let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
                d.get_item(k)?.ok_or_else(|| {
                    pyo3::exceptions::PyKeyError::new_err(format!("request lacks '{k}'"))
                })
            };
            reqs.push(load_request(
                get("binary")?.extract()?,
                get("kernel_name")?.extract()?,
                get("build_flags")?.extract()?,
                get("is_spv")?.extract()?,
                get("device")?.extract()?,
                get("device_arch")?.extract()?,
                get("cache")?.extract()?,
                get("cache_dir")?.extract()?,
                get("spill_threshold")?.extract()?,
                get("isolated")?.extract()?,
                get("timeout")?.extract()?,
                get("speculative")?.extract()?,
            )?);
        }
        let jobs = jobs.unwrap_or_else(engine::default_jobs);
        if jobs == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "jobs must be at least 1",
            ));
        }
        let on_done = |i: usize| {
            if let Some(cb) = &progress {
                Python::attach(|py| {
                    if let Err(e) = cb.call1(py, (i,)) {
                        e.write_unraisable(py, None);
                    }
                });
            }
        };
        let results = interruptible(py, |cancel| {
            crate::ze::load::compile_and_load_many(&reqs, jobs, cancel, &on_done)
        })?;
        results
            .into_iter()
            .map(|r| match r {
                Ok(l) => Ok(Py::new(py, loaded_kernel(py, l))?.into_any()),
                Err(f) => Ok(to_exception(py, *f)?.unbind()),
            })
            .collect()
    }

    /// The Level Zero devices (initialising the driver on first use).
    #[pyfunction]
    fn devices<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let list = py
            .detach(crate::ze::devices)
            .map_err(|e| to_pyerr(py, e.into()))?;
        Ok(pythonize::pythonize(py, &list)?)
    }

    /// (modules created, modules destroyed, kernels created, kernels destroyed).
    #[pyfunction]
    fn ze_handle_counts() -> (u64, u64, u64, u64) {
        crate::ze::handle_counts()
    }

    /// The error kinds as (name, description) pairs.
    #[pyfunction]
    fn error_kinds() -> Vec<(&'static str, &'static str)> {
        ErrorKind::ALL
            .iter()
            .map(|k| (k.name(), k.description()))
            .collect()
    }

    /// Parallel jobs `compile_many` uses by default: the machine's cores.
    #[pyfunction]
    fn default_jobs() -> usize {
        engine::default_jobs()
    }

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("GRF_FLAGS", crate::grf::GRF_FLAGS.to_vec())?;
        m.add("OCLOC_ENV", crate::ocloc::OCLOC_ENV)?;
        m.add("CACHE_DIR_ENV", crate::cache::CACHE_DIR_ENV)?;
        m.add("TIMEOUT_ENV", crate::engine::TIMEOUT_ENV)?;
        m.add("PERSISTENT_ENV", crate::pool::PERSISTENT_ENV)?;
        m.add("SIMULATED_DEVICE_ENV", crate::ze::SIMULATED_DEVICE_ENV)?;
        Ok(())
    }
}

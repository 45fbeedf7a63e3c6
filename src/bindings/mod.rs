//! What every binding shares: the Attempt class, errors as Python exceptions, and running
//! native work with the GIL released while Ctrl-C stays live.

use crate::engine::{self, Failure};
use crate::error::ErrorKind;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub mod bundle;
pub mod level_zero;
pub mod offline;
pub mod options;
pub mod remote;
pub mod triton;
pub mod workers;

/// Why an attempt failed: the error's kind, message and, for a PTSS overflow, the
/// required and limit bytes. `str()` is `"kind: message"`.
#[pyclass(frozen, get_all, from_py_object, eq, module = "xpu_zebin._core")]
#[derive(Clone, PartialEq)]
pub struct AttemptError {
    kind: String,
    message: String,
    required: Option<u64>,
    limit: Option<u64>,
}

#[pymethods]
impl AttemptError {
    #[new]
    #[pyo3(signature = (kind, message, required=None, limit=None))]
    fn new(kind: String, message: String, required: Option<u64>, limit: Option<u64>) -> Self {
        AttemptError {
            kind,
            message,
            required,
            limit,
        }
    }

    /// `{kind, message, required?, limit?}`, as `--json` prints it.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("kind", &self.kind)?;
        d.set_item("message", &self.message)?;
        if let (Some(r), Some(l)) = (self.required, self.limit) {
            d.set_item("required", r)?;
            d.set_item("limit", l)?;
        }
        Ok(d)
    }

    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> (
        Bound<'py, pyo3::types::PyType>,
        (String, String, Option<u64>, Option<u64>),
    ) {
        let e = slf.get();
        (
            slf.get_type(),
            (e.kind.clone(), e.message.clone(), e.required, e.limit),
        )
    }

    fn __str__(&self) -> String {
        format!("{}: {}", self.kind, self.message)
    }

    fn __repr__(&self) -> String {
        format!(
            "AttemptError(kind={:?}, message={:?}, required={:?}, limit={:?})",
            self.kind, self.message, self.required, self.limit
        )
    }
}

/// One build of the GRF ladder.
#[pyclass(frozen, get_all, from_py_object, module = "xpu_zebin._core")]
#[derive(Clone)]
pub struct Attempt {
    build_flags: String,
    ok: bool,
    spill_size: Option<u64>,
    seconds: f64,
    error: Option<AttemptError>,
    /// Seconds after its ladder began that it started (attempts overlap when one starts
    /// before another's `started + seconds`).
    started: f64,
}

#[pymethods]
impl Attempt {
    #[new]
    #[pyo3(signature = (build_flags, ok, spill_size, seconds, error, started = 0.0))]
    fn new(
        build_flags: String,
        ok: bool,
        spill_size: Option<u64>,
        seconds: f64,
        error: Option<AttemptError>,
        started: f64,
    ) -> Self {
        Attempt {
            build_flags,
            ok,
            spill_size,
            seconds,
            error,
            started,
        }
    }

    /// Picklable, so results can come back from process pools, Ray or Dask.
    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> (
        Bound<'py, pyo3::types::PyType>,
        (String, bool, Option<u64>, f64, Option<AttemptError>, f64),
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
                a.started,
            ),
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "Attempt(build_flags={:?}, ok={}, spill_size={:?}, seconds={:.3}, error={}, \
             started={:.3})",
            self.build_flags,
            self.ok,
            self.spill_size,
            self.seconds,
            self.error.as_ref().map_or("None".into(), |e| e.__repr__()),
            self.started
        )
    }
}

pub(crate) fn attempts(list: &[engine::Attempt]) -> Vec<Attempt> {
    list.iter()
        .map(|a| Attempt {
            build_flags: a.build_flags.clone(),
            ok: a.ok,
            spill_size: a.spill_size,
            seconds: a.seconds,
            started: a.started,
            error: a.error.as_ref().map(|e| AttemptError {
                kind: e.kind.name().to_string(),
                message: e.message.clone(),
                required: e.required,
                limit: e.limit,
            }),
        })
        .collect()
}

/// Build the Python exception (a subclass of `xpu_zebin.BuildError`) for a failure.
pub(crate) fn to_exception(py: Python<'_>, f: Failure) -> PyResult<Bound<'_, PyAny>> {
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

pub(crate) fn to_pyerr(py: Python<'_>, f: Failure) -> PyErr {
    match to_exception(py, f) {
        Ok(value) => PyErr::from_value(value),
        Err(e) => e,
    }
}

/// Run `work` on another thread with the GIL released, checking for Ctrl-C meanwhile;
/// on a signal, `cancel` is raised so running compilers are killed, and the signal's
/// exception propagates. A panic in `work` (a bug of ours) is an `InternalError`: the wait
/// ends however the work ends.
pub(crate) fn interruptible<T: Send>(
    py: Python<'_>,
    work: impl FnOnce(&AtomicBool) -> T + Send,
) -> PyResult<T> {
    let cancel = AtomicBool::new(false);
    let generation = CANCEL_GENERATION.load(Ordering::Relaxed);
    let done = (std::sync::Mutex::new(false), std::sync::Condvar::new());
    /// Says "done" when dropped: after the work returns or while it unwinds.
    struct Done<'a>(&'a (std::sync::Mutex<bool>, std::sync::Condvar));
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            *crate::sync::lock(&self.0 .0) = true;
            self.0 .1.notify_all();
        }
    }
    let out = std::thread::scope(|scope| {
        let handle = scope.spawn(|| {
            let _done = Done(&done);
            crate::sync::catch("the compile engine", || work(&cancel))
        });
        let mut interrupted = None;
        // Wake at once when the work ends; every 20 ms otherwise, to look for Ctrl-C.
        let finished = || {
            let guard = crate::sync::lock(&done.0);
            match done
                .1
                .wait_timeout_while(guard, Duration::from_millis(20), |d| !*d)
            {
                Ok((guard, _)) => *guard,
                Err(poisoned) => *poisoned.into_inner().0,
            }
        };
        while !py.detach(finished) {
            // Another thread's Ctrl-C (only the main thread sees signals): `cancel_running`.
            if CANCEL_GENERATION.load(Ordering::Relaxed) != generation {
                cancel.store(true, Ordering::Relaxed);
            }
            if interrupted.is_none() {
                if let Err(e) = py.check_signals() {
                    cancel.store(true, Ordering::Relaxed);
                    interrupted = Some(e);
                }
            }
        }
        let joined = py.detach(|| handle.join());
        (joined, interrupted)
    });
    match out {
        (_, Some(e)) => Err(e),
        (Ok(Ok(value)), None) => Ok(value),
        (Ok(Err(error)), None) => Err(to_pyerr(py, error.into())),
        (Err(_), None) => Err(to_pyerr(
            py,
            crate::error::BuildError::new(
                crate::error::ErrorKind::Internal,
                "the compile engine's thread ended abnormally (a bug in xpu-zebin)",
            )
            .into(),
        )),
    }
}

/// Bumped by `cancel_running`: every call running when it changed is cancelled.
pub(crate) static CANCEL_GENERATION: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Cancel every compile or load running now in this process, on any thread (their
/// compilers killed; each raises `CancelledError`): what Ctrl-C does to the main thread's
/// own, for work other threads run on its behalf.
#[pyfunction]
pub fn cancel_running() {
    CANCEL_GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Log the engine's pending warnings (said once each) on the `xpu_zebin` logger.
pub(crate) fn emit_warnings(py: Python<'_>) {
    let warnings = crate::diag::take();
    let details = crate::diag::take_details();
    if warnings.is_empty() && details.is_empty() {
        return;
    }
    let logged = (|| -> PyResult<()> {
        let logging = py.import("logging")?;
        let logger = logging.call_method1("getLogger", ("xpu_zebin",))?;
        for w in &warnings {
            logger.call_method1("warning", ("%s", w))?;
        }
        for (part, d) in &details {
            let logger = logging.call_method1("getLogger", (format!("xpu_zebin.{part}"),))?;
            logger.call_method1("debug", ("%s", d))?;
        }
        Ok(())
    })();
    if let Err(e) = logged {
        e.write_unraisable(py, None);
    }
}

/// One key of a batch request dict (the Python side fills in every key).
pub(crate) fn field<'py>(request: &Bound<'py, PyDict>, key: &str) -> PyResult<Bound<'py, PyAny>> {
    request
        .get_item(key)?
        .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(format!("request lacks '{key}'")))
}

/// Run a batch with the GIL released and Ctrl-C live: `run(jobs, cancel, on_done)` gives
/// one outcome per item; `progress(index)` is called as each item ends. Returns, in input
/// order, each success as `convert` makes it or each failure as its exception object.
pub(crate) fn run_batch<T: Send>(
    py: Python<'_>,
    jobs: Option<usize>,
    progress: Option<Py<PyAny>>,
    run: impl FnOnce(usize, &AtomicBool, &(dyn Fn(usize) + Sync)) -> Vec<Result<T, Box<Failure>>> + Send,
    convert: impl Fn(Python<'_>, T) -> PyResult<Py<PyAny>>,
) -> PyResult<Vec<Py<PyAny>>> {
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
    let outcomes = interruptible(py, |cancel| run(jobs, cancel, &on_done));
    emit_warnings(py);
    let outcomes = outcomes?;
    outcomes
        .into_iter()
        .map(|r| match r {
            Ok(value) => convert(py, value),
            Err(f) => Ok(to_exception(py, *f)?.unbind()),
        })
        .collect()
}

/// The error kinds as (name, description) pairs.
#[pyfunction]
pub fn error_kinds() -> Vec<(&'static str, &'static str)> {
    ErrorKind::ALL
        .iter()
        .map(|k| (k.name(), k.description()))
        .collect()
}

/// Parallel jobs `compile_many` uses by default: the machine's cores.
#[pyfunction]
pub fn default_jobs() -> usize {
    engine::default_jobs()
}

//! Triton's front ends shared between processes: one run per kernel, the others answered
//! from Triton's cache (`levels::front_ends`; `xpu_zebin.triton.front_ends` is the caller).

use crate::levels::claims::Claim;
use crate::levels::front_ends::{claim_group, Flight};
use crate::sync::lock;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The claim on one of Triton's cache groups, held while this process runs its front end:
/// let go by `release()` (once the group is put, or the compile failed) or when dropped.
#[pyclass(module = "xpu_zebin._core", frozen)]
pub struct FrontEndClaim {
    claim: Mutex<Option<Claim>>,
}

#[pymethods]
impl FrontEndClaim {
    /// Let go (its waiters look in Triton's cache again); a second call does nothing.
    fn release(&self) {
        let held = lock(&self.claim).take();
        drop(held);
    }

    /// Whether it is still held.
    fn held(&self) -> bool {
        lock(&self.claim).is_some()
    }
}

/// Claim Triton's cache group `filename` of the kernel whose Triton cache key is `key`, or
/// wait for the process whose front end holds it: `found()` asks Triton's cache (true: the
/// group is there). Returns the claim (None: Triton's cache answers, or the front end runs
/// without a claim), whether it stepped aside (`step_aside`: held by another at the first
/// look, and the caller has other front ends to run first) and what happened, in words.
/// The wait ends at `bound_s` (default 300 s), when the holder stalls, or at Ctrl-C and
/// `cancel_running()` (raised: `KeyboardInterrupt`, `CancelledError`); `found()`'s own
/// error is raised.
#[pyfunction]
#[pyo3(signature = (key, filename, found, bound_s=None, cache_dir=None, step_aside=false))]
pub fn claim_triton_group(
    py: Python<'_>,
    key: &str,
    filename: &str,
    found: Py<PyAny>,
    bound_s: Option<f64>,
    cache_dir: Option<PathBuf>,
    step_aside: bool,
) -> PyResult<(Option<FrontEndClaim>, bool, String)> {
    let bound = match bound_s.map(Duration::try_from_secs_f64).transpose() {
        Ok(bound) => bound,
        Err(_) => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "bound_s: a number of seconds from 0, not {}",
                bound_s.unwrap_or_default()
            )))
        }
    };
    if cache_dir.as_ref().is_some_and(|d| d.as_os_str().is_empty()) {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "cache_dir: a directory, not an empty path (None: the user's cache)",
        ));
    }
    let cancel = AtomicBool::new(false);
    // Another thread's Ctrl-C (only the main thread sees signals): `cancel_running`.
    let generation = super::CANCEL_GENERATION.load(Ordering::Relaxed);
    let mut raised: Option<PyErr> = None;
    let flight = py.detach(|| {
        claim_group(
            cache_dir.as_deref(),
            (key, filename),
            (bound, &cancel, step_aside),
            || {
                if super::CANCEL_GENERATION.load(Ordering::Relaxed) != generation {
                    cancel.store(true, Ordering::Relaxed);
                    return false;
                }
                Python::attach(|py| {
                    let asked = py.check_signals().and_then(|()| found.call0(py));
                    match asked.and_then(|v| v.is_truthy(py)) {
                        Ok(there) => there,
                        Err(e) => {
                            raised = Some(e);
                            cancel.store(true, Ordering::Relaxed);
                            false
                        }
                    }
                })
            },
        )
    });
    super::emit_warnings(py);
    if let Some(e) = raised {
        return Err(e);
    }
    match flight.map_err(|e| super::to_pyerr(py, e.into()))? {
        Flight::Mine(claim) => Ok((
            Some(FrontEndClaim {
                claim: Mutex::new(Some(claim)),
            }),
            false,
            "claimed: this process runs the front end".into(),
        )),
        Flight::Answered(took) => Ok((
            None,
            false,
            format!(
                "waited {:.2} s for another process's front end of this kernel",
                took.as_secs_f64()
            ),
        )),
        Flight::Alone(why) => Ok((None, false, why)),
        Flight::Later => Ok((
            None,
            true,
            "another process runs this front end: later".into(),
        )),
        // The same error as a cancelled wait for another's native build.
        Flight::Cancelled => Err(super::to_pyerr(
            py,
            crate::levels::Refusal::cancelled().error.into(),
        )),
    }
}

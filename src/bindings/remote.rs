//! What a fleet shares: signing keys (`signing.rs`) and the local cache's entries as
//! stored, taken from and given to the remote store (`python/xpu_zebin/remote.py`).

use super::offline::CompileResult;
use super::options::PyOptions;
use super::to_pyerr;
use crate::engine::{self, CompileRequest};
use crate::signing::{self, Signer, Trusted};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;

fn request(spirv: Vec<u8>, device: String, options: &PyOptions) -> CompileRequest {
    CompileRequest {
        spirv,
        device,
        options: options.inner.clone(),
    }
}

/// Write a new secret key to `path` (never over an existing file; owner-only) and return
/// its public key, `NAME:HEX`.
#[pyfunction]
pub fn key_generate(py: Python<'_>, path: PathBuf, name: &str) -> PyResult<String> {
    signing::generate(&path, name).map_err(|e| to_pyerr(py, e.into()))
}

/// The public key of `XPU_ZEBIN_SIGNING_KEY` (None when unset); a bad key file is an
/// `InvalidArgumentError`.
#[pyfunction]
pub fn signing_public(py: Python<'_>) -> PyResult<Option<String>> {
    let signer = Signer::from_env().map_err(|e| to_pyerr(py, e.into()))?;
    Ok(signer.map(|s| s.public()))
}

/// `(signer's public key, signature in hex)` of `message` with `XPU_ZEBIN_SIGNING_KEY`;
/// None when no key is set.
#[pyfunction]
pub fn sign(py: Python<'_>, message: &[u8]) -> PyResult<Option<(String, String)>> {
    let signer = Signer::from_env().map_err(|e| to_pyerr(py, e.into()))?;
    Ok(signer.map(|s| (s.public(), s.sign(message))))
}

/// Did a key of `XPU_ZEBIN_TRUSTED_KEYS` sign `message`? Malformed fields are a no.
#[pyfunction]
pub fn verify(py: Python<'_>, signer: &str, message: &[u8], signature: &str) -> PyResult<bool> {
    let trusted = Trusted::from_env().map_err(|e| to_pyerr(py, e.into()))?;
    Ok(trusted.verify(signer, message, signature))
}

/// Are any keys trusted (`XPU_ZEBIN_TRUSTED_KEYS`)? A malformed list is an error.
#[pyfunction]
pub fn trusted_keys_set(py: Python<'_>) -> PyResult<bool> {
    let trusted = Trusted::from_env().map_err(|e| to_pyerr(py, e.into()))?;
    Ok(!trusted.is_empty())
}

/// Where a request's answer is cached (`engine::Slot`): its SPIR-V validated once, then
/// looked up locally and, on a miss, given another node's entry.
#[pyclass(frozen, module = "xpu_zebin._core")]
pub struct CacheSlot {
    inner: engine::Slot,
}

/// The slot of this request: an error when the request itself is bad (as `compile`'s).
#[pyfunction]
pub fn cache_slot(
    py: Python<'_>,
    spirv: Vec<u8>,
    device: String,
    options: PyRef<'_, PyOptions>,
) -> PyResult<CacheSlot> {
    let req = request(spirv, device, &options);
    let inner = py
        .detach(|| engine::slot(&req))
        .map_err(|e| to_pyerr(py, e.into()))?;
    Ok(CacheSlot { inner })
}

#[pymethods]
impl CacheSlot {
    /// The key the answer is stored under (local cache and remote store).
    #[getter]
    fn key(&self) -> &str {
        self.inner.key()
    }

    /// The identity of the compiler the key holds.
    #[getter]
    fn compiler(&self) -> &str {
        self.inner.compiler()
    }

    /// The local cache entry that answers, as stored (checked); None when there is none.
    fn local<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        let bytes = py.detach(|| self.inner.local());
        bytes.map(|b| PyBytes::new(py, &b))
    }

    /// Take another node's entry (verified by its signature) into the local cache as the
    /// answer, and answer with it (`source` "remote"); an `InvalidArgumentError` when it
    /// is not this request's entry.
    fn adopt(&self, py: Python<'_>, entry: &[u8]) -> PyResult<CompileResult> {
        let compiled = py
            .detach(|| self.inner.adopt(entry))
            .map_err(|e| to_pyerr(py, e.into()))?;
        Ok(super::offline::to_result(py, compiled).with_source_of("remote"))
    }
}

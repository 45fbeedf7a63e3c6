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

/// `(key, entry bytes or None)`: the key this request's answer is stored under (local
/// cache and remote store), and the local cache entry that answers it, if any.
#[pyfunction]
pub fn cached_entry<'py>(
    py: Python<'py>,
    spirv: Vec<u8>,
    device: String,
    options: PyRef<'_, PyOptions>,
) -> PyResult<(String, Option<Bound<'py, PyBytes>>)> {
    let (key, bytes) = engine::cached_entry(&request(spirv, device, &options))
        .map_err(|e| to_pyerr(py, e.into()))?;
    Ok((key, bytes.map(|b| PyBytes::new(py, &b))))
}

/// Take another node's entry (verified by its signature) into the local cache as this
/// request's answer, and answer with it (`source` "remote"); an `InvalidArgumentError`
/// when it is not one.
#[pyfunction]
pub fn adopt_entry(
    py: Python<'_>,
    spirv: Vec<u8>,
    device: String,
    options: PyRef<'_, PyOptions>,
    entry: &[u8],
) -> PyResult<CompileResult> {
    let compiled = engine::adopt_entry(&request(spirv, device, &options), entry)
        .map_err(|e| to_pyerr(py, e.into()))?;
    Ok(super::offline::to_result(py, compiled).with_source_of("remote"))
}

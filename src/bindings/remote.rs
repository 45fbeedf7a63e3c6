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
        bundle: None,
        counted: true,
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

// --- the fleet's store (`store::remote`) ------------------------------------------------

use crate::store::{format, remote as level};
use pyo3::types::PyDict;
use std::collections::BTreeMap;

fn store_config(py: Python<'_>) -> PyResult<Option<level::Config>> {
    level::config().map_err(|e| to_pyerr(py, e.into()))
}

/// The store's settings from the environment as a dict (None when `XPU_ZEBIN_REMOTE` is
/// unset); a bad value is an `InvalidArgumentError` naming it.
#[pyfunction]
pub fn remote_config<'py>(py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(cfg) = store_config(py)? else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    d.set_item("url", crate::store::address::redacted(&cfg.url))?;
    d.set_item("read_write", cfg.read_write)?;
    d.set_item("timeout", cfg.timeout.as_secs_f64())?;
    d.set_item("ttl", cfg.ttl)?;
    d.set_item("max_bytes", cfg.max_bytes)?;
    Ok(Some(d))
}

/// What the store gave the cache in `cache_dir` (default: the user's), as `stats` counts
/// it (since its last zero): hits (native requests, and Triton's kernel groups), misses,
/// untrusted, too_large, errors, published (only those that happened).
#[pyfunction]
#[pyo3(signature = (cache_dir=None))]
pub fn remote_counts(py: Python<'_>, cache_dir: Option<PathBuf>) -> BTreeMap<String, u64> {
    use crate::cache::Counter;
    let counters = py.detach(|| crate::cache::Cache::open(cache_dir.as_deref()).counters(false));
    super::emit_warnings(py);
    let of = |c: Counter| {
        counters
            .iter()
            .find(|(k, _)| *k == c)
            .map_or(0, |(_, n)| *n)
    };
    [
        ("hits", of(Counter::StoreHits) + of(Counter::TritonHits)),
        ("misses", of(Counter::StoreMisses)),
        ("untrusted", of(Counter::RefusedUntrusted)),
        ("too_large", of(Counter::StoreTooLarge)),
        ("errors", of(Counter::StoreErrors)),
        ("published", of(Counter::StorePublished)),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(k, n)| (k.to_string(), n))
    .collect()
}

/// Forget what this process saw of the store, its connections and what it said.
#[pyfunction]
pub fn remote_reset() {
    level::reset();
}

/// Triton's entries: the bytes at each of `rkeys` signed by a trusted key for that key
/// and `identity`, in one read (None each where not; `all_or_none`: all or none).
#[pyfunction]
#[pyo3(signature = (rkeys, identity, all_or_none=false))]
pub fn remote_fetch_signed<'py>(
    py: Python<'py>,
    rkeys: Vec<String>,
    identity: &str,
    all_or_none: bool,
) -> PyResult<Vec<Option<Bound<'py, PyBytes>>>> {
    let Some(cfg) = store_config(py)? else {
        return Ok(vec![None; rkeys.len()]);
    };
    let found = py.detach(|| {
        let ledger = crate::cache::Cache::open(None).ledger_to_count();
        level::fetch_signed(&cfg, (&rkeys, identity), all_or_none, ledger.as_deref())
    });
    super::emit_warnings(py);
    let found = found.map_err(|e| to_pyerr(py, e.into()))?;
    Ok(found
        .into_iter()
        .map(|v| v.map(|b| PyBytes::new(py, &b)))
        .collect())
}

/// Triton's entry `data`, signed for `rkey` and `identity`, into the store (a read-write
/// node with a signing key); True when written.
#[pyfunction]
pub fn remote_publish_signed(
    py: Python<'_>,
    rkey: &str,
    identity: &str,
    data: &[u8],
) -> PyResult<bool> {
    let Some(cfg) = store_config(py)? else {
        return Ok(false);
    };
    let done = py.detach(|| {
        let ledger = crate::cache::Cache::open(None).ledger_to_count();
        level::publish_signed(&cfg, (rkey, identity), data, ledger.as_deref())
    });
    super::emit_warnings(py);
    done.map_err(|e| to_pyerr(py, e.into()))
}

/// `stats`, `verify` or `purge` the store (a SCAN page at a time): a dict of entries,
/// bytes, bad (key, why) and purged; an `OSError` saying why the store could not be read.
#[pyfunction]
pub fn remote_survey<'py>(py: Python<'py>, action: &str) -> PyResult<Bound<'py, PyAny>> {
    let action = match action {
        "stats" => level::Action::Stats,
        "verify" => level::Action::Verify,
        "purge" => level::Action::Purge,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{other:?}: stats, verify or purge"
            )))
        }
    };
    let Some(cfg) = store_config(py)? else {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{} is not set: no remote store to look at",
            level::REMOTE_ENV
        )));
    };
    // Ctrl-C stops it between two keys.
    let report = super::interruptible(py, |cancel| level::survey(&cfg, action, cancel))?
        .map_err(pyo3::exceptions::PyOSError::new_err)?;
    Ok(pythonize::pythonize(py, &report)?)
}

/// The store's address without its credentials.
#[pyfunction]
pub fn remote_redacted(url: &str) -> String {
    crate::store::address::redacted(url)
}

/// What a signature covers: key, device (stripped), compiler and bytes, each with its
/// length.
#[pyfunction]
pub fn remote_signed_message<'py>(
    py: Python<'py>,
    key: &str,
    device: &str,
    compiler: &str,
    entry: &[u8],
) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &format::signed_message(key, device, compiler, entry))
}

/// A stored value from its header (key, device, compiler, signer, signature) and entry.
#[pyfunction]
pub fn remote_pack<'py>(
    py: Python<'py>,
    header: BTreeMap<String, String>,
    entry: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let field = |name: &str| {
        header.get(name).cloned().ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!("the header lacks {name:?}"))
        })
    };
    let h = format::Header {
        key: field("key")?,
        device: field("device")?,
        compiler: field("compiler")?,
        signer: field("signer")?,
        signature: field("signature")?,
    };
    Ok(PyBytes::new(py, &format::pack(&h, entry)))
}

/// A stored value's header (a dict) and entry; a `ValueError` for anything else.
#[pyfunction]
pub fn remote_unpack<'py>(
    py: Python<'py>,
    value: &[u8],
) -> PyResult<(BTreeMap<&'static str, String>, Bound<'py, PyBytes>)> {
    let (h, entry) = format::unpack(value).map_err(pyo3::exceptions::PyValueError::new_err)?;
    let header = BTreeMap::from([
        ("key", h.key),
        ("device", h.device),
        ("compiler", h.compiler),
        ("signer", h.signer),
        ("signature", h.signature),
    ]);
    Ok((header, PyBytes::new(py, entry)))
}

/// Why the entry at `name` fails verification against `XPU_ZEBIN_TRUSTED_KEYS` (None: a
/// trusted key signed it for this very key; `value` None: too large to read).
#[pyfunction]
pub fn remote_check(py: Python<'_>, name: &[u8], value: Option<&[u8]>) -> PyResult<Option<String>> {
    let trust = Trusted::from_env().map_err(|e| to_pyerr(py, e.into()))?;
    Ok(format::check(&trust, name, value))
}

/// Publish the local cache's entry for this request, signed (a read-write node with a
/// signing key); True when written.
#[pyfunction]
pub fn remote_publish(
    py: Python<'_>,
    spirv: Vec<u8>,
    device: String,
    options: PyRef<'_, PyOptions>,
) -> PyResult<bool> {
    if store_config(py)?.is_none() {
        return Ok(false);
    }
    let req = request(spirv, device, &options);
    let done = py.detach(|| engine::slot(&req)?.share());
    super::emit_warnings(py);
    done.map_err(|e| to_pyerr(py, e.into()))
}

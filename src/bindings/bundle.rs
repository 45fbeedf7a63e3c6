//! Bundle bindings: keys, writing, reading, verifying and looking up (`bundle.rs`).

use super::options::PyOptions;
use super::to_pyerr;
use crate::bundle::{self, Additions, Entry, Found, Manifest, TritonEntry, Unbuilt};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;

/// What a lookup answers: its status, the entry (or the other targets, or why refused),
/// the native bytes when found, and the bundles skipped.
type LookupAnswer<'py> = (
    &'static str,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyBytes>>,
    Vec<String>,
);

fn value_error(e: impl std::fmt::Display) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(e.to_string())
}

/// The key of a native build of `kernel` for the target profile `target_id`.
#[pyfunction]
pub fn bundle_key(
    py: Python<'_>,
    spirv: &[u8],
    kernel: &str,
    arch: &str,
    options: PyRef<'_, PyOptions>,
    target_id: &str,
) -> PyResult<String> {
    bundle::key(spirv, kernel, arch, &options.inner, target_id).map_err(|e| to_pyerr(py, e.into()))
}

/// A Triton cache entry as Python gives it: the entry dict (its `files` left out) and its
/// files, `(name, bytes)`.
type TritonAddition<'py> = (Bound<'py, PyAny>, Vec<(String, Vec<u8>)>);

/// Write entries (`(entry dict, native bytes)`), failures and Triton cache entries into
/// the bundle at `dir`; `header` holds `package`, `triton` and `targets`. Returns the
/// manifest.
#[pyfunction]
#[pyo3(signature = (dir, header, built, failures, triton=Vec::new()))]
pub fn bundle_write<'py>(
    py: Python<'py>,
    dir: PathBuf,
    header: Bound<'py, PyAny>,
    built: Vec<(Bound<'py, PyAny>, Vec<u8>)>,
    failures: Bound<'py, PyAny>,
    triton: Vec<TritonAddition<'py>>,
) -> PyResult<Bound<'py, PyAny>> {
    // Through JSON text: a manifest is read as a file is (its targets as text first).
    let h: serde_json::Value = pythonize::depythonize(&header).map_err(value_error)?;
    let mut h: Manifest = serde_json::from_str(&h.to_string()).map_err(value_error)?;
    h.format = bundle::FORMAT.to_string();
    let built = built
        .into_iter()
        .map(|(e, bytes)| {
            Ok((
                pythonize::depythonize::<Entry>(&e).map_err(value_error)?,
                bytes,
            ))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let failures: Vec<Unbuilt> = pythonize::depythonize(&failures).map_err(value_error)?;
    let triton = triton
        .into_iter()
        .map(|(e, files)| {
            let e = e.call_method1("copy", ())?;
            e.set_item("files", Vec::<String>::new())?;
            Ok((
                pythonize::depythonize::<TritonEntry>(&e).map_err(value_error)?,
                files,
            ))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let additions = Additions {
        built,
        failures,
        triton,
    };
    let manifest = py
        .detach(|| bundle::write(&dir, h, additions))
        .map_err(|e| to_pyerr(py, e.into()))?;
    Ok(pythonize::pythonize(py, &manifest)?)
}

/// The bundle's manifest, checked.
#[pyfunction]
pub fn bundle_read<'py>(py: Python<'py>, dir: PathBuf) -> PyResult<Bound<'py, PyAny>> {
    let manifest = bundle::read(&dir).map_err(|e| to_pyerr(py, e.into()))?;
    Ok(pythonize::pythonize(py, &manifest)?)
}

/// The bundle's native entries for the target profiles `target_ids` (its manifest
/// checked), as `(key, kernel, build_flags)`: what this machine may load, without the
/// rest of a large manifest in Python (`bundle_native` reads one).
#[pyfunction]
pub fn bundle_entries_for(
    py: Python<'_>,
    dir: PathBuf,
    target_ids: Vec<String>,
) -> PyResult<Vec<(String, String, String)>> {
    let manifest = py
        .detach(|| bundle::read(&dir))
        .map_err(|e| to_pyerr(py, e.into()))?;
    let mine = manifest.entries.into_iter();
    Ok(mine
        .filter(|e| target_ids.contains(&e.target_id))
        .map(|e| (e.key, e.kernel, e.build_flags))
        .collect())
}

/// The zebin of the bundle's native entry `key`, checked (its file as stored and what it
/// holds, a zebin of its kernel); `InvalidArgumentError` says why it is not.
#[pyfunction]
pub fn bundle_native<'py>(
    py: Python<'py>,
    dir: PathBuf,
    key: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let zebin = py.detach(|| bundle::native(&dir, key)).map_err(|why| {
        let e = crate::error::BuildError::new(crate::error::ErrorKind::InvalidArgument, why);
        to_pyerr(py, e.into())
    })?;
    Ok(PyBytes::new(py, &zebin))
}

/// Every entry checked: `{"ok": [keys], "bad": [(key, why)]}` (`ok` empty with
/// `bad_only`).
#[pyfunction]
#[pyo3(signature = (dir, bad_only=false))]
pub fn bundle_verify<'py>(
    py: Python<'py>,
    dir: PathBuf,
    bad_only: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let mut report = py
        .detach(|| bundle::verify(&dir))
        .map_err(|e| to_pyerr(py, e.into()))?;
    if bad_only {
        report.ok = Vec::new(); // a large bundle's every key is not needed
    }
    Ok(pythonize::pythonize(py, &report)?)
}

/// Look `key` up in `dirs` for `kernel` on the target profile `target_id`: `(status,
/// what, bytes, skipped)`, status `"native"` (what: the entry), `"missing"` (what: the ids
/// of other targets that have the kernel) or `"refused"` (what: why); `skipped` says which
/// bundles could not be read or were made from another Triton's SPIR-V than `triton` (the
/// caller's Triton version).
#[pyfunction]
#[pyo3(signature = (dirs, key, kernel, target_id, triton=None))]
pub fn bundle_lookup<'py>(
    py: Python<'py>,
    dirs: Vec<PathBuf>,
    key: &str,
    kernel: &str,
    target_id: &str,
    triton: Option<&str>,
) -> PyResult<LookupAnswer<'py>> {
    let bundle::Lookup { found, skipped } =
        py.detach(|| bundle::lookup(&dirs, key, kernel, target_id, triton));
    Ok(match found {
        Found::Native(entry, bytes) => (
            "native",
            pythonize::pythonize(py, &*entry)?,
            Some(PyBytes::new(py, &bytes)),
            skipped,
        ),
        Found::Missing { other_target_ids } => (
            "missing",
            pythonize::pythonize(py, &other_target_ids)?,
            None,
            skipped,
        ),
        Found::Refused(why) => ("refused", why.into_pyobject(py)?.into_any(), None, skipped),
    })
}

/// Why the bundle at `dir` cannot be used here, or None when it can: a file (an archive,
/// used once imported), no manifest, a manifest that cannot be read, or one made from
/// another Triton's SPIR-V than `triton` (the caller's Triton version). From the index
/// `bundle_lookup` reads: a manifest is read once per change.
#[pyfunction]
#[pyo3(signature = (dir, triton=None))]
pub fn bundle_usable(py: Python<'_>, dir: PathBuf, triton: Option<&str>) -> Option<String> {
    py.detach(|| bundle::unusable(&dir, triton))
}

/// Copy a bundle, entry by checked entry, into the new directory `dest`; returns how
/// many entries.
#[pyfunction]
pub fn bundle_copy(py: Python<'_>, src: PathBuf, dest: PathBuf) -> PyResult<usize> {
    py.detach(|| bundle::copy_verified(&src, &dest))
        .map_err(|e| to_pyerr(py, e.into()))
}

/// A checked Triton entry as Python gets it: the entry dict and its files.
type CheckedTritonEntry<'py> = (Bound<'py, PyAny>, Vec<(String, Bound<'py, PyBytes>)>);

/// The bundle's Triton cache entries for some target profiles, from one read of its
/// manifest (and its signature checked when keys are trusted), each yielded checked with
/// its files: one entry's files in memory at a time, whatever the bundle's size. An entry
/// that fails its checks is an `InvalidArgumentError` when it is reached.
#[pyclass(module = "xpu_zebin._core")]
pub struct TritonEntries {
    dir: PathBuf,
    natives: bundle::Natives,
    entries: std::vec::IntoIter<bundle::TritonEntry>,
    /// The manifest's `triton_key`: the Triton build its entries were made by.
    #[pyo3(get)]
    triton_key: Option<String>,
}

#[pymethods]
impl TritonEntries {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __len__(&self) -> usize {
        self.entries.len()
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<CheckedTritonEntry<'py>>> {
        let Some(entry) = self.entries.next() else {
            return Ok(None);
        };
        let (dir, natives) = (&self.dir, &self.natives);
        let files = py
            .detach(|| bundle::triton_files(dir, natives, &entry))
            .map_err(|why| {
                let e =
                    crate::error::BuildError::new(crate::error::ErrorKind::InvalidArgument, why);
                to_pyerr(py, e.into())
            })?;
        let files = files
            .into_iter()
            .map(|(name, bytes)| (name, PyBytes::new(py, &bytes)))
            .collect();
        Ok(Some((pythonize::pythonize(py, &entry)?, files)))
    }
}

/// The bundle's Triton cache entries for the target profiles `target_ids`, to be read
/// one at a time, each checked (`TritonEntries`).
#[pyfunction]
pub fn bundle_triton_entries(
    py: Python<'_>,
    dir: PathBuf,
    target_ids: Vec<String>,
) -> PyResult<TritonEntries> {
    let (natives, entries, triton_key) = py
        .detach(|| {
            let mut manifest = bundle::read(&dir)?;
            bundle::check_trusted(&dir, &manifest)?;
            // A Triton entry's native binary is one of its own target's entries.
            let asked = |target: &String| target_ids.contains(target);
            manifest.entries.retain(|e| asked(&e.target_id));
            manifest.triton_cache.retain(|t| asked(&t.target_id));
            let natives = bundle::Natives::of(&manifest.entries);
            crate::error::Result::Ok((natives, manifest.triton_cache, manifest.triton_key))
        })
        .map_err(|e: crate::error::BuildError| to_pyerr(py, e.into()))?;
    Ok(TritonEntries {
        dir,
        natives,
        entries: entries.into_iter(),
        triton_key,
    })
}

/// The blake3 a bundle's manifest records for `data` (hex).
#[pyfunction]
pub fn bundle_checksum(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// Write the bundle at `dir` as one archive file `out`; returns how many files it holds.
#[pyfunction]
pub fn bundle_pack(py: Python<'_>, dir: PathBuf, out: PathBuf) -> PyResult<usize> {
    py.detach(|| bundle::pack(&dir, &out))
        .map_err(|e| to_pyerr(py, e.into()))
}

/// Unpack the archive `archive` into the new directory `dest`; returns its manifest.
#[pyfunction]
pub fn bundle_unpack<'py>(
    py: Python<'py>,
    archive: PathBuf,
    dest: PathBuf,
) -> PyResult<Bound<'py, PyAny>> {
    let manifest = py
        .detach(|| bundle::unpack(&archive, &dest))
        .map_err(|e| to_pyerr(py, e.into()))?;
    Ok(pythonize::pythonize(py, &manifest)?)
}

/// The compiler's identity as keys and manifests record it (`ocloc` as `compile` finds it).
#[pyfunction]
#[pyo3(signature = (ocloc=None))]
pub fn compiler_identity(py: Python<'_>, ocloc: Option<PathBuf>) -> PyResult<String> {
    py.detach(|| {
        let path = crate::ocloc::discover(ocloc.as_deref())?;
        crate::ocloc::identity(&path)
    })
    .map_err(|e| to_pyerr(py, e.into()))
}

/// Where bundles are imported: `bundles` in the cache directory.
#[pyfunction]
pub fn bundles_dir(py: Python<'_>) -> PyResult<PathBuf> {
    crate::cache::default_dir()
        .map(|d| d.join("bundles"))
        .map_err(|why| {
            let e = crate::error::BuildError::new(crate::error::ErrorKind::InvalidArgument, why);
            to_pyerr(py, e.into())
        })
}

/// Sign the bundle at `dir` with `XPU_ZEBIN_SIGNING_KEY`; returns the signer's public key.
#[pyfunction]
pub fn bundle_sign(py: Python<'_>, dir: PathBuf) -> PyResult<String> {
    bundle::sign(&dir).map_err(|e| to_pyerr(py, e.into()))
}

/// What Python says of the bundles to ask: Triton's release, the device's target
/// profiles, most specific first, as `(ocloc device, id)`, and the bundles
/// (`bundle_search_path`'s).
pub type BundleQuery = (Option<String>, Vec<(String, String)>, Vec<PathBuf>);

pub(crate) fn bundle_query((triton, targets, dirs): BundleQuery) -> crate::bundle::search::Query {
    crate::bundle::search::Query {
        triton,
        targets,
        dirs,
    }
}

/// `bundle=` as a caller gave it (`xpu_zebin.bundle.query()`'s answer, or None), named
/// `what` in the error: anything else is an `InvalidArgumentError` saying what is expected.
pub(crate) fn bundle_arg(
    py: Python<'_>,
    value: Option<&Bound<'_, PyAny>>,
    what: &str,
) -> PyResult<Option<crate::bundle::search::Query>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    match value.extract::<BundleQuery>() {
        Ok(query) => Ok(Some(bundle_query(query))),
        Err(_) => {
            let shown: String = value.repr().map_or_else(|_| "?".into(), |r| r.to_string());
            let shown: String = shown.chars().take(80).collect();
            let message = format!(
                "{what}={shown} is not valid: expected what xpu_zebin.bundle.query() returns \
                 (Triton's release or None, [(ocloc device, profile id)], [bundle directories])"
            );
            let error =
                crate::error::BuildError::new(crate::error::ErrorKind::InvalidArgument, message);
            Err(to_pyerr(py, error.into()))
        }
    }
}

/// The build of `kernel` (from `spirv`, with `options`) that a bundle this process uses
/// holds for the first of `bundle`'s targets that has one: `(native, flags, False)`;
/// else `(None, why, refused)`, `refused` when a bundle's entry failed its checks.
#[pyfunction]
pub fn bundle_find<'py>(
    py: Python<'py>,
    spirv: Vec<u8>,
    kernel: String,
    options: PyRef<'_, PyOptions>,
    bundle: BundleQuery,
) -> (Option<Bound<'py, PyBytes>>, String, bool) {
    let options = options.inner.clone();
    let found =
        py.detach(|| crate::bundle::search::find(&spirv, &kernel, &options, &bundle_query(bundle)));
    super::emit_warnings(py);
    match found {
        Ok(b) => (Some(PyBytes::new(py, &b.native)), b.build_flags, false),
        Err(crate::bundle::search::Missed::Absent(why)) => (None, why, false),
        Err(crate::bundle::search::Missed::Refused(why)) => (None, why, true),
    }
}

/// The bundles the drop-ins use for Triton release `triton`: `$XPU_ZEBIN_BUNDLE`, then
/// every imported one; one that cannot be used is said once and skipped.
#[pyfunction]
#[pyo3(signature = (triton=None))]
pub fn bundle_search_path(py: Python<'_>, triton: Option<String>) -> Vec<PathBuf> {
    let dirs = py.detach(|| crate::bundle::search::search_path(triton.as_deref()));
    super::emit_warnings(py);
    dirs
}

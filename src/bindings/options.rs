//! `Options`: the one typed options object every entry point builds its request from
//! (`compile`, `compile_many`, `compile_and_load`, the CLI, the Triton drop-ins). Its
//! defaults are `crate::options::Options::default()`; a bad value is an
//! `InvalidArgumentError` naming the option, raised when the object is made.

use super::to_pyerr;
use crate::error::{BuildError, ErrorKind};
use crate::options::Options;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString};
use std::path::PathBuf;

/// Build options, immutable; `replace(**changes)` gives a changed copy.
#[pyclass(
    name = "Options",
    frozen,
    eq,
    hash,
    skip_from_py_object,
    module = "xpu_zebin._core"
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyOptions {
    pub inner: Options,
}

/// The option names, in the order `repr` and `as_dict` show them.
const NAMES: [&str; 14] = [
    "build_flags",
    "grf_mode",
    "num_warps",
    "kernel_name",
    "device_arch",
    "max_grf_mode",
    "ocloc",
    "timeout",
    "cache",
    "cache_dir",
    "spill_policy",
    "speculative",
    "isolated",
    "allow_unresolved",
];

fn invalid(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>, expected: &str) -> PyErr {
    let shown = value
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "?".into());
    let e = BuildError::new(
        ErrorKind::InvalidArgument,
        format!("{name}={shown} is not valid: expected {expected}"),
    );
    to_pyerr(py, e.into())
}

fn text(name: &str, v: &Bound<'_, PyAny>) -> PyResult<String> {
    match v.cast::<PyString>() {
        Ok(s) => Ok(s.to_cow()?.into_owned()),
        Err(_) => Err(invalid(v.py(), name, v, "a str")),
    }
}

fn flag(name: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
    match v.cast::<PyBool>() {
        Ok(b) => Ok(b.is_true()),
        Err(_) => Err(invalid(v.py(), name, v, "True or False")),
    }
}

/// A whole number (never a bool) that fits a u32.
fn count(name: &str, v: &Bound<'_, PyAny>) -> PyResult<u32> {
    let n = (v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>())
        .then(|| v.extract::<u32>().ok())
        .flatten();
    n.ok_or_else(|| invalid(v.py(), name, v, "an integer from 0 to 4294967295"))
}

/// A path: str, bytes or os.PathLike; not empty (that would be the current directory),
/// no NUL (the system would cut it).
fn path(name: &str, v: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    const EXPECTED: &str = "a non-empty path without NUL (str, bytes or os.PathLike)";
    let p = if let Ok(b) = v.cast::<PyBytes>() {
        PathBuf::from(std::ffi::OsStr::from_bytes(b.as_bytes()))
    } else if v.is_instance_of::<PyBool>() {
        return Err(invalid(v.py(), name, v, EXPECTED));
    } else {
        v.extract::<PathBuf>()
            .map_err(|_| invalid(v.py(), name, v, EXPECTED))?
    };
    let bytes = p.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.contains(&0) {
        return Err(invalid(v.py(), name, v, EXPECTED));
    }
    Ok(p)
}

fn seconds(name: &str, v: &Bound<'_, PyAny>) -> PyResult<std::time::Duration> {
    let number = (v.is_instance_of::<PyFloat>() || v.is_instance_of::<PyInt>())
        && !v.is_instance_of::<PyBool>();
    let expected = "seconds, a finite number from 0 to 1e9";
    let value: f64 = if number {
        v.extract()
            .map_err(|_| invalid(v.py(), name, v, expected))?
    } else {
        return Err(invalid(v.py(), name, v, expected));
    };
    crate::knobs::seconds_argument(name, value).map_err(|e| to_pyerr(v.py(), e.into()))
}

/// Upstream's max GRF mode: 128, 256 or 512, as an int or as Triton passes it, a str.
fn grf_size(name: &str, v: &Bound<'_, PyAny>) -> PyResult<u32> {
    let n = if v.is_instance_of::<PyString>() {
        let t = text(name, v)?;
        let t = t.trim();
        let digits = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        digits.then(|| t.parse::<u32>().ok()).flatten()
    } else {
        count(name, v).ok()
    };
    match n {
        Some(n @ (128 | 256 | 512)) => Ok(n),
        _ => Err(invalid(v.py(), name, v, "128, 256 or 512")),
    }
}

/// Set `name` on `o` from `v`; `None` means the default for the options that have one
/// meaning "choose", and is an error for the others.
fn set(o: &mut Options, name: &str, v: &Bound<'_, PyAny>) -> PyResult<()> {
    fn opt<T>(
        name: &str,
        v: &Bound<'_, PyAny>,
        f: fn(&str, &Bound<'_, PyAny>) -> PyResult<T>,
    ) -> PyResult<Option<T>> {
        if v.is_none() {
            Ok(None)
        } else {
            f(name, v).map(Some)
        }
    }
    match name {
        "build_flags" => o.build_flags = text(name, v)?,
        "grf_mode" => {
            o.grf_mode = text(name, v)?;
            crate::grf::GrfMode::parse(&o.grf_mode).map_err(|e| to_pyerr(v.py(), e.into()))?;
        }
        "num_warps" => o.num_warps = opt(name, v, count)?,
        "kernel_name" => o.kernel_name = opt(name, v, text)?,
        "device_arch" => o.device_arch = opt(name, v, text)?,
        "max_grf_mode" => o.max_grf_mode = opt(name, v, grf_size)?,
        "ocloc" => o.ocloc = opt(name, v, path)?,
        "timeout" => o.timeout = opt(name, v, seconds)?,
        "cache" => o.cache = flag(name, v)?,
        "cache_dir" => o.cache_dir = opt(name, v, path)?,
        "spill_policy" => {
            // Blank is unset, as for the variable: the environment's policy applies.
            o.spill_policy = opt(name, v, text)?.filter(|t| !t.trim().is_empty());
            if let Some(p) = &o.spill_policy {
                crate::spill::SpillPolicy::parse(p, name)
                    .map_err(|e| to_pyerr(v.py(), e.into()))?;
            }
        }
        "speculative" => o.speculative = opt(name, v, flag)?,
        "isolated" => o.isolated = opt(name, v, flag)?,
        "allow_unresolved" => o.allow_unresolved = flag(name, v)?,
        "spill_threshold" => {
            let e = BuildError::new(
                ErrorKind::InvalidArgument,
                "spill_threshold was replaced by spill_policy: \"bytes:N\" retries above N \
                 bytes, \"slots:N\" above N slots per lane, \"any\" on any spill (or \
                 XPU_ZEBIN_SPILL_POLICY)",
            );
            return Err(to_pyerr(v.py(), e.into()));
        }
        other => {
            return Err(PyTypeError::new_err(format!(
                "unknown option '{other}': options are {}",
                NAMES.join(", ")
            )))
        }
    }
    Ok(())
}

fn with_changes(mut o: Options, changes: Option<&Bound<'_, PyDict>>) -> PyResult<Options> {
    for (k, v) in changes.into_iter().flatten() {
        set(&mut o, &k.extract::<String>()?, &v)?;
    }
    Ok(o)
}

#[pymethods]
impl PyOptions {
    #[new]
    #[pyo3(signature = (**options))]
    fn new(options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Ok(PyOptions {
            inner: with_changes(Options::default(), options)?,
        })
    }

    /// A copy with `changes` applied.
    #[pyo3(signature = (**changes))]
    fn replace(&self, changes: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Ok(PyOptions {
            inner: with_changes(self.inner.clone(), changes)?,
        })
    }

    /// Every option by name (paths as `pathlib.Path`, the timeout in seconds).
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = &self.inner;
        let d = PyDict::new(py);
        d.set_item("build_flags", &o.build_flags)?;
        d.set_item("grf_mode", &o.grf_mode)?;
        d.set_item("num_warps", o.num_warps)?;
        d.set_item("kernel_name", &o.kernel_name)?;
        d.set_item("device_arch", &o.device_arch)?;
        d.set_item("max_grf_mode", o.max_grf_mode)?;
        d.set_item("ocloc", &o.ocloc)?;
        d.set_item("timeout", o.timeout.map(|t| t.as_secs_f64()))?;
        d.set_item("cache", o.cache)?;
        d.set_item("cache_dir", &o.cache_dir)?;
        d.set_item("spill_policy", &o.spill_policy)?;
        d.set_item("speculative", o.speculative)?;
        d.set_item("isolated", o.isolated)?;
        d.set_item("allow_unresolved", o.allow_unresolved)?;
        Ok(d)
    }

    fn __getattr__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        match self.as_dict(py)?.get_item(name)? {
            Some(v) => Ok(v),
            None => Err(pyo3::exceptions::PyAttributeError::new_err(format!(
                "Options has no option '{name}'"
            ))),
        }
    }

    /// Picklable (process pools, Dask): made again from its options.
    fn __getnewargs_ex__<'py>(&self, py: Python<'py>) -> PyResult<((), Bound<'py, PyDict>)> {
        Ok(((), self.as_dict(py)?))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let d = self.as_dict(py)?;
        let parts = NAMES
            .iter()
            .map(|n| {
                Ok(format!(
                    "{n}={}",
                    d.get_item(n)?.map_or("None".into(), |v| v
                        .repr()
                        .map_or("?".into(), |r| r.to_string()))
                ))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(format!("Options({})", parts.join(", ")))
    }
}

/// The spill policy in force for each path, and upstream's lines it can name: `policy`
/// (else `$XPU_ZEBIN_SPILL_POLICY`, else `upstream`) resolved for the JIT (`jit`), the
/// offline engine (`offline`) and each upstream path; `lines` lists upstream's rules by
/// line (`spill.rs`). A bad policy is an `InvalidArgumentError`.
#[pyfunction]
#[pyo3(signature = (policy=None))]
pub fn spill_rules<'py>(py: Python<'py>, policy: Option<&str>) -> PyResult<Bound<'py, PyDict>> {
    use crate::spill::{self, Path, SpillPolicy, UpstreamPath};
    let from_env =
        crate::knobs::text_knob(spill::SPILL_POLICY_ENV).map_err(|e| to_pyerr(py, e.into()))?;
    let chosen =
        SpillPolicy::choose(policy, from_env.as_deref()).map_err(|e| to_pyerr(py, e.into()))?;
    let rule = |r: spill::Rule| -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("name", r.name())?;
        d.set_item("describe", r.describe())?;
        Ok(d)
    };
    let out = PyDict::new(py);
    out.set_item("policy", policy.map(str::to_string).or(from_env))?;
    out.set_item("jit", rule(chosen.rule(Path::Jit))?)?;
    out.set_item("offline", rule(chosen.rule(Path::Offline))?)?;
    let lines = pyo3::types::PyList::empty(py);
    for line in spill::LINES {
        let d = PyDict::new(py);
        d.set_item("id", line.id)?;
        d.set_item("what", line.what)?;
        for path in UpstreamPath::ALL {
            d.set_item(path.name(), rule(line.rule(path))?)?;
        }
        lines.append(d)?;
    }
    out.set_item("lines", lines)?;
    out.set_item("current_line", spill::CURRENT_LINE)?;
    out.set_item("last_checked", spill::LAST_CHECKED)?;
    Ok(out)
}

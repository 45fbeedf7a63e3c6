//! xpu-zebin: SPIR-V to Intel GPU zebin with automatic large-GRF fallback.
//!
//! The engine lives in its own modules (one concern each); this file only declares them and,
//! with the `python` feature (maturin turns it on), binds them as `xpu_zebin._core`
//! (the bindings themselves are in `bindings/`, one file per concern).

pub mod answer;
pub mod attempt;
pub mod batch;
#[cfg(feature = "python")]
mod bindings;
pub mod bounded;
pub mod bundle;
pub mod cache;
pub mod classify;
pub mod compressed;
pub mod cores;
pub mod crash_watch;
pub mod diag;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod grf;
pub mod key;
pub mod knobs;
pub mod ladder;
pub mod levels;
pub mod libocloc;
pub mod ocloc;
pub mod options;
pub mod pool;
pub mod private;
pub mod signing;
pub mod spill;
pub mod spirv;
pub mod store;
pub mod sync;
pub mod trusted;
pub mod ze;
pub mod zebin;

#[cfg(feature = "python")]
#[pyo3::pymodule]
mod _core {
    use pyo3::prelude::*;

    #[pymodule_export]
    use crate::bindings::bundle::{
        bundle_checksum, bundle_copy, bundle_entries_for, bundle_find, bundle_key, bundle_lookup,
        bundle_native, bundle_pack, bundle_read, bundle_search_path, bundle_sign,
        bundle_triton_entries, bundle_unpack, bundle_usable, bundle_verify, bundle_write,
        bundles_dir, compiler_identity, TritonEntries,
    };
    #[pymodule_export]
    use crate::bindings::level_zero::{
        compile_and_load, compile_and_load_many, devices, ze_handle_counts, LoadedKernel,
    };
    #[pymodule_export]
    use crate::bindings::offline::{
        _compile_result, compile, compile_many, find_ocloc, forget_cached, opencl_to_spirv,
        validate_spirv, zebin_info, CompileResult,
    };
    #[pymodule_export]
    use crate::bindings::options::{spill_rules, PyOptions};
    #[pymodule_export]
    use crate::bindings::remote::{
        cache_slot, key_generate, remote_check, remote_config, remote_counts, remote_fetch_signed,
        remote_pack, remote_publish, remote_publish_signed, remote_redacted, remote_reset,
        remote_signed_message, remote_survey, remote_unpack, sign, signing_public,
        trusted_keys_set, verify, CacheSlot,
    };
    #[pymodule_export]
    use crate::bindings::triton::{claim_triton_group, FrontEndClaim};
    #[pymodule_export]
    use crate::bindings::workers::{
        bool_knob, broken_workers, cache_stats, compiler_refusals, compiler_refused,
        configure_workers, count_triton_cache_hit, doctor, forget_compiler_refusals,
        join_multiprocess_batch, knobs, ocloc_worker_unavailable, remember_compiler_refused,
        serve_worker, shutdown_workers,
    };
    #[pymodule_export]
    use crate::bindings::{cancel_running, default_jobs, error_kinds, Attempt, AttemptError};

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("GRF_FLAGS", crate::grf::GRF_FLAGS.to_vec())?;
        m.add("OCLOC_ENV", crate::ocloc::OCLOC_ENV)?;
        m.add("CACHE_DIR_ENV", crate::cache::CACHE_DIR_ENV)?;
        m.add("TIMEOUT_ENV", crate::knobs::TIMEOUT_ENV)?;
        m.add("PERSISTENT_ENV", crate::pool::PERSISTENT_ENV)?;
        m.add("SIMULATED_DEVICE_ENV", crate::ze::SIMULATED_DEVICE_ENV)?;
        m.add("MAX_SECONDS", crate::knobs::MAX_SECONDS)?;
        m.add("SPILL_POLICY_ENV", crate::spill::SPILL_POLICY_ENV)?;
        m.add("ISOLATED_ENV", crate::options::ISOLATED_ENV)?;
        m.add("SIGNING_KEY_ENV", crate::signing::SIGNING_KEY_ENV)?;
        m.add("TRUSTED_KEYS_ENV", crate::signing::TRUSTED_KEYS_ENV)?;
        use crate::store::{format, remote};
        m.add("REMOTE_ENV", remote::REMOTE_ENV)?;
        m.add("REMOTE_MODE_ENV", remote::MODE_ENV)?;
        m.add("REMOTE_TIMEOUT_ENV", remote::TIMEOUT_ENV)?;
        m.add("REMOTE_TTL_ENV", remote::TTL_ENV)?;
        m.add("REMOTE_MAX_BYTES_ENV", remote::MAX_BYTES_ENV)?;
        m.add("REMOTE_PREFIX", format::PREFIX)?;
        m.add("REMOTE_TRITON_PREFIX", format::TRITON_PREFIX)?;
        m.add(
            "REMOTE_MAGIC",
            pyo3::types::PyBytes::new(m.py(), format::MAGIC),
        )?;
        m.add(
            "REMOTE_SIGNED_TAG",
            pyo3::types::PyBytes::new(m.py(), format::SIGNED_TAG),
        )?;
        Ok(())
    }
}

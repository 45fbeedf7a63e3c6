//! What the offline engine answers a request with (`Compiled`): the entry a level gave or
//! the ladder built (its record and native binary), for the kernel and device asked, its
//! registers, and whether a level answered.

use crate::attempt::{Attempt, Record};
use crate::cache::Counter;
use crate::grf;
use crate::spill::Spill;
use crate::spirv::GrfRequest;
use serde::{Deserialize, Serialize};

/// A successful compile.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Compiled {
    pub kernel: String,
    pub device: String,
    #[serde(skip)]
    pub binary: Vec<u8>,
    pub build_flags: String,
    pub grf_mode: String,
    pub n_regs: u32,
    /// The kernel's spills, bytes per hardware thread, and its SIMD width.
    pub spill: Spill,
    /// The first attempt failed and a large-GRF attempt rescued the build.
    pub recovered: bool,
    pub cached: bool,
    pub attempts: Vec<Attempt>,
    /// The chosen attempt's compiler output.
    pub log: String,
    /// Things worth logging that are not failures (cache problems, spill retries).
    #[serde(skip)]
    pub notes: Vec<String>,
    /// The level that answered (`levels`: a bundle, the local cache, the fleet's
    /// store), as its hits are counted; None: built now.
    #[serde(skip)]
    pub level: Option<Counter>,
}

/// What an answer says beside its entry: the request's kernel, device and GRF mode, and
/// the GRF mode its kernel asks for itself (its registers are read from the entry).
pub struct Answering<'a> {
    pub kernel: &'a str,
    pub device: &'a str,
    pub grf_mode: &'a str,
    pub own_grf: Option<GrfRequest>,
}

impl Compiled {
    /// The answer `record` and `binary` give to the request `a` describes; `level`: the
    /// level that answered, as its hits are counted (None: built now).
    pub fn new(
        record: Record,
        binary: Vec<u8>,
        a: &Answering<'_>,
        level: Option<Counter>,
        notes: Vec<String>,
    ) -> Self {
        Compiled {
            n_regs: grf::n_regs_with(&record.build_flags, a.own_grf, &binary, a.kernel),
            kernel: a.kernel.to_string(),
            device: a.device.to_string(),
            binary,
            build_flags: record.build_flags,
            grf_mode: a.grf_mode.to_string(),
            spill: record.spill,
            recovered: record.recovered,
            cached: level.is_some(),
            attempts: record.attempts,
            log: record.log,
            notes,
            level,
        }
    }
}

//! One attempt of the GRF ladder, as every backend (ocloc, Level Zero) makes it and the
//! ladder and the levels see it: its flags, time, spills and error (`Attempt`), what it
//! built (`Build`), and the record kept beside a native binary (`Record`). Below the
//! ladder, so that a backend's attempt needs nothing above it.

use crate::error::{AttemptError, Result};
use crate::spill::Spill;
use serde::{Deserialize, Serialize};

/// What one attempt built, as the ladder needs to see it.
pub trait Build {
    /// What the requested kernel spills.
    fn spill(&self) -> Spill;
    /// The compiler's output.
    fn log(&self) -> &str;
}

/// One build of the ladder.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attempt {
    pub build_flags: String,
    pub ok: bool,
    pub spill_size: Option<u64>,
    pub seconds: f64,
    /// When it started: seconds after its ladder began (two attempts overlapped when the
    /// second started before the first's `started + seconds`). 0 in entries of releases
    /// that did not keep it.
    #[serde(default)]
    pub started: f64,
    /// Why it failed, when it failed.
    pub error: Option<AttemptError>,
}

impl Attempt {
    pub fn new<B: Build>(flags: &str, seconds: f64, result: &Result<B>) -> Self {
        Attempt {
            build_flags: flags.to_string(),
            ok: result.is_ok(),
            spill_size: result.as_ref().ok().map(|b| b.spill().bytes),
            seconds,
            started: 0.0,
            error: result.as_ref().err().map(AttemptError::from),
        }
    }
}

/// One attempt and what it built.
pub type Tried<B> = (Attempt, Result<B>);

/// Make one attempt with `build`, timed and recorded.
pub fn timed<B: Build>(flags: &str, build: impl FnOnce() -> Result<B>) -> Tried<B> {
    let started = std::time::Instant::now();
    let result = build();
    let attempt = Attempt::new(flags, started.elapsed().as_secs_f64(), &result);
    (attempt, result)
}

/// What the levels keep beside a native binary, for either backend.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub build_flags: String,
    pub spill: Spill,
    pub attempts: Vec<Attempt>,
    /// The first attempt failed and a large-GRF attempt rescued the build.
    pub recovered: bool,
    /// The chosen attempt's compiler output.
    pub log: String,
}

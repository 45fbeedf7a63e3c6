//! One rung of the GRF ladder built by ocloc: the module compiled with one set of flags,
//! its zebin parsed for what the requested kernel spills, or the failure classified.

use super::{run, JobSpec};
use crate::attempt::{Attempt, Build, Tried};
use crate::classify::{classify_failure, Exit};
use crate::error::{BuildError, ErrorKind};
use crate::spill::Spill;
use crate::zebin;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// What every attempt of one request shares: the compiler, the target, the kernel whose
/// spills decide the ladder, and the time each attempt may take.
#[derive(Debug, Clone)]
pub struct Job {
    pub ocloc: PathBuf,
    /// The `ocloc -device` name, e.g. `pvc`.
    pub device: String,
    pub kernel: String,
    pub timeout: Option<Duration>,
}

/// One ocloc build of the module: its zebin and what the requested kernel spills.
pub struct Built {
    pub binary: Vec<u8>,
    spill: Spill,
    log: String,
}

impl Build for Built {
    fn spill(&self) -> Spill {
        self.spill
    }
    fn log(&self) -> &str {
        &self.log
    }
}

impl Job {
    /// Build `spirv` with `flags`, timed by ocloc's own run; any flag in `cancel` set
    /// kills the build.
    pub fn attempt(&self, spirv: &[u8], flags: &str, cancel: &[&AtomicBool]) -> Tried<Built> {
        let mut args = vec![
            "-spirv_input".to_string(),
            "-device".to_string(),
            self.device.clone(),
        ];
        if !flags.is_empty() {
            args.extend(["-options".to_string(), flags.to_string()]);
        }
        let spec = JobSpec {
            input: spirv,
            input_name: "kernel.spv",
            args,
            timeout: self.timeout,
            cancel,
        };
        let (result, seconds) = match run(&self.ocloc, &spec) {
            Err(e) => (Err(e), 0.0),
            Ok(run) => {
                let seconds = run.seconds;
                (self.built(run.exit, run.output, run.log), seconds)
            }
        };
        (Attempt::new(flags, seconds, &result), result)
    }

    /// What one run's exit and output say: the kernel's build, or why there is none.
    fn built(
        &self,
        exit: Exit,
        output: Option<Vec<u8>>,
        log: String,
    ) -> crate::error::Result<Built> {
        match (exit, output) {
            (Exit::Code(0), Some(binary)) => {
                match zebin::parse(&binary).and_then(|info| info.kernel_spill(&self.kernel)) {
                    Ok(spill) => Ok(Built { spill, binary, log }),
                    Err(e) => Err(e.with_log(log)),
                }
            }
            (Exit::Code(0), None) => Err(BuildError::new(
                ErrorKind::DegenerateBinary,
                "ocloc reported success but wrote no binary",
            )
            .with_log(log)),
            (exit, _) => Err(classify_failure(exit, &log)),
        }
    }
}

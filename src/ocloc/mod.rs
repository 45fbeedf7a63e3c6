//! How one ocloc attempt is built: one compile job on a persistent libocloc worker
//! (`src/pool/`), or else in a one-shot ocloc process (`process.rs`), for a compiler found
//! and identified by `find.rs`.
//!
//! A job runs with argv only (never a shell), in a private temp dir removed afterwards, in
//! its own process group so a timeout or Ctrl-C kills ocloc and anything it started.

mod attempt;
mod find;
mod process;
pub mod wire;

pub use attempt::{Built, Job};
pub use find::{discover, identity, worker_library, worker_unavailable, OCLOC_ENV};
/// The compilers' identities and worker kinds known so far (the pool's tests hold them).
#[cfg(test)]
pub(crate) use find::{IDENTITIES, SPECS};
pub use process::run_process;

use crate::classify::{classify_failure, Exit};
use crate::error::{BuildError, ErrorKind, Result};
use crate::pool;
use find::worker_spec;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

fn missing(message: String) -> BuildError {
    BuildError::new(ErrorKind::ToolchainMissing, message)
}

/// One ocloc invocation's result, before classification.
#[derive(Debug)]
pub struct RawRun {
    pub exit: Exit,
    /// stdout and stderr, interleaved as ocloc wrote them.
    pub log: String,
    /// The file ocloc wrote into its output directory, if any.
    pub output: Option<Vec<u8>>,
    pub seconds: f64,
}

/// What a compile job needs. Every flag in `cancel` is polled; any one set kills the job
/// (Ctrl-C for the whole batch, or a speculative attempt that lost).
pub struct JobSpec<'a> {
    pub input: &'a [u8],
    pub input_name: &'a str,
    /// ocloc arguments after `compile -file <input> -output kernel -out_dir <dir> -output_no_suffix`.
    pub args: Vec<String>,
    pub timeout: Option<Duration>,
    pub cancel: &'a [&'a AtomicBool],
}

/// Run `ocloc compile` on `spec.input` and collect what it wrote: on a persistent worker
/// when this compiler has one, else in a one-shot ocloc process.
pub fn run(ocloc: &Path, spec: &JobSpec) -> Result<RawRun> {
    let started = Instant::now();
    // IGC reads `-igc_opts` (shader dumps, upstream's `dump_shader_info`) once per process:
    // a persistent worker would honour them only on its first job.
    let on_worker = !spec.args.iter().any(|a| a.contains("-igc_opts"));
    match on_worker.then(|| run_on_worker(ocloc, spec)).flatten() {
        Some(run) => Ok(run),
        None => {
            // The one-shot run gets what is left of the request's time, not a fresh limit.
            let timeout = spec.timeout.map(|t| t.saturating_sub(started.elapsed()));
            if timeout.is_some_and(|t| t.is_zero()) {
                return Ok(RawRun {
                    exit: Exit::TimedOut {
                        limit: spec.timeout.unwrap_or_default(),
                    },
                    log: String::new(),
                    output: None,
                    seconds: started.elapsed().as_secs_f64(),
                });
            }
            let rest = JobSpec {
                input: spec.input,
                input_name: spec.input_name,
                args: spec.args.clone(),
                timeout,
                cancel: spec.cancel,
            };
            let _busy = pool::BusyGuard::new();
            run_process(ocloc, &rest).map(|mut run| {
                if let Exit::TimedOut { limit } = &mut run.exit {
                    *limit = spec.timeout.unwrap_or_default(); // the whole limit
                }
                run
            })
        }
    }
}

/// Run a job on a persistent worker. `None`: no worker for this compiler (use one-shot),
/// or the worker died mid-job (re-run one-shot to classify what happened).
fn run_on_worker(ocloc: &Path, spec: &JobSpec) -> Option<RawRun> {
    if !pool::persistent_enabled() {
        return None;
    }
    let kind = worker_spec(ocloc).ok()?;
    let header = serde_json::to_vec(&wire::Request {
        args: spec.args.clone(),
        input_name: spec.input_name.to_string(),
    })
    .ok()?;
    let started = Instant::now();
    let reply = pool::call(&kind, &header, spec.input, spec.cancel, spec.timeout).ok()?;
    from_reply(reply, spec.timeout, started.elapsed().as_secs_f64())
}

/// What a worker's reply says of the job; `None`: re-run it one-shot to classify it.
fn from_reply(reply: pool::Reply, timeout: Option<Duration>, seconds: f64) -> Option<RawRun> {
    match reply {
        pool::Reply::Done {
            header,
            payload,
            chatter,
        } => {
            let response: wire::Response = serde_json::from_slice(&header).ok()?;
            Some(RawRun {
                // In-process ocloc returns what the CLI would turn into its exit status.
                exit: Exit::Code(response.code & 0xff),
                log: response.log + &chatter,
                output: response.wrote_output.then_some(payload),
                seconds,
            })
        }
        // Its watch ended it in the compiler's crash handler: a crash, said now. A one-shot
        // re-run could hang in the same handler.
        pool::Reply::Died {
            exit: exit @ Exit::StuckInCrashHandler,
            chatter,
        } => Some(RawRun {
            exit,
            log: chatter,
            output: None,
            seconds,
        }),
        // An IGC crash (or a worker it left garbled): the one-shot re-run classifies it
        // from ocloc's own exit.
        pool::Reply::Died { .. } | pool::Reply::Garbled { .. } => None,
        pool::Reply::TimedOut { chatter, .. } => Some(RawRun {
            exit: Exit::TimedOut {
                limit: timeout.unwrap_or_default(),
            },
            log: chatter,
            output: None,
            seconds,
        }),
        pool::Reply::Cancelled => Some(RawRun {
            exit: Exit::Cancelled,
            log: String::new(),
            output: None,
            seconds,
        }),
    }
}

/// OpenCL C -> SPIR-V with `ocloc -spv_only` (samples and test fixtures), with the same
/// checks, time limit and cancel as a compile.
pub fn opencl_to_spirv(
    ocloc: &Path,
    source: &str,
    device: &str,
    options: &str,
    cancel: &AtomicBool,
) -> Result<Vec<u8>> {
    crate::knobs::check_request(&[("device", device), ("options", options), ("source", source)])?;
    let timeout = crate::knobs::effective_timeout(None)?;
    let mut args = vec![
        "-device".to_string(),
        device.to_string(),
        "-spv_only".to_string(),
    ];
    if !options.is_empty() {
        args.extend(["-options".to_string(), options.to_string()]);
    }
    let run = run(
        ocloc,
        &JobSpec {
            input: source.as_bytes(),
            input_name: "kernel.cl",
            args,
            timeout,
            cancel: &[cancel],
        },
    )?;
    match (run.exit, run.output) {
        (Exit::Code(0), Some(spirv)) => Ok(spirv),
        (Exit::Code(0), None) => Err(BuildError::new(
            ErrorKind::BuildFailure,
            "ocloc -spv_only reported success but wrote no SPIR-V",
        )
        .with_log(run.log)),
        (exit, _) => Err(classify_failure(exit, &run.log)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker its watch ended in the compiler's crash handler is a crash, said at once:
    /// no one-shot re-run (which could hang in the same handler). Other deaths are re-run.
    #[test]
    fn a_worker_ended_in_a_crash_handler_is_a_crash_without_a_re_run() {
        let died = |exit| pool::Reply::Died {
            exit,
            chatter: "IGC said this".into(),
        };
        let run = from_reply(died(Exit::StuckInCrashHandler), None, 1.0).unwrap();
        assert_eq!(run.exit, Exit::StuckInCrashHandler);
        assert_eq!(run.log, "IGC said this");
        let e = classify_failure(run.exit, &run.log);
        assert_eq!(e.kind, ErrorKind::CompilerCrash);
        assert_eq!(e.log, "IGC said this");
        assert!(from_reply(died(Exit::Signal(libc::SIGSEGV)), None, 1.0).is_none());
    }
}

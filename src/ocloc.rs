//! How one ocloc attempt is built: discovery, compiler identity, and one compile job on a
//! persistent libocloc worker (`src/pool/`) or in a one-shot ocloc process.
//!
//! A job runs with argv only (never a shell), in a private temp dir removed afterwards, in
//! its own process group so a timeout or Ctrl-C kills ocloc and anything it started.

use crate::classify::{classify_failure, Exit};
use crate::error::{BuildError, ErrorKind, Result};
use crate::sync::Renewable;
use crate::{crash_watch, libocloc, pool};
use serde::Deserialize;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Environment variable naming the ocloc to use when no explicit path is given.
pub const OCLOC_ENV: &str = "XPU_ZEBIN_OCLOC";

fn missing(message: String) -> BuildError {
    BuildError::new(ErrorKind::ToolchainMissing, message)
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn search_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

/// Resolve a user-given ocloc (a path, or a bare command name looked up on PATH).
fn resolve(given: &Path, origin: &str) -> Result<PathBuf> {
    let found = if given.components().count() == 1 && !given.is_absolute() {
        search_path(&given.to_string_lossy())
    } else {
        Some(given.to_path_buf()).filter(|p| is_executable(p))
    };
    found.ok_or_else(|| {
        missing(format!(
            "ocloc from {origin} ('{}') does not exist or is not executable",
            given.display()
        ))
    })
}

/// Find ocloc: an explicit argument, then `$XPU_ZEBIN_OCLOC`, then `ocloc` on PATH.
pub fn discover(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(given) = explicit {
        return resolve(given, "the explicit argument");
    }
    if let Some(env) =
        std::env::var_os(OCLOC_ENV).filter(|v| !v.to_string_lossy().trim().is_empty())
    {
        return resolve(Path::new(&env), &format!("${OCLOC_ENV}"));
    }
    search_path("ocloc").ok_or_else(|| {
        missing(format!(
            "no ocloc found: pass one explicitly (ocloc=... / --ocloc), set ${OCLOC_ENV}, or put `ocloc` on PATH \
             (Debian: apt-get install intel-opencl-icd)"
        ))
    })
}

/// (path, size, mtime) of an ocloc -> its identity string, so `query` runs once per compiler.
type IdentityCache = Mutex<HashMap<(PathBuf, u64, i64), String>>;
pub(crate) static IDENTITIES: Renewable<IdentityCache> =
    Renewable::new(|| Mutex::new(HashMap::new()), forget_after_fork);

/// Each ocloc's worker kind, or why it has none.
type WorkerSpecs = Mutex<HashMap<PathBuf, std::result::Result<pool::WorkerSpec, String>>>;
pub(crate) static SPECS: Renewable<WorkerSpecs> =
    Renewable::new(|| Mutex::new(HashMap::new()), forget_after_fork);

/// In a forked child: its locks start afresh (`sync::Renewable`).
pub(crate) fn forget_after_fork() {
    IDENTITIES.renew();
    SPECS.renew();
}

/// A string that changes whenever the compiler does: its path, size, mtime and the driver
/// version it reports (`ocloc query OCL_DRIVER_VERSION`). Part of every cache key.
pub fn identity(ocloc: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(ocloc)
        .map_err(|e| missing(format!("cannot stat ocloc '{}': {e}", ocloc.display())))?;
    let key = (ocloc.to_path_buf(), meta.len(), meta.mtime());
    if let Some(found) = crate::sync::lock(IDENTITIES.get()).get(&key) {
        return Ok(found.clone());
    }
    let dir = tempfile::Builder::new()
        .prefix("xpu-zebin-query-")
        .tempdir()
        .map_err(|e| missing(format!("cannot create a temp dir: {e}")))?;
    let log_path = dir.path().join("query.log");
    let log = File::create(&log_path).map_err(|e| missing(format!("cannot create a log: {e}")))?;
    let mut command = Command::new(ocloc);
    command
        .args(["query", "OCL_DRIVER_VERSION"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(
            log.try_clone()
                .map_err(|e| missing(format!("cannot share a log: {e}")))?,
        )
        .stderr(log);
    let child = spawn_in_own_group(&mut command)
        .map_err(|e| missing(format!("cannot run ocloc '{}': {e}", ocloc.display())))?;
    let exit = wait_for(child, Instant::now(), Some(QUERY_TIMEOUT), &[])
        .map_err(|e| missing(format!("cannot wait for ocloc query: {e}")))?;
    let said = crate::bounded::tail(&log_path, MAX_LOG_BYTES);
    let version = std::fs::read(dir.path().join("OCL_DRIVER_VERSION"))
        .map(|v| String::from_utf8_lossy(&v[..v.len().min(4096)]).into_owned())
        .unwrap_or_else(|_| said.clone());
    // ocloc writes the version C-string with its terminating NUL.
    let version = version.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    if exit != Exit::Code(0) || version.is_empty() {
        return Err(classify_failure(exit, &said));
    }
    let id = format!(
        "{}|{}|{}|{}",
        ocloc.display(),
        meta.len(),
        meta.mtime(),
        version
    );
    crate::sync::lock(IDENTITIES.get()).insert(key, id.clone());
    Ok(id)
}

/// How long `ocloc query` may take (it loads the compiler's libraries, ~0.2 s here).
const QUERY_TIMEOUT: Duration = Duration::from_secs(60);
/// What is kept of a compiler's log: its end, where the errors are.
const MAX_LOG_BYTES: u64 = 4 << 20;
/// No compiler output is larger than this (a zebin is a few MB).
const MAX_OUTPUT_BYTES: u64 = 1 << 30;

/// Start `command` in its own process group (a kill takes whatever it started too), to
/// be killed by the kernel if the thread that started it (which waits for it) dies with
/// its process.
fn spawn_in_own_group(command: &mut Command) -> std::io::Result<std::process::Child> {
    command.process_group(0);
    pool::prefer_for_oom_kill(command);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl
    // and getppid, both async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl: then nobody waits for this run.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the caller exited"));
            }
            Ok(())
        })
    };
    command.spawn()
}

/// Wait for a child started by [`spawn_in_own_group`] until it exits, the deadline passes
/// or a cancel flag is set; the latter two kill its whole group (before it is reaped, so
/// the group id cannot belong to anyone else yet).
fn wait_for(
    mut child: std::process::Child,
    started: Instant,
    timeout: Option<Duration>,
    cancel: &[&AtomicBool],
) -> std::io::Result<Exit> {
    let deadline = timeout.and_then(|t| started.checked_add(t));
    let exit_watch = ExitWatch::new(child.id());
    // A compiler sitting in its crash handler never ends by itself (`crash_watch.rs`).
    let mut crash_watch = crash_watch::ProcessWatch::new(child.id(), crash_watch::STUCK);
    let mut next_sample = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(exit_of(status));
        }
        let now = Instant::now();
        let cancelled = cancel.iter().any(|c| c.load(Ordering::Relaxed));
        let timed_out = deadline.is_some_and(|d| now >= d);
        let stuck = now >= next_sample && crash_watch.stuck(now);
        if now >= next_sample {
            next_sample = now + CRASH_SAMPLE;
        }
        if cancelled || timed_out || stuck {
            // SAFETY: killpg on the group created for this child, whose leader is not
            // reaped yet.
            unsafe { libc::killpg(child.id() as libc::pid_t, libc::SIGKILL) };
            child.wait()?;
            return Ok(if timed_out {
                Exit::TimedOut {
                    seconds: timeout.unwrap_or_default().as_secs(),
                }
            } else if stuck {
                Exit::StuckInCrashHandler
            } else {
                Exit::Cancelled
            });
        }
        exit_watch.wait(Duration::from_millis(20));
    }
}

/// How often a one-shot compiler's threads are sampled for a stuck crash handler.
const CRASH_SAMPLE: Duration = Duration::from_millis(500);

fn exit_of(status: std::process::ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(sig)) => Exit::Signal(sig),
        _ => Exit::Code(-1),
    }
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
    match run_on_worker(ocloc, spec) {
        Some(run) => Ok(run),
        None => {
            // The one-shot run gets what is left of the request's time, not a fresh limit.
            let timeout = spec.timeout.map(|t| t.saturating_sub(started.elapsed()));
            if timeout.is_some_and(|t| t.is_zero()) {
                return Ok(RawRun {
                    exit: Exit::TimedOut {
                        seconds: spec.timeout.unwrap_or_default().as_secs(),
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
                if let Exit::TimedOut { seconds } = &mut run.exit {
                    *seconds = spec.timeout.unwrap_or_default().as_secs(); // the whole limit
                }
                run
            })
        }
    }
}

/// `<ocloc>.toolchain`: how to load a compiler that needs its own glibc.
#[derive(Debug, Clone, Deserialize)]
struct Descriptor {
    libocloc: PathBuf,
    #[serde(default)]
    loader: Option<PathBuf>,
    #[serde(default)]
    library_path: Option<String>,
}

/// Find libocloc for an ocloc: a descriptor beside it, else the usual library dirs.
fn descriptor(ocloc: &Path) -> std::result::Result<Descriptor, String> {
    let mut beside = ocloc.as_os_str().to_owned();
    beside.push(".toolchain");
    if let Ok(text) = std::fs::read_to_string(&beside) {
        let d: Descriptor = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} is not a valid descriptor: {e}",
                beside.to_string_lossy()
            )
        })?;
        // Relative paths are the descriptor's own (workers run in another directory).
        let here = Path::new(&beside).parent().unwrap_or(Path::new("/"));
        return Ok(Descriptor {
            libocloc: here.join(d.libocloc),
            loader: d.loader.map(|l| here.join(l)),
            library_path: d.library_path.map(|lp| {
                std::env::split_paths(&lp)
                    .map(|p| here.join(p).display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            }),
        });
    }
    let real = std::fs::canonicalize(ocloc).map_err(|e| e.to_string())?;
    let prefix = real
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/"));
    ["lib/x86_64-linux-gnu", "lib64", "lib"]
        .iter()
        .map(|d| prefix.join(d).join("libocloc.so"))
        .find(|p| p.is_file())
        .map(|libocloc| Descriptor {
            libocloc,
            loader: None,
            library_path: None,
        })
        .ok_or_else(|| {
            format!(
                "no libocloc.so beside {} (looked in {}/lib*) and no {} descriptor",
                real.display(),
                prefix.display(),
                beside.to_string_lossy()
            )
        })
}

/// The persistent worker kind for one ocloc, or why it has none.
fn worker_spec(ocloc: &Path) -> std::result::Result<pool::WorkerSpec, String> {
    let mut specs = crate::sync::lock(SPECS.get());
    specs
        .entry(ocloc.to_path_buf())
        .or_insert_with(|| {
            let d = descriptor(ocloc)?;
            Ok(pool::WorkerSpec {
                key: format!("ocloc:{}", ocloc.display()),
                args: vec!["ocloc".into(), d.libocloc.into_os_string()],
                loader: d.loader.map(|l| (l, d.library_path)),
                // Old IGC writes a legacy patch-token binary for pvc unless asked for zebin.
                env: vec![("IGC_EnableZEBinary".into(), "1".into())],
            })
        })
        .clone()
}

/// The libocloc a persistent worker for this ocloc loads, or why there is none.
pub fn worker_library(ocloc: &Path) -> std::result::Result<PathBuf, String> {
    descriptor(ocloc).map(|d| d.libocloc)
}

/// Why an ocloc has no persistent worker (it then runs one process per compile), if so.
pub fn worker_unavailable(ocloc: &Path) -> Option<String> {
    match worker_spec(ocloc) {
        Err(why) => Some(why),
        Ok(spec) => pool::unavailable(&spec.key),
    }
}

/// Run a job on a persistent worker. `None`: no worker for this compiler (use one-shot),
/// or the worker died mid-job (re-run one-shot to classify what happened).
fn run_on_worker(ocloc: &Path, spec: &JobSpec) -> Option<RawRun> {
    if !pool::persistent_enabled() {
        return None;
    }
    let kind = worker_spec(ocloc).ok()?;
    let header = serde_json::to_vec(&libocloc::Request {
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
            let response: libocloc::Response = serde_json::from_slice(&header).ok()?;
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
                seconds: timeout.unwrap_or_default().as_secs(),
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

/// Sleeps until a child exits or a slice of time passes, so an exit is seen at once while
/// cancel and timeout are still checked between slices. Uses a pidfd (Linux 5.3+); where
/// that is missing it just sleeps the slice.
struct ExitWatch(Option<std::os::fd::OwnedFd>);

impl ExitWatch {
    fn new(pid: u32) -> Self {
        // SAFETY: pidfd_open has no memory arguments; a valid fd is owned from here on.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        ExitWatch((fd >= 0).then(|| {
            // SAFETY: fd was just returned by the kernel and is not owned elsewhere.
            unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) }
        }))
    }

    fn wait(&self, slice: Duration) {
        match &self.0 {
            Some(fd) => {
                let mut pfd = libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(fd),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call.
                unsafe { libc::poll(&mut pfd, 1, slice.as_millis() as i32) };
            }
            None => std::thread::sleep(slice),
        }
    }
}

/// One ocloc process for one job.
pub fn run_process(ocloc: &Path, spec: &JobSpec) -> Result<RawRun> {
    // The compiler could not run here at all: never a build failure of the input (which
    // would drive the GRF ladder).
    let io = |what: &str, e: std::io::Error| {
        missing(format!("the compiler cannot run here: {what}: {e}"))
    };
    let dir = tempfile::Builder::new()
        .prefix("xpu-zebin-job-")
        .tempdir()
        .map_err(|e| io("cannot create the job's temp dir", e))?;
    let input = dir.path().join(spec.input_name);
    let out_dir = dir.path().join("out");
    std::fs::write(&input, spec.input).map_err(|e| io("cannot write the compiler input", e))?;
    std::fs::create_dir(&out_dir).map_err(|e| io("cannot create the output dir", e))?;
    let log_path = dir.path().join("ocloc.log");
    let log_file = File::create(&log_path).map_err(|e| io("cannot create the log", e))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| io("cannot share the log", e))?;

    let started = Instant::now();
    let mut command = Command::new(ocloc);
    command
        .arg("compile")
        .arg("-file")
        .arg(&input)
        .args(["-output", "kernel", "-output_no_suffix", "-out_dir"])
        .arg(&out_dir)
        .args(&spec.args)
        .current_dir(dir.path())
        // Old IGC writes a legacy patch-token binary for pvc unless asked for zebin.
        .env("IGC_EnableZEBinary", "1")
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err);
    let child = spawn_in_own_group(&mut command)
        .map_err(|e| missing(format!("cannot start ocloc '{}': {e}", ocloc.display())))?;
    let exit = wait_for(child, started, spec.timeout, spec.cancel)
        .map_err(|e| io("cannot wait for ocloc", e))?;
    let seconds = started.elapsed().as_secs_f64();
    let log = crate::bounded::tail(&log_path, MAX_LOG_BYTES);
    // ocloc names its output differently across versions ("kernel", "kernel.bin", "kernel.spv").
    let output = std::fs::read_dir(&out_dir)
        .ok()
        .and_then(|entries| {
            entries.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("kernel"))
            })
        })
        .and_then(|p| crate::bounded::read(File::open(p).ok()?, MAX_OUTPUT_BYTES).ok());
    Ok(RawRun {
        exit,
        log,
        output,
        seconds,
    })
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

    /// A real process in the state a compiler deadlocked in its crash handler shows: crash
    /// signals blocked and no CPU time spent (a `sleep` started with SIGSEGV blocked; the
    /// deadlock itself cannot be caused on demand). Its caller kills it and says so well
    /// before the deadline, where it used to wait the deadline out.
    #[test]
    fn a_one_shot_compiler_sitting_in_a_crash_handler_is_killed_not_waited_for() {
        let mut command = Command::new("sleep");
        command.arg("600");
        // SAFETY: between fork and exec; sigemptyset/sigaddset/sigprocmask only touch the
        // set on this stack and the mask, which exec keeps.
        unsafe {
            command.pre_exec(|| {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGSEGV);
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                Ok(())
            })
        };
        let child = spawn_in_own_group(&mut command).unwrap();
        let started = Instant::now();
        let limit = Duration::from_secs(120);
        let exit = wait_for(child, started, Some(limit), &[]).unwrap();
        assert_eq!(exit, Exit::StuckInCrashHandler);
        assert!(started.elapsed() < limit / 2, "{:?}", started.elapsed());
        let e = classify_failure(exit, "");
        assert_eq!(e.kind, ErrorKind::CompilerCrash);
        assert!(e.message.contains("crash handler"), "{}", e.message);
    }

    /// The same `sleep` with nothing blocked is just slow: waited for until its deadline.
    #[test]
    fn a_one_shot_compiler_that_is_only_slow_is_waited_for() {
        let child = spawn_in_own_group(Command::new("sleep").arg("600")).unwrap();
        let limit = crash_watch::STUCK * 2;
        let exit = wait_for(child, Instant::now(), Some(limit), &[]).unwrap();
        assert_eq!(
            exit,
            Exit::TimedOut {
                seconds: limit.as_secs()
            }
        );
    }

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

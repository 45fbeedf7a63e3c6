//! One compile job in a one-shot ocloc process: started in its own process group (to die
//! with the thread that waits for it), waited for until it exits, its deadline passes, a
//! cancel flag is set or it sits in its crash handler; its log's tail and output collected.

use super::{missing, JobSpec, RawRun};
use crate::classify::Exit;
use crate::error::Result;
use crate::{crash_watch, pool};
use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What is kept of a compiler's log: its end, where the errors are.
pub(super) const MAX_LOG_BYTES: u64 = 4 << 20;
/// No compiler output is larger than this (a zebin is a few MB).
const MAX_OUTPUT_BYTES: u64 = 1 << 30;

/// Start `command` in its own process group (a kill takes whatever it started too), to
/// be killed by the kernel if the thread that started it (which waits for it) dies with
/// its process.
pub(super) fn spawn_in_own_group(command: &mut Command) -> std::io::Result<std::process::Child> {
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
pub(super) fn wait_for(
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
                    limit: timeout.unwrap_or_default(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::classify_failure;
    use crate::error::ErrorKind;

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
        assert_eq!(exit, Exit::TimedOut { limit });
    }
}

//! The caller's side of one worker: start it, send a request, read the answer with
//! deadlines and cancel flags, kill its process group.

use super::*;

// Caller side.

pub(super) struct Worker {
    pub(super) child: Child,
    pub(super) stdin: ChildStdin,
    pub(super) stdout: ChildStdout,
    /// The worker's fds 1 and 2; read here from `seen` on.
    pub(super) chatter: File,
    pub(super) seen: u64,
    pub(super) jobs: u32,
}

pub(super) enum Wait {
    Done,
    TimedOut,
    Cancelled,
    Closed,
    /// Closed before it took the whole request: it died idle, not of the job.
    Unsent,
    Garbled(String),
}

/// Why no worker could be had for a request.
pub(super) enum Unstarted {
    Failed(String),
    Cancelled,
    TimedOut,
}

pub(super) fn set_nonblocking(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor this process owns; no memory is involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A write to a worker that just died raises SIGPIPE, which ends a process that did not
/// ignore it (Python ignores it, an embedder or `signal(SIGPIPE, SIG_DFL)` may not): this
/// thread blocks it, and sees EPIPE instead.
pub(super) fn block_sigpipe() {
    // SAFETY: a sigset built by sigemptyset/sigaddset, passed to pthread_sigmask for the
    // calling thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Bytes written to a worker's stdin that it has not read yet.
pub(super) fn unread(stdin: &ChildStdin) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the valid pointer.
    let r = unsafe { libc::ioctl(stdin.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r == 0 {
        n.max(0) as usize
    } else {
        0
    }
}

/// Where workers run: the package's private directory (only this user writes there), else
/// the root directory.
pub(super) fn worker_dir() -> PathBuf {
    crate::private::subdir("work").unwrap_or_else(|_| PathBuf::from("/"))
}

/// This worker is what the kernel's OOM killer picks before its caller: an input that
/// makes IGC balloon costs the worker, not the caller (raising one's own score needs no
/// rights; without /proc nothing changes).
pub(super) fn prefer_me_for_oom_kill() {
    let _ = std::fs::write("/proc/self/oom_score_adj", b"1000");
}

/// The same for a one-shot compiler process, set between fork and exec.
pub fn prefer_for_oom_kill(command: &mut Command) {
    // SAFETY: runs between fork and exec; open, write and close are async-signal-safe and
    // touch only the static path and value. A failure (no /proc) changes nothing.
    unsafe {
        command.pre_exec(|| {
            let fd = libc::open(
                c"/proc/self/oom_score_adj".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if fd >= 0 {
                libc::write(fd, b"1000".as_ptr().cast(), 4);
                libc::close(fd);
            }
            Ok(())
        })
    };
}

/// Wait for `events` on `fd` for at most 20 ms (so cancel flags are seen), or until the
/// deadline. `Ok(true)` when `fd` is ready (or hung up), `Ok(false)` when the slice passed,
/// `Err(wait)` when the wait is over for good.
pub(super) fn poll_slice(
    fd: RawFd,
    events: libc::c_short,
    cancel: &[&AtomicBool],
    deadline: Option<Instant>,
) -> Result<bool, Wait> {
    if cancel.iter().any(|c| c.load(Ordering::Relaxed)) {
        return Err(Wait::Cancelled);
    }
    let now = Instant::now();
    if deadline.is_some_and(|d| now >= d) {
        return Err(Wait::TimedOut);
    }
    let slice = deadline.map_or(20, |d| (d - now).as_millis().clamp(1, 20) as i32);
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call. A failure (EINTR) or a
    // timeout is just another turn of the caller's loop.
    Ok(unsafe { libc::poll(&mut pfd, 1, slice) } > 0)
}

impl Worker {
    pub(super) fn spawn(
        python: &PythonRuntime,
        spec: &WorkerSpec,
        cancel: &[&AtomicBool],
        deadline: Option<Instant>,
    ) -> Result<Worker, Unstarted> {
        let failed = |e: std::io::Error| Unstarted::Failed(e.to_string());
        let mut command = match &spec.loader {
            Some((loader, library_path)) => {
                let mut c = Command::new(loader);
                if let Some(lp) = library_path {
                    c.args(["--library-path", lp]);
                }
                c.arg(&python.executable);
                c
            }
            None => Command::new(&python.executable),
        };
        let chatter = tempfile::tempfile().map_err(failed)?;
        command
            .args(["-m", "xpu_zebin._worker"])
            .args(&spec.args)
            .env("PYTHONPATH", &python.pythonpath)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(chatter.try_clone().map_err(failed)?)
            // `python -m` puts the working directory first on sys.path: never the caller's
            // (anyone may write there, and plant an `xpu_zebin` to run as this user).
            .current_dir(worker_dir())
            // Its own group: the terminal's Ctrl-C reaches Python, which cancels us; a kill
            // takes the worker and anything it started.
            .process_group(0);
        let mut child = command.spawn().map_err(failed)?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            // SAFETY: killpg on the group just created for this child.
            unsafe { libc::killpg(child.id() as libc::pid_t, libc::SIGKILL) };
            let _ = child.wait();
            return Err(Unstarted::Failed("the worker's pipes were not made".into()));
        };
        let mut worker = Worker {
            child,
            stdin,
            stdout,
            chatter,
            seen: 0,
            jobs: 0,
        };
        if let Err(e) = set_nonblocking(worker.stdin.as_raw_fd()) {
            worker.kill();
            return Err(failed(e));
        }
        let mut greeting = [0u8; 4];
        let startup = Instant::now() + STARTUP;
        let until = deadline.map_or(startup, |d| d.min(startup));
        let waited = worker.read_exact_until(&mut greeting, cancel, Some(until));
        match waited {
            Wait::Done if &greeting == READY => return Ok(worker),
            Wait::Cancelled => {
                worker.kill();
                return Err(Unstarted::Cancelled);
            }
            Wait::TimedOut if deadline.is_some_and(|d| d <= startup) => {
                worker.kill();
                return Err(Unstarted::TimedOut);
            }
            _ => {}
        }
        let said = worker.new_chatter();
        worker.kill();
        let said = said.trim();
        Err(Unstarted::Failed(format!(
            "a worker (python -m xpu_zebin._worker {}) did not start{}",
            spec.args
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            // The line that names the problem: the last error, else the last line.
            match (
                waited,
                said.lines()
                    .rfind(|l| l.to_ascii_lowercase().contains("error"))
                    .or(said.lines().last()),
            ) {
                (Wait::TimedOut, _) => format!(" within {} s", STARTUP.as_secs()),
                (_, Some(last)) => format!(": {last}"),
                (Wait::Done, None) => ": it greeted with something else".into(),
                _ => String::new(),
            }
        )))
    }

    pub(super) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Text the worker printed since the last call (its last MiB, where errors are).
    pub(super) fn new_chatter(&mut self) -> String {
        let end = self.chatter.metadata().map_or(self.seen, |m| m.len());
        if end <= self.seen {
            return String::new();
        }
        let from = self.seen.max(end.saturating_sub(MAX_CHATTER_BYTES));
        let mut buf = vec![0u8; (end - from) as usize];
        let n = self.chatter.read_at(&mut buf, from).unwrap_or(0);
        buf.truncate(n);
        self.seen = from + n as u64;
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Kill the worker's whole group, then reap it (in this order: once reaped, its pid
    /// and group id may belong to someone else).
    pub(super) fn kill(mut self) {
        // SAFETY: killpg on the group created for this worker, whose leader is not reaped.
        unsafe { libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    /// How a worker whose stdout closed ended: wait a little for it to go (without
    /// reaping it, so its group id stays ours), kill its group, then reap it.
    pub(super) fn reap(mut self) -> Exit {
        let deadline = Instant::now() + Duration::from_secs(5);
        let pid = self.child.id() as libc::id_t;
        while Instant::now() < deadline {
            // SAFETY: waitid with a zeroed siginfo out-parameter; WNOWAIT leaves the child
            // to be reaped below.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let r = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            // SAFETY: si_pid is set by waitid when a child changed state (0 otherwise).
            if r != 0 || unsafe { info.si_pid() } != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: the leader is not reaped yet: the group id is still this worker's.
        unsafe { libc::killpg(pid as libc::pid_t, libc::SIGKILL) };
        match self.child.wait() {
            Ok(status) => match (status.code(), status.signal()) {
                (Some(crate::crash_watch::STUCK_EXIT), _) => Exit::StuckInCrashHandler,
                (Some(code), _) => Exit::Code(code),
                (None, Some(sig)) => Exit::Signal(sig),
                _ => Exit::Code(-1),
            },
            Err(_) => Exit::Code(-1),
        }
    }

    /// Read exactly `buf.len()` bytes, giving up at the deadline or on cancel.
    pub(super) fn read_exact_until(
        &mut self,
        buf: &mut [u8],
        cancel: &[&AtomicBool],
        deadline: Option<Instant>,
    ) -> Wait {
        let fd = self.stdout.as_raw_fd();
        let mut filled = 0;
        while filled < buf.len() {
            match poll_slice(fd, libc::POLLIN, cancel, deadline) {
                Err(wait) => return wait,
                Ok(false) => continue,
                Ok(true) => {}
            }
            match self.stdout.read(&mut buf[filled..]) {
                Ok(0) => return Wait::Closed,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Wait::Closed,
            }
        }
        Wait::Done
    }

    /// Read `len` bytes, growing the buffer only as they arrive.
    pub(super) fn read_part(
        &mut self,
        len: usize,
        cancel: &[&AtomicBool],
        deadline: Option<Instant>,
    ) -> Result<Vec<u8>, Wait> {
        const CHUNK: usize = 1 << 20;
        let mut part = Vec::new();
        while part.len() < len {
            let at = part.len();
            part.resize(at + (len - at).min(CHUNK), 0);
            match self.read_exact_until(&mut part[at..], cancel, deadline) {
                Wait::Done => {}
                other => return Err(other),
            }
        }
        Ok(part)
    }

    /// Write all of `bytes` to the worker's stdin (non-blocking), giving up at the deadline,
    /// on cancel, or when the worker closed it.
    pub(super) fn write_until(
        &mut self,
        bytes: &[u8],
        cancel: &[&AtomicBool],
        deadline: Option<Instant>,
    ) -> Wait {
        let fd = self.stdin.as_raw_fd();
        let mut sent = 0;
        while sent < bytes.len() {
            match self.stdin.write(&bytes[sent..]) {
                Ok(0) => return Wait::Closed,
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Err(wait) = poll_slice(fd, libc::POLLOUT, cancel, deadline) {
                        return wait;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Wait::Closed,
            }
        }
        Wait::Done
    }

    /// Send one request and read its response; `Err((how, answered))` otherwise, where
    /// `answered` says whether any byte of a response came. A worker that closed before
    /// taking the whole request is `(Closed, false)` with nothing of the job done by it.
    pub(super) fn exchange(
        &mut self,
        header: &[u8],
        payload: &[u8],
        cancel: &[&AtomicBool],
        deadline: Option<Instant>,
    ) -> Result<(Vec<u8>, Vec<u8>), (Wait, bool)> {
        for part in [&frame_prefix(header, payload)[..], header, payload] {
            match self.write_until(part, cancel, deadline) {
                Wait::Done => {}
                Wait::Closed => return Err((Wait::Unsent, false)),
                other => return Err((other, false)),
            }
        }
        let mut prefix = [0u8; 16];
        match self.read_exact_until(&mut prefix, cancel, deadline) {
            Wait::Done => {}
            // A worker that closed before any byte of an answer: see `call`.
            Wait::Closed => return Err((Wait::Closed, false)),
            other => return Err((other, true)),
        }
        let head = parse_prefix(&prefix).map_err(|why| (Wait::Garbled(why), true))?;
        let header = self
            .read_part(head.header_len, cancel, deadline)
            .map_err(|w| (w, true))?;
        let payload = self
            .read_part(head.payload_len, cancel, deadline)
            .map_err(|w| (w, true))?;
        Ok((header, payload))
    }
}

//! The worker's side: its loop, and ending itself when its caller is gone or its serving
//! thread is stuck in a compiler's crash handler (`crash_watch.rs`).

use super::*;

// Worker side.

/// End this worker's whole process group as soon as its caller's end of stdin closes:
/// the caller exited (however it ended, SIGKILL included), so nobody waits for this build.
/// The same when the serving thread is stuck in a compiler's crash handler
/// (`crash_watch.rs`): the caller then sees the crash at once, not at its deadline.
pub(super) fn die_with_caller() -> std::io::Result<()> {
    // SAFETY: getppid cannot fail.
    let caller = unsafe { libc::getppid() };
    let mut serving = crate::crash_watch::Watch::new(
        crate::crash_watch::current_thread(),
        crate::crash_watch::STUCK,
    );
    std::thread::Builder::new()
        .name("xpu-zebin-caller-watch".into())
        .spawn(move || loop {
            // events 0: only a hang-up or an error wakes this; requests do not. The caller's
            // end may also live on in a child it forked: then the caller's death shows as a
            // new parent (checked each second).
            let mut pfd = libc::pollfd {
                fd: 0,
                events: 0,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let r = unsafe { libc::poll(&mut pfd, 1, 1000) };
            let hung_up =
                r > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0;
            // SAFETY: getppid cannot fail.
            if hung_up || unsafe { libc::getppid() } != caller {
                // SAFETY: kill(0) signals this process's own group (the worker and whatever
                // it started); nothing else is touched.
                unsafe { libc::kill(0, libc::SIGKILL) };
                std::process::exit(1);
            }
            if serving.stuck(Instant::now()) {
                // Said with an exit status of its own, so the caller reports the crash at
                // once instead of re-running the input (it would hang in the same handler);
                // the caller kills the rest of the group. `_exit`: nothing that may need a
                // lock the stuck thread holds (malloc's, stdio's).
                // SAFETY: writes of static bytes to fd 2, then the end of the process.
                unsafe {
                    for said in ["\nxpu-zebin worker: ", crate::crash_watch::STUCK_SAID, "\n"] {
                        libc::write(2, said.as_ptr().cast(), said.len());
                    }
                    libc::_exit(crate::crash_watch::STUCK_EXIT);
                }
            }
        })
        .map(|_| ())
}

/// What a worker whose compiler's crash handler caught a fault adds to the request's log.
pub const FAULTED_SAID: &str = "the compiler's crash handler caught a fault during this \
     request; this worker ends after answering";

/// The worker's main loop: greet, then answer each request with `handle(header, payload)`
/// until stdin closes or no request comes for the idle time. Call it once the library
/// the worker exists for is loaded: the greeting tells the caller it started.
pub fn serve(
    mut handle: impl FnMut(Vec<u8>, Vec<u8>) -> (Vec<u8>, Vec<u8>),
) -> std::io::Result<()> {
    // IGC may print straight to fd 1: keep the protocol on a private copy of stdout and send
    // fd 1 where fd 2 goes (the caller's chatter file).
    // SAFETY: plain descriptor juggling on this process's own fds.
    let protocol_fd = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 0) };
    if protocol_fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: protocol_fd is a fresh descriptor owned from here on.
    let mut protocol = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(protocol_fd) };
    // SAFETY: dup2 on this process's own descriptors.
    if unsafe { libc::dup2(2, 1) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    die_with_caller()?;
    prefer_me_for_oom_kill();
    protocol.write_all(READY)?;
    protocol.flush()?;
    // Zero: the caller keeps no idle worker and ends this one itself.
    let idle = idle_exit();
    let millis = if idle.is_zero() {
        -1
    } else {
        i32::try_from(idle.as_millis()).unwrap_or(i32::MAX)
    };
    let mut stdin = std::io::stdin().lock();
    let mut served = 0u64;
    loop {
        let mut pfd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // The first request follows the greeting: no idle limit before it.
        let wait = if served == 0 { -1 } else { millis };
        // SAFETY: one valid pollfd for the duration of the call.
        match unsafe { libc::poll(&mut pfd, 1, wait) } {
            0 => return Ok(()), // idle: the caller starts a new worker when it needs one
            r if r < 0 => {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            _ => {}
        }
        let Some((header, payload)) = read_frame(&mut stdin)? else {
            return Ok(());
        };
        let (header, payload) = handle(header, payload);
        // A crash handler that jumped back out of a fault leaves the crash signals blocked:
        // the compile answered, on a heap the fault may have corrupted. Answer, then end (exit
        // 0, as an idle worker does: the caller's next request goes to a fresh one).
        let faulted = crate::crash_watch::unblock_crash_signals();
        if faulted {
            eprintln!("\nxpu-zebin worker: {FAULTED_SAID}");
        }
        write_frame(&mut protocol, &header, &payload)?;
        served += 1;
        if faulted {
            // SAFETY: ends the process now: no destructor or atexit handler runs on that heap.
            unsafe { libc::_exit(0) };
        }
    }
}

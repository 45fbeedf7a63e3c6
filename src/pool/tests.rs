//! The pool's tests: real processes (this test binary, shell stand-ins for a worker's
//! protocol, real compilers), deadlines, crashes and forks.
use super::*;

/// A worker played by a shell script (the protocol's other end, misbehaving on purpose;
/// no compiler is involved): `sh SCRIPT -m xpu_zebin._worker KEY`.
fn script_worker(body: &str) -> (tempfile::TempDir, PythonRuntime, WorkerSpec) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("worker.sh");
    std::fs::write(&script, body).unwrap();
    let runtime = PythonRuntime {
        executable: script,
        pythonpath: String::new(),
    };
    let spec = WorkerSpec {
        key: format!("script:{}", dir.path().display()),
        args: vec![],
        loader: Some(("/bin/sh".into(), None)),
        env: vec![],
    };
    (dir, runtime, spec)
}

fn call_script(body: &str, payload: &[u8], timeout: Duration) -> (Result<Reply, String>, f64) {
    let (_dir, runtime, spec) = script_worker(body);
    let started = Instant::now();
    let reply = call_with(&runtime, &spec, b"{}", payload, &[], Some(timeout));
    (reply, started.elapsed().as_secs_f64())
}

#[test]
fn a_garbled_reply_is_a_garbled_worker() {
    let (reply, _) = call_script(
        "printf XZW3; head -c 16 >/dev/null; printf 'this is no frame at all'; sleep 30\n",
        b"",
        Duration::from_secs(60),
    );
    assert!(matches!(reply, Ok(Reply::Garbled { .. })), "{reply:?}");
}

#[test]
fn an_oversized_reply_is_refused_before_it_is_read() {
    // Magic, header length 0, payload length 2^63: refused at once, nothing allocated.
    let (reply, seconds) = call_script(
        "printf XZW3; head -c 18 >/dev/null; printf 'XZF3\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\200'; sleep 30\n",
        b"",
        Duration::from_secs(60),
    );
    assert!(
        matches!(&reply, Ok(Reply::Garbled { why, .. }) if why.contains("bounds")),
        "{reply:?}"
    );
    assert!(seconds < 20.0, "{seconds}");
}

#[test]
fn a_worker_that_never_reads_cannot_block_the_write() {
    // 4 MiB does not fit in a pipe: a blocking write would wait forever.
    let (reply, seconds) = call_script(
        "printf XZW3; sleep 60\n",
        &vec![0u8; 4 << 20],
        Duration::from_millis(500),
    );
    assert!(matches!(reply, Ok(Reply::TimedOut { .. })), "{reply:?}");
    assert!(seconds < 20.0, "{seconds}");
}

#[test]
fn start_up_honours_the_callers_deadline() {
    let (reply, seconds) = call_script("sleep 60\n", b"", Duration::from_millis(500));
    assert!(matches!(reply, Ok(Reply::TimedOut { .. })), "{reply:?}");
    assert!(seconds < 20.0, "{seconds}");
}

#[test]
fn workers_that_quit_without_answering_are_no_crash_of_the_input() {
    let (reply, _) = call_script("printf XZW3; exit 0\n", b"", Duration::from_secs(60));
    assert!(
        matches!(&reply, Err(why) if why.contains("new workers in a row")),
        "{reply:?}"
    );
    let (reply, _) = call_script("exit 3\n", b"", Duration::from_secs(60));
    assert!(
        matches!(&reply, Err(why) if why.contains("did not start")),
        "{reply:?}"
    );
}

#[test]
fn a_worker_that_dies_mid_reply_is_a_death_not_a_hang() {
    let (reply, _) = call_script(
        "printf XZW3; head -c 18 >/dev/null; printf 'XZF3\\002\\000\\000\\000'; kill -9 $$\n",
        b"",
        Duration::from_secs(60),
    );
    assert!(
        matches!(
            reply,
            Ok(Reply::Died {
                exit: Exit::Signal(9),
                ..
            })
        ),
        "{reply:?}"
    );
}

/// Not a test by itself: the worker side of the tests below, run when this test binary
/// is started as a worker (`XPU_ZEBIN_TEST_WORKER`, the protocol on fd 3).
/// `libocloc:PATH`: a real libocloc worker (the real compiler, hosted by this binary
/// instead of Python). `pids`: it answers each request with its pid; a `fault` request
/// returns with SIGSEGV blocked on the serving thread, the state libocloc's guard leaves
/// when it jumps back out of a fault (the real guards here abort instead: measured on
/// both compilers).
#[test]
fn worker_main() {
    let Some(role) = std::env::var_os("XPU_ZEBIN_TEST_WORKER") else {
        return;
    };
    // SAFETY: fd 3 is the protocol pipe the script set up; dup2 on own fds.
    unsafe { libc::dup2(3, 1) };
    if let Some(lib) = role.to_string_lossy().strip_prefix("libocloc:") {
        let served = crate::libocloc::serve(std::path::Path::new(lib));
        std::process::exit(i32::from(served.is_err()));
    }
    let served = serve(|_, payload| {
        if payload == b"fault" {
            // SAFETY: a sigset built here, for this thread's own mask.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGSEGV);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
        }
        (std::process::id().to_string().into_bytes(), Vec::new())
    });
    std::process::exit(i32::from(served.is_err()));
}

#[test]
fn a_worker_whose_crash_handler_caught_a_fault_ends_after_answering() {
    let exe = std::env::current_exe().unwrap();
    let (_dir, runtime, mut spec) = script_worker(&format!(
        "exec '{}' --exact pool::tests::worker_main --nocapture --test-threads=1 3>&1 1>&2\n",
        exe.display()
    ));
    spec.env = vec![("XPU_ZEBIN_TEST_WORKER".into(), "pids".into())];
    let ask = |payload: &[u8]| match call_with(
        &runtime,
        &spec,
        b"{}",
        payload,
        &[],
        Some(Duration::from_secs(120)),
    ) {
        Ok(Reply::Done {
            header, chatter, ..
        }) => (String::from_utf8(header).unwrap(), chatter),
        other => panic!("{other:?}"),
    };
    let (first, _) = ask(b"hello");
    let (faulted, said) = ask(b"fault");
    assert_eq!(first, faulted, "an answering worker is kept");
    assert!(said.contains(FAULTED_SAID), "{said}");
    let (next, _) = ask(b"hello");
    assert_ne!(next, faulted, "the worker that faulted served another job");
    let (again, _) = ask(b"hello");
    assert_eq!(next, again);
}

/// This test binary as a real libocloc worker (see `worker_main`).
fn libocloc_worker(dir: &std::path::Path) -> PythonRuntime {
    let script = dir.join("worker");
    let exe = std::env::current_exe().unwrap();
    let body = format!(
        "#!/bin/sh\nXPU_ZEBIN_TEST_WORKER=\"libocloc:$4\" exec '{}' --exact \
         pool::tests::worker_main --nocapture --test-threads=1 3>&1 1>&2\n",
        exe.display()
    );
    std::fs::write(&script, body).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&script, mode).unwrap();
    PythonRuntime {
        executable: script,
        pythonpath: String::new(),
    }
}

/// A thread holding every lock a compile takes (and a busy slot) until told to let go.
fn hold_every_lock() -> (std::thread::JoinHandle<()>, std::sync::mpsc::Sender<()>) {
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _busy = BusyGuard::new();
        let _locks = (
            lock(POOL.get()),
            lock(&BUSY_CHANGED.get().0),
            lock(crate::ocloc::IDENTITIES.get()),
            lock(crate::ocloc::SPECS.get()),
            lock(crate::diag::SAID.get()),
        );
        held_tx.send(()).unwrap();
        let _ = release_rx.recv_timeout(Duration::from_secs(300));
    });
    held_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    (holder, release_tx)
}

/// The exit status of a child process, killed if it has not ended within `limit`.
fn exit_within(child: libc::pid_t, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    let mut status = 0;
    // SAFETY: waitpid/kill on our own unreaped child, with a status out-parameter.
    unsafe {
        while libc::waitpid(child, &mut status, libc::WNOHANG) == 0 {
            if Instant::now() > deadline {
                libc::kill(child, libc::SIGKILL);
                libc::waitpid(child, &mut status, 0);
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status))
}

/// A child forked while another thread holds every lock a compile takes (the pool's,
/// the busy count's, the compiler identities' and worker kinds', the warnings') compiles
/// with the real compiler on a worker of its own: nothing of the parent's (held locks,
/// busy count, idle workers) is the child's. The parent's idle worker stays its own.
#[test]
fn a_child_forked_while_the_locks_are_held_compiles_on_workers_of_its_own() {
    // The busy count and the pool are the process's: other tests running beside this one
    // in the same test binary would change them, so it runs alone, in a process of its own.
    const ALONE: &str = "XPU_ZEBIN_FORK_TEST_ALONE";
    if std::env::var_os(ALONE).is_none() {
        let name =
            "pool::tests::a_child_forked_while_the_locks_are_held_compiles_on_workers_of_its_own";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("1 passed"), "the child ran no test: {said}");
        return;
    }
    let ocloc = crate::ocloc::discover(None).expect("the real ocloc (apt: intel-opencl-icd)");
    let dir = tempfile::tempdir().unwrap();
    configure(libocloc_worker(dir.path()));
    let key = format!("ocloc:{}", ocloc.display());
    let idle = || -> Vec<u32> {
        let pool = lock(POOL.get());
        pool.idle
            .get(&key)
            .map_or(vec![], |w| w.iter().map(|w| w.child.id()).collect())
    };
    let source = "kernel void add(global float *a) { a[get_global_id(0)] += 1.0f; }";
    let no = AtomicBool::new(false);
    let spirv = crate::ocloc::opencl_to_spirv(&ocloc, source, "pvc", "", &no).unwrap();
    let compiled = || {
        let spec = crate::ocloc::JobSpec {
            input: &spirv,
            input_name: "kernel.spv",
            args: ["-spirv_input", "-device", "pvc"]
                .map(String::from)
                .to_vec(),
            timeout: Some(Duration::from_secs(120)),
            cancel: &[],
        };
        let run = crate::ocloc::run(&ocloc, &spec);
        matches!(
            run,
            Ok(crate::ocloc::RawRun {
                exit: Exit::Code(0),
                output: Some(_),
                ..
            })
        )
    };
    assert!(compiled());
    let parents = idle();
    assert_eq!(parents.len(), 1, "the compile left its worker idle");

    let (holder, release) = hold_every_lock();
    assert_eq!(busy(), 1);
    // SAFETY: the child runs only the checks and the compile below, then _exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // The exit status names the first check that failed.
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            [
                busy() == 0,
                idle().is_empty(),
                compiled(),
                idle().len() == 1,
            ]
            .iter()
            .position(|ok| !ok)
            .map_or(0, |i| i as i32 + 2)
        }));
        // SAFETY: ends the child without running the test harness's exit.
        unsafe { libc::_exit(failed.unwrap_or(1)) };
    }
    assert!(child > 0);
    release.send(()).unwrap();
    holder.join().unwrap();
    let exit = exit_within(child, Duration::from_secs(120));
    // Exit 2: busy count inherited, 3: idle workers inherited, 4: compile failed,
    // 5: its worker not kept; None: it hung (killed at the deadline).
    assert_eq!(exit, Some(0), "the forked child failed");
    assert_eq!(idle(), parents, "the child took the parent's idle worker");
    assert!(compiled());
    assert_eq!(idle(), parents);
}

#[test]
fn a_worker_its_crash_watch_ended_says_so() {
    let (reply, _) = call_script(
        "printf XZW3; head -c 18 >/dev/null; exit 86\n",
        b"",
        Duration::from_secs(60),
    );
    assert!(
        matches!(
            reply,
            Ok(Reply::Died {
                exit: Exit::StuckInCrashHandler,
                ..
            })
        ),
        "{reply:?}"
    );
}

#[test]
fn frames_round_trip_and_bad_prefixes_are_refused() {
    let mut wire = Vec::new();
    write_frame(&mut wire, b"{\"a\":1}", b"payload").unwrap();
    let (h, p) = read_frame(&mut wire.as_slice()).unwrap().unwrap();
    assert_eq!(
        (h.as_slice(), p.as_slice()),
        (&b"{\"a\":1}"[..], &b"payload"[..])
    );
    // A huge declared payload is refused before any allocation.
    let mut huge = frame_prefix(b"", b"").to_vec();
    huge[8..].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(read_frame(&mut huge.as_slice()).is_err());
    // A truncated frame is an error, not a short read taken as whole.
    let cut = &wire[..wire.len() - 1];
    assert!(read_frame(&mut &cut[..]).is_err());
    assert!(read_frame(&mut &b"XZF2xxxxxxxxxxxx"[..]).is_err());
    assert!(read_frame(&mut &b""[..]).unwrap().is_none());
}

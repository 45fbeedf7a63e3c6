//! Persistent compiler workers: IGC stays loaded between compiles.
//!
//! Measured (DESIGN.md §4 and here): a one-shot ocloc process spends most of a small
//! kernel's compile loading IGC; `oclocInvoke` from libocloc in a live process does the same
//! compile 2-3x faster after its first call. Each worker is a separate process (crash
//! isolation: IGC dying takes down only the worker), started as
//! `[loader --library-path L] python -m xpu_zebin._worker LIBOCLOC`, which calls [`serve`].
//! The loader part is the glibc trick of the modern compiler, described by a
//! `<ocloc>.toolchain` JSON file beside its wrapper. Any trouble with a worker falls back to
//! a one-shot ocloc, which also gives a crash its proper classification.
//!
//! Protocol on the worker's stdin/stdout, all integers little-endian:
//! request  = u32 header length, JSON `{args, input_name}`, u64 input length, input bytes;
//! response = u32 header length, JSON `{code, outputs: [[name, length], ...]}`, the bytes.

use crate::classify::Exit;
use crate::ocloc::{JobSpec, RawRun};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CString};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};
use std::time::Instant;

/// Set to `0` to always use one-shot ocloc processes.
pub const PERSISTENT_ENV: &str = "XPU_ZEBIN_PERSISTENT";
/// What a worker says once libocloc is loaded.
const READY: &[u8; 4] = b"XZW1";
/// How long a new worker may take to load IGC and greet.
const STARTUP: std::time::Duration = std::time::Duration::from_secs(60);
/// A worker is replaced after this many jobs, bounding whatever IGC accumulates.
const JOBS_PER_WORKER: u32 = 256;
/// Idle workers kept per compiler: each holds IGC (~200 MB measured), so a many-core
/// machine does not keep one per core forever. Busier moments start more, briefly.
const MAX_IDLE_PER_COMPILER: usize = 8;
/// A worker with no request for this long exits by itself, returning its memory.
pub const IDLE_EXIT_ENV: &str = "XPU_ZEBIN_WORKER_IDLE_SECONDS";
const DEFAULT_IDLE_EXIT_SECONDS: u64 = 300;

#[derive(Serialize, Deserialize)]
struct Request {
    args: Vec<String>,
    input_name: String,
}

#[derive(Serialize, Deserialize)]
struct Response {
    code: i32,
    outputs: Vec<(String, u64)>,
}

// ---------------------------------------------------------------------------------------
// Worker side.

type InvokeFn = unsafe extern "C" fn(
    u32,
    *const *const c_char,
    u32,
    *const *const u8,
    *const u64,
    *const *const c_char,
    u32,
    *const *const u8,
    *const u64,
    *const *const c_char,
    *mut u32,
    *mut *mut *mut u8,
    *mut *mut u64,
    *mut *mut *mut c_char,
) -> c_int;
type FreeFn = unsafe extern "C" fn(
    *mut u32,
    *mut *mut *mut u8,
    *mut *mut u64,
    *mut *mut *mut c_char,
) -> c_int;

/// One `oclocInvoke` call: argv and one in-memory source in, named outputs out.
fn invoke(
    invoke: &InvokeFn,
    free: &FreeFn,
    argv: &[String],
    name: &str,
    input: &[u8],
) -> (i32, Vec<(String, Vec<u8>)>) {
    let args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_str()).unwrap_or_default())
        .collect();
    let arg_ptrs: Vec<*const c_char> = args.iter().map(|a| a.as_ptr()).collect();
    let name = CString::new(name).unwrap_or_default();
    let (data, len, names) = ([input.as_ptr()], [input.len() as u64], [name.as_ptr()]);
    let mut count: u32 = 0;
    let mut outputs: *mut *mut u8 = std::ptr::null_mut();
    let mut lengths: *mut u64 = std::ptr::null_mut();
    let mut out_names: *mut *mut c_char = std::ptr::null_mut();
    // SAFETY: the arrays live across the call and match ocloc_api.h; the outputs are read
    // within their reported lengths, then released with oclocFreeOutput exactly once.
    unsafe {
        let code = invoke(
            arg_ptrs.len() as u32,
            arg_ptrs.as_ptr(),
            1,
            data.as_ptr(),
            len.as_ptr(),
            names.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            &mut count,
            &mut outputs,
            &mut lengths,
            &mut out_names,
        );
        let mut result = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            let n = std::ffi::CStr::from_ptr(*out_names.add(i))
                .to_string_lossy()
                .into_owned();
            let bytes = std::slice::from_raw_parts(*outputs.add(i), *lengths.add(i) as usize);
            result.push((n, bytes.to_vec()));
        }
        free(&mut count, &mut outputs, &mut lengths, &mut out_names);
        (code, result)
    }
}

fn read_frame(input: &mut impl Read) -> std::io::Result<Option<(Request, Vec<u8>)>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let mut header = vec![0u8; u32::from_le_bytes(len) as usize];
    input.read_exact(&mut header)?;
    let request: Request = serde_json::from_slice(&header)?;
    let mut len = [0u8; 8];
    input.read_exact(&mut len)?;
    let mut data = vec![0u8; u64::from_le_bytes(len) as usize];
    input.read_exact(&mut data)?;
    Ok(Some((request, data)))
}

/// The worker's main loop: serve compile requests on stdin until it closes.
pub fn serve(libocloc: &Path) -> std::io::Result<()> {
    // SAFETY: loading libocloc runs its initialisers; it is Intel's library, loaded once.
    let lib = unsafe { libloading::Library::new(libocloc) }.map_err(std::io::Error::other)?;
    // SAFETY: the symbol types follow ocloc_api.h.
    let (invoke_fn, free_fn) = unsafe {
        (
            *lib.get::<InvokeFn>(b"oclocInvoke\0")
                .map_err(std::io::Error::other)?,
            *lib.get::<FreeFn>(b"oclocFreeOutput\0")
                .map_err(std::io::Error::other)?,
        )
    };
    // IGC may print straight to fd 1 or 2: keep the protocol on a private copy of stdout and
    // point fds 1 and 2 at a scratch file whose new text is added to each job's log.
    // SAFETY: plain descriptor juggling on this process's own fds.
    let protocol_fd = unsafe { libc::dup(1) };
    if protocol_fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: protocol_fd is a fresh descriptor owned from here on.
    let mut protocol =
        unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(protocol_fd) };
    let mut chatter = tempfile::tempfile()?;
    // SAFETY: as above.
    unsafe {
        libc::dup2(chatter.as_raw_fd(), 1);
        libc::dup2(chatter.as_raw_fd(), 2);
    }
    // Ready: libocloc is loaded. The engine tells a worker that cannot start from one that
    // crashed on a job by this greeting.
    protocol.write_all(READY)?;
    protocol.flush()?;
    let idle_exit = std::env::var(IDLE_EXIT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_IDLE_EXIT_SECONDS);
    let mut stdin = std::io::stdin().lock();
    let mut seen = 0u64;
    loop {
        // Wait for the next request, or end after the idle time (the engine skips ended
        // workers and starts new ones on demand).
        let mut pfd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = i32::try_from(idle_exit.saturating_mul(1000)).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd for the duration of the call.
        if unsafe { libc::poll(&mut pfd, 1, millis) } == 0 {
            return Ok(());
        }
        let Some((request, mut input)) = read_frame(&mut stdin)? else {
            break;
        };
        // libocloc reads in-memory OpenCL C as a C string: its length counts the terminator.
        if request.input_name.ends_with(".cl") {
            input.push(0);
        }
        let mut argv = vec![
            "ocloc".to_string(),
            "compile".to_string(),
            "-file".to_string(),
            request.input_name.clone(),
            "-output".to_string(),
            "kernel".to_string(),
            "-output_no_suffix".to_string(),
        ];
        argv.extend(request.args);
        let (code, mut outputs) = invoke(&invoke_fn, &free_fn, &argv, &request.input_name, &input);
        // Text IGC printed outside stdout.log belongs to this job's log too.
        let end = chatter.seek(SeekFrom::End(0))?;
        if end > seen {
            let mut extra = Vec::new();
            chatter.seek(SeekFrom::Start(seen))?;
            Read::by_ref(&mut chatter)
                .take(end - seen)
                .read_to_end(&mut extra)?;
            seen = end;
            match outputs.iter_mut().find(|(n, _)| n == "stdout.log") {
                Some((_, log)) => log.extend_from_slice(&extra),
                None => outputs.push(("stdout.log".into(), extra)),
            }
        }
        let response = Response {
            code,
            outputs: outputs
                .iter()
                .map(|(n, b)| (n.clone(), b.len() as u64))
                .collect(),
        };
        let header = serde_json::to_vec(&response)?;
        protocol.write_all(&(header.len() as u32).to_le_bytes())?;
        protocol.write_all(&header)?;
        for (_, bytes) in &outputs {
            protocol.write_all(bytes)?;
        }
        protocol.flush()?;
    }
    drop(lib);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Engine side.

/// How to start a Python that can import this package (set by the bindings at import).
#[derive(Debug, Clone)]
pub struct PythonRuntime {
    /// The real interpreter binary (not a venv symlink: a loader needs the ELF file).
    pub executable: PathBuf,
    /// `sys.path` joined for PYTHONPATH, so the worker imports the same package.
    pub pythonpath: String,
}

static PYTHON: OnceLock<PythonRuntime> = OnceLock::new();

/// Enable persistent workers by telling the engine how to start one.
pub fn configure(runtime: PythonRuntime) {
    let _ = PYTHON.set(runtime);
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
fn descriptor(ocloc: &Path) -> Option<Descriptor> {
    let mut beside = ocloc.as_os_str().to_owned();
    beside.push(".toolchain");
    if let Ok(text) = std::fs::read_to_string(&beside) {
        return serde_json::from_str(&text).ok();
    }
    let real = std::fs::canonicalize(ocloc).ok()?;
    let prefix = real.parent()?.parent()?;
    ["lib/x86_64-linux-gnu", "lib64", "lib"]
        .iter()
        .map(|d| prefix.join(d).join("libocloc.so"))
        .find(|p| p.is_file())
        .map(|libocloc| Descriptor {
            libocloc,
            loader: None,
            library_path: None,
        })
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    jobs: u32,
}

impl Worker {
    fn spawn(python: &PythonRuntime, d: &Descriptor) -> std::io::Result<Worker> {
        let mut command = match &d.loader {
            Some(loader) => {
                let mut c = Command::new(loader);
                if let Some(lp) = &d.library_path {
                    c.args(["--library-path", lp]);
                }
                c.arg(&python.executable);
                c
            }
            None => Command::new(&python.executable),
        };
        command
            .args(["-m", "xpu_zebin._worker"])
            .arg(&d.libocloc)
            .env("PYTHONPATH", &python.pythonpath)
            .env("IGC_EnableZEBinary", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // Its own group: the terminal's Ctrl-C reaches Python, which cancels us.
            .process_group(0);
        let mut child = command.spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut worker = Worker {
            child,
            stdin,
            stdout,
            jobs: 0,
        };
        let mut greeting = [0u8; 4];
        let waited = read_exact_until(
            &mut worker.stdout,
            &mut greeting,
            &[],
            Some(Instant::now() + STARTUP),
        );
        if !matches!(waited, Wait::Done) || &greeting != READY {
            worker.kill();
            return Err(std::io::Error::other(format!(
                "worker for {} did not start (python -m xpu_zebin._worker)",
                d.libocloc.display()
            )));
        }
        Ok(worker)
    }

    fn kill(mut self) {
        // SAFETY: killpg on the group created for this worker.
        unsafe { libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

#[derive(Default)]
struct Pool {
    idle: HashMap<PathBuf, Vec<Worker>>,
    /// Compilers whose workers could not start or answer: use one-shot ocloc for them.
    broken: HashMap<PathBuf, String>,
}

static POOL: LazyLock<Mutex<Pool>> = LazyLock::new(|| Mutex::new(Pool::default()));

fn enabled() -> bool {
    std::env::var(PERSISTENT_ENV).map_or(true, |v| v.trim() != "0")
}

enum Wait {
    Done,
    TimedOut,
    Cancelled,
    Closed,
}

/// Read exactly `buf.len()` bytes from the worker, giving up at the deadline or on cancel.
fn read_exact_until(
    stdout: &mut ChildStdout,
    buf: &mut [u8],
    cancel: &[&AtomicBool],
    deadline: Option<Instant>,
) -> Wait {
    let fd = stdout.as_raw_fd();
    let mut filled = 0;
    while filled < buf.len() {
        if cancel.iter().any(|c| c.load(Ordering::Relaxed)) {
            return Wait::Cancelled;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Wait::TimedOut;
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut pfd, 1, 20) };
        if ready <= 0 {
            continue;
        }
        match stdout.read(&mut buf[filled..]) {
            Ok(0) | Err(_) => return Wait::Closed,
            Ok(n) => filled += n,
        }
    }
    Wait::Done
}

/// Send one request and read its whole response: (log, the kernel output, return code).
fn exchange(
    worker: &mut Worker,
    header: &[u8],
    spec: &JobSpec,
    deadline: Option<Instant>,
) -> Result<(String, Option<Vec<u8>>, i32), Wait> {
    let sent = (|| -> std::io::Result<()> {
        let stdin = &mut worker.stdin;
        stdin.write_all(&(header.len() as u32).to_le_bytes())?;
        stdin.write_all(header)?;
        stdin.write_all(&(spec.input.len() as u64).to_le_bytes())?;
        stdin.write_all(spec.input)?;
        stdin.flush()
    })();
    if sent.is_err() {
        return Err(Wait::Closed);
    }
    let mut read =
        |buf: &mut [u8]| match read_exact_until(&mut worker.stdout, buf, spec.cancel, deadline) {
            Wait::Done => Ok(()),
            other => Err(other),
        };
    let mut len = [0u8; 4];
    read(&mut len)?;
    let mut header = vec![0u8; u32::from_le_bytes(len) as usize];
    read(&mut header)?;
    let response: Response = serde_json::from_slice(&header).map_err(|_| Wait::Closed)?;
    let mut log = String::new();
    let mut output = None;
    for (name, length) in &response.outputs {
        let mut bytes = vec![0u8; *length as usize];
        read(&mut bytes)?;
        if name == "stdout.log" {
            // libocloc's in-memory log carries a C string terminator.
            log = String::from_utf8_lossy(&bytes)
                .trim_end_matches('\0')
                .to_string();
        } else if output.is_none() && name.starts_with("kernel") {
            output = Some(bytes);
        }
    }
    Ok((log, output, response.code))
}

/// Run a job on a persistent worker. `None`: no worker for this compiler (use one-shot),
/// or the worker died mid-job (re-run one-shot to classify what happened).
pub fn run(ocloc: &Path, spec: &JobSpec) -> Option<RawRun> {
    if !enabled() {
        return None;
    }
    let python = PYTHON.get()?;
    let key = ocloc.to_path_buf();
    let mut worker = {
        let mut pool = POOL.lock().unwrap();
        if pool.broken.contains_key(&key) {
            return None;
        }
        // An idle worker may have ended itself (idle timeout): skip those.
        let idle = pool.idle.entry(key.clone()).or_default();
        std::iter::from_fn(|| idle.pop()).find_map(|mut w| match w.child.try_wait() {
            Ok(None) => Some(w),
            _ => None,
        })
    };
    if worker.is_none() {
        let Some(d) = descriptor(ocloc) else {
            POOL.lock()
                .unwrap()
                .broken
                .insert(key, "no libocloc found".into());
            return None;
        };
        match Worker::spawn(python, &d) {
            Ok(w) => worker = Some(w),
            Err(e) => {
                POOL.lock().unwrap().broken.insert(key, e.to_string());
                return None;
            }
        }
    }
    let mut worker = worker?;
    let started = Instant::now();
    let deadline = spec.timeout.map(|t| started + t);
    let header = serde_json::to_vec(&Request {
        args: spec.args.clone(),
        input_name: spec.input_name.to_string(),
    })
    .ok()?;
    let (log, output, code) = match exchange(&mut worker, &header, spec, deadline) {
        Ok(done) => done,
        Err(Wait::Closed) => {
            // The worker died on this job (an IGC crash): the one-shot re-run classifies it.
            worker.kill();
            return None;
        }
        Err(wait) => {
            worker.kill();
            let exit = match wait {
                Wait::TimedOut => Exit::TimedOut {
                    seconds: spec.timeout.unwrap_or_default().as_secs(),
                },
                _ => Exit::Cancelled,
            };
            return Some(RawRun {
                exit,
                log: String::new(),
                output: None,
                seconds: started.elapsed().as_secs_f64(),
            });
        }
    };
    worker.jobs += 1;
    let mut pool = POOL.lock().unwrap();
    let idle = pool.idle.entry(key).or_default();
    if worker.jobs < JOBS_PER_WORKER && idle.len() < MAX_IDLE_PER_COMPILER {
        idle.push(worker);
    } else {
        drop(pool);
        worker.kill();
    }
    Some(RawRun {
        // In-process ocloc returns what the CLI would turn into its exit status.
        exit: Exit::Code(code & 0xff),
        log,
        output,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Why workers are off for each compiler that has them off (for diagnostics).
pub fn broken() -> Vec<(PathBuf, String)> {
    POOL.lock()
        .unwrap()
        .broken
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Stop every idle worker (tests, benchmarks, or before fork).
pub fn shutdown() {
    let idle: Vec<Worker> = POOL
        .lock()
        .unwrap()
        .idle
        .drain()
        .flat_map(|(_, w)| w)
        .collect();
    for w in idle {
        w.kill();
    }
}

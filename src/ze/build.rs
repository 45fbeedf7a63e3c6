//! How one Level Zero attempt is built: `zeModuleCreate`, `zeKernelCreate` and the kernel's
//! properties, every failure classified and nothing leaked.
//!
//! The driver compiles SPIR-V with IGC inside the calling process, and well-formed but
//! type-confused SPIR-V ends that process (measured: SIGSEGV in 10 of 12 mutations of a
//! real Triton kernel). So by default a SPIR-V attempt runs in a pool worker
//! ([`isolated`]): the worker builds with the same driver on the same device and returns
//! the driver's native binary, which the caller then loads (`ZE_MODULE_FORMAT_NATIVE`, no
//! IGC involved). A native binary the caller is handed (not one built here) can end the
//! process too (measured: the driver's loader dies with SIGSEGV on a zebin whose kernel
//! symbol names a section that does not exist), so it is loaded in a worker first.
//! [`in_process`] is the build itself, run by the worker, by the caller for native
//! binaries, and for SPIR-V only when isolation is explicitly turned off.

use super::{ffi, runtime, Kernel, Module, Runtime};
use crate::attempt::Build;
use crate::classify::{classify_driver_failure, signal_name, Exit};
use crate::error::{BuildError, ErrorKind, Result};
use crate::pool;
use crate::spill::Spill;
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// A module built in this process, its kernel and what the driver said.
pub struct Built {
    pub kernel: Kernel,
    pub module: Module,
    /// `spillMemSize` (bytes) and the SIMD width: the required sub-group size, else the
    /// largest the kernel supports (what upstream divides by, #7950).
    pub spill: Spill,
    pub private_mem_size: u32,
    pub log: String,
}

impl Build for Built {
    fn spill(&self) -> Spill {
        self.spill
    }
    fn log(&self) -> &str {
        &self.log
    }
}

fn classify_result(r: ffi::ze_result_t, log: &str) -> BuildError {
    let name = ffi::result_name(r);
    match r {
        ffi::ZE_RESULT_ERROR_INVALID_NATIVE_BINARY => BuildError::new(
            ErrorKind::UnsupportedDevice,
            format!("the native binary is not for this device ({name})"),
        )
        .with_log(log),
        ffi::ZE_RESULT_ERROR_DEVICE_LOST | ffi::ZE_RESULT_ERROR_UNINITIALIZED => {
            BuildError::new(ErrorKind::NoDevice, format!("the driver failed: {name}")).with_log(log)
        }
        _ => classify_driver_failure(&name, log),
    }
}

/// The symbols a link log says nothing provides, each once, in order.
fn unresolved_symbols(link_log: &str) -> Vec<String> {
    static SYMBOL: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"Unresolved Symbol <([^>]+)>|unresolved external symbol (\S+)").unwrap()
    });
    let mut names: Vec<String> = Vec::new();
    for c in SYMBOL.captures_iter(link_log) {
        let name = c.get(1).or(c.get(2)).map_or("", |m| m.as_str()).to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// One build in this process: module, kernel, properties.
pub fn in_process(
    rt: &'static Runtime,
    device: usize,
    kernel_name: &str,
    input: &[u8],
    is_spv: bool,
    flags: &str,
) -> Result<Built> {
    let (module, log) = rt
        .create_module(device, input, is_spv, flags)
        .map_err(|(r, log)| classify_result(r, &log))?;
    let kernel = match module.create_kernel(kernel_name) {
        Ok(k) => k,
        Err(ffi::ZE_RESULT_ERROR_INVALID_KERNEL_NAME) => {
            return Err(BuildError::new(
                ErrorKind::KernelNotFound,
                format!(
                    "kernel '{kernel_name}' is not in the module; kernels: [{}]",
                    module.kernel_names().join(", ")
                ),
            )
            .with_log(log))
        }
        Err(ffi::ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED) => {
            let (_, link_log) = module.link_log();
            let symbols = unresolved_symbols(&link_log);
            return Err(BuildError::new(
                ErrorKind::LinkFailure,
                if symbols.is_empty() {
                    "module is unlinked: it imports symbols nothing provides (the driver does not name them)".to_string()
                } else {
                    format!("module is unlinked: unresolved symbols: {}", symbols.join(", "))
                },
            )
            .with_log(format!("{log}{link_log}")));
        }
        Err(r) => {
            return Err(BuildError::new(
                ErrorKind::BuildFailure,
                format!("zeKernelCreate failed with {}", ffi::result_name(r)),
            )
            .with_log(log))
        }
    };
    let props = kernel.properties().map_err(|r| {
        BuildError::new(
            ErrorKind::BuildFailure,
            format!("zeKernelGetProperties failed with {}", ffi::result_name(r)),
        )
        .with_log(log.clone())
    })?;
    Ok(Built {
        spill: Spill {
            bytes: u64::from(props.spill_mem_size),
            simd: if props.required_subgroup_size != 0 {
                props.required_subgroup_size
            } else {
                props.max_subgroup_size
            },
        },
        private_mem_size: props.private_mem_size,
        kernel,
        module,
        log,
    })
}

/// What the caller asks a Level Zero worker; the payload is the SPIR-V to build, or a
/// native binary to try loading.
#[derive(Serialize, Deserialize)]
struct Request {
    device: usize,
    kernel_name: String,
    build_flags: String,
    is_spv: bool,
}

/// What the worker answers; on success the payload is the native binary.
#[derive(Serialize, Deserialize)]
struct Response {
    result: std::result::Result<(Spill, String), BuildError>,
}

/// A SPIR-V attempt built in a worker: the driver's native binary and what it reported.
pub struct Isolated {
    pub native: Vec<u8>,
    pub spill: Spill,
    pub log: String,
}

impl Build for Isolated {
    fn spill(&self) -> Spill {
        self.spill
    }
    fn log(&self) -> &str {
        &self.log
    }
}

/// The Level Zero worker's main loop (`python -m xpu_zebin._worker ze`): the same driver
/// and devices as its caller (the environment, simulated-device keys included, is
/// inherited), one SPIR-V build or native-binary trial load per request.
pub fn serve() -> std::io::Result<()> {
    let ready = runtime(); // load the driver before greeting; its error answers every request
    pool::serve(|header, input| {
        let result = match (serde_json::from_slice::<Request>(&header), ready.as_ref()) {
            (Err(e), _) => Err(BuildError::new(
                ErrorKind::InvalidArgument,
                format!("bad request: {e}"),
            )),
            (_, Err(e)) => Err((*e).clone()),
            (Ok(req), Ok(&rt)) => in_process(
                rt,
                req.device,
                &req.kernel_name,
                &input,
                req.is_spv,
                &req.build_flags,
            )
            .and_then(|built| {
                if !req.is_spv {
                    return Ok((Vec::new(), built.spill, built.log)); // it loads: that was all
                }
                let native = built.module.native_binary();
                if native.is_empty() {
                    return Err(BuildError::new(
                        ErrorKind::DegenerateBinary,
                        "the driver built the module but gave no native binary",
                    )
                    .with_log(built.log));
                }
                Ok((native, built.spill, built.log))
            }),
        };
        let (native, result) = match result {
            Ok((native, spill, log)) => (native, Ok((spill, log))),
            Err(e) => (Vec::new(), Err(e)),
        };
        let result = match result {
            Ok((spill, log)) => Ok((spill, crate::pool::log_tail(log))),
            Err(mut e) => {
                e.log = crate::pool::log_tail(std::mem::take(&mut e.log));
                Err(e)
            }
        };
        let header = serde_json::to_vec(&Response { result }).unwrap_or_default();
        (header, native)
    })
}

fn worker_kind() -> pool::WorkerSpec {
    pool::WorkerSpec {
        key: "ze".into(),
        args: vec!["ze".into()],
        loader: None,
        env: super::worker_env(),
    }
}

/// Why Level Zero workers cannot be used here, if they cannot.
pub fn unavailable() -> Option<String> {
    pool::unavailable(&worker_kind().key)
}

/// Build SPIR-V in a Level Zero worker, or (`is_spv` false) load a native binary there
/// first, to see that it loads (then `native` is empty: the caller loads its own bytes).
/// A worker that dies on the input is a `compiler_crash` naming how it ended, with what it
/// printed; the caller goes on.
pub fn isolated(
    device: usize,
    kernel_name: &str,
    input: &[u8],
    is_spv: bool,
    flags: &str,
    timeout: Option<Duration>,
    cancel: &[&AtomicBool],
) -> Result<Isolated> {
    let header = serde_json::to_vec(&Request {
        device,
        kernel_name: kernel_name.to_string(),
        build_flags: flags.to_string(),
        is_spv,
    })
    .map_err(|e| BuildError::new(ErrorKind::InvalidArgument, e.to_string()))?;
    let reply = pool::call(&worker_kind(), &header, input, cancel, timeout).map_err(|why| {
        BuildError::new(
            ErrorKind::ToolchainMissing,
            format!(
                "cannot start a Level Zero build worker ({why}); isolated=False builds in this \
                 process instead, which an input that crashes the driver's compiler ends"
            ),
        )
    })?;
    match reply {
        pool::Reply::Done {
            header,
            payload,
            chatter,
        } => {
            let response: Response = serde_json::from_slice(&header).map_err(|e| {
                BuildError::new(
                    ErrorKind::CompilerCrash,
                    format!("the Level Zero worker answered garbage: {e}"),
                )
                .with_log(chatter.clone())
            })?;
            match response.result {
                Ok((spill, log)) => Ok(Isolated {
                    native: payload,
                    spill,
                    log: log + &chatter,
                }),
                Err(mut e) => {
                    e.log.push_str(&chatter);
                    Err(e)
                }
            }
        }
        pool::Reply::Died { exit, chatter } => {
            let how = match exit {
                Exit::Signal(sig) => format!("killed by {} ({sig})", signal_name(sig)),
                Exit::Code(code) => format!("the driver ended its process with exit status {code}"),
                Exit::StuckInCrashHandler => crate::crash_watch::STUCK_SAID.into(),
                _ => "it ended".into(),
            };
            let what = if is_spv {
                format!("the Level Zero driver's compiler died building '{kernel_name}' with flags '{flags}'")
            } else {
                format!("the Level Zero driver died loading the native binary of '{kernel_name}'")
            };
            Err(BuildError::new(
                ErrorKind::CompilerCrash,
                format!("{what} in a worker process ({how}); this process is unaffected"),
            )
            .with_log(chatter))
        }
        pool::Reply::Garbled { why, chatter } => Err(BuildError::new(
            ErrorKind::CompilerCrash,
            format!(
                "the Level Zero worker answered garbage ({why}) for '{kernel_name}'; it was \
                 killed and will be replaced, and this process is unaffected"
            ),
        )
        .with_log(chatter)),
        pool::Reply::TimedOut { seconds, chatter } => Err(BuildError::new(
            ErrorKind::Timeout,
            format!(
                "the Level Zero {} did not finish within {seconds} s; its worker was killed",
                if is_spv { "build" } else { "native load" }
            ),
        )
        .with_log(chatter)),
        pool::Reply::Cancelled => Err(BuildError::new(
            ErrorKind::Cancelled,
            "cancelled; the Level Zero build worker was killed",
        )),
    }
}

//! The ocloc worker's side: Intel's libocloc loaded once, `oclocInvoke` per request.
//!
//! Measured (docs/design.md §4 and here): a one-shot ocloc process spends most of a small
//! kernel's compile loading IGC; `oclocInvoke` in a live process does the same compile 2-3x
//! faster after its first call. The process is a pool worker (`src/pool/`), so IGC dying
//! takes down only the worker.

use crate::ocloc::wire::{Request, Response};
use std::ffi::{c_char, c_int, CString};
use std::path::Path;

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

/// Load libocloc, then serve compile requests until the caller is done with this worker.
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
    crate::pool::serve(|header, mut input| {
        let request: Request = match serde_json::from_slice(&header) {
            Ok(r) => r,
            Err(e) => return answer(-1, format!("bad request: {e}"), None),
        };
        // C strings end at a NUL: an argument holding one would reach ocloc cut.
        if request
            .args
            .iter()
            .chain([&request.input_name])
            .any(|a| a.contains('\0'))
        {
            return answer(
                -1,
                "bad request: an argument holds a NUL character".into(),
                None,
            );
        }
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
        let (code, outputs) = invoke(&invoke_fn, &free_fn, &argv, &request.input_name, &input);
        let mut log = String::new();
        let mut output = None;
        for (name, bytes) in outputs {
            if name == "stdout.log" {
                // libocloc's in-memory log carries a C string terminator.
                log = String::from_utf8_lossy(&bytes)
                    .trim_end_matches('\0')
                    .to_string();
            } else if output.is_none() && name.starts_with("kernel") {
                output = Some(bytes);
            }
        }
        answer(code, log, output)
    })?;
    drop(lib);
    Ok(())
}

fn answer(code: i32, log: String, output: Option<Vec<u8>>) -> (Vec<u8>, Vec<u8>) {
    let response = Response {
        code,
        log: crate::pool::log_tail(log),
        wrote_output: output.is_some(),
    };
    (
        serde_json::to_vec(&response).unwrap_or_default(),
        output.unwrap_or_default(),
    )
}

//! What the caller and an ocloc worker (`libocloc.rs`) say to each other about one job,
//! beside the input and output bytes the pool frames carry.

use serde::{Deserialize, Serialize};

/// What the caller asks: ocloc arguments after `compile -file <input_name> -output kernel
/// -output_no_suffix`; the payload is the input.
#[derive(Serialize, Deserialize)]
pub struct Request {
    pub args: Vec<String>,
    pub input_name: String,
}

/// What the worker answers; the payload is the kernel output (empty when none).
#[derive(Serialize, Deserialize)]
pub struct Response {
    /// What ocloc's CLI would have exited with.
    pub code: i32,
    pub log: String,
    pub wrote_output: bool,
}

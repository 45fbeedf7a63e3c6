//! SPIR-V validation before any byte reaches IGC.
//!
//! Measured (DESIGN.md §4): random bytes given to the Level Zero driver end the whole
//! process, and truncated SPIR-V "builds" into an empty module. So every input is parsed
//! here first, with rspirv, and rejected with a message that says what is wrong and where.

use crate::error::{BuildError, ErrorKind, Result};
use rspirv::binary::ParseState;
use rspirv::dr::{self, Operand};
use rspirv::spirv::ExecutionModel;

const MAGIC: u32 = 0x0723_0203;
const HEADER_BYTES: usize = 20;

/// What the validator learned about a well-formed module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpirvInfo {
    /// (major, minor) from the header.
    pub version: (u8, u8),
    /// Names of the OpenCL kernel entry points, in module order.
    pub kernels: Vec<String>,
}

impl SpirvInfo {
    /// The kernel a compile is about: the requested one (which must exist) or the first.
    pub fn select_kernel(&self, requested: Option<&str>) -> Result<String> {
        match requested {
            Some(name) if self.kernels.iter().any(|k| k == name) => Ok(name.to_string()),
            Some(name) => Err(BuildError::new(
                ErrorKind::KernelNotFound,
                format!(
                    "kernel '{name}' is not an entry point of this module; entry points: [{}]",
                    self.kernels.join(", ")
                ),
            )),
            None => Ok(self.kernels[0].clone()),
        }
    }
}

fn invalid(message: impl Into<String>) -> BuildError {
    BuildError::new(ErrorKind::InvalidSpirv, message)
}

/// Cheap checks with precise messages, before the full parse.
fn check_header(bytes: &[u8]) -> Result<(u8, u8)> {
    if bytes.is_empty() {
        return Err(invalid(
            "empty input: a SPIR-V module needs at least a 20-byte header",
        ));
    }
    if bytes.len() % 4 != 0 {
        return Err(invalid(format!(
            "{} bytes is not a whole number of 32-bit words (SPIR-V is a stream of words)",
            bytes.len()
        )));
    }
    if bytes.len() < HEADER_BYTES {
        return Err(invalid(format!(
            "{} bytes is shorter than the 20-byte SPIR-V header",
            bytes.len()
        )));
    }
    let word = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    let magic = word(0);
    if magic == MAGIC.swap_bytes() {
        return Err(invalid(
            "big-endian SPIR-V: IGC takes little-endian modules only (magic 0x03022307)",
        ));
    }
    if magic != MAGIC {
        return Err(invalid(format!(
            "wrong magic number 0x{magic:08x} (SPIR-V starts with 0x07230203); is this a SPIR-V file?"
        )));
    }
    let version = word(1);
    let (major, minor) = ((version >> 16) as u8, (version >> 8) as u8);
    if version & 0xff00_00ff != 0 || major != 1 || minor > 6 {
        return Err(invalid(format!(
            "unsupported SPIR-V version word 0x{version:08x} (expected 1.0 to 1.6)"
        )));
    }
    if word(3) == 0 {
        return Err(invalid(
            "id bound is 0: the header is not from a real module",
        ));
    }
    if bytes.len() == HEADER_BYTES {
        return Err(invalid("header only: the module has no instructions"));
    }
    Ok((major, minor))
}

/// Walk the instruction stream by word counts alone, so a cut-off or corrupted module gets a
/// message with its position (rspirv's operand errors only say "expected more bytes").
fn check_instruction_stream(bytes: &[u8]) -> Result<()> {
    let words = bytes.len() / 4;
    let (mut at, mut index) = (HEADER_BYTES / 4, 1usize);
    while at < words {
        let first = u32::from_le_bytes(bytes[4 * at..4 * at + 4].try_into().unwrap());
        let (count, opcode) = ((first >> 16) as usize, first & 0xffff);
        if count == 0 {
            return Err(invalid(format!(
                "instruction #{index} at word {at} (opcode {opcode}) has word count 0"
            )));
        }
        if at + count > words {
            return Err(invalid(format!(
                "truncated: instruction #{index} at word {at} (opcode {opcode}) needs {count} words, \
                 only {} remain",
                words - at
            )));
        }
        at += count;
        index += 1;
    }
    Ok(())
}

/// Every id an instruction uses must be defined somewhere in the module (forward references
/// are legal). Measured: one dangling operand makes the Level Zero driver end the process.
fn check_ids(module: &dr::Module) -> Result<()> {
    let bound = module.header.as_ref().map_or(0, |h| h.bound) as usize;
    let mut defined = vec![false; bound];
    for inst in module.all_inst_iter() {
        if let Some(id) = inst.result_id {
            match defined.get_mut(id as usize) {
                Some(slot) if id != 0 => *slot = true,
                _ => {
                    return Err(invalid(format!(
                        "Op{} defines %{id}, outside the module's id bound {bound}",
                        inst.class.opname
                    )))
                }
            }
        }
    }
    for inst in module.all_inst_iter() {
        let used = inst
            .result_type
            .into_iter()
            .chain(inst.operands.iter().filter_map(|o| match o {
                Operand::IdRef(id) | Operand::IdScope(id) | Operand::IdMemorySemantics(id) => {
                    Some(*id)
                }
                _ => None,
            }));
        for id in used {
            if !defined.get(id as usize).copied().unwrap_or(false) {
                return Err(invalid(format!(
                    "Op{} uses %{id}, which no instruction defines",
                    inst.class.opname
                )));
            }
        }
    }
    Ok(())
}

/// Validate `bytes` as a SPIR-V module with at least one OpenCL kernel entry point.
pub fn validate(bytes: &[u8]) -> Result<SpirvInfo> {
    let version = check_header(bytes)?;
    check_instruction_stream(bytes)?;
    let module = dr::load_bytes(bytes).map_err(|state| match state {
        // The loader reports unclosed functions and blocks through the consumer error.
        ParseState::ConsumerError(e) => invalid(format!("malformed module structure: {e}")),
        ParseState::OperandExpected(offset, index) => invalid(format!(
            "truncated or malformed: instruction #{index} at byte {offset} runs past its word count or the end of the input"
        )),
        other => invalid(format!("malformed module: {other}")),
    })?;
    check_ids(&module)?;
    if module.functions.is_empty() {
        return Err(invalid("the module defines no functions"));
    }
    let mut kernels = Vec::new();
    let mut other_models = Vec::new();
    for entry in &module.entry_points {
        let model = match entry.operands.first() {
            Some(Operand::ExecutionModel(m)) => *m,
            _ => return Err(invalid("OpEntryPoint without an execution model")),
        };
        let name = match entry.operands.get(2) {
            Some(Operand::LiteralString(s)) => s.clone(),
            _ => return Err(invalid("OpEntryPoint without a name")),
        };
        if model == ExecutionModel::Kernel {
            kernels.push(name);
        } else {
            other_models.push(format!("{name} ({model:?})"));
        }
    }
    if kernels.is_empty() {
        let found = if other_models.is_empty() {
            "none".to_string()
        } else {
            other_models.join(", ")
        };
        return Err(invalid(format!(
            "no OpenCL kernel entry point (OpEntryPoint Kernel); found: {found}"
        )));
    }
    Ok(SpirvInfo { version, kernels })
}

//! SPIR-V validation before any byte reaches IGC.
//!
//! Measured (docs/design.md §4): random bytes given to the Level Zero driver end the whole
//! process, and truncated SPIR-V "builds" into an empty module. So every input a compiler
//! will see is parsed here first, with rspirv, and rejected with a message that says what is
//! wrong and where (`validate`). What a cache key needs (the kernels and the GRF modes they
//! ask for) is read from the words alone (`scan`): a hit hands no byte to a compiler, and
//! the full parse was most of a hit's time (6 ms of 7 for a 300 KB Triton module).

use crate::error::{BuildError, ErrorKind, Result};
use rspirv::binary::{self, Consumer, ParseAction, ParseState};
use rspirv::dr::{self, Operand};
use rspirv::spirv::{ExecutionMode, ExecutionModel, NamedMaximumNumberOfRegisters, Op};
use std::collections::HashMap;

const MAGIC: u32 = 0x0723_0203;
const HEADER_BYTES: usize = 20;

/// What the validator learned about a well-formed module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpirvInfo {
    /// (major, minor) from the header.
    pub version: (u8, u8),
    /// Names of the OpenCL kernel entry points, in module order.
    pub kernels: Vec<String>,
    /// The GRF mode a kernel asks for itself (SPV_INTEL_maximum_registers), by kernel.
    pub grf_requests: Vec<(String, GrfRequest)>,
}

/// A GRF mode carried by the kernel itself: an execution mode of SPV_INTEL_maximum_registers
/// (upstream off LTS drivers writes it from `grf_mode`, `!MaximumRegisters` in its LLVM IR,
/// instead of a build flag). IGC honours it like the flag, so it is an explicit mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrfRequest {
    /// `MaximumRegistersINTEL` / `MaximumRegistersIdINTEL`: this many registers.
    Registers(u32),
    /// `NamedMaximumRegistersINTEL AutoINTEL`: IGC chooses, as the auto flag.
    Auto,
}

impl GrfRequest {
    /// Upstream's `n_regs` for it: the number asked for; 128 for auto, as the auto flag.
    pub fn n_regs(self) -> u32 {
        match self {
            GrfRequest::Registers(n) => n,
            GrfRequest::Auto => 128,
        }
    }
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

    /// The GRF mode `kernel` asks for itself, if it does.
    pub fn grf_request(&self, kernel: &str) -> Option<GrfRequest> {
        self.grf_requests
            .iter()
            .find(|(k, _)| k == kernel)
            .map(|(_, r)| *r)
    }
}

fn invalid(message: impl Into<String>) -> BuildError {
    BuildError::new(ErrorKind::InvalidSpirv, message)
}

/// The little-endian word at index `i` (callers check `i` is inside `bytes`).
fn word_at(bytes: &[u8], i: usize) -> u32 {
    let w = &bytes[4 * i..4 * i + 4];
    u32::from_le_bytes([w[0], w[1], w[2], w[3]])
}

/// Cheap checks with precise messages, before the full parse.
fn check_header(bytes: &[u8]) -> Result<(u8, u8)> {
    if bytes.is_empty() {
        return Err(invalid(
            "empty input: a SPIR-V module needs at least a 20-byte header",
        ));
    }
    if !bytes.len().is_multiple_of(4) {
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
    let word = |i: usize| word_at(bytes, i);
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
    for (i, (at, count, opcode)) in instructions(bytes).enumerate() {
        let index = i + 1;
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
    }
    Ok(())
}

/// The instructions after the header, by word counts alone: (word index, word count,
/// opcode), in order. A count may be 0 or run past the end: `check_instruction_stream`
/// refuses both, and other callers come after it.
fn instructions(bytes: &[u8]) -> impl Iterator<Item = (usize, usize, u32)> + '_ {
    let words = bytes.len() / 4;
    let mut at = HEADER_BYTES / 4;
    std::iter::from_fn(move || {
        if at >= words {
            return None;
        }
        let first = word_at(bytes, at);
        let count = (first >> 16) as usize;
        let this = at;
        at += count.max(1);
        Some((this, count, first & 0xffff))
    })
}

/// What one pass over the instructions collects. rspirv decodes each instruction with the
/// SPIR-V grammar; the structure checks are ours, because rspirv's module loader rejects
/// legal modules (Triton emits module-level OpExtInst for debug info).
#[derive(Default)]
struct Collector {
    bound: usize,
    /// The module's size: what the table of defined ids may take at most.
    module_bytes: usize,
    /// Ids defined so far.
    defined: Defined,
    /// (id, opcode name) of every id operand, checked once all definitions are known.
    used: Vec<(u32, &'static str)>,
    functions: usize,
    in_function: bool,
    /// Result ids of OpExtInstImport "OpenCL.std": the one extended set whose operands are
    /// all ids. Other sets (e.g. NonSemantic debug info) mix literals in.
    opencl_std: Vec<u32>,
    problem: Option<String>,
}

impl Collector {
    fn fail(&mut self, message: String) -> ParseAction {
        self.problem = Some(message.clone());
        ParseAction::Error(message.into())
    }
}

impl Consumer for Collector {
    fn initialize(&mut self) -> ParseAction {
        ParseAction::Continue
    }

    fn finalize(&mut self) -> ParseAction {
        ParseAction::Continue
    }

    fn consume_header(&mut self, header: dr::ModuleHeader) -> ParseAction {
        self.bound = header.bound as usize;
        self.defined = Defined::for_module(header.bound, self.module_bytes);
        ParseAction::Continue
    }

    fn consume_instruction(&mut self, inst: dr::Instruction) -> ParseAction {
        let name = inst.class.opname;
        match inst.class.opcode {
            Op::Function if self.in_function => {
                return self.fail("OpFunction inside a function (a missing OpFunctionEnd)".into())
            }
            Op::Function => {
                self.in_function = true;
                self.functions += 1;
            }
            Op::FunctionEnd if !self.in_function => {
                return self.fail("OpFunctionEnd outside a function".into())
            }
            Op::FunctionEnd => self.in_function = false,
            _ => {}
        }
        if let Some(id) = inst.result_id {
            match id {
                1.. if (id as usize) < self.bound && self.defined.contains(id) => {
                    return self.fail(format!("Op{name} defines %{id} a second time"));
                }
                1.. if (id as usize) < self.bound => {
                    self.defined.insert(id);
                }
                _ => {
                    let bound = self.bound;
                    return self.fail(format!(
                        "Op{name} defines %{id}, outside the module's id bound {bound}"
                    ));
                }
            }
        }
        if inst.class.opcode == Op::ExtInstImport
            && matches!(inst.operands.first(), Some(Operand::LiteralString(s)) if s == "OpenCL.std")
        {
            self.opencl_std.extend(inst.result_id);
        }
        // Check every operand of known instructions; of an extended instruction from another
        // set only the set itself, since rspirv cannot tell its literals from ids.
        let checked = match (inst.class.opcode, inst.operands.first()) {
            (Op::ExtInst, Some(Operand::IdRef(set))) if !self.opencl_std.contains(set) => 1,
            _ => inst.operands.len(),
        };
        let ids = inst
            .result_type
            .into_iter()
            .chain(inst.operands[..checked].iter().filter_map(|o| match o {
                Operand::IdRef(id) | Operand::IdScope(id) | Operand::IdMemorySemantics(id) => {
                    Some(*id)
                }
                _ => None,
            }));
        self.used.extend(ids.map(|id| (id, name)));
        ParseAction::Continue
    }
}

/// The ids a module defines: one bit per id below the header's bound when that table is no
/// larger than the module itself, else a set. Never a table sized by the bound alone (an
/// untrusted number: 2^32-1 in 28 bytes would ask for 4 GiB of bools).
enum Defined {
    Bits(Vec<u64>),
    Set(std::collections::HashSet<u32>),
}

impl Default for Defined {
    fn default() -> Self {
        Defined::Set(Default::default())
    }
}

impl Defined {
    fn for_module(bound: u32, module_bytes: usize) -> Self {
        let words = (bound as usize).div_ceil(64);
        if words * 8 <= module_bytes.max(64) {
            Defined::Bits(vec![0; words])
        } else {
            Defined::Set(Default::default())
        }
    }

    fn insert(&mut self, id: u32) {
        match self {
            Defined::Bits(bits) => {
                if let Some(w) = bits.get_mut(id as usize / 64) {
                    *w |= 1 << (id % 64);
                }
            }
            Defined::Set(set) => {
                set.insert(id);
            }
        }
    }

    fn contains(&self, id: u32) -> bool {
        match self {
            Defined::Bits(bits) => bits
                .get(id as usize / 64)
                .is_some_and(|w| w & (1 << (id % 64)) != 0),
            Defined::Set(set) => set.contains(&id),
        }
    }
}

/// A register-limit execution mode's value: known, or a constant's (`MaximumRegistersIdINTEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModeValue {
    Known(GrfRequest),
    Constant(u32),
}

/// What a module says of its kernels: its entry points, the register-limit execution modes
/// (SPV_INTEL_maximum_registers) and the constants those modes name. Read from the words
/// alone (`read_kernels`), for `validate` and `scan` alike, so both give the same answer.
#[derive(Default)]
struct Kernels {
    names: Vec<String>,
    /// (function id, name) of every kernel entry point.
    functions: Vec<(u32, String)>,
    /// Entry points of other execution models, as a message names them.
    other_models: Vec<String>,
    /// (function id, request) of every register-limit execution mode; an `Id` one names
    /// its constant, resolved once the module is read.
    grf_modes: Vec<(u32, ModeValue)>,
    /// The 32-bit constants those `Id` modes name: id -> value (one entry per named id, so
    /// the table is bounded by the modes, never by the constants).
    grf_constants: HashMap<u32, Option<u32>>,
}

/// A literal string's text: the bytes of `words` up to its first NUL, as UTF-8.
fn literal_string(bytes: &[u8], words: std::ops::Range<usize>) -> Option<String> {
    let raw = bytes.get(4 * words.start..4 * words.end)?;
    let end = raw.iter().position(|b| *b == 0)?;
    std::str::from_utf8(&raw[..end]).ok().map(str::to_owned)
}

fn read_kernels(bytes: &[u8]) -> Result<Kernels> {
    let mut k = Kernels::default();
    let words = bytes.len() / 4;
    for (at, count, opcode) in instructions(bytes) {
        let ops = at + 1..(at + count).min(words);
        let word = |i: usize| (ops.start + i < ops.end).then(|| word_at(bytes, ops.start + i));
        match Op::from_u32(opcode) {
            Some(Op::EntryPoint) => {
                let (Some(model), Some(f), Some(name)) = (
                    word(0),
                    word(1),
                    literal_string(bytes, (ops.start + 2).min(ops.end)..ops.end),
                ) else {
                    return Err(invalid(
                        "OpEntryPoint without an execution model and a name",
                    ));
                };
                match ExecutionModel::from_u32(model) {
                    Some(ExecutionModel::Kernel) => {
                        k.functions.push((f, name.clone()));
                        k.names.push(name);
                    }
                    Some(m) => k.other_models.push(format!("{name} ({m:?})")),
                    None => k.other_models.push(format!("{name} (model {model})")),
                }
            }
            Some(Op::ExecutionMode | Op::ExecutionModeId) => {
                let (Some(f), Some(mode)) = (word(0), word(1)) else {
                    continue;
                };
                let value = match (ExecutionMode::from_u32(mode), word(2)) {
                    (Some(ExecutionMode::MaximumRegistersINTEL), Some(n)) => {
                        ModeValue::Known(GrfRequest::Registers(n))
                    }
                    (Some(ExecutionMode::MaximumRegistersIdINTEL), Some(c)) => {
                        k.grf_constants.insert(c, None);
                        ModeValue::Constant(c)
                    }
                    (Some(ExecutionMode::NamedMaximumRegistersINTEL), Some(n))
                        if n == NamedMaximumNumberOfRegisters::AutoINTEL as u32 =>
                    {
                        ModeValue::Known(GrfRequest::Auto)
                    }
                    _ => continue,
                };
                k.grf_modes.push((f, value));
            }
            // Only constants a mode named (modes come first in a module): a bounded table,
            // and none looked up in a module that names none. Result type, result id,
            // value: one value word is 32 bits or fewer (rspirv's LiteralBit32).
            Some(Op::Constant) if !k.grf_constants.is_empty() => {
                if let (Some(id), Some(value)) = (word(1), word(2).filter(|_| ops.len() == 3)) {
                    if let Some(slot @ None) = k.grf_constants.get_mut(&id) {
                        *slot = Some(value);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(k)
}

/// The GRF mode each kernel asks for: one per kernel; two that disagree, or one naming no
/// 32-bit integer constant, is invalid (IGC could not honour both).
fn grf_requests(k: &Kernels) -> Result<Vec<(String, GrfRequest)>> {
    let resolve = |value: ModeValue| match value {
        ModeValue::Known(request) => Ok(request),
        ModeValue::Constant(id) => match k.grf_constants.get(&id) {
            Some(Some(n)) => Ok(GrfRequest::Registers(*n)),
            _ => Err(invalid(format!(
                "MaximumRegistersIdINTEL names %{id}, which is no 32-bit integer constant"
            ))),
        },
    };
    let mut requests: Vec<(String, GrfRequest)> = Vec::new();
    let functions: HashMap<u32, &str> = k
        .functions
        .iter()
        .map(|(f, name)| (*f, name.as_str()))
        .collect();
    let mut seen: HashMap<u32, GrfRequest> = Default::default();
    for (f, value) in &k.grf_modes {
        let request = resolve(*value)?;
        match seen.insert(*f, request) {
            Some(before) if before != request => {
                return Err(invalid(format!(
                    "kernel %{f} asks for two GRF modes ({before:?} and {request:?})"
                )))
            }
            Some(_) => {}
            None => {
                if let Some(name) = functions.get(f) {
                    requests.push((name.to_string(), request));
                }
            }
        }
    }
    Ok(requests)
}

/// The kernels of a module whose header and stream are checked, and their GRF modes.
fn kernel_info(bytes: &[u8], version: (u8, u8)) -> Result<SpirvInfo> {
    let k = read_kernels(bytes)?;
    if k.names.is_empty() {
        let found = if k.other_models.is_empty() {
            "none".to_string()
        } else {
            k.other_models.join(", ")
        };
        return Err(invalid(format!(
            "no OpenCL kernel entry point (OpEntryPoint Kernel); found: {found}"
        )));
    }
    let grf_requests = grf_requests(&k)?;
    Ok(SpirvInfo {
        version,
        kernels: k.names,
        grf_requests,
    })
}

/// What a cache key needs of `bytes`, read from its words alone: its header and stream
/// checked, its kernels and their GRF modes, as `validate` gives them for a module it
/// accepts. Never enough to hand the bytes to a compiler: `validate` first.
pub fn scan(bytes: &[u8]) -> Result<SpirvInfo> {
    let version = check_header(bytes)?;
    check_instruction_stream(bytes)?;
    kernel_info(bytes, version)
}

/// `other`, unless `bytes` is not valid SPIR-V: then that is the answer. A lookup reads
/// only the key's part of the SPIR-V (`scan`), so what it finds wrong before a build (a
/// kernel name, the levels' settings, a missing compiler or device) yields to invalid
/// input, as when it was validated first.
pub fn invalid_or<E: From<BuildError>>(bytes: &[u8], other: E) -> E {
    validate(bytes).err().map_or(other, E::from)
}

/// Validate `bytes` as a SPIR-V module with at least one OpenCL kernel entry point.
pub fn validate(bytes: &[u8]) -> Result<SpirvInfo> {
    let version = check_header(bytes)?;
    check_instruction_stream(bytes)?;
    let mut c = Collector {
        module_bytes: bytes.len(),
        ..Collector::default()
    };
    if let Err(state) = binary::parse_bytes(bytes, &mut c) {
        return Err(match (state, c.problem.take()) {
            (_, Some(problem)) => invalid(format!("malformed module: {problem}")),
            (ParseState::OperandExpected(offset, index), None) => invalid(format!(
                "malformed: instruction #{index} at byte {offset} has fewer operands than its opcode needs"
            )),
            (other, None) => invalid(format!("malformed module: {other}")),
        });
    }
    if c.in_function {
        return Err(invalid(
            "the last function has no OpFunctionEnd: the module is cut short",
        ));
    }
    // Every id an instruction uses must be defined somewhere in the module (forward
    // references are legal). Measured: one dangling operand makes the Level Zero driver end
    // the process.
    if let Some((id, op)) = c.used.iter().find(|(id, _)| !c.defined.contains(*id)) {
        return Err(invalid(format!(
            "Op{op} uses %{id}, which no instruction defines"
        )));
    }
    if c.functions == 0 {
        return Err(invalid("the module defines no functions"));
    }
    kernel_info(bytes, version)
}

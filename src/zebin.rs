//! Reading a zebin: an ELF file whose `.ze_info` section is YAML describing each kernel.
//!
//! Only the fields the GRF policy and the user need are read; unknown keys are ignored so a
//! newer IGC (new `.ze_info` versions) keeps working.

use crate::error::{BuildError, ErrorKind, Result};
use crate::spill::Spill;
use object::{Object, ObjectSection, ObjectSymbol};
use serde::{Deserialize, Serialize};

/// Per-kernel facts from `.ze_info`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KernelInfo {
    pub name: String,
    pub grf_count: Option<u32>,
    pub simd_size: Option<u32>,
    /// `execution_env.spill_size` (IGC 2.x); absent from older compilers.
    pub spill_size: Option<u64>,
    /// `execution_env.private_size`, when present.
    pub private_size: Option<u64>,
    /// Sum of the `scratch` buffers under `per_thread_memory_buffers`.
    pub scratch_size: u64,
    /// Sum of the `private_space` buffers under `per_thread_memory_buffers`.
    pub private_space_size: u64,
}

/// What a zebin holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ZebinInfo {
    /// `.ze_info` format version, e.g. "1.20".
    pub version: String,
    pub kernels: Vec<KernelInfo>,
    /// Names of the ELF sections, in file order.
    pub sections: Vec<String>,
    /// Symbols the module imports and does not define, each once, but those the driver's
    /// linker provides itself: nothing resolves them (Debian's IGC 1.x leaves calls of
    /// builtins it does not know, `intel_sub_group_2d_block_*`, so).
    pub undefined_symbols: Vec<String>,
}

impl ZebinInfo {
    /// The `.ze_info` format's major version (`"1.20"` -> 1): a driver refuses a zebin
    /// whose major it does not know (measured: `ZE_RESULT_ERROR_INVALID_NATIVE_BINARY`).
    pub fn version_major(&self) -> Option<u32> {
        self.version.split('.').next()?.trim().parse().ok()
    }

    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// What `kernel` spills, from its own `.ze_info` entry and nothing else: `spill_size`
    /// (IGC 2.x), else its scratch space (IGC 1.x writes no `spill_size`; its scratch is
    /// what the Level Zero driver reports as the kernel's `spillMemSize`, measured equal).
    /// Never another kernel's figure, nor the module-wide "spilled around N" the compiler
    /// prints (docs/design.md §2).
    pub fn kernel_spill(&self, kernel: &str) -> Result<Spill> {
        let k = self.kernel(kernel).ok_or_else(|| {
            let names: Vec<&str> = self.kernels.iter().map(|k| k.name.as_str()).collect();
            BuildError::new(
                ErrorKind::KernelNotFound,
                format!(
                    "kernel '{kernel}' is not in the zebin; kernels: [{}]",
                    names.join(", ")
                ),
            )
        })?;
        Ok(Spill {
            bytes: k.spill_size.unwrap_or(k.scratch_size),
            simd: k.simd_size.unwrap_or(0),
        })
    }
}

/// What a request needs of a binary it did not build (another node's, or a bundle's,
/// already verified by its level): a zebin holding `kernel` with the spill its record
/// says, and linked unless `linked` is false (the request allows unresolved symbols).
/// `compiler` names what builds here (said when a build does not link).
#[derive(Clone, Copy)]
pub struct Fits<'a> {
    pub kernel: &'a str,
    pub linked: bool,
    pub compiler: &'a str,
}

impl Fits<'_> {
    /// Why `binary`, recorded as spilling `recorded`, does not fit, if it does not.
    pub fn check(&self, binary: &[u8], recorded: Spill) -> Result<()> {
        let info = parse(binary)?;
        if info.kernel_spill(self.kernel)? != recorded {
            return Err(BuildError::new(
                ErrorKind::InvalidArgument,
                "the entry's record does not describe its binary",
            ));
        }
        self.resolves(&info.undefined_symbols)
    }

    /// Unless the request allows unresolved symbols, `binary` must link, whichever level
    /// kept it (one kept here only may answer a request that allows them). Reads the ELF's
    /// symbols and relocations alone, not `.ze_info`: every hit pays this, and the YAML
    /// was 60% of a warm hit's time (what the entry spills, its record says; that it has
    /// a zebin's sections, `Levels::find` checked).
    pub fn linked(&self, binary: &[u8]) -> Result<()> {
        match self.linked {
            true => self.resolves(&unresolved_imports(binary)?),
            false => Ok(()),
        }
    }

    /// A zebin importing `symbols` that nothing provides cannot load: the driver's link
    /// fails on them (measured: Debian's IGC 1.x compiles calls of builtins it does not
    /// know, `intel_sub_group_2d_block_*`, into such imports and reports success).
    fn resolves(&self, symbols: &[String]) -> Result<()> {
        if !self.linked || symbols.is_empty() {
            return Ok(());
        }
        Err(BuildError::new(
            ErrorKind::LinkFailure,
            format!(
                "kernel '{}': {} left unresolved symbols nothing provides: {} \
                 (builtins this compiler does not know; the driver's own compiler may; \
                 allow_unresolved keeps such a build)",
                self.kernel,
                self.compiler,
                symbols.join(", ")
            ),
        ))
    }
}

#[derive(Deserialize)]
struct ZeInfoDoc {
    version: Option<serde_norway::Value>,
    #[serde(default)]
    kernels: Vec<ZeKernel>,
}

#[derive(Deserialize)]
struct ZeKernel {
    name: String,
    #[serde(default)]
    execution_env: ZeExecutionEnv,
    #[serde(default)]
    per_thread_memory_buffers: Vec<ZeMemoryBuffer>,
}

#[derive(Deserialize, Default)]
struct ZeExecutionEnv {
    grf_count: Option<u32>,
    simd_size: Option<u32>,
    spill_size: Option<u64>,
    private_size: Option<u64>,
}

#[derive(Deserialize)]
struct ZeMemoryBuffer {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    size: u64,
}

fn degenerate(message: impl Into<String>) -> BuildError {
    BuildError::new(ErrorKind::DegenerateBinary, message)
}

/// Parse a zebin and check it is usable: an ELF with `.ze_info`, `.symtab` and `.text.*`.
/// A binary failing these checks is what IGC leaves behind when it fails silently.
pub fn parse(bytes: &[u8]) -> Result<ZebinInfo> {
    parse_data(bytes)
}

/// `parse` of a zebin in a file, reading only what the checks need (headers, section
/// names, symbols, `.ze_info`), not its code: a large binary costs no memory. Reads stay
/// within the file's length.
pub fn parse_reader<R: std::io::Read + std::io::Seek>(reader: R) -> Result<ZebinInfo> {
    parse_data(&object::ReadCache::new(reader))
}

/// The symbols a zebin imports that nothing provides (`ZebinInfo::undefined_symbols`),
/// read from its ELF alone.
pub fn unresolved_imports(bytes: &[u8]) -> Result<Vec<String>> {
    Ok(undefined_symbols(&elf(bytes)?))
}

fn elf<'a, R: object::ReadRef<'a>>(data: R) -> Result<object::File<'a, R>> {
    if data.read_bytes_at(0, 4).ok() != Some(b"\x7fELF".as_slice()) {
        return Err(degenerate(
            "output is not an ELF zebin (legacy patch-token binary or garbage)",
        ));
    }
    object::File::parse(data)
        .map_err(|e| degenerate(format!("output is not a readable ELF file: {e}")))
}

fn parse_data<'a, R: object::ReadRef<'a>>(data: R) -> Result<ZebinInfo> {
    let file = elf(data)?;
    let sections = usable_sections(&file)?;
    let ze_info = file
        .section_by_name(".ze_info")
        .ok_or_else(|| degenerate("zebin has no .ze_info section"))?
        .data()
        .map_err(|e| degenerate(format!(".ze_info cannot be read: {e}")))?;
    let text =
        std::str::from_utf8(ze_info).map_err(|_| degenerate(".ze_info is not UTF-8 text"))?;
    let doc: ZeInfoDoc = serde_norway::from_str(text)
        .map_err(|e| degenerate(format!(".ze_info is not the YAML IGC writes: {e}")))?;
    let version = match doc.version {
        Some(serde_norway::Value::String(s)) => s,
        Some(serde_norway::Value::Number(n)) => n.to_string(),
        _ => String::new(),
    };
    let kernels = doc
        .kernels
        .into_iter()
        .map(|k| {
            let sum = |kind: &str| {
                // Saturating: the sizes are the file's word, not ours (no overflow panic).
                k.per_thread_memory_buffers
                    .iter()
                    .filter(|b| b.kind == kind)
                    .fold(0u64, |total, b| total.saturating_add(b.size))
            };
            KernelInfo {
                grf_count: k.execution_env.grf_count,
                simd_size: k.execution_env.simd_size,
                spill_size: k.execution_env.spill_size,
                private_size: k.execution_env.private_size,
                scratch_size: sum("scratch"),
                private_space_size: sum("private_space"),
                name: k.name,
            }
        })
        .collect();
    Ok(ZebinInfo {
        version,
        kernels,
        sections,
        undefined_symbols: undefined_symbols(&file),
    })
}

/// Whether `bytes` is an ELF with the sections every loadable zebin has (`usable_sections`),
/// without reading its `.ze_info` YAML: what a hit of one's own cache checks (a build
/// here was parsed whole when it was made; a hit must not cost the parse).
pub fn has_zebin_sections(bytes: &[u8]) -> Result<()> {
    usable_sections(&elf(bytes)?).map(|_| ())
}

/// The section names of a zebin, when it has those every loadable zebin must: `.text.*`,
/// one `.symtab` and one `.ze_info` (what IGC leaves out when it fails silently; the
/// driver refuses a second `.ze_info` or `.symtab`, and which one a reader took would
/// decide its spill).
fn usable_sections<'a, R: object::ReadRef<'a>>(file: &object::File<'a, R>) -> Result<Vec<String>> {
    let sections: Vec<String> = file
        .sections()
        .map(|s| s.name().unwrap_or("").to_string())
        .collect();
    let has_text = sections.iter().any(|s| s.starts_with(".text."));
    let has_symtab = sections.iter().any(|s| s == ".symtab");
    if !has_text || !has_symtab {
        return Err(degenerate(format!(
            "zebin lacks {}: IGC likely failed without reporting an error (sections: [{}])",
            match (has_text, has_symtab) {
                (false, false) => ".text.* and .symtab",
                (false, true) => ".text.*",
                _ => ".symtab",
            },
            sections.join(", ")
        )));
    }
    if !sections.iter().any(|s| s == ".ze_info") {
        return Err(degenerate("zebin has no .ze_info section"));
    }
    for name in [".symtab", ".ze_info"] {
        let n = sections.iter().filter(|s| *s == name).count();
        if n > 1 {
            return Err(degenerate(format!(
                "zebin has {n} {name} sections, not one"
            )));
        }
    }
    Ok(sections)
}

/// Symbols the driver's linker resolves itself (IGC's relocation names, vISA
/// `RelocationInfo.h` and its zebin builder's runtime symbols, and the runtime's built-in
/// globals): imports, but never missing.
const DRIVER_SYMBOLS: [&str; 4] = [
    "__INTEL_PER_THREAD_OFF",
    "__SubDeviceID",
    "__MaxHWThreadIDPerSubDevice",
    "INTEL_PATCH_CROSS_THREAD_OFFSET_OFF_R0",
];

fn driver_provides(name: &str) -> bool {
    DRIVER_SYMBOLS.contains(&name) || name.starts_with("__INTEL_PATCH_")
}

/// Undefined symbols that code or data refers to (a relocation names them): the driver's
/// linker fails on those alone, not on a symbol table entry nothing uses.
fn undefined_symbols<'a, R: object::ReadRef<'a>>(file: &object::File<'a, R>) -> Vec<String> {
    let used: std::collections::HashSet<object::SymbolIndex> = file
        .sections()
        .flat_map(|s| s.relocations().collect::<Vec<_>>())
        .filter_map(|(_, r)| match r.target() {
            object::RelocationTarget::Symbol(i) => Some(i),
            _ => None,
        })
        .collect();
    let mut names: Vec<String> = Vec::new();
    for symbol in file
        .symbols()
        .filter(|s| s.is_undefined() && used.contains(&s.index()))
    {
        let name = symbol.name().unwrap_or("");
        if !name.is_empty() && !driver_provides(name) && !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    names
}

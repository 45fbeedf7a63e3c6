//! One key scheme for everything the package remembers about a build: the offline engine's
//! and the Level Zero path's cache entries, and the record of native binaries that loaded
//! safely. Every input that can change the answer is in the key, the kernel name included
//! (one SPIR-V module holds many kernels, each with its own spills and GRF choice).

use crate::cache;
use crate::spill::Rule;

/// What a key is for: entries of different purposes never answer for each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `ocloc` built this kernel (the offline engine, `make_zebin`).
    Offline,
    /// The Level Zero driver built this kernel from SPIR-V (`compile_and_load`).
    Jit,
    /// This native binary loaded in a worker on this device and driver.
    NativeTrial,
    /// A bundle's native build for a target profile (`bundle/`).
    Bundle,
}

impl Purpose {
    /// v4 of offline and jit: the ladder hashed whole (a kernel that asks for its own
    /// GRF mode is built on the first rung only by the ladder itself, `ladder::Plan`).
    /// v5: a hit reads only the key's part of the SPIR-V (`spirv::scan`), so an entry must
    /// be of input this validator accepted (`spirv::validate`, before every build); bump
    /// again when it refuses more.
    fn tag(self) -> &'static [u8] {
        match self {
            Purpose::Offline => b"xpu-zebin/offline/v5",
            Purpose::Jit => b"xpu-zebin/jit/v5",
            Purpose::NativeTrial => b"xpu-zebin/native-trial/v3",
            Purpose::Bundle => b"xpu-zebin/bundle/v1",
        }
    }
}

/// The inputs of one build or load, as a key.
pub struct KeyInputs<'a> {
    pub purpose: Purpose,
    /// The SPIR-V module or native binary.
    pub input: &'a [u8],
    pub kernel: &'a str,
    /// The build flags that may be tried, in order (one set for a native load).
    pub flags: &'a [String],
    /// The rule that chooses between them (`None` when nothing is chosen).
    pub rule: Option<Rule>,
    /// Who builds or loads it: the compiler's identity and device name, or the Level Zero
    /// device and driver.
    pub target: &'a [&'a str],
}

impl KeyInputs<'_> {
    pub fn key(&self) -> String {
        let flags = self.flags.join("\n");
        let rule = self.rule.map(Rule::name).unwrap_or_default();
        let mut parts: Vec<&[u8]> = vec![
            self.purpose.tag(),
            self.input,
            self.kernel.as_bytes(),
            flags.as_bytes(),
            rule.as_bytes(),
        ];
        parts.extend(self.target.iter().map(|t| t.as_bytes()));
        cache::key(&parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_input_changes_the_key() {
        let flags = vec![String::new(), "-cl-intel-256-GRF-per-thread".to_string()];
        let one = vec![String::new()];
        let base = KeyInputs {
            purpose: Purpose::Offline,
            input: b"spirv",
            kernel: "add",
            flags: &flags,
            rule: Some(Rule::Any),
            target: &["pvc", "ocloc 1"],
        };
        let variants = [
            KeyInputs {
                purpose: Purpose::Jit,
                ..base
            },
            KeyInputs {
                input: b"other",
                ..base
            },
            KeyInputs {
                kernel: "spill",
                ..base
            },
            KeyInputs {
                flags: &one,
                ..base
            },
            KeyInputs {
                rule: Some(Rule::Slots(16)),
                ..base
            },
            KeyInputs { rule: None, ..base },
            KeyInputs {
                target: &["bmg", "ocloc 1"],
                ..base
            },
            KeyInputs {
                target: &["pvc", "ocloc 2"],
                ..base
            },
        ];
        let k = base.key();
        for v in &variants {
            assert_ne!(v.key(), k);
        }
    }
}

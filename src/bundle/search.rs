//! Finding a kernel's native build in the bundles this process uses (`$XPU_ZEBIN_BUNDLE`,
//! then every imported one) for a device's target profiles: the one search behind every
//! path that asks a bundle (the Level Zero load's bundle level, `make_zebin`, the Triton
//! drop-ins). What a target profile is (Triton's warp size, the driver) is the caller's.

use super::{lookup, unusable, Found, Lookup};
use crate::options::Options;
use std::path::PathBuf;

/// Bundle directories the drop-ins look in, `:`-separated (imported bundles too).
pub const BUNDLE_ENV: &str = "XPU_ZEBIN_BUNDLE";

/// What a request looks up in bundles: the Triton release of the caller (a bundle of
/// another Triton's SPIR-V is skipped), the device's target profiles, most specific first,
/// each as (its `ocloc` device, its id), and the bundles (`search_path`'s, as the caller
/// found them when it decided to ask).
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub triton: Option<String>,
    pub targets: Vec<(String, String)>,
    pub dirs: Vec<PathBuf>,
}

/// A bundle's build of a kernel: its native binary and the flags it was built with.
#[derive(Debug, Clone)]
pub struct Build {
    pub native: Vec<u8>,
    pub build_flags: String,
}

/// Why no bundle answered.
#[derive(Debug, Clone)]
pub enum Missed {
    /// No bundle holds the kernel for these targets (why, for a debug line).
    Absent(String),
    /// A bundle holds it, but its entry fails its checks.
    Refused(String),
}

/// Why a bundle is not used, said once as a warning, in the words of its reason: no
/// bundle there at all, another Triton's, or what is wrong with it.
fn not_used(why: &str) {
    let message = if why.ends_with("; skipped") {
        format!("{BUNDLE_ENV}: {why}")
    } else if why.ends_with(": not used") {
        why.to_string()
    } else {
        format!("bundle not used: {why}")
    };
    crate::diag::warn_once(&format!("bundle:{message}"), message);
}

/// The bundles the drop-ins use: `$XPU_ZEBIN_BUNDLE`, then every imported one (the cache
/// directory's `bundles/`, by name). A directory that holds no usable bundle for `triton`
/// is said once and skipped.
pub fn search_path(triton: Option<&str>) -> Vec<PathBuf> {
    let listed = std::env::var_os(BUNDLE_ENV).unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&listed)
        .filter(|d| !d.to_string_lossy().trim().is_empty())
        .collect();
    if let Ok(imported) = crate::cache::default_dir().map(|d| d.join("bundles")) {
        if let Ok(read) = std::fs::read_dir(&imported) {
            let mut names: Vec<PathBuf> = read
                .flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path())
                .collect();
            names.sort();
            dirs.extend(names);
        }
    }
    dirs.retain(|d| match unusable(d, triton) {
        None => true,
        Some(why) => {
            not_used(&why);
            false
        }
    });
    dirs
}

/// Where to look for one kernel: the bundles, the kernel's name, the caller's Triton, and
/// the kernel's bundle key for each target profile (with the profile's id), most
/// specific first.
#[derive(Debug, Clone)]
pub struct Wanted {
    pub dirs: Vec<PathBuf>,
    pub kernel: String,
    pub triton: Option<String>,
    pub keys: Vec<(String, String)>,
}

impl Wanted {
    /// What to look up for `kernel` of `spirv` built with `options`, in the query's
    /// bundles; None (why, for the debug log) when there is nothing to look for.
    pub fn new(
        spirv: &[u8],
        kernel: &str,
        options: &Options,
        query: &Query,
    ) -> Result<Wanted, String> {
        if query.dirs.is_empty() {
            return Err("no bundle".into());
        }
        let keys = query
            .targets
            .iter()
            .map(|(device, id)| {
                let key = super::key(spirv, kernel, device, options, id);
                key.map(|k| (k, id.clone()))
                    .map_err(|e| format!("no bundle key for target {}: {}", short(id), e.message))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Wanted {
            dirs: query.dirs.clone(),
            kernel: kernel.to_string(),
            triton: query.triton.clone(),
            keys,
        })
    }

    /// The build a bundle holds for the first target that has one.
    pub fn find(&self) -> Result<Build, Missed> {
        let mut others: Vec<String> = Vec::new();
        for (key, id) in &self.keys {
            let triton = self.triton.as_deref();
            let Lookup { found, skipped } = lookup(&self.dirs, key, &self.kernel, id, triton);
            skipped.iter().for_each(|why| not_used(why));
            match found {
                Found::Native(entry, native) => {
                    return Ok(Build {
                        native,
                        build_flags: entry.build_flags.clone(),
                    })
                }
                Found::Refused(why) => return Err(Missed::Refused(why)),
                Found::Missing { other_target_ids } => {
                    for t in other_target_ids {
                        if !others.contains(&t) {
                            others.push(t);
                        }
                    }
                }
            }
        }
        others.retain(|t| !self.keys.iter().any(|(_, id)| id == t));
        Err(Missed::Absent(match others.is_empty() {
            true => "not in the bundle".into(),
            false => {
                let shown: Vec<&str> = others.iter().map(|t| short(t)).collect();
                format!(
                    "the bundle has it for other targets only ({})",
                    shown.join(", ")
                )
            }
        }))
    }
}

/// A target id as said in a line: its first 12 characters (an id read from a manifest
/// may hold anything).
fn short(id: &str) -> &str {
    id.char_indices().nth(12).map_or(id, |(at, _)| &id[..at])
}

/// The build of `kernel` (from `spirv`, with `options`) that a bundle of the query's
/// holds for the first of its targets that has one.
pub fn find(spirv: &[u8], kernel: &str, options: &Options, query: &Query) -> Result<Build, Missed> {
    Wanted::new(spirv, kernel, options, query)
        .map_err(Missed::Absent)?
        .find()
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_id_is_shortened_on_a_character() {
        assert_eq!(super::short("0123456789abcdef"), "0123456789ab");
        assert_eq!(super::short("aaaaaaaaaaaé-more"), "aaaaaaaaaaaé");
        assert_eq!(super::short("ééééééééééééé"), "éééééééééééé");
        assert_eq!(super::short("short"), "short");
    }
}

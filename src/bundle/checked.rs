//! A bundle checked whole: every file it lists read and checked (`verify`), or copied as
//! it is stored once checked (`copy_verified`, an import).

use super::triton::{self, triton_files, Natives};
use super::{bad, check_trusted, entry_bytes, entry_member, persist, persist_manifest, read};
use crate::error::Result;
use serde::Serialize;
use std::path::Path;

/// Copy the bundle at `src` into `dest` (a new directory): its manifest and every file it
/// lists, each read checked (sizes, checksums, a zebin holding its kernel) and copied as
/// it is stored (its manifest, and so its signature, stay as they are), nothing else.
pub fn copy_verified(src: &Path, dest: &Path) -> Result<usize> {
    let manifest = read(src)?;
    check_trusted(src, &manifest)?;
    let io = |e: std::io::Error| bad(dest, e);
    std::fs::create_dir(dest).map_err(io)?;
    std::fs::create_dir(dest.join("native")).map_err(io)?;
    for e in &manifest.entries {
        let member = entry_member(src, e).map_err(|why| bad(src, why))?;
        persist(&dest.join("native"), &dest.join(&e.file), &member.stored).map_err(io)?;
    }
    let natives = Natives::of(&manifest.entries);
    for t in &manifest.triton_cache {
        let files = triton::triton_members(src, &natives, t).map_err(|why| bad(src, why))?;
        let here = triton::make_entry_dir(dest, t)?;
        for (name, member) in files {
            persist(&here, &here.join(name), &member.stored).map_err(io)?;
        }
    }
    persist_manifest(dest, &manifest).map_err(io)?;
    Ok(manifest.entries.len())
}

/// What `verify` found: entries whose bytes are what the manifest says, and the others.
#[derive(Debug, Default, Serialize)]
pub struct Verified {
    pub ok: Vec<String>,
    pub bad: Vec<(String, String)>,
}

/// Check every entry of the bundle.
pub fn verify(dir: &Path) -> Result<Verified> {
    let manifest = read(dir)?;
    let mut report = Verified::default();
    if let Err(e) = check_trusted(dir, &manifest) {
        report.bad.push(("signature".into(), e.message));
    }
    for e in &manifest.entries {
        match entry_bytes(dir, e) {
            Ok(_) => report.ok.push(e.key.clone()),
            Err(why) => report.bad.push((e.key.clone(), why)),
        }
    }
    let natives = Natives::of(&manifest.entries);
    for t in &manifest.triton_cache {
        let name = format!("triton:{}:{}", &t.target_id[..12], t.hash);
        match triton_files(dir, &natives, t) {
            Ok(_) => report.ok.push(name),
            Err(why) => report.bad.push((name, why)),
        }
    }
    Ok(report)
}

//! The archive's tests: packing and unpacking, bounds, hostile archives, flat memory.

use super::layout::{header, place, triton_path};
use super::unpack::unpack_with_limits;
use super::*;
use crate::bundle::{Manifest, TritonEntry, MANIFEST};
use proptest::prelude::*;
use std::path::Path;

/// A tar holding one regular file at `path`, written byte by byte (the tar crate's
/// own builder refuses paths with `..`, which a hostile archive would not).
fn tar_with(path: &str, data: &[u8]) -> Vec<u8> {
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
    header.set_size(data.len() as u64);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_cksum();
    let mut out = header.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

#[test]
fn only_a_bundles_paths_have_a_place() {
    let key = "a".repeat(64);
    assert!(place("manifest.json").is_some());
    assert!(place(&format!("native/{key}.zebin")).is_some());
    assert!(place(&format!("triton/{key}/{key}/k.spv")).is_some());
    assert!(place(&format!("triton/{key}/k.spv")).is_none());
    for hostile in [
        "../manifest.json".to_string(),
        format!("native/../{key}.zebin"),
        format!("native/{key}.so"),
        format!("triton/{key}/{key}/__grp__k.json"),
        format!("triton/{key}/{key}/../../x"),
        "/etc/passwd".to_string(),
        "native".to_string(),
    ] {
        assert!(place(&hostile).is_none(), "{hostile}");
    }
}

/// A bundle with one Triton entry whose file names are long (paths past tar's 100
/// bytes: GNU long names) packs, unpacks and verifies.
#[test]
fn long_names_round_trip_and_huge_name_records_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let stem = "k".repeat(150);
    let entry = super::super::TritonEntry {
        hash: "b".repeat(64),
        kernel: stem.clone(),
        config: String::new(),
        target_id: "c".repeat(64),
        native: false,
        files: Vec::new(),
        native_key: String::new(),
    };
    let files = vec![
        (format!("{stem}.json"), b"{}".to_vec()),
        (format!("{stem}.spv"), spirv_of(&stem)),
    ];
    let additions = super::super::Additions {
        triton: vec![(entry, files)],
        ..Default::default()
    };
    let bundle = dir.path().join("b");
    super::super::write(&bundle, super::super::Manifest::default(), additions).unwrap();
    let archive = dir.path().join("b.tar");
    assert_eq!(pack(&bundle, &archive).unwrap(), 3);
    unpack(&archive, &dir.path().join("u")).unwrap();
    let report = super::super::verify(&dir.path().join("u")).unwrap();
    assert!(report.bad.is_empty() && report.ok.len() == 1, "{report:?}");
    assert!(pack(&bundle, &bundle.join("inside.tar")).is_err());

    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::GNULongName);
    header.set_size(1 << 20);
    header.set_cksum();
    let mut huge = header.as_bytes().to_vec();
    huge.resize(512 + (1 << 20) + 1024, b'a');
    std::fs::write(dir.path().join("huge.tar"), huge).unwrap();
    let err = unpack(&dir.path().join("huge.tar"), &dir.path().join("h")).unwrap_err();
    assert!(err.message.contains("larger than"), "{}", err.message);
}

/// A minimal ELF64 zebin holding kernel `k` (as `tests/properties.rs` builds one).
fn zebin() -> Vec<u8> {
    let ze_info = b"version: '1.20'\nkernels:\n  - name: k\n    execution_env:\n      grf_count: 128\n      simd_size: 32\n";
    let names = b"\0.text.k\0.symtab\0.ze_info\0.shstrtab\0";
    let mut data = vec![0u8; 64 + 16 + 24]; // header, .text.k, one null symbol
    data.extend_from_slice(ze_info);
    data.extend_from_slice(names);
    data.resize(data.len().div_ceil(8) * 8, 0);
    let sh_off = data.len();
    let section = |out: &mut Vec<u8>, name: u32, kind: u32, off: usize, size: usize| {
        for word in [name, kind] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        let entsize = if kind == 2 { 24 } else { 0 };
        for word in [0, 0, off as u64, size as u64] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.extend_from_slice(&[0u8; 8]); // link, info
        out.extend_from_slice(&8u64.to_le_bytes());
        out.extend_from_slice(&(entsize as u64).to_le_bytes());
    };
    data.extend_from_slice(&[0u8; 64]); // null section
    section(&mut data, 1, 1, 64, 16);
    section(&mut data, 9, 2, 80, 24);
    section(&mut data, 17, 0xff00_0001, 104, ze_info.len());
    section(&mut data, 26, 3, 104 + ze_info.len(), names.len());
    data[..4].copy_from_slice(b"\x7fELF");
    data[4..7].copy_from_slice(&[2, 1, 1]); // 64-bit, little-endian, version
    data[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
    data[18..20].copy_from_slice(&0xcdu16.to_le_bytes()); // Intel GEN
    data[20..24].copy_from_slice(&1u32.to_le_bytes());
    data[40..48].copy_from_slice(&(sh_off as u64).to_le_bytes());
    for (at, half) in [(52, 64u16), (58, 64), (60, 5), (62, 4)] {
        data[at..at + 2].copy_from_slice(&half.to_le_bytes());
    }
    data
}

/// `head` at `path`, the file then `len` bytes long (a sparse tail: no disk, no time);
/// returns its blake3, read streaming.
fn sparse_file(path: &Path, head: &[u8], len: u64) -> String {
    std::fs::write(path, head).unwrap();
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
    let mut hasher = blake3::Hasher::new();
    hasher
        .update_reader(std::fs::File::open(path).unwrap())
        .unwrap();
    hasher.finalize().to_hex().to_string()
}

/// A SPIR-V module with one kernel, `name`: what a Triton entry's binary must be.
fn spirv_of(name: &str) -> Vec<u8> {
    use rspirv::binary::Assemble;
    use rspirv::spirv;
    let mut b = rspirv::dr::Builder::new();
    b.set_version(1, 2);
    b.capability(spirv::Capability::Kernel);
    b.capability(spirv::Capability::Addresses);
    b.memory_model(
        spirv::AddressingModel::Physical64,
        spirv::MemoryModel::OpenCL,
    );
    let void = b.type_void();
    let fn_type = b.type_function(void, vec![]);
    let f = b
        .begin_function(void, None, spirv::FunctionControl::NONE, fn_type)
        .unwrap();
    b.begin_block(None).unwrap();
    b.ret().unwrap();
    b.end_function().unwrap();
    b.entry_point(spirv::ExecutionModel::Kernel, f, name, vec![]);
    b.module()
        .assemble()
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

/// A bundle at `dir` with `natives` native entries for `k` (zebins `native_len` bytes
/// long) and one Triton entry with a SPIR-V module of `k`, written file by file (no
/// large file in memory).
fn bundle_of(dir: &Path, natives: usize, native_len: u64) -> Manifest {
    let (hash, target_id) = ("b".repeat(64), "c".repeat(64));
    std::fs::create_dir_all(dir.join("native")).unwrap();
    let entries = (0..natives)
        .map(|i| {
            let key = ["a", "5", "6", "7"][i % 4].repeat(64);
            let file = format!("native/{key}.zebin");
            let blake3 = sparse_file(&dir.join(&file), &zebin(), native_len);
            super::super::Entry {
                key,
                kernel: "k".to_string(),
                config: String::new(),
                target_id: target_id.clone(),
                build_flags: String::new(),
                spill_bytes: 0,
                n_spills: 0,
                compiler: String::new(),
                file,
                blake3,
                size: native_len,
                stored: None,
            }
        })
        .collect();
    let here = dir.join("triton").join(&target_id).join(&hash);
    std::fs::create_dir_all(&here).unwrap();
    let spirv = spirv_of("k");
    let files = [("k.json", &b"{}"[..]), ("k.spv", &spirv[..])].map(|(name, bytes)| {
        super::super::TritonFile {
            name: name.to_string(),
            size: bytes.len() as u64,
            blake3: sparse_file(&here.join(name), bytes, bytes.len() as u64),
            stored: None,
        }
    });
    let manifest = Manifest {
        format: super::super::FORMAT.to_string(),
        entries,
        triton_cache: vec![TritonEntry {
            hash,
            kernel: "k".to_string(),
            config: String::new(),
            target_id,
            native: false,
            files: files.to_vec(),
            native_key: String::new(),
        }],
        ..Default::default()
    };
    let text = serde_json::to_vec_pretty(&manifest).unwrap();
    std::fs::write(dir.join(MANIFEST), text).unwrap();
    manifest
}

/// This process's peak resident memory so far, in bytes (`VmHWM`).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb << 10
}

const MEMORY_CHILD: &str = "XPU_ZEBIN_ARCHIVE_MEMORY_CHILD";

/// Packing and unpacking a 1 GiB bundle (four 256 MiB files, the most one may be)
/// costs far less memory than one of its files: every file is streamed. Run in a child
/// process of its own (this test binary again, filtered), so that its peak is this
/// work's alone.
#[test]
fn a_large_bundle_packs_and_unpacks_in_flat_memory() {
    if std::env::var_os(MEMORY_CHILD).is_none() {
        let module = module_path!().split_once("::").unwrap().1;
        let name = format!("{module}::a_large_bundle_packs_and_unpacks_in_flat_memory");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(MEMORY_CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("{stdout}");
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(
            stdout.contains("peak memory"),
            "the child ran no test: {stdout}"
        );
        return;
    }
    let before = peak_rss();
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("b");
    let big = MAX_ENTRY_BYTES;
    bundle_of(&bundle, 4, big);
    let archive = dir.path().join("b.tar");
    assert_eq!(pack(&bundle, &archive).unwrap(), 7);
    let after_pack = peak_rss();
    let unpacked = dir.path().join("u");
    let manifest = unpack(&archive, &unpacked).unwrap();
    let after = peak_rss();
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    println!(
        "peak memory: {:.1} MiB before, {:.1} MiB after pack, {:.1} MiB after unpack \
         ({:.0} MiB bundle, {:.0} MiB archive)",
        mib(before),
        mib(after_pack),
        mib(after),
        mib(4 * big),
        mib(std::fs::metadata(&archive).unwrap().len()),
    );
    assert!(
        after - before < 64 << 20,
        "peak grew by {:.1} MiB",
        mib(after - before)
    );
    // Whole and as listed (`verify` reads entries whole: after the measure).
    assert_eq!(manifest.entries[0].size, big);
    let report = super::super::verify(&unpacked).unwrap();
    assert!(report.bad.is_empty() && report.ok.len() == 5, "{report:?}");
}

/// An archive of `members` (path, bytes), in order, through the tar crate.
fn archive_of(path: &Path, members: &[(&str, &[u8])]) {
    let mut tar = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (name, bytes) in members {
        tar.append_data(&mut header(bytes.len() as u64), name, *bytes)
            .unwrap();
    }
    tar.finish().unwrap();
}

/// A file at a bundle's own path that the manifest does not list is refused, naming it,
/// whether it comes after the manifest or before, and nothing of the archive stays.
#[test]
fn files_the_manifest_does_not_list_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("b");
    bundle_of(&bundle, 1, 4096);
    let manifest = std::fs::read(bundle.join(MANIFEST)).unwrap();
    let stray = format!("native/{}.zebin", "d".repeat(64));
    let listed = format!("native/{}.zebin", "a".repeat(64));
    let native = std::fs::read(bundle.join(&listed)).unwrap();
    // Packing takes only what the manifest lists, whatever else is in the directory.
    std::fs::write(bundle.join(&stray), &native).unwrap();
    let archive = dir.path().join("b.tar");
    assert_eq!(pack(&bundle, &archive).unwrap(), 4);
    unpack(&archive, &dir.path().join("ok")).unwrap();
    assert!(!dir.path().join("ok").join(&stray).exists());

    let after: &[(&str, &[u8])] = &[(MANIFEST, &manifest), (&listed, &native), (&stray, &native)];
    let before: &[(&str, &[u8])] = &[(&stray, &native), (MANIFEST, &manifest)];
    for (i, members) in [after, before].into_iter().enumerate() {
        let archive = dir.path().join(format!("{i}.tar"));
        archive_of(&archive, members);
        let dest = dir.path().join(format!("u{i}"));
        let err = unpack(&archive, &dest).unwrap_err();
        assert!(
            err.message
                .contains(&format!("{stray:?} is not a file its manifest lists")),
            "{}",
            err.message
        );
        assert!(!dest.exists(), "a refused archive left {}", dest.display());
    }
}

/// More members than the bound (directories count too), more bytes in all than the
/// bound, a file larger than the bound: each a clear error, nothing left.
#[test]
fn members_and_bytes_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = format!(
        r#"{{"format": "{}", "package": "0"}}"#,
        super::super::FORMAT
    );
    let mut bytes = tar_with(MANIFEST, manifest.as_bytes());
    bytes.truncate(bytes.len() - 1024);
    let mut dir_header = tar::Header::new_gnu();
    dir_header.set_entry_type(tar::EntryType::Directory);
    dir_header.set_path("native/").unwrap();
    dir_header.set_size(0);
    dir_header.set_mode(0o755);
    dir_header.set_cksum();
    // A flood of headers past the bound (lowered here: the real one is millions).
    let few = Limits {
        members: 1 << 12,
        ..LIMITS
    };
    for _ in 0..few.members {
        bytes.extend_from_slice(dir_header.as_bytes());
    }
    bytes.resize(bytes.len() + 1024, 0);
    let flood = dir.path().join("flood.tar");
    std::fs::write(&flood, &bytes).unwrap();
    let err = unpack_with_limits(&flood, &dir.path().join("f"), few).unwrap_err();
    assert!(
        err.message.contains("more than 4096 members"),
        "{}",
        err.message
    );
    assert!(!dir.path().join("f").exists());

    let bundle = dir.path().join("b");
    bundle_of(&bundle, 1, 4096);
    let archive = dir.path().join("b.tar");
    pack(&bundle, &archive).unwrap();
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    let total = size(&bundle.join(MANIFEST)) + 4096 + 2 + spirv_of("k").len() as u64;
    // The manifest, the native entry, two Triton files each with its GNU long name.
    let tight = Limits {
        members: 6,
        total_bytes: total,
        entry_bytes: 4096,
    };
    unpack_with_limits(&archive, &dir.path().join("ok"), tight).unwrap();
    // A member cut short (the archive ends inside it) is no file of the bundle.
    let bytes = std::fs::read(&archive).unwrap();
    let cut = dir.path().join("cut.tar");
    std::fs::write(&cut, &bytes[..size(&bundle.join(MANIFEST)) as usize + 2048]).unwrap();
    let err = unpack(&cut, &dir.path().join("c")).unwrap_err();
    assert!(
        err.message.contains("where its header says 4096"),
        "{}",
        err.message
    );
    assert!(!dir.path().join("c").exists());
    let fewer = |members, total_bytes, entry_bytes| Limits {
        members,
        total_bytes,
        entry_bytes,
    };
    for (limits, why) in [
        (fewer(5, total, 4096), "more than 5 members".to_string()),
        (
            fewer(6, total - 1, 4096),
            format!("more than {} bytes in all", total - 1),
        ),
        (
            fewer(6, total, 4095),
            "4096 bytes: larger than 4095 bytes".to_string(),
        ),
    ] {
        let dest = dir.path().join("u");
        let err = unpack_with_limits(&archive, &dest, limits).unwrap_err();
        assert!(err.message.contains(&why), "{why}: {}", err.message);
        assert!(!dest.exists());
    }
}

/// A pack that fails (a file no longer what the manifest says) leaves the archive it
/// would have replaced as it was, and no temporary file beside it.
#[test]
fn a_failed_pack_leaves_the_old_archive() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("b");
    let manifest = bundle_of(&bundle, 1, 4096);
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let archive = out_dir.join("b.tar");
    std::fs::write(&archive, b"old").unwrap();
    let spv = bundle.join(triton_path(&manifest.triton_cache[0], "k.spv"));
    let mut changed = std::fs::read(&spv).unwrap();
    changed[40] ^= 1;
    std::fs::write(&spv, changed).unwrap();
    let err = pack(&bundle, &archive).unwrap_err();
    assert!(
        err.message.contains("does not match its checksum"),
        "{}",
        err.message
    );
    assert_eq!(std::fs::read(&archive).unwrap(), b"old");
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any bytes as an archive: an error or a checked bundle, never a panic, and
    /// nothing written outside the new directory.
    #[test]
    fn any_bytes_unpack_safely(bytes in proptest::collection::vec(any::<u8>(), 0..3000)) {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("a.tar");
        std::fs::write(&archive, &bytes).unwrap();
        let _ = unpack(&archive, &dir.path().join("out"));
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        prop_assert!(names.len() <= 2);
    }

    /// Any path in a well-formed archive: refused unless it is a bundle's, and never
    /// written outside the new directory.
    #[test]
    fn archive_paths_stay_inside(path in "[a-z0-9_./]{1,60}") {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("a.tar");
        std::fs::write(&archive, tar_with(&path, b"{}")).unwrap();
        let result = unpack(&archive, &dir.path().join("out"));
        if place(&path).is_none() {
            prop_assert!(result.is_err());
        }
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        prop_assert!(names.len() <= 2, "{names:?}");
    }
}

/// A signature covers the manifest as serialized less its signature: the borrowed view
/// (no copy of a large manifest) writes the very bytes the whole manifest would, so the
/// signatures of bundles signed before it still verify.
#[test]
fn the_signed_message_is_the_manifest_less_its_signature() {
    let dir = tempfile::tempdir().unwrap();
    let mut manifest = bundle_of(dir.path(), 3, 4096);
    manifest.format = super::super::FORMAT.to_string();
    manifest.triton = Some("3.3.0".to_string());
    manifest.triton_key = Some("d".repeat(64));
    manifest
        .targets
        .insert("c".repeat(64), serde_json::json!({"arch": {"x": 1}}));
    manifest.failures.push(super::super::Unbuilt {
        kernel: "k".to_string(),
        config: "c".to_string(),
        target_id: "c".repeat(64),
        kind: "scratch_overflow".to_string(),
        message: "m".to_string(),
    });
    manifest.signature = Some(super::super::BundleSignature {
        signer: "farm:00".to_string(),
        signature: "11".to_string(),
    });
    let mut unsigned = manifest.clone();
    unsigned.signature = None;
    let mut whole = super::super::SIGNED_TAG.to_vec();
    whole.extend(serde_json::to_vec(&unsigned).unwrap());
    assert_eq!(super::super::signed_message(&manifest), whole);
}

/// A manifest's targets are read as text and bounded before any becomes a JSON value (a
/// value takes many times its text): a flood of them is refused by name.
#[test]
fn a_manifest_flooding_its_targets_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let zeros = vec!["0"; 3 << 20].join(",");
    let manifest = format!(
        r#"{{"format": "{}", "package": "0", "targets": {{"x": [{zeros}]}}}}"#,
        super::super::FORMAT
    );
    std::fs::write(dir.path().join(MANIFEST), manifest).unwrap();
    let err = super::super::read(dir.path()).unwrap_err();
    assert!(
        err.message.contains("more than a manifest may hold"),
        "{}",
        err.message
    );
    let few = format!(
        r#"{{"format": "{}", "package": "0", "targets": {{"x": {{"arch": 1}}}}}}"#,
        super::super::FORMAT
    );
    std::fs::write(dir.path().join(MANIFEST), few).unwrap();
    assert_eq!(super::super::read(dir.path()).unwrap().targets.len(), 1);
}

//! Property tests of every reader of untrusted bytes: SPIR-V, zebins and their `.ze_info`,
//! cache entries, worker frames. Whatever the input, each returns (an error or a value):
//! no panic, no abort, no allocation sized by a number in the input. Fixed budget per
//! property (`PROPTEST_CASES` raises it), so CI time stays bounded.

use proptest::prelude::*;
use rspirv::binary::Assemble;
use rspirv::spirv;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(512),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A small, valid OpenCL kernel module, words.
fn kernel_module() -> Vec<u32> {
    kernel_module_asking(0)
}

/// The same module, its kernel asking for a GRF mode itself (SPV_INTEL_maximum_registers):
/// none (0), 128 registers (1), the constant 256 (2), IGC's choice (3).
fn kernel_module_asking(grf: u8) -> Vec<u32> {
    let mut b = rspirv::dr::Builder::new();
    b.set_version(1, 2);
    b.capability(spirv::Capability::Kernel);
    b.capability(spirv::Capability::Addresses);
    b.memory_model(
        spirv::AddressingModel::Physical64,
        spirv::MemoryModel::OpenCL,
    );
    let void = b.type_void();
    let int = b.type_int(32, 0);
    let fn_type = b.type_function(void, vec![]);
    let f = b
        .begin_function(void, None, spirv::FunctionControl::NONE, fn_type)
        .unwrap();
    b.begin_block(None).unwrap();
    let one = b.constant_bit32(int, 1);
    b.i_add(int, None, one, one).unwrap();
    b.ret().unwrap();
    b.end_function().unwrap();
    b.entry_point(spirv::ExecutionModel::Kernel, f, "k", vec![]);
    match grf {
        1 => b.execution_mode(f, spirv::ExecutionMode::MaximumRegistersINTEL, [128]),
        2 => {
            let regs = b.constant_bit32(int, 256);
            b.execution_mode_id(f, spirv::ExecutionMode::MaximumRegistersIdINTEL, [regs])
        }
        3 => b.execution_mode(f, spirv::ExecutionMode::NamedMaximumRegistersINTEL, [0]),
        _ => {}
    }
    b.module().assemble()
}

fn bytes_of(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A minimal ELF64 zebin: `.text.k`, `.symtab`, and `.ze_info` holding `ze_info`.
fn zebin_with(ze_info: &[u8]) -> Vec<u8> {
    let names = b"\0.text.k\0.symtab\0.ze_info\0.shstrtab\0";
    let (text, symtab, info, shstr) = (1u32, 9u32, 17u32, 26u32);
    let mut data = Vec::new();
    let text_off = 64usize;
    data.extend_from_slice(&[0u8; 64]);
    data.extend_from_slice(&[0u8; 16]); // .text.k
    let symtab_off = data.len();
    data.extend_from_slice(&[0u8; 24]); // one null symbol
    let info_off = data.len();
    data.extend_from_slice(ze_info);
    let names_off = data.len();
    data.extend_from_slice(names);
    while data.len() % 8 != 0 {
        data.push(0);
    }
    let sh_off = data.len();
    let section =
        |out: &mut Vec<u8>, name: u32, kind: u32, off: usize, size: usize, entsize: u64| {
            out.extend_from_slice(&name.to_le_bytes());
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes()); // flags
            out.extend_from_slice(&0u64.to_le_bytes()); // addr
            out.extend_from_slice(&(off as u64).to_le_bytes());
            out.extend_from_slice(&(size as u64).to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes()); // link
            out.extend_from_slice(&0u32.to_le_bytes()); // info
            out.extend_from_slice(&8u64.to_le_bytes()); // align
            out.extend_from_slice(&entsize.to_le_bytes());
        };
    data.extend_from_slice(&[0u8; 64]); // null section
    section(&mut data, text, 1, text_off, 16, 0);
    section(&mut data, symtab, 2, symtab_off, 24, 24);
    section(&mut data, info, 0xff00_0001, info_off, ze_info.len(), 0);
    section(&mut data, shstr, 3, names_off, names.len(), 0);
    let mut h = [0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 2; // 64-bit
    h[5] = 1; // little-endian
    h[6] = 1;
    h[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
    h[18..20].copy_from_slice(&0xcdu16.to_le_bytes()); // Intel GEN
    h[20..24].copy_from_slice(&1u32.to_le_bytes());
    h[40..48].copy_from_slice(&(sh_off as u64).to_le_bytes());
    h[52..54].copy_from_slice(&64u16.to_le_bytes());
    h[58..60].copy_from_slice(&64u16.to_le_bytes());
    h[60..62].copy_from_slice(&5u16.to_le_bytes()); // sections
    h[62..64].copy_from_slice(&4u16.to_le_bytes()); // .shstrtab index
    data[..64].copy_from_slice(&h);
    data
}

const ZE_INFO: &str = "version: '1.20'\nkernels:\n  - name: k\n    execution_env:\n      grf_count: 128\n      simd_size: 32\n      spill_size: 64\n    per_thread_memory_buffers:\n      - type: scratch\n        usage: spill_fill_space\n        size: 64\n";

#[test]
fn the_fixtures_are_what_they_claim() {
    use xpu_zebin::spirv::GrfRequest;
    for (grf, asks) in [
        (1, GrfRequest::Registers(128)),
        (2, GrfRequest::Registers(256)),
        (3, GrfRequest::Auto),
    ] {
        let bytes = bytes_of(&kernel_module_asking(grf));
        let info = xpu_zebin::spirv::validate(&bytes).unwrap();
        assert_eq!(info.grf_request("k"), Some(asks));
        assert_eq!(xpu_zebin::spirv::scan(&bytes).unwrap(), info);
    }
    let info = xpu_zebin::spirv::validate(&bytes_of(&kernel_module())).unwrap();
    assert_eq!(info.kernels, vec!["k".to_string()]);
    let zebin = xpu_zebin::zebin::parse(&zebin_with(ZE_INFO.as_bytes())).unwrap();
    assert_eq!(zebin.kernels[0].spill_size, Some(64));
}

/// A hit of one's own cache checks the section names alone (`has_zebin_sections`), yet
/// refuses what `parse` refuses for its sections: no code, no symbols, no `.ze_info`, or
/// two of a section the driver takes once.
#[test]
fn a_zebin_missing_or_doubling_a_section_is_degenerate_to_both_readings() {
    let whole = zebin_with(ZE_INFO.as_bytes());
    xpu_zebin::zebin::has_zebin_sections(&whole).unwrap();
    for (name, renamed, said) in [
        (&b".text.k"[..], &b".data.k"[..], "lacks .text.*"),
        (b".symtab", b".symtad", "lacks .symtab"),
        (b".ze_info", b".ze_infx", "no .ze_info"),
        (b".shstrtab", b".ze_info\0", "2 .ze_info sections"),
    ] {
        let mut zebin = whole.clone();
        let at = zebin.windows(name.len()).position(|w| w == name).unwrap();
        zebin[at..at + name.len()].copy_from_slice(renamed);
        for error in [
            xpu_zebin::zebin::parse(&zebin).map(|_| ()).unwrap_err(),
            xpu_zebin::zebin::has_zebin_sections(&zebin).unwrap_err(),
        ] {
            assert_eq!(
                error.kind,
                xpu_zebin::error::ErrorKind::DegenerateBinary,
                "{error}"
            );
            assert!(error.message.contains(said), "{error}");
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn spirv_validation_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = xpu_zebin::spirv::validate(&bytes);
        let _ = xpu_zebin::spirv::scan(&bytes);
    }

    #[test]
    fn spirv_validation_never_panics_on_mutated_modules(
        grf in 0u8..4,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u32>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut words = kernel_module_asking(grf);
        for (at, value) in edits {
            let i = at.index(words.len());
            words[i] = value; // the header's id bound included
        }
        if truncate {
            words.truncate(cut.index(words.len() + 1));
        }
        let bytes = bytes_of(&words);
        let scanned = xpu_zebin::spirv::scan(&bytes); // a cache key's reading: never panics
        if let Ok(info) = xpu_zebin::spirv::validate(&bytes) {
            prop_assert!(!info.kernels.is_empty());
            // What validation accepts, the key reads the same: a hit and a build agree.
            prop_assert_eq!(scanned.ok(), Some(info));
        }
    }

    #[test]
    fn zebin_reading_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
        elf.extend_from_slice(&bytes);
        let _ = xpu_zebin::zebin::parse(&elf);
        let _ = xpu_zebin::zebin::parse(&bytes);
    }

    #[test]
    fn zebin_reading_never_panics_on_mutated_zebins(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut zebin = zebin_with(ZE_INFO.as_bytes());
        for (at, value) in edits {
            let i = at.index(zebin.len());
            zebin[i] = value;
        }
        // What parse accepts, a hit's readings accept, with the same imports.
        if let Ok(info) = xpu_zebin::zebin::parse(&zebin) {
            prop_assert!(xpu_zebin::zebin::has_zebin_sections(&zebin).is_ok());
            let imports = xpu_zebin::zebin::unresolved_imports(&zebin);
            prop_assert_eq!(imports.ok(), Some(info.undefined_symbols));
        }
        // Read from a file (a bundle's pack), it says the same.
        let from_reader = xpu_zebin::zebin::parse_reader(std::io::Cursor::new(&zebin));
        let kernels = |info: xpu_zebin::zebin::ZebinInfo| format!("{:?}", info.kernels);
        prop_assert_eq!(
            from_reader.map(kernels).ok(),
            xpu_zebin::zebin::parse(&zebin).map(kernels).ok()
        );
    }

    #[test]
    fn ze_info_reading_never_panics(
        text in "(version|kernels|name|execution_env|grf_count|spill_size|size|type|scratch|per_thread_memory_buffers|[-:'\\[\\]{}&*!|>0-9 \n])*",
        sizes in proptest::collection::vec(any::<u64>(), 0..4),
    ) {
        let _ = xpu_zebin::zebin::parse(&zebin_with(text.as_bytes()));
        // Sizes that overflow when summed.
        let mut yaml = String::from("version: '1.20'\nkernels:\n  - name: k\n    per_thread_memory_buffers:\n");
        for s in sizes {
            yaml.push_str(&format!("      - type: scratch\n        size: {s}\n"));
        }
        let _ = xpu_zebin::zebin::parse(&zebin_with(yaml.as_bytes()));
    }

    #[test]
    fn cache_entries_decode_or_are_refused(
        meta in ".*",
        binary in proptest::collection::vec(any::<u8>(), 0..256),
        flip in any::<prop::sample::Index>(),
        junk in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut entry = xpu_zebin::cache::encode("k1", &meta, &binary).unwrap();
        let (m, b) = xpu_zebin::cache::decode::<String>("k1", &entry).unwrap();
        prop_assert_eq!((m, b), (meta, binary));
        // The same bytes under another key (an entry renamed) are refused.
        prop_assert!(xpu_zebin::cache::decode::<String>("k2", &entry).is_err());
        let i = flip.index(entry.len());
        entry[i] ^= 0x40;
        prop_assert!(xpu_zebin::cache::decode::<String>("k1", &entry).is_err());
        let _ = xpu_zebin::cache::decode::<String>("k1", &junk);
    }

    #[test]
    fn worker_frames_round_trip_or_are_refused(
        header in proptest::collection::vec(any::<u8>(), 0..128),
        payload in proptest::collection::vec(any::<u8>(), 0..512),
        junk in proptest::collection::vec(any::<u8>(), 0..64),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut wire = Vec::new();
        xpu_zebin::pool::write_frame(&mut wire, &header, &payload).unwrap();
        let got = xpu_zebin::pool::read_frame(&mut wire.as_slice()).unwrap().unwrap();
        prop_assert_eq!(got, (header, payload));
        let short = &wire[..cut.index(wire.len())];
        prop_assert!(xpu_zebin::pool::read_frame(&mut &short[..]).map_or(true, |f| f.is_none()));
        // Junk (a declared length of up to 2^64) is refused or read as what it holds.
        let _ = xpu_zebin::pool::read_frame(&mut junk.as_slice());
        let mut prefixed = b"XZF3".to_vec();
        prefixed.extend_from_slice(&junk);
        let _ = xpu_zebin::pool::read_frame(&mut prefixed.as_slice());
    }
}

// --- the fleet's store: replies, addresses and values from a store we do not trust ----------

mod store {
    use super::config;
    use proptest::prelude::*;
    use std::io::{Cursor, Read, Write};
    use xpu_zebin::store::address::{redacted, Address};
    use xpu_zebin::store::format;
    use xpu_zebin::store::resp::{Budget, Paced, Reader, Reply, MAX_DEPTH};

    /// A peer that sent `bytes`.
    struct Sent(Cursor<Vec<u8>>);
    impl Read for Sent {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(b)
        }
    }
    impl Write for Sent {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Paced for Sent {
        fn expect(&mut self, _: u64) {}
    }

    /// (bulk bytes, items, depth) a reply holds.
    fn weight(r: &Reply) -> (u64, u64, usize) {
        match r {
            Reply::Bulk(b) => (b.len() as u64, 0, 0),
            Reply::Array(items) => items
                .iter()
                .map(weight)
                .fold((0, items.len() as u64, 1), |(b, i, d), (b2, i2, d2)| {
                    (b + b2, i + i2, d.max(d2 + 1))
                }),
            _ => (0, 0, 0),
        }
    }

    fn encode(r: &Reply, out: &mut Vec<u8>) {
        match r {
            Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
            Reply::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Reply::Status(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Reply::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Reply::Bulk(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                items.iter().for_each(|i| encode(i, out));
            }
        }
    }

    fn leaf() -> impl Strategy<Value = Reply> {
        prop_oneof![
            Just(Reply::Nil),
            any::<i64>().prop_map(Reply::Int),
            "[a-zA-Z0-9 ]{0,20}".prop_map(Reply::Status),
            "[a-zA-Z0-9 ]{0,20}".prop_map(Reply::Error),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(Reply::Bulk),
        ]
    }

    /// What an array may hold (statuses and errors only stand alone).
    fn item() -> impl Strategy<Value = Reply> {
        prop_oneof![
            Just(Reply::Nil),
            any::<i64>().prop_map(Reply::Int),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(Reply::Bulk),
        ]
    }

    fn reply() -> impl Strategy<Value = Reply> {
        let array = item()
            .prop_recursive(1, 64, 8, |inner| {
                proptest::collection::vec(inner, 0..8).prop_map(Reply::Array)
            })
            .prop_map(|r| match r {
                Reply::Array(_) => r,
                one => Reply::Array(vec![one]),
            });
        prop_oneof![leaf(), array]
    }

    proptest! {
        #![proptest_config(config())]

        /// Any bytes, any budget: a reply within the budget and the nesting bound, or an
        /// error; never a panic.
        #[test]
        fn any_reply_is_bounded(bytes in proptest::collection::vec(any::<u8>(), 0..2048),
                                bulk in 0u64..4096, items in 0u64..64) {
            let budget = Budget { bulk_bytes: bulk, items };
            let mut reader = Reader::new(Sent(Cursor::new(bytes)));
            let mut left = budget;
            if let Ok(r) = reader.reply(&mut left) {
                let (b, i, d) = weight(&r);
                prop_assert!(b <= bulk && i <= items && d <= MAX_DEPTH);
            }
        }

        /// What a real server sends, within a roomy budget, reads back as sent; with one
        /// byte less of budget than its bulks hold, it is refused.
        #[test]
        fn replies_read_back(r in reply()) {
            let mut wire = Vec::new();
            encode(&r, &mut wire);
            let (bulk, items, _) = weight(&r);
            let budget = Budget { bulk_bytes: bulk, items };
            let mut left = budget;
            let got = Reader::new(Sent(Cursor::new(wire.clone()))).reply(&mut left);
            prop_assert_eq!(got.ok(), Some(r));
            if bulk > 0 {
                let tight = Budget { bulk_bytes: bulk - 1, items };
                let mut tight = tight;
                let refused = Reader::new(Sent(Cursor::new(wire))).reply(&mut tight).is_err();
                prop_assert!(refused);
            }
        }

        /// Any address text: parsed or refused, and said without the password it holds.
        #[test]
        fn addresses_parse_or_are_refused(text in ".{0,80}",
                                          password in "[a-zA-Z0-9]{8,16}") {
            let _ = Address::parse(&text);
            let url = format!("redis://user:{password}@{text}");
            let _ = Address::parse(&url);
            prop_assert!(!redacted(&url).contains(&password) || text.contains(&password));
        }

        /// Any value from the store: an entry and its header, or a reason; never a panic.
        #[test]
        fn any_value_gets_an_answer(value in proptest::collection::vec(any::<u8>(), 0..512),
                                    name in proptest::collection::vec(any::<u8>(), 0..64)) {
            let trust = xpu_zebin::signing::Trusted::parse("", "test").unwrap();
            let _ = format::unpack(&value);
            let mut ours = format::MAGIC.to_vec();
            ours.extend_from_slice(&(value.len() as u32).to_le_bytes());
            ours.extend_from_slice(&value);
            prop_assert!(format::check(&trust, &name, Some(&ours)).is_some());
        }
    }
}

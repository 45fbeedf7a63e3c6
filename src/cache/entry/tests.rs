use super::*;
use crate::cache::tests::noise;
use proptest::prelude::*;
use serde::de::IgnoredAny;
use std::io::Write;

const KEY: &str = "0123abcd";

/// `MAGIC | stated | frame` with a valid checksum: what anyone who may write the directory
/// can make (the checksum is integrity, not trust).
fn sealed(stated: u64, frame: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&stated.to_le_bytes());
    out.extend_from_slice(frame);
    let sum = checksum(KEY, &out);
    out.extend_from_slice(sum.as_bytes());
    out
}

fn frame(plain: &[u8]) -> Vec<u8> {
    zstd::bulk::compress(plain, 3).unwrap()
}

fn refused(bytes: &[u8]) -> String {
    decode::<IgnoredAny>(KEY, bytes).expect_err("refused")
}

#[test]
fn an_entry_comes_back_whole_and_smaller() {
    let mut binary = noise(4096);
    binary.extend(std::iter::repeat_n(0u8, 12_000)); // a zebin's zeroed sections
    let entry = encode(KEY, &"meta", &binary).unwrap();
    assert!(entry.len() < binary.len() / 2, "{}", entry.len());
    assert_eq!(uncompressed_len(&entry), Some(binary.len() as u64 + 6 + 4));
    let (meta, back): (String, Vec<u8>) = decode(KEY, &entry).unwrap();
    assert_eq!((meta.as_str(), back), ("meta", binary));
    assert!(decode::<String>("another key", &entry).is_err());
}

#[test]
fn an_entry_of_the_last_format_still_answers() {
    let meta = br#""old""#;
    let mut old = MAGIC_PLAIN.to_vec();
    old.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    old.extend_from_slice(meta);
    old.extend_from_slice(b"native");
    let sum = checksum(KEY, &old);
    old.extend_from_slice(sum.as_bytes());
    let (meta, binary): (String, Vec<u8>) = decode(KEY, &old).unwrap();
    assert_eq!((meta.as_str(), binary.as_slice()), ("old", &b"native"[..]));
    assert_eq!(uncompressed_len(&old), Some(old.len() as u64));
}

#[test]
fn a_hostile_body_is_refused_with_its_reason() {
    let plain = noise(1000);
    // A bomb: 64 MiB of zeros stated as 1000 bytes; told truthfully, more than any entry.
    let zeros = frame(&vec![0u8; 64 << 20]);
    let bomb = refused(&sealed(1000, &zeros));
    assert!(
        bomb.contains("its frame states 67108864 bytes, not 1000"),
        "{bomb}"
    );
    let truthful = refused(&sealed(64 << 20, &zeros));
    assert!(truthful.contains("more than ours inflate"), "{truthful}");
    // A length that lies the other way.
    let lie = refused(&sealed(5000, &frame(&plain)));
    assert!(
        lie.contains("its frame states 1000 bytes, not 5000"),
        "{lie}"
    );
    // A length no entry may have, or not here: refused before anything is allocated.
    let huge = refused(&sealed(u64::MAX, &frame(&plain)));
    assert!(huge.contains("more than it may hold here"), "{huge}");
    let entry = encode(KEY, &"m", &plain).unwrap();
    let small = decode_within::<IgnoredAny>(KEY, &entry, 100).expect_err("over the bound");
    assert!(
        small.contains("more than it may hold here (100)"),
        "{small}"
    );
    let mut trailing = frame(&plain);
    trailing.extend_from_slice(b"junk");
    assert!(refused(&sealed(1000, &trailing)).contains("4 bytes after the compressed body"));
    let whole = frame(&plain);
    let cut = refused(&sealed(1000, &whole[..whole.len() - 3]));
    assert!(cut.contains("cut short or not zstd"), "{cut}");
    assert!(refused(&sealed(1000, &noise(64))).contains("cut short or not zstd"));
    // Metadata said to be longer than what inflated.
    let mut short = b"ab".to_vec();
    short.extend_from_slice(&1000u32.to_le_bytes());
    let past = refused(&sealed(6, &frame(&short)));
    assert!(past.contains("metadata runs past the start"), "{past}");
    let mut flipped = entry;
    flipped[MAGIC.len() + 10] ^= 0xff;
    assert!(refused(&flipped).contains("checksum mismatch"));
}

/// A frame that does not state its length (ours always do) is not inflated at all.
#[test]
fn a_frame_without_its_length_is_refused() {
    let plain = noise(1 << 12);
    let mut lengthless = Vec::new();
    let mut encoder = zstd::stream::write::Encoder::new(&mut lengthless, 3).unwrap();
    encoder.include_contentsize(false).unwrap();
    encoder.write_all(&plain).unwrap();
    encoder.finish().unwrap();
    let why = refused(&sealed(plain.len() as u64, &lengthless));
    assert!(why.contains("does not state its length"), "{why}");
}

/// What a bundle's hit is made into (never kept): the last format, read as ever.
#[test]
fn a_plain_entry_reads_as_a_compressed_one() {
    let binary = noise(3000);
    let plain = encode_plain(KEY, &"m", &binary).unwrap();
    assert!(plain.starts_with(MAGIC_PLAIN) && plain.len() > binary.len());
    let (meta, back): (String, Vec<u8>) = decode(KEY, &plain).unwrap();
    assert_eq!((meta.as_str(), back), ("m", binary));
}

proptest! {
    /// Any body under a valid checksum is an entry or a reason, never a panic, and never
    /// more than it states (at most `MAX_ENTRY_BYTES`) in memory.
    #[test]
    fn any_body_is_an_entry_or_a_reason(stated in any::<u64>(), body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode::<IgnoredAny>(KEY, &sealed(stated, &body));
        let _ = decode::<IgnoredAny>(KEY, &sealed(stated % 2048, &frame(&body)));
    }
}

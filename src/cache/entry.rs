//! An entry's bytes, as every level holds them (the local cache, the fleet's store):
//! `MAGIC | uncompressed length (u64 LE) | one zstd frame | checksum`, the frame holding
//! `binary | meta JSON | meta length (u32 LE)`; the checksum is blake3 over the key and
//! everything before it, so an entry renamed onto another key (by anyone who may write the
//! directory) fails it and never answers for another kernel.
//!
//! Native code and its logs compress about 4x (zstd, as ccache keeps its entries), so a
//! bounded cache holds four times the kernels and a node pulls a quarter of the bytes from
//! the store. Inflating is bounded by construction (`compressed.rs`): the stated length is
//! checked against the level's bound (`MAX_ENTRY_BYTES`; the store's
//! `XPU_ZEBIN_REMOTE_MAX_BYTES`) before anything is allocated.
//! The binary is the front of the inflated buffer, so a hit is inflated once and returned
//! with no second copy.
//!
//! Entries of the last format (`XZCACHE2`: `MAGIC | meta length | meta | binary |
//! checksum`, stored as built) still answer as they are.

use super::MAX_ENTRY_BYTES;
use serde::{de::DeserializeOwned, Serialize};

const MAGIC: &[u8; 8] = b"XZCACHE3";
/// The last format: uncompressed (read, never written).
const MAGIC_PLAIN: &[u8; 8] = b"XZCACHE2";
const CHECKSUM_BYTES: usize = 32;

/// The bytes of an entry holding `meta` and `binary`, compressed (what every level keeps).
pub fn encode<M: Serialize>(key: &str, meta: &M, binary: &[u8]) -> std::io::Result<Vec<u8>> {
    let (meta, meta_len) = meta_json(meta)?;
    let plain = binary.len() + meta.len() + 4;
    if plain as u64 > MAX_ENTRY_BYTES {
        return Err(std::io::Error::other(format!(
            "{plain} bytes, more than an entry may hold ({MAX_ENTRY_BYTES})"
        )));
    }
    let mut out = Vec::with_capacity(MAGIC.len() + 8 + plain / 3 + CHECKSUM_BYTES);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(plain as u64).to_le_bytes());
    crate::compressed::compress_into(&mut out, &[binary, &meta, &meta_len.to_le_bytes()])?;
    if !crate::compressed::within_ratio(out.len() - MAGIC.len() - 8, plain as u64) {
        return Ok(plain_entry(key, (&meta, meta_len), binary));
    }
    let sum = checksum(key, &out);
    out.extend_from_slice(sum.as_bytes());
    Ok(out)
}

/// The same entry uncompressed (the last format): for one made to be read at once and
/// never kept (a bundle's hit, as the levels see it), so nothing is compressed for it.
pub fn encode_plain<M: Serialize>(key: &str, meta: &M, binary: &[u8]) -> std::io::Result<Vec<u8>> {
    let (meta, meta_len) = meta_json(meta)?;
    Ok(plain_entry(key, (&meta, meta_len), binary))
}

/// An entry of the last format, uncompressed: `encode_plain`'s, and `encode`'s for what
/// would inflate more than a reader takes (`compressed::within_ratio`).
fn plain_entry(key: &str, (meta, meta_len): (&[u8], u32), binary: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC_PLAIN.len() + 4 + meta.len() + binary.len() + 32);
    out.extend_from_slice(MAGIC_PLAIN);
    out.extend_from_slice(&meta_len.to_le_bytes());
    out.extend_from_slice(meta);
    out.extend_from_slice(binary);
    let sum = checksum(key, &out);
    out.extend_from_slice(sum.as_bytes());
    out
}

/// An entry's metadata as JSON, and its length as both formats write it.
fn meta_json<M: Serialize>(meta: &M) -> std::io::Result<(Vec<u8>, u32)> {
    let meta = serde_json::to_vec(meta)?;
    let len = u32::try_from(meta.len()).map_err(std::io::Error::other)?;
    Ok((meta, len))
}

/// An entry's metadata and binary; `Err` says why the bytes are not the whole entry of
/// `key`.
pub fn decode<M: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<(M, Vec<u8>), String> {
    decode_within(key, bytes, MAX_ENTRY_BYTES)
}

/// `decode`, for a level whose entries hold at most `most` bytes uncompressed.
pub fn decode_within<M: DeserializeOwned>(
    key: &str,
    bytes: &[u8],
    most: u64,
) -> Result<(M, Vec<u8>), String> {
    match bytes.get(..MAGIC.len()) {
        Some(m) if m == MAGIC => decode_compressed(key, bytes, most.min(MAX_ENTRY_BYTES)),
        Some(m) if m == MAGIC_PLAIN => decode_plain(key, bytes),
        _ => Err("bad header".into()),
    }
}

/// Whether `bytes` are an entry kept as built (the last format's layout: an old entry, one
/// written with compression off, or one that would inflate more than a reader takes).
pub fn is_plain(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC_PLAIN)
}

/// Whether `bytes` are an entry kept compressed.
pub fn is_compressed(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// How many bytes an entry holds uncompressed (its stated length; the stored length for
/// one of the last format); None when it is no entry.
pub fn uncompressed_len(bytes: &[u8]) -> Option<u64> {
    match bytes.get(..MAGIC.len())? {
        m if m == MAGIC => Some(u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?)),
        m if m == MAGIC_PLAIN => Some(bytes.len() as u64),
        _ => None,
    }
}

/// blake3 over the key, then the entry's body.
fn checksum(key: &str, body: &[u8]) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    hasher.update(key.as_bytes());
    hasher.update(body);
    hasher.finalize()
}

/// The body of `bytes` (all but the checksum) when at least `head` bytes long and its
/// checksum is `key`'s.
fn verified<'b>(key: &str, bytes: &'b [u8], head: usize) -> Result<&'b [u8], String> {
    if bytes.len() < head + CHECKSUM_BYTES {
        return Err("bad header".into());
    }
    let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
    if checksum(key, body).as_bytes() != sum {
        return Err("checksum mismatch (a torn, altered or renamed entry)".into());
    }
    Ok(body)
}

fn decode_compressed<M: DeserializeOwned>(
    key: &str,
    bytes: &[u8],
    most: u64,
) -> Result<(M, Vec<u8>), String> {
    let head = MAGIC.len() + 8;
    let body = verified(key, bytes, head)?;
    let mut stated = [0u8; 8];
    stated.copy_from_slice(&body[MAGIC.len()..head]);
    let stated = u64::from_le_bytes(stated);
    let frame = &body[head..];
    if stated < 4 {
        return Err(format!(
            "states {stated} bytes uncompressed: too few for an entry"
        ));
    }
    let mut plain = crate::compressed::inflate(frame, stated, most)?;
    let end = plain.len() - 4;
    let meta_len = u32::from_le_bytes([plain[end], plain[end + 1], plain[end + 2], plain[end + 3]]);
    let Some(split) = end.checked_sub(meta_len as usize) else {
        return Err("metadata runs past the start".into());
    };
    let meta = serde_json::from_slice(&plain[split..end]).map_err(|e| format!("metadata: {e}"))?;
    plain.truncate(split);
    Ok((meta, plain))
}

fn decode_plain<M: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<(M, Vec<u8>), String> {
    let head = MAGIC_PLAIN.len() + 4;
    let body = verified(key, bytes, head)?;
    let len = &body[MAGIC_PLAIN.len()..head];
    let meta_len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if meta_len > body.len() - head {
        return Err("metadata runs past the end".into());
    }
    let meta = serde_json::from_slice(&body[head..head + meta_len])
        .map_err(|e| format!("metadata: {e}"))?;
    Ok((meta, body[head + meta_len..].to_vec()))
}

#[cfg(test)]
mod tests;

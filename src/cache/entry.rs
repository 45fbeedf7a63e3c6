//! An entry's bytes, as every level holds them (the local cache, the fleet's store):
//! `MAGIC | uncompressed length (u64 LE) | one zstd frame | checksum`, the frame holding
//! `binary | meta JSON | meta length (u32 LE)`; the checksum is blake3 over the key and
//! everything before it, so an entry renamed onto another key (by anyone who may write the
//! directory) fails it and never answers for another kernel.
//!
//! Native code and its logs compress about 4x (zstd, as ccache keeps its entries), so a
//! bounded cache holds four times the kernels and a node pulls a quarter of the bytes from
//! the store. Inflating is bounded by construction: before anything is allocated, the
//! stated length is checked against the level's bound (`MAX_ENTRY_BYTES`; the store's
//! `XPU_ZEBIN_REMOTE_MAX_BYTES`) and against `MOST_RATIO` times the bytes read, and the
//! frame must be one whole frame with nothing after it, stating that same length; it is
//! then inflated at once into a buffer of that length, which a frame holding more does not
//! fit (zstd stops at the buffer's end).
//! The binary is the front of the inflated buffer, so a hit is inflated once and returned
//! with no second copy.
//!
//! Entries of the last format (`XZCACHE2`: `MAGIC | meta length | meta | binary |
//! checksum`, stored as built) still answer as they are.

use super::MAX_ENTRY_BYTES;
use serde::{de::DeserializeOwned, Serialize};
use std::io::Write;

const MAGIC: &[u8; 8] = b"XZCACHE3";
/// The last format: uncompressed (read, never written).
const MAGIC_PLAIN: &[u8; 8] = b"XZCACHE2";
const CHECKSUM_BYTES: usize = 32;
/// zstd's level for entries. Measured on 8 real Triton kernels here (`benches/lean.py`):
/// 3.28x smaller at level 1, 3.34x at 3, 3.51x at 9, 3.91x at 15, 4.1x at 19; level 15
/// takes 6 ms a kernel on average (a small one 1-2 ms, a 170 KB matmul about 20 ms), next
/// to builds of tens of milliseconds to seconds; inflating costs the same at every level.
const LEVEL: i32 = 15;
/// Entries above this many bytes are compressed at level 3: level 15 makes about 8 MB a
/// second here, level 3 about 170.
const LEVEL_15_MOST: usize = 8 << 20;
/// The window our frames use (4 MiB): the encoder's memory.
const WINDOW_LOG: u32 = 22;
/// Entries inflate by far less than this (Triton kernels 2.7-6.6x here): one that states
/// more is not one of ours (a bomb), refused before anything is allocated.
const MOST_RATIO: u64 = 1024;

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
    let level = if plain <= LEVEL_15_MOST { LEVEL } else { 3 };
    let mut frame = zstd::stream::write::Encoder::new(&mut out, level)?;
    frame.window_log(WINDOW_LOG)?;
    frame.set_pledged_src_size(Some(plain as u64))?;
    frame.write_all(binary)?;
    frame.write_all(&meta)?;
    frame.write_all(&meta_len.to_le_bytes())?;
    frame.finish()?;
    let sum = checksum(key, &out);
    out.extend_from_slice(sum.as_bytes());
    Ok(out)
}

/// The same entry uncompressed (the last format): for one made to be read at once and
/// never kept (a bundle's hit, as the levels see it), so nothing is compressed for it.
pub fn encode_plain<M: Serialize>(key: &str, meta: &M, binary: &[u8]) -> std::io::Result<Vec<u8>> {
    let (meta, meta_len) = meta_json(meta)?;
    let mut out = Vec::with_capacity(MAGIC_PLAIN.len() + 4 + meta.len() + binary.len() + 32);
    out.extend_from_slice(MAGIC_PLAIN);
    out.extend_from_slice(&meta_len.to_le_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(binary);
    let sum = checksum(key, &out);
    out.extend_from_slice(sum.as_bytes());
    Ok(out)
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
    if !(4..=most).contains(&stated) {
        return Err(format!(
            "states {stated} bytes uncompressed: not an entry here (at most {most})"
        ));
    }
    if stated > (frame.len() as u64).saturating_mul(MOST_RATIO) {
        return Err(format!(
            "states {stated} bytes from {} compressed: more than an entry inflates \
             ({MOST_RATIO}x)",
            frame.len()
        ));
    }
    let mut plain = inflate(frame, stated as usize)?;
    let end = plain.len() - 4;
    let meta_len = u32::from_le_bytes([plain[end], plain[end + 1], plain[end + 2], plain[end + 3]]);
    let Some(split) = end.checked_sub(meta_len as usize) else {
        return Err("metadata runs past the start".into());
    };
    let meta = serde_json::from_slice(&plain[split..end]).map_err(|e| format!("metadata: {e}"))?;
    plain.truncate(split);
    Ok((meta, plain))
}

/// `frame` inflated: one whole zstd frame, nothing after it, stating `len` bytes and
/// inflating to exactly that, at once into a buffer of that length (a frame holding more
/// does not fit it: zstd stops there).
fn inflate(frame: &[u8], len: usize) -> Result<Vec<u8>, String> {
    let cut = || "the compressed body is cut short or not zstd".to_string();
    match zstd::zstd_safe::find_frame_compressed_size(frame) {
        Ok(n) if n == frame.len() => {}
        Ok(n) => {
            return Err(format!(
                "{} bytes after the compressed body",
                frame.len().saturating_sub(n)
            ))
        }
        Err(_) => return Err(cut()),
    }
    match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(n)) if n == len as u64 => {}
        Ok(Some(n)) => return Err(format!("its frame states {n} bytes, its header {len}")),
        Ok(None) => return Err("its frame does not state its length: not one of ours".into()),
        Err(_) => return Err(cut()),
    }
    let inflating = |e: std::io::Error| format!("the compressed body does not inflate: {e}");
    let mut at_once = zstd::bulk::Decompressor::new().map_err(inflating)?;
    let mut plain = Vec::with_capacity(len);
    at_once
        .decompress_to_buffer(frame, &mut plain)
        .map_err(inflating)?;
    // Never more than `len`: the buffer holds no more.
    if plain.len() < len {
        return Err(format!(
            "the compressed body inflates to {} bytes, not the {len} its header states",
            plain.len()
        ));
    }
    Ok(plain)
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

//! One zstd frame, as every level keeps what it holds compressed (the cache's and the
//! store's entries, `cache/entry.rs`; a bundle's files, `bundle/stored.rs`): written at a
//! level chosen for size, and inflated bounded by construction. Before anything is
//! allocated, the length a frame is to inflate to is checked against the caller's bound and
//! against `MOST_RATIO` times the bytes read; the frame must be one whole frame with
//! nothing after it, stating that same length; it is then inflated at once into a buffer of
//! that length, which a frame holding more does not fit (zstd stops at the buffer's end).

use std::io::Write;

/// zstd's level. Measured on 8 real Triton kernels here (`benches/lean.py`): 3.28x smaller
/// at level 1, 3.34x at 3, 3.51x at 9, 3.91x at 15, 4.1x at 19; level 15 takes 6 ms a
/// kernel on average (a small one 1-2 ms, a 170 KB matmul about 20 ms), next to builds of
/// tens of milliseconds to seconds; inflating costs the same at every level.
const LEVEL: i32 = 15;
/// Inputs above this many bytes are compressed at level 3: level 15 makes about 8 MB a
/// second here, level 3 about 170.
const LEVEL_15_MOST: usize = 8 << 20;
/// The window our frames use (4 MiB): the encoder's memory.
const WINDOW_LOG: u32 = 22;
/// What we keep inflates by far less than this (Triton kernels 2.7-6.6x here, 7.7x the
/// most at level 19): a frame that states more is not one of ours (a bomb), refused before
/// anything is allocated; so a small file never costs a reader much memory (256 MiB takes
/// 4 MiB of it).
pub const MOST_RATIO: u64 = 64;
/// Whether `plain` bytes kept as `stored` bytes of frame inflate within `MOST_RATIO`: what
/// inflates more is kept as it is instead, so no reader refuses what a writer kept.
pub fn within_ratio(stored: usize, plain: u64) -> bool {
    plain <= (stored as u64).saturating_mul(MOST_RATIO)
}

/// How every zstd frame starts (a skippable frame, or anything else, is not one of ours).
const FRAME_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// `parts`, one after the other, as one frame appended to `out`.
pub fn compress_into(out: &mut Vec<u8>, parts: &[&[u8]]) -> std::io::Result<()> {
    let plain: usize = parts.iter().map(|p| p.len()).sum();
    let level = if plain <= LEVEL_15_MOST { LEVEL } else { 3 };
    let mut frame = zstd::stream::write::Encoder::new(out, level)?;
    frame.window_log(WINDOW_LOG)?;
    frame.set_pledged_src_size(Some(plain as u64))?;
    for part in parts {
        frame.write_all(part)?;
    }
    frame.finish()?;
    Ok(())
}

/// `frame` inflated to the `len` bytes it is said to hold: refused before anything is
/// allocated when that is more than `most` or than `MOST_RATIO` times the frame; then it
/// must be one whole zstd frame, nothing after it, stating `len` bytes and inflating to
/// exactly that, at once into a buffer of that length (a frame holding more does not fit
/// it: zstd stops there).
pub fn inflate(frame: &[u8], len: u64, most: u64) -> Result<Vec<u8>, String> {
    if len > most {
        return Err(format!(
            "states {len} bytes uncompressed: more than it may hold here ({most})"
        ));
    }
    if !within_ratio(frame.len(), len) {
        return Err(format!(
            "states {len} bytes from {} compressed: more than ours inflate ({MOST_RATIO}x)",
            frame.len()
        ));
    }
    let cut = || "the compressed body is cut short or not zstd".to_string();
    if !frame.starts_with(&FRAME_MAGIC) {
        return Err(cut());
    }
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
        Ok(Some(n)) if n == len => {}
        Ok(Some(n)) => return Err(format!("its frame states {n} bytes, not {len}")),
        Ok(None) => return Err("its frame does not state its length: not one of ours".into()),
        Err(_) => return Err(cut()),
    }
    let inflating = |e: std::io::Error| format!("the compressed body does not inflate: {e}");
    let mut at_once = zstd::bulk::Decompressor::new().map_err(inflating)?;
    // Bounded above: `most` and the ratio (the callers' `most` fit in memory).
    let len = usize::try_from(len).map_err(|_| cut())?;
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

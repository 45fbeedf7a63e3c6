//! The framing protocol, both sides: bounded, grown only as bytes arrive.

use super::*;

// Framing, both sides.

/// A frame's parts, as read: bounded, and grown only as bytes arrive.
pub(super) struct FrameHead {
    pub(super) header_len: usize,
    pub(super) payload_len: usize,
}

pub(super) fn frame_prefix(header: &[u8], payload: &[u8]) -> [u8; 16] {
    let mut prefix = [0u8; 16];
    prefix[..4].copy_from_slice(FRAME_MAGIC);
    prefix[4..8].copy_from_slice(&(header.len() as u32).to_le_bytes());
    prefix[8..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    prefix
}

/// Check a frame's 16-byte prefix: the magic and both lengths within bounds.
pub(super) fn parse_prefix(prefix: &[u8; 16]) -> Result<FrameHead, String> {
    if &prefix[..4] != FRAME_MAGIC {
        return Err(format!(
            "not a frame: starts with {:02x?}, expected {:?} (a worker of another version, or \
             output that is not the protocol)",
            &prefix[..4],
            String::from_utf8_lossy(FRAME_MAGIC)
        ));
    }
    let header = u32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]) as u64;
    let mut len = [0u8; 8];
    len.copy_from_slice(&prefix[8..]);
    let payload = u64::from_le_bytes(len);
    if header > MAX_HEADER_BYTES || payload > MAX_PAYLOAD_BYTES {
        return Err(format!(
            "a frame of {header} + {payload} bytes is over the bounds ({MAX_HEADER_BYTES} + \
             {MAX_PAYLOAD_BYTES})"
        ));
    }
    Ok(FrameHead {
        header_len: header as usize,
        payload_len: payload as usize,
    })
}

/// Check that `header` and `payload` fit in a frame before sending them.
pub(super) fn check_sizes(header: &[u8], payload: &[u8]) -> Result<(), String> {
    if header.len() as u64 > MAX_HEADER_BYTES || payload.len() as u64 > MAX_PAYLOAD_BYTES {
        return Err(format!(
            "a request of {} + {} bytes is over the worker protocol's bounds ({MAX_HEADER_BYTES} \
             + {MAX_PAYLOAD_BYTES})",
            header.len(),
            payload.len()
        ));
    }
    Ok(())
}

/// What a worker sends of a compiler log: its end (where the errors are), so an answer
/// always fits a frame.
pub const MAX_LOG_BYTES: usize = 4 << 20;

/// The last `MAX_LOG_BYTES` of `log`, cut at a character boundary.
pub fn log_tail(mut log: String) -> String {
    if log.len() > MAX_LOG_BYTES {
        let mut from = log.len() - MAX_LOG_BYTES;
        while !log.is_char_boundary(from) {
            from += 1;
        }
        log.drain(..from);
    }
    log
}

/// Read one frame from a blocking reader (the worker's side). `Ok(None)` at a clean end.
pub fn read_frame(input: &mut impl Read) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut prefix = [0u8; 16];
    match input.read_exact(&mut prefix) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let head = parse_prefix(&prefix).map_err(std::io::Error::other)?;
    let mut read_part = |len: usize| -> std::io::Result<Vec<u8>> {
        let mut part = Vec::new();
        input.take(len as u64).read_to_end(&mut part)?;
        if part.len() < len {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(part)
    };
    let header = read_part(head.header_len)?;
    let payload = read_part(head.payload_len)?;
    Ok(Some((header, payload)))
}

/// Write one frame to a blocking writer (the worker's side).
pub fn write_frame(out: &mut impl Write, header: &[u8], payload: &[u8]) -> std::io::Result<()> {
    check_sizes(header, payload).map_err(std::io::Error::other)?;
    out.write_all(&frame_prefix(header, payload))?;
    out.write_all(header)?;
    out.write_all(payload)?;
    out.flush()
}

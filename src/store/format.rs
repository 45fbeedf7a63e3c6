//! What the fleet's store holds: a value is `MAGIC`, a header's length (u32, little
//! endian), the header (JSON: the entry's key, the device and compiler it was built for,
//! who signed it, the signature) and the entry's bytes. A signature covers key, device,
//! compiler and bytes, each with its length (no field can stand in for another). The
//! header is written byte for byte as the last release's Python wrote it (`json.dumps`,
//! keys sorted, ASCII), so a mixed fleet shares entries both ways.

use crate::signing::{Signer, Trusted};
use serde::Deserialize;

/// The store's keys of native entries: one namespace, one format version.
pub const PREFIX: &str = "xpu-zebin:v1:";
/// Triton's own cache entries (`FleetCacheManager`).
pub const TRITON_PREFIX: &str = "xpu-zebin:triton:v1:";
pub const NAMESPACES: [&str; 2] = [PREFIX, TRITON_PREFIX];
pub const MAGIC: &[u8] = b"XZREMOTE1\n";
/// A header is a few hundred bytes; anything larger is not one of ours.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
pub const SIGNED_TAG: &[u8] = b"xpu-zebin/remote-entry/v1\0";

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Header {
    pub key: String,
    pub device: String,
    pub compiler: String,
    pub signer: String,
    pub signature: String,
}

/// What a signature covers.
pub fn signed_message(key: &str, device: &str, compiler: &str, entry: &[u8]) -> Vec<u8> {
    let mut out = SIGNED_TAG.to_vec();
    for part in [
        key.as_bytes(),
        device.trim().as_bytes(),
        compiler.as_bytes(),
        entry,
    ] {
        out.extend_from_slice(&(part.len() as u64).to_le_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// A JSON string as Python's `json.dumps` writes it (ASCII only).
fn json_string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
}

pub fn pack(header: &Header, entry: &[u8]) -> Vec<u8> {
    let mut json = String::from("{");
    let fields = [
        ("compiler", &header.compiler),
        ("device", &header.device),
        ("key", &header.key),
        ("signature", &header.signature),
        ("signer", &header.signer),
    ];
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            json.push_str(", ");
        }
        json_string(name, &mut json);
        json.push_str(": ");
        json_string(value, &mut json);
    }
    json.push('}');
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    out.extend_from_slice(entry);
    out
}

/// `entry` signed by `signer` as `key`'s, built for `device` with `compiler`, packed.
pub fn pack_signed(
    signer: &Signer,
    key: &str,
    device: &str,
    compiler: &str,
    entry: &[u8],
) -> Vec<u8> {
    let header = Header {
        key: key.to_string(),
        device: device.to_string(),
        compiler: compiler.to_string(),
        signer: signer.public(),
        signature: signer.sign(&signed_message(key, device, compiler, entry)),
    };
    pack(&header, entry)
}

/// A stored value's header and entry; why not, for anything else.
pub fn unpack(value: &[u8]) -> Result<(Header, &[u8]), String> {
    let start = MAGIC.len() + 4;
    if !value.starts_with(MAGIC) || value.len() < start {
        return Err("not an xpu-zebin remote entry".into());
    }
    let mut size = [0u8; 4];
    size.copy_from_slice(&value[MAGIC.len()..start]);
    let size = u32::from_le_bytes(size) as usize;
    if size > MAX_HEADER_BYTES || start + size > value.len() {
        return Err("its header is cut short or too large".into());
    }
    let header: Header = serde_json::from_slice(&value[start..start + size])
        .map_err(|e| format!("its header is not one ({e})"))?;
    Ok((header, &value[start + size..]))
}

/// Did a trusted key sign this entry, as its header describes it?
pub fn trusted(trust: &Trusted, header: &Header, entry: &[u8]) -> bool {
    let message = signed_message(&header.key, &header.device, &header.compiler, entry);
    trust.verify(&header.signer, &message, &header.signature)
}

/// The entry in `value` when a trusted key signed it as `key`'s, built for `device` with
/// `compiler`; why not otherwise.
pub fn signed_entry<'v>(
    trust: &Trusted,
    value: &'v [u8],
    key: &str,
    device: &str,
    compiler: &str,
) -> Result<&'v [u8], String> {
    let (header, entry) = unpack(value)?;
    let asked = (key, device.trim(), compiler);
    if (
        header.key.as_str(),
        header.device.trim(),
        header.compiler.as_str(),
    ) != asked
    {
        return Err("it was signed for another request".into());
    }
    if !trusted(trust, &header, entry) {
        return Err("no trusted key signed it for this request".into());
    }
    Ok(entry)
}

/// Why the entry at `name` fails verification (None: a trusted key signed it, for this
/// very key; `value` None: too large to read). Any value, however forged, gets an answer.
pub fn check(trust: &Trusted, name: &[u8], value: Option<&[u8]>) -> Option<String> {
    let value = match value {
        None => return Some("larger than the bound".into()),
        Some(v) => v,
    };
    let (header, entry) = match unpack(value) {
        Ok(found) => found,
        Err(why) => return Some(format!("malformed ({why})")),
    };
    let Ok(text) = std::str::from_utf8(name) else {
        return Some("malformed (a key that is not UTF-8)".into());
    };
    let own = text.strip_prefix(PREFIX).unwrap_or(text);
    if header.key != own {
        return Some("its header names another key (an entry replayed under this one)".into());
    }
    if !trusted(trust, &header, entry) {
        return Some("not signed by a trusted key".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_as_python_wrote_them() {
        let mut s = String::new();
        json_string("a\"\\\n\u{1}é😀", &mut s);
        assert_eq!(s, r#""a\"\\\n\u0001\u00e9\ud83d\ude00""#);
    }

    #[test]
    fn any_value_gets_an_answer() {
        let trust = Trusted::parse("", "test").unwrap();
        for value in [&b""[..], b"XZREMOTE1\n", b"XZREMOTE1\n\xff\xff\xff\xff{}"] {
            assert!(check(&trust, b"k", Some(value)).is_some());
            assert!(unpack(value).is_err());
        }
    }
}

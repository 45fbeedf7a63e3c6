//! Ed25519 signatures over what a fleet shares (the remote store's entries): a farm signs
//! with its secret key (`XPU_ZEBIN_SIGNING_KEY`, a private file), a node accepts only what
//! a key it trusts signed (`XPU_ZEBIN_TRUSTED_KEYS`). As Nix's binary caches: the
//! transport is untrusted, the signature over the content and its key is what counts.
//!
//! A public key is written `<name>:<64 hex digits>`; a secret key file holds one line,
//! `xpu-zebin-secret-key:<name>:<64 hex digits>` (the 32-byte seed).

use crate::error::{BuildError, ErrorKind, Result};
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The secret key a farm signs with: a file's path.
pub const SIGNING_KEY_ENV: &str = "XPU_ZEBIN_SIGNING_KEY";
/// The public keys a node accepts, separated by commas or blanks.
pub const TRUSTED_KEYS_ENV: &str = "XPU_ZEBIN_TRUSTED_KEYS";

const SECRET_TAG: &str = "xpu-zebin-secret-key";
/// A key file is one short line; anything larger is not one.
const MAX_KEY_FILE_BYTES: u64 = 4096;

fn bad(message: String) -> BuildError {
    BuildError::new(ErrorKind::InvalidArgument, message)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let text = text.as_bytes();
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in text.chunks(2).enumerate() {
        // Lowercase only: one spelling per key and signature (an uppercase copy would be
        // a changed value that still verifies).
        let digit = |c: u8| (!c.is_ascii_uppercase()).then(|| (c as char).to_digit(16))?;
        out[i] = u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()?;
    }
    Some(out)
}

/// A key's name: letters, digits, `.`, `_`, `-` (it is shown, and separates fields).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// A public key as text, `<name>:<hex>`.
fn public_text(name: &str, key: &VerifyingKey) -> String {
    format!("{name}:{}", hex(key.as_bytes()))
}

/// Parse `<name>:<hex>`; `what` says where it came from, for the error.
pub fn parse_public(text: &str, what: &str) -> Result<(String, VerifyingKey)> {
    let parsed = text.trim().split_once(':').and_then(|(name, key)| {
        let key = VerifyingKey::from_bytes(&unhex::<32>(key)?).ok()?;
        valid_name(name).then(|| (name.to_string(), key))
    });
    parsed.ok_or_else(|| {
        bad(format!(
            "{what}: {text:?} is not a public key (expected NAME:64 hex digits, as \
             `xpu-zebin key generate` prints it)"
        ))
    })
}

/// The secret key a farm signs with.
pub struct Signer {
    name: String,
    key: SigningKey,
}

impl Signer {
    /// This key's public half, as nodes list it in `XPU_ZEBIN_TRUSTED_KEYS`.
    pub fn public(&self) -> String {
        public_text(&self.name, &self.key.verifying_key())
    }

    /// The signature of `message`, in hex.
    pub fn sign(&self, message: &[u8]) -> String {
        hex(&self.key.sign(message).to_bytes())
    }

    /// Read a secret key file: a regular file of this user's, readable by no one else.
    pub fn load(path: &Path) -> Result<Signer> {
        let what = format!("{SIGNING_KEY_ENV}={}", path.display());
        // A link is followed (secret mounts are links); the file it leads to is checked.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| bad(format!("{what}: cannot read it: {e}")))?;
        let meta = file.metadata().map_err(|e| bad(format!("{what}: {e}")))?;
        if !meta.file_type().is_file()
            || meta.uid() != crate::private::uid()
            || meta.mode() & 0o077 != 0
        {
            return Err(bad(format!(
                "{what}: a secret key must be a regular file of this user's, readable by no \
                 one else (chmod 600)"
            )));
        }
        let bytes = crate::bounded::read(file, MAX_KEY_FILE_BYTES)
            .map_err(|e| bad(format!("{what}: {e}")))?;
        let text = String::from_utf8_lossy(&bytes);
        let mut fields = text.trim().splitn(3, ':');
        match (fields.next(), fields.next(), fields.next()) {
            (Some(SECRET_TAG), Some(name), Some(seed)) if valid_name(name) => {
                let seed = unhex::<32>(seed)
                    .ok_or_else(|| bad(format!("{what}: the key's digits are not 64 hex")))?;
                Ok(Signer {
                    name: name.to_string(),
                    key: SigningKey::from_bytes(&seed),
                })
            }
            _ => Err(bad(format!(
                "{what}: not a secret key written by `xpu-zebin key generate`"
            ))),
        }
    }

    /// The key named by `XPU_ZEBIN_SIGNING_KEY`, if set.
    pub fn from_env() -> Result<Option<Signer>> {
        match crate::knobs::text_knob(SIGNING_KEY_ENV)? {
            None => Ok(None),
            Some(path) => Signer::load(Path::new(&path)).map(Some),
        }
    }
}

/// 32 random bytes from the kernel.
fn random_seed() -> Result<[u8; 32]> {
    let mut seed = [0u8; 32];
    let mut filled = 0;
    while filled < seed.len() {
        // SAFETY: writes at most the rest of `seed`, which outlives the call.
        let n =
            unsafe { libc::getrandom(seed[filled..].as_mut_ptr().cast(), seed.len() - filled, 0) };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(BuildError::new(
                ErrorKind::Internal,
                format!("no randomness for a key: {e}"),
            ));
        }
        filled += n as usize;
    }
    Ok(seed)
}

/// Write a new secret key named `name` to `path` (a new file, owner-only: never over an
/// existing one) and return its public key.
pub fn generate(path: &Path, name: &str) -> Result<String> {
    if !valid_name(name) {
        return Err(bad(format!(
            "key name {name:?}: use letters, digits, '.', '_' or '-' (at most 64)"
        )));
    }
    let key = SigningKey::from_bytes(&random_seed()?);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .and_then(|mut f| {
            f.write_all(format!("{SECRET_TAG}:{name}:{}\n", hex(key.as_bytes())).as_bytes())?;
            f.sync_all()
        });
    written.map_err(|e| bad(format!("cannot write a new key to {}: {e}", path.display())))?;
    Ok(public_text(name, &key.verifying_key()))
}

/// The public keys a node accepts.
#[derive(Default)]
pub struct Trusted {
    keys: Vec<(String, VerifyingKey)>,
}

impl Trusted {
    /// Parse a list of public keys (commas or blanks between them).
    pub fn parse(text: &str, what: &str) -> Result<Trusted> {
        let keys = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|k| !k.is_empty())
            .map(|k| parse_public(k, what))
            .collect::<Result<Vec<_>>>()?;
        Ok(Trusted { keys })
    }

    /// `XPU_ZEBIN_TRUSTED_KEYS` (none when unset). Set, it must name a key: a list that
    /// parses to nothing (`,`) would quietly trust every unsigned bundle.
    pub fn from_env() -> Result<Trusted> {
        match crate::knobs::text_knob(TRUSTED_KEYS_ENV)? {
            None => Ok(Trusted::default()),
            Some(text) => {
                let trusted = Trusted::parse(&text, TRUSTED_KEYS_ENV)?;
                if trusted.is_empty() && !text.trim().is_empty() {
                    return Err(bad(format!(
                        "{TRUSTED_KEYS_ENV}={text:?} names no key (NAME:64 hex digits, \
                         comma- or blank-separated)"
                    )));
                }
                Ok(trusted)
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Did a trusted key, `signer` (its public text), sign `message` with `signature`
    /// (hex)? A key that is not trusted, or any malformed field, is a no.
    pub fn verify(&self, signer: &str, message: &[u8], signature: &str) -> bool {
        let Ok((_, key)) = parse_public(signer, "signer") else {
            return false;
        };
        let Some(bytes) = unhex::<64>(signature) else {
            return false;
        };
        self.keys.iter().any(|(_, k)| *k == key)
            && key
                .verify_strict(message, &Signature::from_bytes(&bytes))
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_refuse() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("farm.key");
        let public = generate(&path, "farm-1").unwrap();
        assert!(
            generate(&path, "farm-1").is_err(),
            "never over an existing key"
        );
        let signer = Signer::load(&path).unwrap();
        assert_eq!(signer.public(), public);
        let sig = signer.sign(b"entry");
        let trusted = Trusted::parse(&format!(" {public}, "), "t").unwrap();
        assert!(trusted.verify(&public, b"entry", &sig));
        assert!(!trusted.verify(&public, b"entry!", &sig), "another message");
        let mut flipped = sig.clone().into_bytes();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert!(!trusted.verify(&public, b"entry", &flipped));
        let other = generate(&dir.path().join("other.key"), "other").unwrap();
        let other_sig = Signer::load(&dir.path().join("other.key"))
            .unwrap()
            .sign(b"entry");
        assert!(
            !trusted.verify(&other, b"entry", &other_sig),
            "an untrusted key"
        );
        assert!(!Trusted::default().verify(&public, b"entry", &sig));
        for bad in ["", "x", "farm:zz", "a b:00", &format!("{public}0")] {
            assert!(!trusted.verify(bad, b"entry", &sig), "{bad}");
            assert!(Trusted::parse(bad, "t").is_err() || bad.is_empty(), "{bad}");
        }
        assert!(!trusted.verify(&public, b"entry", "00"));
        // A key readable by others is refused.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Signer::load(&path).is_err());
        assert!(generate(&dir.path().join("x"), "bad name").is_err());
    }
}

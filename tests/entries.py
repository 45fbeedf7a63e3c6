"""Cache entries as a test (or anyone who may write the cache directory) reads and forges
them: `MAGIC | uncompressed length (u64) | zstd frame of binary | meta | meta length (u32)
| blake3(key + everything before)` (src/cache/entry.rs); the last format, `XZCACHE2`
(`MAGIC | meta length | meta | binary | checksum`, uncompressed), still answers."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Tuple, Union

import blake3
import zstandard


def opened(entry: Union[bytes, Path]) -> Tuple[bytes, bytes]:
    """(meta JSON, binary) of an entry in either format."""
    data = entry.read_bytes() if isinstance(entry, Path) else entry
    if data.startswith(b"XZCACHE2"):
        (meta_len,) = struct.unpack_from("<I", data, 8)
        return data[12 : 12 + meta_len], data[12 + meta_len : -32]
    assert data.startswith(b"XZCACHE3"), data[:8]
    (stated,) = struct.unpack_from("<Q", data, 8)
    plain = zstandard.ZstdDecompressor().decompress(data[16:-32])
    assert len(plain) == stated
    (meta_len,) = struct.unpack("<I", plain[-4:])
    return plain[-4 - meta_len : -4], plain[: -4 - meta_len]


def binary_of(entry: Union[bytes, Path]) -> bytes:
    return opened(entry)[1]


def sealed(key: str, meta: bytes, binary: bytes) -> bytes:
    """An entry of `key` holding `meta` and `binary`, compressed, its checksum recomputed."""
    plain = binary + meta + struct.pack("<I", len(meta))
    body = b"XZCACHE3" + struct.pack("<Q", len(plain))
    body += zstandard.ZstdCompressor(level=3).compress(plain)
    return body + blake3.blake3(key.encode() + body).digest()


def sealed_plain(key: str, meta: bytes, binary: bytes) -> bytes:
    """The same entry in the last format (uncompressed), as that release wrote it."""
    body = b"XZCACHE2" + struct.pack("<I", len(meta)) + meta + binary
    return body + blake3.blake3(key.encode() + body).digest()


def forge(path: Path, binary: bytes) -> None:
    """Rewrite the entry at `path` with another binary, as a writer of the cache can."""
    meta, _ = opened(path)
    path.write_bytes(sealed(path.stem, meta, binary))


def held(path: Path) -> bytes:
    """What a bundle's file holds: inflated when stored compressed (as this package writes
    bundles, src/bundle/stored.rs), else as it is (format 1)."""
    data = path.read_bytes()
    if data.startswith(b"\x28\xb5\x2f\xfd"):
        return zstandard.ZstdDecompressor().decompress(data)
    return data


def forge_file(path: Path, record: dict, data: bytes) -> None:
    """Write ``data`` at ``path`` as it is, listed so in its manifest ``record`` (size and
    checksum made to match, stored as a bundle of format 1 stores files): a forger's file."""
    path.write_bytes(data)
    record.pop("stored", None)
    record.update(size=len(data), blake3=blake3.blake3(data).hexdigest())

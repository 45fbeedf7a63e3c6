"""The format of what the fleet's store holds: a value is a header (the entry's key, the
device and compiler it was built for, who signed it, the signature) and the entry's bytes;
a signature covers key, device, compiler and bytes, each with its length. Pure functions:
no client here (``remote.py`` is the level that uses them)."""

from __future__ import annotations

import json
import struct
from typing import Dict, Optional, Tuple

from . import _core

#: The store's keys: one namespace, one format version.
PREFIX = "xpu-zebin:v1:"
MAGIC = b"XZREMOTE1\n"
#: A header is a few hundred bytes; anything larger is not one of ours.
MAX_HEADER_BYTES = 64 * 1024
SIGNED_TAG = b"xpu-zebin/remote-entry/v1\0"
#: The store's namespaces: native entries, and Triton's own cache entries.
NAMESPACES = (PREFIX, "xpu-zebin:triton:v1:")


def signed_message(key: str, device: str, compiler: str, entry: bytes) -> bytes:
    """What a signature covers: the entry's key, the device and compiler it was built for,
    and its bytes, each with its length (no field can stand in for another)."""
    parts = [key.encode("utf-8", "surrogatepass"), device.strip().encode("utf-8", "surrogatepass"),
             compiler.encode("utf-8", "surrogatepass"), entry]  # fmt: skip
    return SIGNED_TAG + b"".join(struct.pack("<Q", len(p)) + p for p in parts)


def pack(header: Dict[str, str], entry: bytes) -> bytes:
    raw = json.dumps(header, sort_keys=True).encode()
    return MAGIC + struct.pack("<I", len(raw)) + raw + entry


def unpack(value: bytes) -> Tuple[Dict[str, str], bytes]:
    """A stored value's header and entry; ValueError for anything else."""
    if not value.startswith(MAGIC) or len(value) < len(MAGIC) + 4:
        raise ValueError("not an xpu-zebin remote entry")
    (size,) = struct.unpack_from("<I", value, len(MAGIC))
    start = len(MAGIC) + 4
    if size > MAX_HEADER_BYTES or start + size > len(value):
        raise ValueError("its header is cut short or too large")
    header = json.loads(value[start : start + size])
    fields = ("key", "device", "compiler", "signer", "signature")
    if not isinstance(header, dict) or not all(isinstance(header.get(f), str) for f in fields):
        raise ValueError("its header lacks a field")
    return header, value[start + size :]


def trusted(header: Dict[str, str], entry: bytes) -> bool:
    """Did a trusted key sign this entry, as its header describes it?"""
    message = signed_message(header["key"], header["device"], header["compiler"], entry)
    return _core.verify(header["signer"], message, header["signature"])


def check(name: bytes, value: Optional[bytes]) -> Optional[str]:
    """Why the entry at ``name`` fails verification (None: a trusted key signed it, for
    this very key). Any value, however forged, gets an answer."""
    if value is None:
        return "larger than the bound"
    try:
        header, entry = unpack(value)
        text = name.decode("utf-8")
        own = text[len(PREFIX) :] if text.startswith(PREFIX) else text
        if header["key"] != own:
            return "its header names another key (an entry replayed under this one)"
        if not trusted(header, entry):
            return "not signed by a trusted key"
    except Exception as e:
        return f"malformed ({type(e).__name__})"
    return None

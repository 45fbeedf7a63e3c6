"""The fleet's store, as Python sees it: names only. The store is the engine's
(``src/store/``: the local cache, the remote level on Redis with a bounded client of its
own, signing and trust, one lookup through the levels); every compile goes through it, so
nothing here takes part in a compile. What is left is what a user or a test names:
settings, counts, the value's format.

``XPU_ZEBIN_REMOTE=redis://[user:password@]host:port/db`` (``rediss://`` for TLS,
``unix://`` for a socket) turns the store on; ``XPU_ZEBIN_REMOTE_MODE`` is ``read-only``
(the default) or ``read-write``. See the fleet page of the documentation."""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple, Union

from . import _core

__all__ = ["MAGIC", "NAMESPACES", "PREFIX", "SIGNED_TAG", "check", "config", "counts",
           "pack", "publish", "redacted", "reset", "signed_message", "unpack"]  # fmt: skip

REMOTE_ENV: str = _core.REMOTE_ENV
MODE_ENV: str = _core.REMOTE_MODE_ENV
TIMEOUT_ENV: str = _core.REMOTE_TIMEOUT_ENV
TTL_ENV: str = _core.REMOTE_TTL_ENV
MAX_BYTES_ENV: str = _core.REMOTE_MAX_BYTES_ENV
#: The store's keys of native entries, and of Triton's own entries.
PREFIX: str = _core.REMOTE_PREFIX
NAMESPACES: Tuple[str, str] = (_core.REMOTE_PREFIX, _core.REMOTE_TRITON_PREFIX)
MAGIC: bytes = _core.REMOTE_MAGIC
SIGNED_TAG: bytes = _core.REMOTE_SIGNED_TAG


def config() -> Optional[Dict[str, object]]:
    """The store's settings (its address without credentials, ``read_write``, ``timeout``,
    ``ttl``, ``max_bytes``); None when ``XPU_ZEBIN_REMOTE`` is unset. A bad value is an
    :class:`~xpu_zebin.InvalidArgumentError` naming it."""
    return _core.remote_config()


def counts(cache_dir: Optional[Union[str, os.PathLike[str]]] = None) -> Dict[str, int]:
    """What the store gave the cache in ``cache_dir`` (default: the user's), from its
    ledger, as ``xpu-zebin stats`` counts it: hits, misses, untrusted, too_large, errors,
    published (those that happened)."""
    return _core.remote_counts(cache_dir)


#: This process forgets what it saw of the store (a store left alone after a failure, its
#: connections, the warnings it said): a fresh node. Counts are the cache's ledger's.
reset = _core.remote_reset
redacted = _core.remote_redacted
signed_message = _core.remote_signed_message
pack = _core.remote_pack
unpack = _core.remote_unpack
#: ``publish(spirv, device, options)``: this request's local cache entry, signed, into the
#: store (a read-write node with a signing key); True when written.
publish = _core.remote_publish


def check(name: bytes, value: Optional[bytes]) -> Optional[str]:
    """Why the entry at ``name`` fails verification (None: a trusted key signed it, for
    this very key). Any value, however forged, gets an answer."""
    return _core.remote_check(name, value)

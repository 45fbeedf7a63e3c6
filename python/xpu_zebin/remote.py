"""The fleet's level: a remote store on Redis behind the local cache, every entry signed.

``XPU_ZEBIN_REMOTE=redis://[user:password@]host:port/db`` (``rediss://`` for TLS) turns it on;
``XPU_ZEBIN_REMOTE_MODE`` is ``read-only`` (the default) or ``read-write``. A node looks in
its local cache first, then in the store; an entry from the store is taken only when a key
of ``XPU_ZEBIN_TRUSTED_KEYS`` signed it (Ed25519, ``src/signing.rs``) over its key, the
device and compiler it was built for, and its bytes, and only when it decodes as the entry
of this node's own key (a checksum over key and body): then it is written to the local
cache, and the result says ``source="remote"``. A read-write node with a signing key
(``XPU_ZEBIN_SIGNING_KEY``) publishes what it compiled. Native code from the store is
still untrusted where it loads (the drop-ins trial-load cached builds in a worker first).

The store can never hang, crash or poison a compile: connect and read timeouts
(``XPU_ZEBIN_REMOTE_TIMEOUT``, 2 s), a bounded value (``XPU_ZEBIN_REMOTE_MAX_BYTES``, 256
MiB, checked with STRLEN before the value is asked for, and asked for with GETRANGE up to
the bound), a TTL (``XPU_ZEBIN_REMOTE_TTL``, 30 days); a store that is down, slow, full or
answers garbage means compiling locally, with one warning, and the store is left alone
for a minute after a failure to reach it."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import _core, remote_client
from .errors import BuildError, InvalidArgumentError
from .remote_client import TooLarge
from .remote_client import redacted as _redacted
from .remote_format import (  # the value's format, used here and said as remote.*
    MAGIC,
    MAX_HEADER_BYTES,
    NAMESPACES,
    PREFIX,
    SIGNED_TAG,
    check,
    pack,
    signed_message,
    trusted,
    unpack,
)

__all__ = ["MAGIC", "NAMESPACES", "PREFIX", "SIGNED_TAG", "TooLarge", "check", "compiled",
           "compiled_many", "config", "counts", "fetch", "pack", "publish", "signed_message",
           "trusted", "unpack"]  # fmt: skip

logger = logging.getLogger("xpu_zebin.remote")

REMOTE_ENV = "XPU_ZEBIN_REMOTE"
MODE_ENV = "XPU_ZEBIN_REMOTE_MODE"
TIMEOUT_ENV = "XPU_ZEBIN_REMOTE_TIMEOUT"
TTL_ENV = "XPU_ZEBIN_REMOTE_TTL"
MAX_BYTES_ENV = "XPU_ZEBIN_REMOTE_MAX_BYTES"

DEFAULT_MAX_BYTES = 256 << 20  # the local cache's own bound on an entry
DEFAULT_TIMEOUT = 2.0
DEFAULT_TTL = 30 * 24 * 3600
#: After the store could not be reached, it is left alone this long (no timeout per kernel).
BACKOFF_SECONDS = 60.0


@dataclass(frozen=True)
class Config:
    url: str
    read_write: bool
    timeout: float
    ttl: int
    max_bytes: int


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 <= value <= _core.MAX_SECONDS) or value != value:
        raise InvalidArgumentError(f"{name}={text!r} is not valid: expected seconds, 0 to 1e9")
    return value


def config() -> Optional[Config]:
    """The store this process uses, from the environment; None when ``XPU_ZEBIN_REMOTE`` is
    unset. A bad value is an :class:`InvalidArgumentError` naming it (never ignored)."""
    url = os.environ.get(REMOTE_ENV, "").strip()
    if not url:
        return None
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise InvalidArgumentError(
            f"{REMOTE_ENV}={_redacted(url)!r} is not valid: expected "
            "redis://[user:password@]host:port/db "
            "(rediss:// for TLS)"
        )
    mode = os.environ.get(MODE_ENV, "").strip().lower() or "read-only"
    if mode not in ("read-only", "read-write"):
        raise InvalidArgumentError(f"{MODE_ENV}={mode!r} is not valid: read-only or read-write")
    max_text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if max_text and not max_text.isdigit():
        raise InvalidArgumentError(f"{MAX_BYTES_ENV}={max_text!r} is not a number of bytes")
    return Config(
        url=url,
        read_write=mode == "read-write",
        timeout=_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT) or DEFAULT_TIMEOUT,
        ttl=math.ceil(_seconds(TTL_ENV, DEFAULT_TTL)),  # 0.5 s lives a second, not forever
        max_bytes=int(max_text) if max_text else DEFAULT_MAX_BYTES,
    )


# --- what this process saw --------------------------------------------------------------

_lock = threading.Lock()
_said: set = set()
_counts: Dict[str, int] = {}
_clients = remote_client.CLIENTS
_down_until: Dict[str, float] = {}


def _count(what: str) -> None:
    with _lock:
        _counts[what] = _counts.get(what, 0) + 1


def counts() -> Dict[str, int]:
    """What the store gave this process: hits, misses, untrusted, too_large, errors,
    published."""
    with _lock:
        return dict(_counts)


def _say_once(key: str, message: str, *args: Any) -> None:
    with _lock:
        if key in _said:
            return
        _said.add(key)
    logger.warning(message, *args)


def _usable(cfg: Config) -> bool:
    with _lock:
        return _down_until.get(cfg.url, 0.0) <= time.monotonic()


def _failed(cfg: Config, e: BaseException) -> None:
    """The store could not be used: one warning, then it is left alone for a while."""
    _count("errors")
    with _lock:
        _down_until[cfg.url] = time.monotonic() + BACKOFF_SECONDS
    _say_once(f"down:{cfg.url}", "xpu-zebin: remote store %s unusable (%s: %s); compiling "
              "locally", _redacted(cfg.url), type(e).__name__, e)  # fmt: skip


# --- the signed value -------------------------------------------------------------------


def _not_ours(e: BaseException) -> bool:
    """A reply about the key, not the store: a value of another type (WRONGTYPE)."""
    return "WRONGTYPE" in str(e)


def _client(cfg: Config) -> Any:
    return remote_client.client(cfg.url, cfg.timeout, cfg.max_bytes + MAX_HEADER_BYTES)


def _read(cfg: Config, rkeys: List[str], all_or_none: bool = False) -> List[Optional[bytes]]:
    """The values at ``rkeys``, bounded together and within one deadline (``all_or_none``:
    none when one is absent); :class:`TooLarge` (counted, said once) when larger than the
    bound."""
    try:
        return remote_client.read_within_deadline(_client(cfg), rkeys, cfg.max_bytes,
                                                  10 * cfg.timeout, all_or_none)  # fmt: skip
    except TooLarge as e:
        _count("too_large")
        _say_once("large", "xpu-zebin: remote entry %s is %d bytes, more than %s=%d: "
                  "not read", e.key, e.size, MAX_BYTES_ENV, cfg.max_bytes)  # fmt: skip
        raise


# --- the level itself -------------------------------------------------------------------


def _untrusted(e: BaseException, rkey: str) -> None:
    _count("untrusted")
    _say_once("untrusted", "xpu-zebin: an entry of the remote store was not loaded (%s); "
              "built locally (xpu-zebin remote verify lists such entries)", e)  # fmt: skip
    logger.debug("remote entry %s refused: %s", rkey, e)


#: What a value must have been signed as: its store key, entry key, device and compiler.
Wanted = Tuple[str, str, str, str]


def _signed_values(cfg: Config, wanted: List[Wanted],
                   all_or_none: bool = False) -> List[Optional[bytes]]:  # fmt: skip
    """For each ``(rkey, key, device, compiler)``, the bytes stored at ``rkey`` when a
    trusted key signed them as ``key``'s, built for ``device`` with ``compiler``; None
    otherwise: absent (a miss), untrusted (counted, warned once), or the store failing
    (one warning, then left alone for a while). One read for all of them; with
    ``all_or_none``, all of them or none (nothing more is read or checked after the first
    that fails)."""
    if not _core.trusted_keys_set():
        _say_once("no-trust", "xpu-zebin: %s is set but %s is not: nothing from the store "
                  "can be trusted, so nothing is loaded from it", REMOTE_ENV,
                  _core.TRUSTED_KEYS_ENV)  # fmt: skip
        return [None] * len(wanted)
    try:
        values = _read(cfg, [w[0] for w in wanted], all_or_none)
    except TooLarge:
        return [None] * len(wanted)
    except Exception as e:  # down, slow, refused, garbage: built locally
        if _not_ours(e):
            _count("untrusted")
        else:
            _failed(cfg, e)
        return [None] * len(wanted)
    found: List[Optional[bytes]] = []
    for value, w in zip(values, wanted):
        found.append(_signed(value, *w))
        if all_or_none and found[-1] is None:
            return [None] * len(wanted)
    return found


def _signed(
    value: Optional[bytes], rkey: str, key: str, device: str, compiler: str
) -> Optional[bytes]:
    """The entry in ``value`` when a trusted key signed it as asked (see above)."""
    if value is None:
        _count("misses")
        return None
    try:
        header, data = unpack(value)
        signed = (header["key"], header["device"].strip(), header["compiler"])
        if signed != (key, device.strip(), compiler) or not trusted(header, data):
            raise ValueError("no trusted key signed it for this request")
    except Exception as e:  # a forged value can raise anything parsing it: never loaded
        _untrusted(e, rkey)
        return None
    return data


def fetch(spirv: bytes, device: str, options: Any, cfg: Optional[Config] = None) -> Any:
    """Before a compile: when the local cache cannot answer, take a trusted entry for this
    request from the store into the local cache, and answer with it (a CompileResult whose
    ``source`` is ``remote``); None when there is none."""
    cfg = cfg or config()
    if cfg is None or not options.cache or not _usable(cfg):
        return None
    try:
        slot = _core.cache_slot(spirv, device, options)
        if slot.local() is not None:
            return None  # the local level answers first
    except BuildError:
        return None  # the compile says why, as without a store
    (entry,) = _signed_values(cfg, [(PREFIX + slot.key, slot.key, device, slot.compiler)])
    if entry is None:
        return None
    try:
        result = slot.adopt(entry)
    except BuildError as e:  # signed, yet not this request's entry: never loaded
        _untrusted(e, slot.key)
        return None
    _count("hits")
    return result


def publish(spirv: bytes, device: str, options: Any, cfg: Optional[Config] = None,
            binary: Optional[bytes] = None) -> bool:  # fmt: skip
    """After a fresh compile (``binary``) on a read-write node with a signing key: its
    local entry, signed, into the store; never an entry that does not hold ``binary``
    (the local cache is read back, and it is shared). True when it was written."""
    cfg = cfg or config()
    if cfg is None or not cfg.read_write or not options.cache or not _usable(cfg):
        return False
    slot = _core.cache_slot(spirv, device, options)
    entry = slot.local()
    if entry is None or (binary is not None and binary not in entry):
        return False
    return _put_signed(cfg, PREFIX + slot.key, slot.key, device, slot.compiler, entry)


def _put_signed(cfg: Config, rkey: str, key: str, device: str, compiler: str, data: bytes) -> bool:
    """``data``, signed as ``key``'s built for ``device`` with ``compiler``, at ``rkey``
    (with the store's TTL); True when written."""
    signed = _core.sign(signed_message(key, device, compiler, data))
    if signed is None:
        _say_once("no-key", "xpu-zebin: %s=read-write but %s is not set: nothing is "
                  "published (an unsigned entry would never be loaded)", MODE_ENV,
                  _core.SIGNING_KEY_ENV)  # fmt: skip
        return False
    header = {"key": key, "device": device, "compiler": compiler, "signer": signed[0],
              "signature": signed[1]}  # fmt: skip
    value = pack(header, data)
    if len(value) > cfg.max_bytes:
        return False
    try:
        _client(cfg).set(rkey, value, ex=cfg.ttl or None)
    except Exception as e:
        _failed(cfg, e)
        return False
    _count("published")
    return True


def compiled(spirv: bytes, device: str, options: Any, compile: Any) -> Any:
    """``compile(spirv, device, options)`` with the store as the level behind the local
    cache: fetched first when the local cache cannot answer, published after a fresh
    build (a read-write node); the result says where its native code came from."""
    store = config()
    result = fetch(spirv, device, options, store) if store is not None else None
    if result is None:
        result = compile(spirv, device, options)
        if store is not None and not result.cached:
            publish(spirv, device, options, store, result.binary)
    logger.debug("kernel %r: native code from %s", result.kernel, result.source)
    return result


def compiled_many(reqs: list, compile_many: Any, jobs: Any, progress: Any) -> list:
    """``compile_many`` with the store behind the local cache: each request the store
    answers (signed by a trusted key) is answered at once, the others compiled as one
    batch and published (a read-write node); results in input order."""
    store = config()
    if store is None:
        return compile_many(reqs, jobs=jobs, progress=progress)
    answered = [fetch(r["spirv"], r["device"], r["options"], store) for r in reqs]
    rest = [i for i, a in enumerate(answered) if a is None]
    for i, a in enumerate(answered):
        if a is not None and progress is not None:
            progress(i)
    built = compile_many(
        [reqs[i] for i in rest],
        jobs=jobs,
        progress=None if progress is None else (lambda k: progress(rest[k])),
    )
    for i, result in zip(rest, built):
        r = reqs[i]
        if not isinstance(result, BaseException) and not result.cached:
            publish(r["spirv"], r["device"], r["options"], store, result.binary)
        answered[i] = result
    return answered


# --- the CLI's view of the store ------------------------------------------------------------


def entries(cfg: Config) -> Iterator[Tuple[bytes, Optional[bytes]]]:
    """Every key of the store's namespaces (native entries and Triton's), as bytes, and its
    value (None when too large to read)."""
    client = _client(cfg)
    for prefix in NAMESPACES:
        for rkey in client.scan_iter(match=prefix + "*", count=256):
            name = rkey if isinstance(rkey, bytes) else str(rkey).encode()
            try:
                yield name, _read(cfg, [name.decode("utf-8", "surrogateescape")])[0]
            except TooLarge:
                yield name, None


def delete_if_unchanged(cfg: Config, name: bytes, value: bytes) -> int:
    """Remove ``name`` only while it still holds ``value`` (a node may have published a
    good entry there meanwhile)."""
    script = ("if redis.call('GET', KEYS[1]) == ARGV[1] then "
              "return redis.call('DEL', KEYS[1]) else return 0 end")  # fmt: skip
    return int(_client(cfg).eval(script, 1, name, value) or 0)


# --- signed values of other kinds (Triton's own cache entries) ---------------------------


def fetch_signed(cfg: Config, rkeys: List[str], identity: str,
                 all_or_none: bool = False) -> List[Optional[bytes]]:  # fmt: skip
    """The bytes stored at each of ``rkeys`` when a trusted key signed them for that key
    and ``identity`` (what they were built with), in one read; None for each other (as
    :func:`_signed_values`, ``all_or_none`` too)."""
    if not _usable(cfg):
        return [None] * len(rkeys)
    wanted = [(rkey, rkey, "", identity) for rkey in dict.fromkeys(rkeys)]  # each read once
    by_key = dict(zip(dict.fromkeys(rkeys), _signed_values(cfg, wanted, all_or_none)))
    found = [by_key[rkey] for rkey in rkeys]
    for data in found:
        if data is not None:
            _count("hits")
    return found


def publish_signed(cfg: Config, rkey: str, identity: str, data: bytes) -> bool:
    """``data`` signed for ``rkey`` and ``identity`` into the store (a read-write node with
    a signing key); True when written."""
    if not cfg.read_write or not _usable(cfg):
        return False
    return _put_signed(cfg, rkey, rkey, "", identity, data)

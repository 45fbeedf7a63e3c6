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

import json
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple

from . import _core
from .errors import BuildError, InvalidArgumentError

logger = logging.getLogger("xpu_zebin.remote")

REMOTE_ENV = "XPU_ZEBIN_REMOTE"
MODE_ENV = "XPU_ZEBIN_REMOTE_MODE"
TIMEOUT_ENV = "XPU_ZEBIN_REMOTE_TIMEOUT"
TTL_ENV = "XPU_ZEBIN_REMOTE_TTL"
MAX_BYTES_ENV = "XPU_ZEBIN_REMOTE_MAX_BYTES"

#: The store's keys: one namespace, one format version.
PREFIX = "xpu-zebin:v1:"
MAGIC = b"XZREMOTE1\n"
#: A header is a few hundred bytes; anything larger is not one of ours.
MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_BYTES = 256 << 20  # the local cache's own bound on an entry
DEFAULT_TIMEOUT = 2.0
DEFAULT_TTL = 30 * 24 * 3600
#: After the store could not be reached, it is left alone this long (no timeout per kernel).
BACKOFF_SECONDS = 60.0
SIGNED_TAG = b"xpu-zebin/remote-entry/v1\0"


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
            f"{REMOTE_ENV}={url!r} is not valid: expected redis://[user:password@]host:port/db "
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
        ttl=int(_seconds(TTL_ENV, DEFAULT_TTL)),
        max_bytes=int(max_text) if max_text else DEFAULT_MAX_BYTES,
    )


# --- what this process saw --------------------------------------------------------------

_lock = threading.Lock()
_said: set = set()
_counts: Dict[str, int] = {}
_clients: Dict[Tuple[int, str, float], Any] = {}
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


def _client(cfg: Config) -> Any:
    """One client per process and store (a forked child makes its own)."""
    import redis

    key = (os.getpid(), cfg.url, cfg.timeout)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = redis.Redis.from_url(
                cfg.url, socket_timeout=cfg.timeout, socket_connect_timeout=cfg.timeout,
                retry_on_timeout=False, health_check_interval=0,
            )  # fmt: skip
            _clients[key] = client
    return client


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


def _redacted(url: str) -> str:
    """The store's address without its password."""
    scheme, _, rest = url.partition("://")
    _credentials, at, host = rest.rpartition("@")
    return f"{scheme}://{'***@' if at else ''}{host}"


# --- the signed value -------------------------------------------------------------------


def signed_message(key: str, device: str, compiler: str, entry: bytes) -> bytes:
    """What a signature covers: the entry's key, the device and compiler it was built for,
    and its bytes."""
    return SIGNED_TAG + b"\0".join(x.encode() for x in (key, device, compiler)) + b"\0" + entry


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


class TooLarge(Exception):
    """A value over the bound: never read."""


def _read(cfg: Config, rkey: str) -> Optional[bytes]:
    """The value at ``rkey``, bounded: None when absent; :class:`TooLarge` when larger than
    the bound (its size asked first, so it is never read)."""
    client = _client(cfg)
    size = client.strlen(rkey)
    if not isinstance(size, int) or size <= 0:
        return None
    if size > cfg.max_bytes:
        _count("too_large")
        _say_once(f"large:{rkey}", "xpu-zebin: remote entry %s is %d bytes, more than %s=%d: "
                  "not read", rkey, size, MAX_BYTES_ENV, cfg.max_bytes)  # fmt: skip
        raise TooLarge(rkey)
    value = client.getrange(rkey, 0, cfg.max_bytes)
    if not isinstance(value, bytes) or len(value) > cfg.max_bytes:
        raise ValueError("the store answered something other than a bounded value")
    return value


# --- the level itself -------------------------------------------------------------------


def fetch(spirv: bytes, device: str, options: Any, cfg: Optional[Config] = None) -> Any:
    """Before a compile: when the local cache cannot answer, take a trusted entry for this
    request from the store into the local cache, and answer with it (a CompileResult whose
    ``source`` is ``remote``); None when there is none."""
    cfg = cfg or config()
    if cfg is None or not options.cache or not _usable(cfg):
        return None
    try:
        key, local = _core.cached_entry(spirv, device, options)
        if local is not None:
            return None  # the local level answers first
        compiler = _core.compiler_identity(options.ocloc)
    except BuildError:
        return None  # the compile says why, as without a store
    if not _core.trusted_keys_set():
        _say_once("no-trust", "xpu-zebin: %s is set but %s is not: nothing from the store "
                  "can be trusted, so nothing is loaded from it", REMOTE_ENV,
                  _core.TRUSTED_KEYS_ENV)  # fmt: skip
        return None
    try:
        value = _read(cfg, PREFIX + key)
    except TooLarge:
        return None
    except Exception as e:  # down, slow, refused, garbage: compile locally
        _failed(cfg, e)
        return None
    if value is None:
        _count("misses")
        return None
    try:
        header, entry = unpack(value)
        signed = (header["key"], header["device"], header["compiler"]) == (key, device, compiler)
        if not (signed and trusted(header, entry)):
            raise ValueError("no trusted key signed it for this request")
        result = _core.adopt_entry(spirv, device, options, entry)
    except (ValueError, BuildError) as e:
        _count("untrusted")
        _say_once("untrusted", "xpu-zebin: an entry of the remote store was not loaded (%s); "
                  "compiled locally (xpu-zebin remote verify lists such entries)", e)  # fmt: skip
        logger.debug("remote entry %s refused: %s", key, e)
        return None
    _count("hits")
    return result


def publish(spirv: bytes, device: str, options: Any, cfg: Optional[Config] = None) -> bool:
    """After a fresh compile on a read-write node with a signing key: its local entry,
    signed, into the store. True when it was written."""
    cfg = cfg or config()
    if cfg is None or not cfg.read_write or not options.cache or not _usable(cfg):
        return False
    key, entry = _core.cached_entry(spirv, device, options)
    if entry is None:
        return False
    compiler = _core.compiler_identity(options.ocloc)
    signed = _core.sign(signed_message(key, device, compiler, entry))
    if signed is None:
        _say_once("no-key", "xpu-zebin: %s=read-write but %s is not set: nothing is "
                  "published (an unsigned entry would never be loaded)", MODE_ENV,
                  _core.SIGNING_KEY_ENV)  # fmt: skip
        return False
    signer, signature = signed
    header = {"key": key, "device": device, "compiler": compiler, "signer": signer,
              "signature": signature}  # fmt: skip
    value = pack(header, entry)
    if len(value) > cfg.max_bytes:
        return False
    try:
        _client(cfg).set(PREFIX + key, value, ex=cfg.ttl or None)
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
            publish(spirv, device, options, store)
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
            publish(r["spirv"], r["device"], r["options"], store)
        answered[i] = result
    return answered


# --- the CLI's view of the store ------------------------------------------------------------


def entries(cfg: Config, limit: Optional[int] = None) -> Iterator[Tuple[str, Optional[bytes]]]:
    """Every key of the store's namespace and its value (None when too large to read)."""
    client = _client(cfg)
    for n, rkey in enumerate(client.scan_iter(match=PREFIX + "*", count=256)):
        if limit is not None and n >= limit:
            return
        name = rkey.decode(errors="replace") if isinstance(rkey, bytes) else str(rkey)
        try:
            yield name, _read(cfg, name)
        except TooLarge:
            yield name, None


def check(value: Optional[bytes]) -> Optional[str]:
    """Why an entry fails verification (None: a trusted key signed it)."""
    if value is None:
        return "larger than the bound"
    try:
        header, entry = unpack(value)
    except ValueError as e:
        return str(e)
    return None if trusted(header, entry) else f"not signed by a trusted key ({header['signer']})"


# --- signed values of other kinds (Triton's own cache entries) ---------------------------


def fetch_signed(cfg: Config, rkey: str, identity: str) -> Optional[bytes]:
    """The bytes stored at ``rkey`` when a trusted key signed them for ``rkey`` and
    ``identity`` (what they were built with); None otherwise (absent, untrusted: counted,
    warned once; a store that fails: one warning, then left alone for a while)."""
    if not _usable(cfg):
        return None
    if not _core.trusted_keys_set():
        _say_once("no-trust", "xpu-zebin: %s is set but %s is not: nothing from the store "
                  "can be trusted, so nothing is loaded from it", REMOTE_ENV,
                  _core.TRUSTED_KEYS_ENV)  # fmt: skip
        return None
    try:
        value = _read(cfg, rkey)
    except TooLarge:
        return None
    except Exception as e:
        _failed(cfg, e)
        return None
    if value is None:
        _count("misses")
        return None
    try:
        header, data = unpack(value)
        if (header["key"], header["compiler"]) != (rkey, identity) or not trusted(header, data):
            raise ValueError("no trusted key signed it for this key")
    except ValueError as e:
        _count("untrusted")
        _say_once("untrusted", "xpu-zebin: an entry of the remote store was not loaded (%s); "
                  "built locally (xpu-zebin remote verify lists such entries)", e)  # fmt: skip
        return None
    _count("hits")
    return data


def publish_signed(cfg: Config, rkey: str, identity: str, data: bytes) -> bool:
    """``data`` signed for ``rkey`` and ``identity`` into the store (a read-write node with
    a signing key); True when written."""
    if not cfg.read_write or not _usable(cfg):
        return False
    signed = _core.sign(signed_message(rkey, "", identity, data))
    if signed is None:
        _say_once("no-key", "xpu-zebin: %s=read-write but %s is not set: nothing is "
                  "published (an unsigned entry would never be loaded)", MODE_ENV,
                  _core.SIGNING_KEY_ENV)  # fmt: skip
        return False
    header = {"key": rkey, "device": "", "compiler": identity, "signer": signed[0],
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

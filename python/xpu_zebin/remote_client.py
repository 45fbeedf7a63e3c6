"""The fleet's store as a client sees it: redis-py (the client Inductor uses), with what a
hostile or broken server must not get past: a reply part over the bound refused before it
is read (an extended RESP2 parser), the value's size asked first, an overall deadline on
a read, and addresses said without their credentials."""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional, Tuple

#: A reply's parts the store may send: a bulk over the value bound, or more items than a
#: SCAN page holds, is refused before it is read (a hostile server cannot fill memory).
MAX_REPLY_ITEMS = 100_000

_lock = threading.Lock()
#: One client per process, address, timeout and bound (a forked child makes its own).
CLIENTS: Dict[Tuple[int, str, float, int], Any] = {}
_pools: Dict[int, Any] = {}


class TooLarge(Exception):
    """A value over the bound: never read."""

    def __init__(self, key: str, size: int) -> None:
        super().__init__(f"{key}: {size} bytes")
        self.key, self.size = key, size


#: What the values of the read under way on this thread may still hold, in bytes: a
#: server answering several range reads at once cannot send more in all than their sizes
#: (each bulk is also bounded alone). Unset outside a read of values.
_budget = threading.local()


def bounded_parser(max_bulk: int) -> Any:
    """redis-py's RESP2 parser, refusing a bulk longer than ``max_bulk`` or a multi-bulk
    of more than :data:`MAX_REPLY_ITEMS` (or nested) before reading it; None when this
    redis-py has no such parser to extend (then the server is trusted to send what it
    is asked: the value's size is asked first)."""
    try:
        from redis._parsers.resp2 import _RESP2Parser
        from redis.exceptions import InvalidResponse
    except ImportError:
        return None

    class Bounded(_RESP2Parser):
        def _read_response(self, disable_decoding=False, **kwargs):
            raw = self._buffer.readline(**kwargs)
            if not raw:
                raise ConnectionError("the store closed the connection")
            if raw[:1] in (b"$", b"*") and raw[1:] != b"-1":
                try:
                    n = int(raw[1:])
                except ValueError:
                    n = -2
                if n < 0 or n > (max_bulk if raw[:1] == b"$" else MAX_REPLY_ITEMS):
                    raise InvalidResponse(f"reply part of {raw[1:64]!r} refused: over the bound")
                left = getattr(_budget, "left", None)
                if raw[:1] == b"$" and left is not None:
                    if n > left:
                        raise InvalidResponse(f"reply part of {n} bytes refused: over the bound")
                    _budget.left = left - n
            self._buffer.rewind(self._buffer.get_pos() - len(raw) - 2)  # let Redis parse it
            return super()._read_response(disable_decoding=disable_decoding, **kwargs)

    return Bounded


def client(url: str, timeout: float, max_bulk: int) -> Any:
    """One client per process and store (a forked child makes its own)."""
    import redis

    key = (os.getpid(), url, timeout, max_bulk)
    with _lock:
        found = CLIENTS.get(key)
        if found is None:
            extra: Dict[str, Any] = {}
            parser = bounded_parser(max_bulk)
            if parser is not None:  # RESP2, whose parser is extended (RESP3 pushes: none)
                extra.update(parser_class=parser, protocol=2)
                try:
                    from redis.maint_notifications import MaintNotificationsConfig

                    extra["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
                except ImportError:
                    pass
            found = redis.Redis.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout,
                retry_on_timeout=False, health_check_interval=0, **extra,
            )  # fmt: skip
            CLIENTS[key] = found
    return found


def redacted(url: str) -> str:
    """The store's address without its credentials (user info and query, where redis-py
    also takes a password)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<an address that does not parse>"
    who = "***@" if "@" in parts.netloc else ""
    return f"{parts.scheme}://{who}{host}{port}{parts.path}{'?***' if parts.query else ''}"


def read(store: Any, keys: List[str], max_bytes: int,
         all_or_none: bool = False) -> List[Optional[bytes]]:  # fmt: skip
    """The values at ``keys`` (None where absent), in two round trips however many: their
    sizes asked first (:class:`TooLarge` when they add up to more than ``max_bytes``, so
    nothing is read), then a range read of each up to its size, the replies together
    bounded by the sizes before a byte of them is read. ``all_or_none``: when one is
    absent, none is read."""
    sizes_of = store.pipeline(transaction=False)
    for key in keys:
        sizes_of.strlen(key)
    sizes = sizes_of.execute()
    if len(sizes) != len(keys) or not all(isinstance(n, int) and n >= 0 for n in sizes):
        raise ValueError("the store answered something other than sizes")
    if sum(sizes) > max_bytes:
        raise TooLarge(keys[0] if len(keys) == 1 else f"{len(keys)} keys", sum(sizes))
    if all_or_none and not all(sizes):
        return [None] * len(keys)
    read_of = store.pipeline(transaction=False)
    for key, n in zip(keys, sizes):
        if n > 0:  # a value that grew since is cut at its size: its signature then fails
            read_of.getrange(key, 0, n - 1)
    _budget.left = sum(sizes)
    try:
        replies = iter(read_of.execute() if any(sizes) else [])
    finally:
        _budget.left = None
    values = [next(replies, None) if n > 0 else None for n in sizes]
    if any(v is not None and not isinstance(v, bytes) for v in values) or next(replies, None):
        raise ValueError("the store answered something other than values")
    return [v or None for v in values]


def read_within_deadline(store: Any, keys: List[str], max_bytes: int, seconds: float,
                         all_or_none: bool = False) -> List[Optional[bytes]]:  # fmt: skip
    """:func:`read` with an overall deadline: a store that trickles its reply byte by
    byte, each within the read timeout, still ends (its connections are dropped)."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as Late

    with _lock:
        pool = _pools.get(os.getpid())
        if pool is None:
            pool = ThreadPoolExecutor(4, thread_name_prefix="xpu-zebin-remote")
            _pools[os.getpid()] = pool
    future = pool.submit(read, store, keys, max_bytes, all_or_none)
    try:
        return future.result(timeout=seconds)
    except Late:
        future.cancel()  # still queued: never run for nobody
        store.connection_pool.disconnect()
        raise TimeoutError(f"no whole reply within {seconds:g} s") from None

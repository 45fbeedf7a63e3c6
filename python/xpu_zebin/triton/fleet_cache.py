"""Triton's own cache in the fleet's signed store: ``TRITON_CACHE_MANAGER=
xpu_zebin.triton.fleet_cache:FleetCacheManager``.

Triton's file cache stays the local level (``TRITON_CACHE_DIR``); behind it, the store of
``XPU_ZEBIN_REMOTE`` (:mod:`xpu_zebin.remote`) holds Triton's entries, IRs, SPIR-V,
metadata and native binaries alike, each signed (``XPU_ZEBIN_SIGNING_KEY``) and taken only
when a trusted key (``XPU_ZEBIN_TRUSTED_KEYS``) signed it. A fresh node thus skips Triton's
front end too. Unlike Triton's ``RemoteCacheManager``, which writes the remote bytes
straight into its file cache, nothing unsigned is ever materialized; and the store's keys
add this host's compiler identity and Level Zero driver version to Triton's key (which
for XPU omits them), so a fleet of two releases never shares native code. A native
binary from the store is still tried in a worker before the driver loads it, where the
drop-in ``load_binary`` is installed."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from typing import Dict, List, Optional

from triton.runtime.cache import CacheManager, FileCacheManager

from .. import _core
from ..errors import BuildError

logger = logging.getLogger("xpu_zebin.triton")

PREFIX = "xpu-zebin:triton:v1:"
#: A Triton cache group holds a kernel's IRs, binary and metadata: a handful of files.
MAX_GROUP_FILES = 64
#: A file of Triton's cache: a plain name (no path, no hidden file).
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")


@functools.lru_cache(maxsize=1)
def host_identity() -> str:
    """This host's compiler and driver, as the store's keys hold them ("none" for either
    the host does not have)."""
    try:
        compiler = _core.compiler_identity(None)
    except BuildError:
        compiler = "none"
    try:
        import xpu_zebin

        driver = str(xpu_zebin.devices()[0]["driver"])
    except (BuildError, IndexError, KeyError):
        driver = "none"
    return f"{compiler}|driver {driver}"


class FleetCacheManager(CacheManager):
    """Triton's ``CacheManager``: Triton's file cache first, then the signed store."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        self._local = FileCacheManager(key, override=override, dump=dump)
        self.cache_dir = self._local.cache_dir
        self._store = not (override or dump) and _core.remote_config() is not None

    def _rkey(self, filename: str) -> str:
        tag = hashlib.sha256(host_identity().encode()).hexdigest()[:16]
        return f"{PREFIX}{tag}:{self.key}:{filename}"

    def _fetch(self, *filenames: str) -> List[Optional[bytes]]:
        """The files from the store, signed for this host, in one read: all of them or
        none (a group is of use only whole)."""
        if not self._store:
            return [None] * len(filenames)
        rkeys = [self._rkey(f) for f in filenames]
        return _core.remote_fetch_signed(rkeys, host_identity(), all_or_none=True)

    def _publish(self, filename: str, data: bytes) -> None:
        if self._store:
            _core.remote_publish_signed(self._rkey(filename), host_identity(), data)

    def get_file(self, filename: str) -> Optional[str]:
        path = self._local.get_file(filename)
        if path is not None:
            return path
        (data,) = self._fetch(filename)
        return None if data is None else self._local.put(data, filename, binary=True)

    def put(self, data, filename: str, binary: bool = True) -> str:
        path = self._local.put(data, filename, binary=binary)
        raw = data if isinstance(data, bytes) else str(data).encode("utf-8")
        self._publish(filename, raw)
        return path

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        group = self._local.get_group(filename)
        if group is not None or not self._store:
            return group
        (listed,) = self._fetch(f"__grp__{filename}")
        if listed is None:
            return None
        try:
            names = json.loads(listed)["child_paths"]
            if not isinstance(names, list) or len(names) > MAX_GROUP_FILES:
                raise ValueError(f"not a list of at most {MAX_GROUP_FILES} names")
            if not all(isinstance(n, str) and FILE_NAME.fullmatch(n) for n in names):
                raise ValueError("a name that is not a plain file name")
        except Exception as e:  # a signed but malformed list: Triton compiles instead
            logger.warning("Triton cache group %s from the store is malformed (%s)", filename, e)
            return None
        names = list(dict.fromkeys(names))
        found = self._fetch(*names)  # one read, bounded as a whole
        if any(data is None for data in found):
            return None  # every file of the group, or none of them
        group = {name: self._local.put(data, name, binary=True) for name, data in zip(names, found)}
        self._local.put_group(filename, group)
        _core.count_triton_cache_hit()  # a kernel's group, from the store
        return group

    def put_group(self, filename: str, group: Dict[str, str]):
        path = self._local.put_group(filename, group)
        listed = json.dumps({"child_paths": sorted(group)}).encode()
        self._publish(f"__grp__{filename}", listed)
        return path

"""What a cache directory holds and what every level did for it: ``xpu-zebin stats``."""

from __future__ import annotations

import os
from typing import Optional, Union

from . import _core

PathLike = Union[str, "os.PathLike[str]"]


def stats(
    cache_dir: Optional[PathLike] = None, *, zero: bool = False, recount: bool = False
) -> dict:
    """What the cache in ``cache_dir`` (default: the user's) holds (``entries``, ``bytes``
    against ``max_bytes``) and what every process that used it counted (``counters``):
    requests, hits per level (local, store, bundle, Triton's cache), compiles, large-GRF
    retries by trigger, entries refused (untrusted, checksum, driver), evictions, compiler
    microseconds spent and saved by hits. Hosts sharing the directory (NFS, Lustre) each
    publish their counts in it: these are every host's, and ``other_hosts`` says how many
    others' files there were (hosts gone for a day are folded into one, still counted).
    ``zero`` sets the counters back to zero, for every host, after they are read;
    ``recount`` counts every entry on disk again first (a writer killed mid-write leaves
    the accounts off by its entry until its shard is recounted), folding gone hosts' files.
    ``cleaning`` is the cleaning in progress (``next_shard`` of ``shards``: over its bound,
    the cache is cleaned a slice per write), or None. As ``xpu-zebin stats``."""
    return _core.cache_stats(None if cache_dir is None else os.fspath(cache_dir), zero, recount)

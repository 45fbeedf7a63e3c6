"""A bundle on disk: a directory (``manifest.json``, ``native/<key>.zebin``, Triton cache
entries under ``triton/``) or one archive file of it; reading, checking and packing them
(the checks themselves are the engine's: ``src/bundle/``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple, Union

import xpu_zebin
from xpu_zebin import _core

from ..targets import TargetProfile

#: A manifest is read at most this big (as the engine reads it).
MAX_MANIFEST_BYTES = 256 << 20
#: An entry's binary is read at most this big (as the engine reads it: ``MAX_ENTRY_BYTES``
#: in ``src/bundle/mod.rs``).
MAX_ENTRY_BYTES = 256 << 20
PathLike = Union[str, "os.PathLike[str]"]

#: A native entry for a bundle: its manifest record and its binary.
Built = Tuple[Dict[str, Any], bytes]
#: The file of a bundle's manifest; an entry's binary is ``native/<key>.zebin``.
MANIFEST = "manifest.json"


def triton_version() -> Optional[str]:
    """The installed Triton's release: a manifest names the one whose SPIR-V it was built
    from (a bundle of another release's is not used: its kernels would never be asked
    for). Only the version is read; nothing else of Triton is used here."""
    try:
        import triton
    except ImportError:
        return None
    return getattr(triton, "__version__", None)


def header(targets: Sequence[TargetProfile]) -> Dict[str, Any]:
    """What a bundle's manifest says of who wrote it and for which targets."""
    return {
        "format": "", "package": xpu_zebin.__version__, "triton": triton_version(),
        "targets": {t.id: t.to_json() for t in targets},
    }  # fmt: skip


@contextlib.contextmanager
def as_directory(bundle: PathLike) -> Iterator[Path]:
    """A bundle directory, or an archive file unpacked (checked) into a private one."""
    path = Path(os.fspath(bundle))
    if path.is_dir() or not path.exists():
        yield path
        return
    path = path.resolve()  # a link the user names is followed, once, here
    with tempfile.TemporaryDirectory(prefix="xpu-zebin-bundle.") as tmp:
        _core.bundle_unpack(os.fspath(path), os.path.join(tmp, path.name))
        yield Path(tmp) / path.name


def pack(bundle: PathLike, archive: PathLike) -> int:
    """Write the bundle directory as one archive file (a tar of its checked files, with
    reproducible headers), to ship; every command that takes a bundle takes it too.
    Returns how many files it holds."""
    return _core.bundle_pack(os.fspath(bundle), os.fspath(archive))


def verify(bundle: PathLike) -> Dict[str, Any]:
    """Every entry checked: ``{"ok": [keys], "bad": [(key, why)]}`` (Triton entries as
    ``triton:<hash>``)."""
    with as_directory(bundle) as d:
        return _core.bundle_verify(os.fspath(d))


def info(bundle: PathLike) -> Dict[str, Any]:
    """The bundle's manifest (checked)."""
    with as_directory(bundle) as d:
        return _core.bundle_read(os.fspath(d))

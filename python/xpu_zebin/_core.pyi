"""Type stubs for the native module (Rust, PyO3)."""

import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .errors import BuildError

__version__: str
GRF_FLAGS: List[str]
OCLOC_ENV: str
CACHE_DIR_ENV: str
TIMEOUT_ENV: str
PERSISTENT_ENV: str
SIMULATED_DEVICE_ENV: str
MAX_SECONDS: float
SPILL_POLICY_ENV: str
ISOLATED_ENV: str

_Path = Union[str, bytes, os.PathLike[str]]

class Options:
    """Build options; ``Options()`` holds every default."""

    build_flags: str
    grf_mode: str
    num_warps: Optional[int]
    kernel_name: Optional[str]
    device_arch: Optional[str]
    max_grf_mode: Optional[int]
    ocloc: Optional[Path]
    timeout: Optional[float]
    cache: bool
    cache_dir: Optional[Path]
    spill_policy: Optional[str]
    speculative: Optional[bool]
    isolated: Optional[bool]
    def __init__(
        self,
        *,
        build_flags: str = "",
        grf_mode: str = "default",
        num_warps: Optional[int] = None,
        kernel_name: Optional[str] = None,
        device_arch: Optional[str] = None,
        max_grf_mode: Optional[Union[int, str]] = None,
        ocloc: Optional[_Path] = None,
        timeout: Optional[float] = None,
        cache: bool = True,
        cache_dir: Optional[_Path] = None,
        spill_policy: Optional[str] = None,
        speculative: Optional[bool] = None,
        isolated: Optional[bool] = None,
    ) -> None: ...
    def replace(self, **changes: Any) -> Options: ...
    def as_dict(self) -> Dict[str, Any]: ...

class AttemptError:
    kind: str
    message: str
    required: Optional[int]
    limit: Optional[int]
    def __init__(
        self, kind: str, message: str, required: Optional[int] = None, limit: Optional[int] = None
    ) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...

class Attempt:
    @property
    def build_flags(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def spill_size(self) -> Optional[int]: ...
    @property
    def seconds(self) -> float: ...
    @property
    def error(self) -> Optional[AttemptError]: ...

class CompileResult:
    @property
    def binary(self) -> bytes: ...
    @property
    def kernel(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def build_flags(self) -> str: ...
    @property
    def grf_mode(self) -> str: ...
    @property
    def n_regs(self) -> int: ...
    @property
    def spill_size(self) -> int: ...
    @property
    def n_spills(self) -> int: ...
    @property
    def simd_size(self) -> int: ...
    @property
    def recovered(self) -> bool: ...
    @property
    def cached(self) -> bool: ...
    @property
    def attempts(self) -> List[Attempt]: ...
    @property
    def log(self) -> str: ...
    @property
    def notes(self) -> List[str]: ...

def compile(spirv: bytes, device: str, options: Options) -> CompileResult: ...
def compile_many(
    requests: Sequence[Dict[str, Any]],
    *,
    jobs: Optional[int] = None,
    progress: Optional[Callable[[int], None]] = None,
) -> List[Union[CompileResult, BuildError]]: ...

class LoadedKernel:
    kernel_name: str
    build_flags: str
    n_regs: int
    n_spills: int
    spill_bytes: int
    n_max_threads: int
    private_mem_size: int
    simd_size: int
    build_log: str
    attempts: List[Attempt]
    recovered: bool
    cached: bool
    native_binary: bytes
    notes: List[str]
    @property
    def module_handle(self) -> int: ...
    @property
    def kernel_handle(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> LoadedKernel: ...
    def __exit__(self, *exc: Any) -> None: ...

def compile_and_load(
    binary: bytes, kernel_name: str, is_spv: bool, device: int, options: Options
) -> LoadedKernel: ...
def compile_and_load_many(
    requests: Sequence[Dict[str, Any]],
    *,
    jobs: Optional[int] = None,
    progress: Optional[Callable[[int], None]] = None,
) -> List[Union[LoadedKernel, BuildError]]: ...
def devices() -> List[Dict[str, Any]]: ...
def ze_handle_counts() -> Tuple[int, int, int, int]: ...
def validate_spirv(spirv: bytes) -> List[str]: ...
def zebin_info(binary: bytes) -> Dict[str, Any]: ...
def find_ocloc(ocloc: Optional[Union[str, os.PathLike[str]]] = None) -> Path: ...
def opencl_to_spirv(
    source: str,
    *,
    device: str = "pvc",
    options: str = "",
    ocloc: Optional[Union[str, os.PathLike[str]]] = None,
) -> bytes: ...
def error_kinds() -> List[Tuple[str, str]]: ...
def configure_workers(executable: Union[str, os.PathLike[str]], pythonpath: str) -> None: ...
def serve_worker(kind: str, libocloc: Optional[Union[str, os.PathLike[str]]] = None) -> None: ...
def shutdown_workers() -> None: ...
def broken_workers() -> List[Tuple[str, str]]: ...
def doctor(ocloc: Optional[Union[str, os.PathLike[str]]] = None) -> Dict[str, Any]: ...
def join_multiprocess_batch() -> None: ...
def ocloc_worker_unavailable(ocloc: Union[str, os.PathLike[str]]) -> Optional[str]: ...
def default_jobs() -> int: ...
def bool_knob(name: str, default: bool) -> bool: ...

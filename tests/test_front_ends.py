"""One Triton front end per kernel, however many processes ask (issue 64, the autotune
shape): processes sharing Triton's cache directory claim a kernel's cache group before
Triton's front end runs; another waits for it and takes the group from Triton's cache. A
holder killed lets its waiter run its own. Real Triton front ends (triton-xpu on the CPU),
real processes; each step waits on what the other process says, never on a sleep."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import xpu_zebin
from xpu_zebin import _core
from xpu_zebin.triton import front_ends

TESTS = Path(__file__).resolve().parent

#: A rank compiling triton_helpers' add kernel with front ends shared. `hold`: it says
#: "holding" inside its front end (the group claimed) and goes on once `go` exists. Every
#: look in Triton's cache is said ("looked"), and the front end's stages it ran are counted.
RANK = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
triton_cache, role, go = sys.argv[2:5]
from triton.backends import backends
from triton.runtime.cache import FileCacheManager
import xpu_zebin
from xpu_zebin.triton import front_ends
from triton_helpers import ADD_SIG, add_kernel, compile_triton, triton_on_cpu

front_ends.install()
ran = []
intel = backends["intel"].compiler
add_stages = intel.add_stages

def counted(self, stages, options, *args, **kwargs):
    add_stages(self, stages, options, *args, **kwargs)
    ttir = stages["ttir"]

    def stage(src, metadata):
        ran.append("ttir")
        if role in ("hold", "fail"):
            print("holding", flush=True)
            deadline = time.monotonic() + 300
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.01)
        if role == "fail":
            raise RuntimeError("this front end fails")
        return ttir(src, metadata)

    stages["ttir"] = stage

intel.add_stages = counted
get_group = FileCacheManager.get_group

def looked(self, filename):
    print("looked", flush=True)
    return get_group(self, filename)

FileCacheManager.get_group = looked
if role == "batch":  # 64 (another's) and 128: 128 first, then 64 from the other's front end
    events = []

    def task(block):
        if events:
            open(go, "w").close()  # the second round: the holder may finish now
        before = len(ran)
        with triton_on_cpu(triton_cache):
            compile_triton(add_kernel, ADD_SIG, {"BLOCK": block})
        events.append([block, len(ran) - before])
        return block

    results = front_ends.unclaimed_first(task, [64, 128], lambda t, items: [t(i) for i in items])
    print(json.dumps({"events": events, "results": results}), flush=True)
    sys.exit(0)
with triton_on_cpu(triton_cache):
    try:
        compiled = compile_triton(add_kernel, ADD_SIG, {"BLOCK": 64})
    except RuntimeError as e:
        kept = sys.exc_info()  # its traceback, and the compile's cache manager, kept alive
        print("failed", flush=True)
        deadline = time.monotonic() + 300
        while not os.path.exists(go + ".end") and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(0)
c = xpu_zebin.stats()["counters"]
waits, saved = c["waits_triton_front_end"], c["wait_saved_triton_front_end_microseconds"]
said = {"ran": len(ran), "hash": compiled.hash, "waits": waits, "saved": saved}
print(json.dumps(said), flush=True)
"""


def _rank(tmp_path: Path, role: str, cache: str = "triton-cache", **env: str) -> subprocess.Popen:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    command = [sys.executable, str(script), str(TESTS), str(tmp_path / cache), role,
               str(tmp_path / "go")]  # fmt: skip
    rank = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
    _started.append(rank)
    return rank


_started: list = []


@pytest.fixture(autouse=True)
def _no_rank_left():
    """Every rank a test started ends with it, whatever the test found."""
    yield
    while _started:
        rank = _started.pop()
        if rank.poll() is None:
            rank.kill()
        rank.communicate(timeout=60)


def _until(rank: subprocess.Popen, line: str, times: int = 1) -> None:
    """Read the rank's lines until it has said `line` `times` times (it ends: fails)."""
    seen = 0
    while seen < times:
        said = rank.stdout.readline()
        assert said, f"the rank ended before saying {line!r} {times} times"
        seen += said.strip() == line


def _result(rank: subprocess.Popen) -> dict:
    out, _ = rank.communicate(timeout=300)
    assert rank.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def _holder_and_its_waiter(tmp_path: Path, role: str = "hold") -> tuple:
    """A rank inside its front end (the group claimed), and one waiting for it: it has
    looked in Triton's cache itself and twice while it waits (the second after it found
    the claim held); and the wall time at which the holder was known to be inside its
    front end."""
    holder = _rank(tmp_path, role)
    _until(holder, "holding")
    holding = time.time()
    waiter = _rank(tmp_path, "wait")
    _until(waiter, "looked", 3)
    return holder, waiter, holding


def test_a_second_process_waits_for_the_first_front_end(tmp_path):
    holder, waiter, holding = _holder_and_its_waiter(tmp_path)
    go = time.time()
    (tmp_path / "go").touch()
    held, waited = _result(holder), _result(waiter)
    assert held["ran"] == 1
    assert waited["ran"] == 0, "the waiter ran its own front end"
    assert waited["hash"] == held["hash"]
    assert waited["waits"] == 1
    # Saved: the holder's front end (claimed before it said "holding", its group found
    # after "go"), not only the wait, which began after the waiter's own start-up.
    assert waited["saved"] >= (go - holding) * 1e6


def test_a_batch_runs_the_front_ends_nobody_runs_first(tmp_path):
    holder = _rank(tmp_path, "hold")
    _until(holder, "holding")
    batch = _result(_rank(tmp_path, "batch"))
    # 64 stepped aside (the holder's), 128 ran here; then 64 came from the holder's.
    assert batch["events"] == [[128, 1], [64, 0]]
    assert batch["results"] == [64, 128]
    assert _result(holder)["ran"] == 1


def test_a_holder_killed_lets_its_waiter_run_its_own(tmp_path):
    holder, waiter, _ = _holder_and_its_waiter(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    waited = _result(waiter)
    assert waited["ran"] == 1
    assert waited["waits"] == 0


@pytest.mark.parametrize(
    "cache, env",
    [
        ("triton-cache", {"XPU_ZEBIN_SHARE_BUILDS": "0"}),
        ("triton-cache", {"TRITON_ALWAYS_COMPILE": "1"}),
        ("triton-cache", {"TRITON_KERNEL_DUMP": "1"}),
        ("another-triton-cache", {}),  # Inductor's: a Triton cache per device
    ],
    ids=["sharing-off", "always-compile", "kernel-dump", "another-cache"],
)
def test_a_compile_of_its_own_never_waits(tmp_path, cache, env):
    holder = _rank(tmp_path, "hold")
    _until(holder, "holding")
    # Not waiting: it runs its own while the other still holds its front end.
    alone = _result(_rank(tmp_path, "alone", cache, TRITON_DUMP_DIR=str(tmp_path / "dump"), **env))
    (tmp_path / "go").touch()
    assert _result(holder)["ran"] == 1
    assert alone["ran"] == 1


def test_a_failed_front_end_lets_its_waiter_run_its_own(tmp_path):
    holder, waiter, _ = _holder_and_its_waiter(tmp_path, "fail")
    (tmp_path / "go").touch()
    _until(holder, "failed")  # alive, the failure's traceback kept
    waited = _result(waiter)
    assert waited["ran"] == 1
    assert waited["waits"] == 0
    (tmp_path / "go.end").touch()
    assert holder.wait(timeout=60) == 0


def test_a_bad_bound_or_a_look_that_fails_is_the_callers_error(tmp_path):
    with pytest.raises(ValueError, match="bound_s"):
        _core.claim_triton_group("K", "k.json", lambda: False, bound_s=-1.0)
    for silly in (float("nan"), float("inf"), 1e20):
        with pytest.raises(ValueError, match="bound_s"):
            _core.claim_triton_group("K", "k.json", lambda: False, bound_s=silly)
    with pytest.raises(ValueError, match="cache_dir"):
        _core.claim_triton_group("K", "k.json", lambda: False, cache_dir="")
    # A directory that cannot hold claims: the front end runs alone, saying why.
    claim, later, why = _core.claim_triton_group("K", "k.json", lambda: False,
                                                 cache_dir="/nonexistent/\0bad")  # fmt: skip
    assert claim is None and not later and "claims are off" in why

    def broken() -> bool:
        raise OSError("Triton's cache cannot be read")

    claim, later, _ = _core.claim_triton_group("K", "k.json", lambda: False)
    assert not later
    assert claim is not None and claim.held()
    try:
        with pytest.raises(OSError, match="cannot be read"):
            _core.claim_triton_group("K", "k.json", broken)
        # Another thread's wait ends at cancel_running (what Ctrl-C does to a batch).
        ended: list = []
        waiter = threading.Thread(target=lambda: ended.append(_wait_for("K")))
        waiter.start()
        while waiter.is_alive():
            _core.cancel_running()
            waiter.join(timeout=0.05)
        assert ended and isinstance(ended[0], xpu_zebin.CancelledError)
    finally:
        claim.release()
    assert not claim.held()
    claim.release()  # a second release does nothing


def _wait_for(key: str):
    try:
        return _core.claim_triton_group(key, "k.json", lambda: False)
    except BaseException as e:
        return e


def test_a_bad_share_setting_is_an_error(monkeypatch):
    monkeypatch.setenv("XPU_ZEBIN_SHARE_BUILDS", "sometimes")
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="XPU_ZEBIN_SHARE_BUILDS"):
        _core.claim_triton_group("K", "k.json", lambda: False)


def test_a_failed_front_end_lets_go_at_once_in_this_thread(tmp_path):
    manager = front_ends.OneFrontEnd(_Empty(str(tmp_path)), "K")
    assert manager.get_group("k.json") is None  # claimed: this thread runs it
    assert manager._claim is not None and manager._claim.held()
    claim = manager._claim
    assert manager.get_group("k.json") is None  # asked again: no wait on itself
    front_ends.let_go()  # what the autotuner does after a front end that raised
    assert not claim.held()
    copy.copy(manager)  # a copy made without __init__ is still an object


class _Empty:
    """A Triton cache manager that holds nothing."""

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir

    def get_group(self, filename: str):
        return None

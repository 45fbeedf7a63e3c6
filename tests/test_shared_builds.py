"""One build per kernel, however many processes ask (issue 64): processes sharing a cache
directory claim a kernel's key before they build it; the others wait for that build and
are answered from its entry. A holder killed or stopped never stops the others; a failure
that repeats is remembered for its kernel and compiler. Real compilers, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from worker_helpers import every_core_taken

import xpu_zebin
from xpu_zebin import samples

#: A small kernel per constant: distinct SPIR-V, distinct keys, a fraction of a second each.
KERNEL = """__kernel void scale{n}(__global float* a, __global const float* b) {{
    int i = get_global_id(0);
    a[i] = b[i] * {n}.0f + a[i];
}}
"""

#: A rank: waits for the start file (every rank starts at once), compiles each SPIR-V in
#: turn, prints what answered each and its notes.
RANK = """
import json, os, sys, time, xpu_zebin
ocloc, cache_dir, start = sys.argv[1:4]
spirvs = [open(p, "rb").read() for p in sys.argv[4:]]
print("ready", flush=True)
deadline = time.monotonic() + 300
while not os.path.exists(start) and time.monotonic() < deadline:
    time.sleep(0.005)
answers = []
for s in spirvs:
    r = xpu_zebin.compile(s, device="pvc", ocloc=ocloc, cache_dir=cache_dir)
    answers.append({"source": r.source, "notes": r.notes, "flags": r.build_flags})
print(json.dumps(answers), flush=True)
"""


def _kernels(ocloc: str, into: Path, count: int) -> list:
    """`count` distinct small kernels' SPIR-V, written to files in `into`."""
    paths = []
    for n in range(count):
        path = into / f"scale{n}.spv"
        path.write_bytes(xpu_zebin.opencl_to_spirv(KERNEL.format(n=n), device="pvc", ocloc=ocloc))
        paths.append(path)
    return paths


def _rank(ocloc: str, cache: Path, start: Path, spirvs: list) -> subprocess.Popen:
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK, ocloc, str(cache), str(start), *map(str, spirvs)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert rank.stdout.readline().strip() == "ready"
    return rank


def _answers(rank: subprocess.Popen) -> list:
    out, _ = rank.communicate(timeout=600)
    assert rank.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def _claims(cache: Path) -> list:
    """The keys claimed now (a claim is a file named by its key while it is held; the
    directory's lock probe stays)."""
    return sorted(p for p in (cache / "zebin-v3" / "claims").glob("*") if p.name != "probe.lock")


def _held(cache: Path) -> bool:
    """Whether a claim is held now: a claim's file exists before its lock is taken, so the
    lock itself is asked (this process holds none, so asking costs no one theirs)."""
    import fcntl

    for path in _claims(cache):
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(fd, fcntl.LOCK_UN)
        except OSError:
            return True
        finally:
            os.close(fd)
    return False


def _until(what, why: str, seconds: float = 300):
    """Wait for `what()` to hold, on a generous deadline (never a bare sleep)."""
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.01)


def test_four_ranks_build_each_kernel_once(system_ocloc, tmp_path):
    """Four processes started together on a cold cache, each compiling the same three
    kernels: exactly three builds; every other answer waited for one of them (or, for a
    rank that came late, found its entry)."""
    spirvs = _kernels(system_ocloc, tmp_path, 3)
    cache, start = tmp_path / "cache", tmp_path / "start"
    ranks = [_rank(system_ocloc, cache, start, spirvs) for _ in range(4)]
    start.touch()
    answers = [a for rank in ranks for a in _answers(rank)]
    c = xpu_zebin.stats(cache)["counters"]
    assert (c["requests"], c["compiles"]) == (12, 3), c
    assert c["waits"] + c["hits_local"] == 9, c
    assert sum(a["source"] == "compiled" for a in answers) == 3
    # A rank may wait for a core, then build (its note says so): not a wait's answer.
    waited = [a for a in answers if any("answered from it" in n for n in a["notes"])]
    assert len(waited) == c["waits"]
    if c["waits"]:
        assert c["wait_saved_microseconds"] > 0
    assert _claims(cache) == [], "a claim outlived its build"


BATCH_RANK = """
import json, os, sys, time, xpu_zebin
ocloc, cache_dir, start = sys.argv[1:4]
reqs = [dict(spirv=open(p, "rb").read(), device="pvc", ocloc=ocloc, cache_dir=cache_dir)
        for p in sys.argv[4:]]
print("ready", flush=True)
deadline = time.monotonic() + 300
while not os.path.exists(start) and time.monotonic() < deadline:
    time.sleep(0.005)
rs = xpu_zebin.compile_many(reqs, jobs=1)
print(json.dumps([{"source": r.source, "notes": r.notes, "flags": r.build_flags} for r in rs]))
"""


def test_two_ranks_given_one_batch_split_its_builds(system_ocloc, tmp_path):
    """Two processes given the same batch of four kernels, one job each, in the same order:
    a rank steps aside from a kernel the other is building and takes the next, so both
    build, and each kernel is built once."""
    spirvs = _kernels(system_ocloc, tmp_path, 4)
    cache, start = tmp_path / "cache", tmp_path / "start"
    ranks = [
        subprocess.Popen([sys.executable, "-c", BATCH_RANK, system_ocloc, str(cache), str(start),
                          *map(str, spirvs)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    for rank in ranks:
        assert rank.stdout.readline().strip() == "ready"
    start.touch()
    built = [sum(a["source"] == "compiled" for a in _answers(rank)) for rank in ranks]
    assert sum(built) == 4 and min(built) >= 1, built
    c = xpu_zebin.stats(cache)["counters"]
    assert (c["requests"], c["compiles"]) == (8, 4), c


#: One compile in a process of its own (bound to one CPU when asked): says it started, then
#: its answer.
ONE = """
import json, os, sys, xpu_zebin
ocloc, cache_dir, spv = sys.argv[1:4]
if len(sys.argv) > 4:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
print("ready", flush=True)
r = xpu_zebin.compile(open(spv, "rb").read(), device="pvc", ocloc=ocloc, cache_dir=cache_dir)
print(json.dumps({"source": r.source, "notes": r.notes}), flush=True)
"""


def _children(pid: int) -> list:
    """The processes `pid` has started and not reaped (its compilers, if any)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += (task / "children").read_text().split()
        except OSError:  # a thread that ended meanwhile
            pass
    return found


def test_a_process_with_no_core_waits_for_the_build_it_wants(system_ocloc, tmp_path):
    """Every core of the host runs another process's compiler: a process with none of its
    own does not claim its kernel and start one more (each a Python start and IGC's load);
    it waits, and is answered by the build another process makes. Nobody building what it
    wants, it builds for itself once it has waited its bound (`XPU_ZEBIN_CORE_WAIT_SECONDS`),
    and says how long it waited. A process bound to some of the host's CPUs never waits:
    its compilers run on its own."""
    spirvs = _kernels(system_ocloc, tmp_path, 3)
    cache, slots, free = tmp_path / "cache", tmp_path / "slots", tmp_path / "free-slots"
    slots.mkdir()
    env = {**os.environ, "XPU_ZEBIN_CORE_SLOTS_DIR": str(slots)}
    one = [sys.executable, "-c", ONE, system_ocloc, str(cache)]

    def run(spirv: Path, *pinned: str, **more: str) -> dict:
        out = subprocess.run([*one, str(spirv), *pinned], capture_output=True, text=True,
                             env={**env, **more}, timeout=600, check=True)  # fmt: skip
        return json.loads(out.stdout.splitlines()[-1])

    with every_core_taken(slots):
        # A bound long enough for the other process's start and build, however loaded.
        cold = subprocess.Popen([*one, str(spirvs[0])], stdout=subprocess.PIPE, text=True,
                                env={**env, "XPU_ZEBIN_CORE_WAIT_SECONDS": "300"})  # fmt: skip
        assert cold.stdout.readline().strip() == "ready"
        # Its first look for a core makes the claims directory: it is waiting now.
        _until((cache / "zebin-v3" / "claims").is_dir, "the process never looked for a core")
        assert _claims(cache) == [] and _children(cold.pid) == [], "it started a build"
        # Another process, with cores of its own, builds the kernel.
        assert run(spirvs[0], XPU_ZEBIN_CORE_SLOTS_DIR=str(free))["source"] == "compiled"
        out, _ = cold.communicate(timeout=600)
        answer = json.loads(out.splitlines()[-1])
        assert answer["source"] == "cache", answer
        assert any("waited" in n and "answered from it" in n for n in answer["notes"]), answer
        # A kernel nobody else builds: built once the wait has run out, and said.
        alone = run(spirvs[1], XPU_ZEBIN_CORE_WAIT_SECONDS="1")
        pinned = run(spirvs[2], "pinned")
    assert alone["source"] == "compiled", alone
    waited = [n for n in alone["notes"] if "for a core of this host" in n]
    assert waited and float(waited[0].split()[1]) >= 1, alone
    assert pinned["source"] == "compiled" and pinned["notes"] == [], pinned
    c = xpu_zebin.stats(cache)["counters"]
    assert (c["requests"], c["compiles"], c["waits"]) == (4, 3, 1), c


#: A batch in a process of its own, `jobs` at once: each answer's source and notes.
BATCH = """
import json, sys, xpu_zebin
ocloc, cache_dir, jobs, *spvs = sys.argv[1:]
reqs = [dict(spirv=open(p, "rb").read(), device="pvc", ocloc=ocloc, cache_dir=cache_dir)
        for p in spvs]
answers = xpu_zebin.compile_many(reqs, jobs=int(jobs))
print(json.dumps([{"source": r.source, "notes": r.notes} for r in answers]), flush=True)
"""


def test_a_batch_builds_in_the_cores_it_holds(system_ocloc, tmp_path):
    """Every core of the host but one runs another process's compiler: a batch of two jobs
    takes that core and builds its two kernels in it one after the other, not two compilers
    (and workers) on one core; the job that found none free waited for the other's to free
    (long before its bound), and says so."""
    spirvs = _kernels(system_ocloc, tmp_path, 2)
    slots = tmp_path / "slots"
    slots.mkdir()
    env = {**os.environ, "XPU_ZEBIN_CORE_SLOTS_DIR": str(slots),
           "XPU_ZEBIN_CORE_WAIT_SECONDS": "300"}  # fmt: skip
    batch = [sys.executable, "-c", BATCH, system_ocloc, str(tmp_path / "cache"), "2"]
    with every_core_taken(slots, leave=1):
        out = subprocess.run([*batch, *map(str, spirvs)], capture_output=True, text=True,
                             env=env, timeout=600, check=True)  # fmt: skip
    answers = json.loads(out.stdout.splitlines()[-1])
    assert [a["source"] for a in answers] == ["compiled", "compiled"], answers
    waited = [n for a in answers for n in a["notes"] if "for a core of this host" in n]
    assert len(waited) == 1 and float(waited[0].split()[1]) < 300, answers


def _ptss_spirv(modern_ocloc: str, tmp_path: Path) -> Path:
    path = tmp_path / "pressure.spv"
    source = samples.ptss_overflow_kernel()
    path.write_bytes(xpu_zebin.opencl_to_spirv(source, device="pvc", ocloc=modern_ocloc))
    return path


@pytest.mark.slow
def test_a_holder_killed_mid_build_costs_one_rebuild(modern_ocloc, tmp_path):
    """The holder of a slow build (the PTSS kernel, both GRF modes) is killed with SIGKILL
    while it builds: its claim goes with it, one of three waiters builds, the others wait
    for that one, nobody fails. Builds counted: one (the killed one never answered)."""
    spirv = _ptss_spirv(modern_ocloc, tmp_path)
    cache, start = tmp_path / "cache", tmp_path / "start"
    start.touch()
    holder = _rank(modern_ocloc, cache, start, [spirv])
    _until(lambda: _held(cache), "the holder never claimed its key")
    waiters = [_rank(modern_ocloc, cache, start, [spirv]) for _ in range(3)]
    holder.kill()
    holder.communicate(timeout=60)
    answers = [a for w in waiters for a in _answers(w)]
    assert [a["flags"] for a in answers] == ["-cl-intel-256-GRF-per-thread"] * 3
    assert sorted(a["source"] for a in answers) == ["cache", "cache", "compiled"]
    c = xpu_zebin.stats(cache)["counters"]
    assert (c["compiles"], c["waits"] + c["hits_local"]) == (1, 2), c


@pytest.mark.slow
def test_a_stopped_holder_lets_its_waiter_build(modern_ocloc, tmp_path):
    """A holder stopped (SIGSTOP) mid-build renews its claim no more: its waiter builds for
    itself once the claim has gone unrenewed for its bound, and says why."""
    spirv = _ptss_spirv(modern_ocloc, tmp_path)
    cache, start = tmp_path / "cache", tmp_path / "start"
    start.touch()
    holder = _rank(modern_ocloc, cache, start, [spirv])
    try:
        _until(lambda: _held(cache), "the holder never claimed its key")
        os.kill(holder.pid, signal.SIGSTOP)
        (answer,) = _answers(_rank(modern_ocloc, cache, start, [spirv]))
    finally:
        holder.kill()
        holder.communicate(timeout=60)
    assert answer["source"] == "compiled"
    assert any("has not renewed its claim" in n for n in answer["notes"]), answer


def _simd8(ocloc: str) -> bytes:
    """Valid SPIR-V that IGC refuses on PVC in every GRF mode (SIMD8 is unsupported)."""
    source = """__attribute__((intel_reqd_sub_group_size(8)))
__kernel void simd8(__global float* p) { p[get_global_id(0)] *= 2.0f; }
"""
    return xpu_zebin.opencl_to_spirv(source, device="pvc", ocloc=ocloc)


FAILING = """
import json, os, sys, time, xpu_zebin
ocloc, cache_dir, spv = sys.argv[1:4]
if len(sys.argv) > 4:  # a start file: every rank at once
    print("ready", flush=True)
    deadline = time.monotonic() + 300
    while not os.path.exists(sys.argv[4]) and time.monotonic() < deadline:
        time.sleep(0.005)
try:
    xpu_zebin.compile(open(spv, "rb").read(), device="pvc", ocloc=ocloc, cache_dir=cache_dir)
except xpu_zebin.BuildError as e:
    print(json.dumps({"kind": e.kind, "message": e.message, "log": e.log, "notes": e.notes,
                      "attempts": [[a.build_flags, a.seconds] for a in e.attempts]}))
"""


def _fail(ocloc: str, cache: Path, spirv: Path, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", FAILING, ocloc, str(cache), str(spirv)],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, **env})  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_failure_that_repeats_is_remembered_across_processes(modern_ocloc, tmp_path):
    """A kernel the compiler refuses in both GRF modes is built once: the next process gets
    the same classified error, attempts and log with no build, counted as remembered; with
    sharing off it builds again."""
    spirv = tmp_path / "simd8.spv"
    spirv.write_bytes(_simd8(modern_ocloc))
    cache = tmp_path / "cache"
    first = _fail(modern_ocloc, cache, spirv)
    assert first["kind"] == "build_failure" and first["log"]
    assert [a[0] for a in first["attempts"]] == ["", "-cl-intel-256-GRF-per-thread"]
    again = _fail(modern_ocloc, cache, spirv)
    assert {k: again[k] for k in ("kind", "message", "log", "attempts")} == {
        k: first[k] for k in ("kind", "message", "log", "attempts")
    }
    assert any("failed the same way before" in n for n in again["notes"]), again["notes"]
    c = xpu_zebin.stats(cache)["counters"]
    assert (c["requests"], c["compiles"], c["remembered_failures"]) == (2, 1, 1), c
    off = _fail(modern_ocloc, cache, spirv, XPU_ZEBIN_SHARE_BUILDS="0")
    assert off["kind"] == "build_failure" and off["notes"] == []
    assert xpu_zebin.stats(cache)["counters"]["compiles"] == 2


def test_four_ranks_on_a_kernel_that_fails_build_it_once(modern_ocloc, tmp_path):
    """Four processes started together on a kernel refused in both GRF modes: one builds
    it; the three others get the same classified error, attempts and log without a build
    (after waiting for that build, or from what it remembered)."""
    spirv = tmp_path / "simd8.spv"
    spirv.write_bytes(_simd8(modern_ocloc))
    cache, start = tmp_path / "cache", tmp_path / "start"
    command = [sys.executable, "-c", FAILING, modern_ocloc, str(cache), str(spirv), str(start)]
    ranks = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    for rank in ranks:
        assert rank.stdout.readline().strip() == "ready"
    start.touch()
    outs = []
    for rank in ranks:
        out, _ = rank.communicate(timeout=600)
        assert rank.returncode == 0, out
        outs.append(json.loads(out))
    same = {(o["kind"], o["message"], o["log"], json.dumps(o["attempts"])) for o in outs}
    assert len(same) == 1 and outs[0]["kind"] == "build_failure", outs
    c = xpu_zebin.stats(cache)["counters"]
    assert (c["requests"], c["compiles"], c["remembered_failures"]) == (4, 1, 3), c


def test_a_new_compiler_tries_a_remembered_failure_again(modern_ocloc, system_ocloc, tmp_path):
    """A failure is remembered with the compiler's identity in its key: another compiler
    (here Debian's, IGC 1.x) builds the same SPIR-V again."""
    spirv = tmp_path / "simd8.spv"
    spirv.write_bytes(_simd8(modern_ocloc))
    cache = tmp_path / "cache"
    _fail(modern_ocloc, cache, spirv)
    try:
        other = xpu_zebin.compile(spirv.read_bytes(), device="pvc", ocloc=system_ocloc,
                                  cache_dir=cache)  # fmt: skip
        assert other.source == "compiled"
    except xpu_zebin.BuildError as e:
        assert not any("failed the same way before" in n for n in e.notes), e.notes
        assert all(a.seconds > 0 for a in e.attempts)
    c = xpu_zebin.stats(cache)["counters"]
    assert (c["compiles"], c["remembered_failures"]) == (2, 0), c


def test_a_transient_failure_is_not_remembered(system_ocloc, tmp_path):
    """A build cancelled by its time limit may not repeat: the next request builds."""
    spirv = xpu_zebin.opencl_to_spirv(samples.register_pressure_kernel(300, name="spill"),
                                      device="pvc", ocloc=system_ocloc)  # fmt: skip
    cache = tmp_path / "cache"
    for _ in range(2):
        with pytest.raises(xpu_zebin.BuildError) as e:
            xpu_zebin.compile(spirv, device="pvc", ocloc=system_ocloc, cache_dir=cache,
                              timeout=0.001)  # fmt: skip
        assert e.value.kind == "timeout"
        assert not any("failed the same way before" in n for n in e.value.notes)
    c = xpu_zebin.stats(cache)["counters"]
    assert (c["compiles"], c["remembered_failures"]) == (2, 0), c


@pytest.fixture
def store(tmp_path):
    """A real redis-server on a free port, and the keys of a farm whose nodes publish."""
    from test_remote import RedisServer

    server = RedisServer(tmp_path / "redis")
    key = tmp_path / "farm.key"
    public = xpu_zebin._core.key_generate(str(key), "farm")
    yield (
        server,
        {
            "XPU_ZEBIN_REMOTE": server.url(),
            "XPU_ZEBIN_REMOTE_MODE": "read-write",
            "XPU_ZEBIN_SIGNING_KEY": str(key),
            "XPU_ZEBIN_TRUSTED_KEYS": public,
        },
    )
    server.stop()


def _node_rank(ocloc: str, cache: Path, spirv: Path, env: dict) -> subprocess.Popen:
    """A node of its own (its own cache directory) sharing only the store."""
    start = cache.parent / "start"
    start.parent.mkdir(parents=True, exist_ok=True)
    start.touch()
    command = [sys.executable, "-c", RANK, ocloc, str(cache), str(start), str(spirv)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, **env})


def test_two_nodes_share_one_build_through_the_store(system_ocloc, store, tmp_path):
    """Two nodes with caches of their own, sharing only a real redis-server: the second,
    started once the first has claimed the kernel in the store, never builds it: it waits
    for the first's entry (or finds it published)."""
    server, env = store
    spirv = tmp_path / "spill.spv"
    spirv.write_bytes(xpu_zebin.opencl_to_spirv(samples.register_pressure_kernel(600, name="spill"),
                                                device="pvc", ocloc=system_ocloc))  # fmt: skip
    first = _node_rank(system_ocloc, tmp_path / "a" / "cache", spirv, env)
    redis = server.client()
    _until(lambda: redis.keys("xpu-zebin:claim:v1:*"), "the first node never claimed its key")
    second = _node_rank(system_ocloc, tmp_path / "b" / "cache", spirv, env)
    (a,), (b,) = _answers(first), _answers(second)
    assert a["source"] == "compiled" and b["source"] == "remote", (a, b)
    assert a["flags"] == b["flags"]
    c = xpu_zebin.stats(tmp_path / "b" / "cache")["counters"]
    assert c["compiles"] == 0 and c["waits"] + c["hits_store"] == 1, c
    assert redis.keys("xpu-zebin:claim:v1:*") == [], "a claim outlived its build"


def test_a_failure_is_remembered_through_the_store(modern_ocloc, store, tmp_path):
    """A kernel refused in both GRF modes, built by one node: another node, with a cache of
    its own, gets the same classified error from the store, without a build."""
    _, env = store
    spirv = tmp_path / "simd8.spv"
    spirv.write_bytes(_simd8(modern_ocloc))
    first = _fail(modern_ocloc, tmp_path / "a" / "cache", spirv, **env)
    again = _fail(modern_ocloc, tmp_path / "b" / "cache", spirv, **env)
    assert {k: again[k] for k in ("kind", "message", "log", "attempts")} == {
        k: first[k] for k in ("kind", "message", "log", "attempts")
    }
    c = xpu_zebin.stats(tmp_path / "b" / "cache")["counters"]
    assert (c["compiles"], c["remembered_failures"]) == (0, 1), c

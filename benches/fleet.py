"""A fleet sharing native code through a real Redis, signed entries.

Node A (a fresh process, read-write, a signing key) compiles the model's kernels
(``model_kernels.py``, real Triton SPIR-V) and publishes them; node B (a fresh process, a
fresh local cache, read-only, A's key trusted) gets the same kernels. Reported, each a ratio
measured in this run:

Each ratio is the median of interleaved pairs (``pairs.py``: baseline and package
alternate, AB then BA, each pair one ratio, a 99% interval beside it in ``bounds`` and
what it is made of in ``made_of``), each side a fresh node timing itself (its process
start is the same on both sides):

- ``fleet_speedup``: B compiling from scratch over B with the store;
- ``triton_fleet_speedup``: the same through Triton's own front end, with the package's
  cache manager (``FleetCacheManager``) against no shared cache;
- ``vs_triton_remote``: B's time with the package's manager over B's time with Triton's own
  ``RemoteCacheManager`` and ``RedisRemoteCacheBackend`` serving the same kernels (which
  checks nothing it loads);
- ``tampered_loaded``: entries loaded by a node after one byte of each was flipped (0);
- ``local_hit_store_ratio``: B again, every kernel in its local cache, with the store set
  over with none (the local level answers first: one read, at most 1.0 but for noise).

A cold start here is a first run on a node: modern Level Zero drivers keep their own JIT
output per node (``NEO_CACHE_PERSISTENT``, on by default), so a second run on the same node
is not cold; a new node, a fresh container or a mixed fleet is. (The simulated PVC's 22.43
driver keeps none.)

    python benches/fleet.py --ocloc <ocloc> [--kernels N] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Tuple

os.environ.setdefault("XPU_ZEBIN_SIMULATED_DEVICE", "pvc")

HERE = Path(__file__).resolve().parent
import pairs  # noqa: E402  (benches/, beside this file)
import record  # noqa: E402

MANAGER = "xpu_zebin.triton.fleet_cache:FleetCacheManager"


def _node_env(work: Path, name: str, url: str, **extra: str) -> Dict[str, str]:
    dropped = ("XPU_ZEBIN_REMOTE", "TRITON_CACHE_MANAGER")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.update(XPU_ZEBIN_CACHE_DIR=str(work / f"cache-{name}"),
               TRITON_CACHE_DIR=str(work / f"triton-{name}"), **extra)  # fmt: skip
    if url:
        env["XPU_ZEBIN_REMOTE"] = url
    return env


def child(mode: str, count: int, ocloc: str, kernels_file: str) -> None:
    """One node in a fresh process: ``native`` compiles the kernels' SPIR-V with the
    package (the store per the environment), timed alone; ``triton`` runs Triton's front
    end on them (its cache manager per the environment). Prints seconds and where code
    came from."""
    sys.path.insert(0, str(HERE))
    import pickle

    import xpu_zebin

    sources: Dict[str, int] = {}
    if mode == "native":
        kernels = pickle.loads(Path(kernels_file).read_bytes())[:count]
        started = time.perf_counter()
        for k in kernels:
            r = xpu_zebin.compile(k["spirv"], device="pvc", ocloc=ocloc, kernel_name=k["name"])
            sources[r.source] = sources.get(r.source, 0) + 1
        seconds = time.perf_counter() - started
        # What the node kept: from the store, the entries it pulled (compressed), each as
        # the store held it (less its signed header), and what they hold uncompressed.
        c = xpu_zebin.stats()["counters"]
        print(json.dumps({"seconds": seconds, "sources": sources, "kept_bytes": c["written_bytes"],
                          "kept_uncompressed_bytes": c["written_uncompressed_bytes"]}))  # fmt: skip
        return
    import model_kernels
    import triton

    from xpu_zebin import targets

    model_kernels.stub_arch_parser()
    target = targets.local().gpu_target()
    started = time.perf_counter()
    for fn, constants, warps in model_kernels._configs()[:count]:
        triton.compile(model_kernels.source(fn, constants), target=target,
                       options={"num_warps": warps})  # fmt: skip
    print(json.dumps({"seconds": time.perf_counter() - started, "sources": sources}))


KERNELS_FILE = ""


def run_node(mode: str, env: Dict[str, str], count: int, ocloc: str) -> Dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(count), ocloc,
                          KERNELS_FILE], env=env, capture_output=True, text=True)  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"node ({mode}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def start_redis(work: Path) -> Tuple[subprocess.Popen, int]:
    import redis

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server not found (scripts/prereqs.sh installs it)")
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(work)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            redis.Redis(port=port, socket_timeout=2).ping()
            return proc, port
        except redis.exceptions.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("redis-server did not start") from None
            time.sleep(0.05)


def _median(runs: list) -> float:
    return statistics.median(x["seconds"] for x in runs)


#: What each ratio is made of: what the baseline side pays that the other does not.
MADE_OF = {
    "fleet_speedup": "node B's own builds of every kernel (IGC, both GRF modes where the "
    "rule retries) against reads from the store, each entry's signature checked, and loads",
    "local_hit_store_ratio": "no compile work on either side: what having a store set "
    "costs a node whose local cache answers (one more read at most)",
    "triton_fleet_speedup": "Triton's front end and IGC for every kernel against Triton "
    "cache hits the package's manager answers from the store (signed, checked)",
    "vs_triton_remote": "the same kernels from the same Redis: the package's manager "
    "checks every entry's signature and hash, Triton's remote cache checks nothing",
}


def _row(r: Dict[str, Any], name: str, ratio: pairs.Ratio) -> None:
    """A ratio into the results, its interval and pairs into ``bounds``, what it is made
    of into ``made_of``."""
    r[name] = round(ratio.median, 2)
    r.setdefault("bounds", {})[name] = ratio.bounds()
    r.setdefault("made_of", {})[name] = MADE_OF[name]


@dataclasses.dataclass
class Nodes:
    """How this run starts a fresh node: its work directory, the store, the kernels."""

    work: Path
    url: str
    ocloc: str
    count: int
    signer: Dict[str, str]
    trust: Dict[str, str]
    #: Seconds a row may take adding pairs (its floor's pairs included).
    budget: float = 0.0
    runs: Dict[str, list] = dataclasses.field(default_factory=dict)

    def run(self, mode: str, name: str, url: str, **extra: str) -> Dict[str, Any]:
        return run_node(mode, _node_env(self.work, name, url, **extra), self.count, self.ocloc)

    def side(self, mode: str, name: str, url: str, fresh: bool = True, **extra: str) -> Any:
        """One side of a pair: a node named ``name`` (a new one each call when ``fresh``),
        its own seconds; every run kept in ``runs[name]``."""

        def one() -> pairs.Took:
            kept = self.runs.setdefault(name, [])
            node = f"{name}-{len(kept)}" if fresh else name
            kept.append(self.run(mode, node, url, **extra))
            return pairs.Took(kept[-1]["seconds"])

        return one

    def measure(self, baseline: Any, package: Any, floor: int) -> pairs.Ratio:
        return pairs.measure(baseline, package, floor=floor, budget_s=self.budget)


def native_cases(nodes: Nodes, repeat: int) -> Dict[str, Any]:
    """A publishes; B, fresh each time, compiles from scratch or takes the kernels from
    the store (in interleaved pairs, so that the machine's drift hits both alike)."""
    nodes.run("native", "a", nodes.url, **nodes.signer)
    r: Dict[str, Any] = {}
    scratch = nodes.side("native", "b0", "")
    shared = nodes.side("native", "b1", nodes.url, **nodes.trust)
    _row(r, "fleet_speedup", nodes.measure(scratch, shared, repeat))
    # One node again: every kernel in its local cache, with the store set and with none.
    warm_store = nodes.side("native", "b1-0", nodes.url, fresh=False, **nodes.trust)
    warm_alone = nodes.side("native", "b1-0", "", fresh=False)
    # A ratio above 1 is the store's cost: the package side is the one with no store.
    _row(r, "local_hit_store_ratio", nodes.measure(warm_store, warm_alone, repeat))
    warm = nodes.runs["b1-0"]
    assert all(set(w["sources"]) == {"cache"} for w in warm), warm
    shared_runs = nodes.runs["b1"]
    return {
        **r,
        "kernels": sum(shared_runs[0]["sources"].values()),
        "b_scratch_s": round(_median(nodes.runs["b0"]), 2),
        "b_remote_s": round(_median(shared_runs), 3),
        "b_pulled_bytes": shared_runs[0]["kept_bytes"],
        "b_pulled_uncompressed_bytes": shared_runs[0]["kept_uncompressed_bytes"],
        "b_sources": shared_runs[0]["sources"],
    }


def triton_cases(nodes: Nodes, repeat: int, port: int) -> Dict[str, Any]:
    """Triton's front end: the package's cache manager against none, and against Triton's
    own remote cache on the same Redis (alternated)."""
    ours = {**nodes.trust, "TRITON_CACHE_MANAGER": MANAGER}
    theirs = {"TRITON_CACHE_MANAGER": "triton.runtime.cache:RemoteCacheManager",
              "TRITON_REMOTE_CACHE_BACKEND": "triton.runtime.cache:RedisRemoteCacheBackend",
              "TRITON_REDIS_HOST": "127.0.0.1", "TRITON_REDIS_PORT": str(port)}  # fmt: skip
    nodes.run("triton", "ta", nodes.url, **nodes.signer, TRITON_CACHE_MANAGER=MANAGER)
    nodes.run("triton", "tc", "", **theirs)  # fills Triton's own store
    r: Dict[str, Any] = {}
    scratch = nodes.side("triton", "tb0", "")
    with_ours = nodes.side("triton", "tb1", nodes.url, **ours)
    with_theirs = nodes.side("triton", "tc", "", **theirs)
    _row(r, "triton_fleet_speedup", nodes.measure(scratch, with_ours, repeat))
    # Ours over theirs: the package side is Triton's own remote cache (below 1: ours faster).
    _row(r, "vs_triton_remote", nodes.measure(with_ours, with_theirs, repeat))
    return {
        **r,
        "triton_ours_s": round(_median(nodes.runs["tb1"]), 3),
        "triton_theirs_s": round(_median(nodes.runs["tc"]), 3),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ocloc", default=None)
    p.add_argument("--kernels", type=int, default=1000,
                   help="at most this many kernel-config pairs of the model")  # fmt: skip
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="at least this many pairs of fresh node B processes per ratio",
    )
    p.add_argument("--budget", type=pairs.seconds, default=60.0,
                   help="seconds a ratio may add pairs for until its interval is within "
                        "5%% of its median (0: exactly --repeat pairs)")  # fmt: skip
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    record.add_output_argument(p)
    args = p.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2], args.child[3])
        return 0
    import redis

    import xpu_zebin
    from xpu_zebin import remote

    global KERNELS_FILE
    import pickle

    sys.path.insert(0, str(HERE))
    import model_kernels

    from xpu_zebin import targets

    ocloc = os.fspath(xpu_zebin.find_ocloc(args.ocloc))
    work = Path(tempfile.mkdtemp(prefix="xpu-zebin-fleet-"))
    os.environ["TRITON_CACHE_DIR"] = str(work / "front-end")
    kernels = model_kernels.model_spirv(targets.local().gpu_target())[: args.kernels]
    KERNELS_FILE = str(work / "kernels.pkl")
    Path(KERNELS_FILE).write_bytes(pickle.dumps(kernels))
    proc, port = start_redis(work)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        key = work / "farm.key"
        public = xpu_zebin._core.key_generate(str(key), "farm")
        signer = {"XPU_ZEBIN_SIGNING_KEY": str(key), "XPU_ZEBIN_REMOTE_MODE": "read-write"}
        trust = {"XPU_ZEBIN_TRUSTED_KEYS": public}
        n, repeat = args.kernels, max(1, args.repeat)
        nodes = Nodes(work, url, ocloc, n, signer, trust, budget=args.budget)
        native, front_end = native_cases(nodes, repeat), triton_cases(nodes, repeat, port)
        bounds = {**native.pop("bounds"), **front_end.pop("bounds")}
        made_of = {**native.pop("made_of"), **front_end.pop("made_of")}
        r: Dict[str, Any] = {"repeat": repeat, **native, **front_end, "bounds": bounds,
                             "made_of": made_of}  # fmt: skip
        # Every entry tampered with (one byte flipped): nothing of it is loaded.
        client = redis.Redis(port=port)
        for name in client.scan_iter(match=remote.PREFIX + "*"):
            value = client.get(name)
            client.set(name, value[:-1] + bytes([value[-1] ^ 1]))
        tampered = nodes.run("native", "b2", url, **trust)
        r["tampered_loaded"] = tampered["sources"].get("remote", 0)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    print(f"fleet of {r['kernels']} kernel-config pairs on a real Redis (first run on a node): "
          f"B from scratch {r['b_scratch_s']} s, from the store {r['b_remote_s']} s "
          f"({r['fleet_speedup']}x); Triton front end skipped {r['triton_fleet_speedup']}x; "
          f"against Triton's own remote cache {r['vs_triton_remote']}x; tampered entries "
          f"loaded {r['tampered_loaded']}; a local hit with the store set "
          f"{r['local_hit_store_ratio']}x one with none", file=sys.stderr)  # fmt: skip
    record.write(args.output, "fleet", r, ocloc)
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

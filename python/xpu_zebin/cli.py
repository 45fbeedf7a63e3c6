"""The ``xpu-zebin`` command: compile, batch, info, demo, kinds.

Exit codes: 0 built, 1 build error, 2 usage error (bad arguments, unreadable input).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import xpu_zebin
from xpu_zebin import BuildError, CompileResult, samples

EXIT_OK, EXIT_BUILD_ERROR, EXIT_USAGE = 0, 1, 2


class _UsageError(Exception):
    pass


def _read_input(path: str, device: str, ocloc: Optional[str]) -> bytes:
    """SPIR-V from a file; OpenCL C (``.cl``) is first turned into SPIR-V by ocloc."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise _UsageError(f"cannot read {path}: {e.strerror}") from e
    if path.endswith(".cl"):
        try:
            source = data.decode()
        except UnicodeDecodeError as e:
            raise _UsageError(f"{path} is not UTF-8 OpenCL C text: {e}") from None
        return xpu_zebin.opencl_to_spirv(source, device=device, ocloc=ocloc)
    return data


def _attempt_json(a: Any) -> dict:
    return dict(
        build_flags=a.build_flags,
        ok=a.ok,
        spill_size=a.spill_size,
        seconds=round(a.seconds, 3),
        error=None if a.error is None else a.error.to_dict(),
    )


def result_json(
    outcome: Union[CompileResult, BuildError],
    kernel: Optional[str],
    device: str,
    grf_mode: str,
) -> dict:
    """The ``--json`` object for one compile."""
    if isinstance(outcome, CompileResult):
        return dict(
            ok=True,
            kernel=outcome.kernel,
            device=outcome.device,
            build_flags=outcome.build_flags,
            grf_mode=outcome.grf_mode,
            n_regs=outcome.n_regs,
            spill_size=outcome.spill_size,
            n_spills=outcome.n_spills,
            recovered=outcome.recovered,
            cached=outcome.cached,
            attempts=[_attempt_json(a) for a in outcome.attempts],
            error=None,
        )
    error: dict = dict(kind=outcome.kind, message=outcome.message, log=outcome.log)
    if isinstance(outcome, xpu_zebin.ScratchOverflowError):
        error.update(required=outcome.required, limit=outcome.limit)
    return dict(
        ok=False,
        kernel=kernel,
        device=device,
        build_flags=None,
        grf_mode=grf_mode,
        n_regs=None,
        spill_size=None,
        n_spills=None,
        recovered=False,
        cached=False,
        attempts=[_attempt_json(a) for a in outcome.attempts],
        error=error,
    )


def _describe(outcome: Union[CompileResult, BuildError], label: str) -> str:
    lines = []
    if isinstance(outcome, CompileResult):
        how = "recovered with large GRF" if outcome.recovered else "built"
        lines.append(
            f"{label}: {how}: kernel '{outcome.kernel}' on {outcome.device}, "
            f"flags '{outcome.build_flags}' ({outcome.n_regs} GRF), spill_size "
            f"{outcome.spill_size}{' (cached)' if outcome.cached else ''}"
        )
    else:
        lines.append(f"{label}: FAILED: {outcome}")
    for i, a in enumerate(outcome.attempts, 1):
        state = f"ok, spill_size {a.spill_size}" if a.ok else f"failed: {a.error}"
        lines.append(f"  attempt {i}: flags '{a.build_flags}': {state} ({a.seconds:.2f} s)")
    if isinstance(outcome, BuildError) and outcome.log.strip():
        tail = outcome.log.strip().splitlines()[-12:]
        lines.append("  compiler log (last lines):")
        lines += [f"    {line}" for line in tail]
    return "\n".join(lines)


def _options(args: argparse.Namespace, kernel: Optional[str] = None) -> xpu_zebin.Options:
    """The command line's options; a bad value is a usage error naming it."""
    try:
        return xpu_zebin.Options(
            build_flags=args.build_flags,
            grf_mode=args.grf_mode,
            num_warps=args.num_warps,
            kernel_name=kernel,
            max_grf_mode=args.max_grf_mode,
            ocloc=args.ocloc,
            timeout=args.timeout,
            cache=not args.no_cache,
            spill_policy=args.spill_policy,
        )
    except xpu_zebin.InvalidArgumentError as e:
        raise _UsageError(e.message) from e


def cmd_compile(args: argparse.Namespace) -> int:
    options = _options(args, args.kernel)
    spirv = _read_input(args.input, args.device, args.ocloc)
    try:
        outcome: Union[CompileResult, BuildError] = xpu_zebin.compile(
            spirv, device=args.device, options=options
        )
    except xpu_zebin.InvalidArgumentError as e:
        raise _UsageError(e.message) from e
    except BuildError as e:
        outcome = e
    if isinstance(outcome, CompileResult) and args.output:
        Path(args.output).write_bytes(outcome.binary)
    if args.json:
        print(json.dumps(result_json(outcome, args.kernel, args.device, args.grf_mode)))
    else:
        print(_describe(outcome, args.input))
        if isinstance(outcome, CompileResult) and args.output:
            print(f"wrote {args.output} ({len(outcome.binary)} bytes)")
    return EXIT_OK if isinstance(outcome, CompileResult) else EXIT_BUILD_ERROR


def cmd_batch(args: argparse.Namespace) -> int:
    options = _options(args)
    inputs = [_read_input(f, args.device, args.ocloc) for f in args.files]
    reqs = [dict(spirv=s, device=args.device, options=options) for s in inputs]
    if args.scheduler or args.dask_local:
        from . import dask

        with contextlib.ExitStack() as stack:
            try:
                client = stack.enter_context(dask.cluster_client(args.scheduler, args.dask_local))
            except xpu_zebin.InvalidArgumentError as e:  # --dask-local below 1
                raise _UsageError(e.message) from None
            except ImportError as e:
                raise _UsageError(
                    f"Dask batches need `pip install 'xpu-zebin[dask]'` ({e})"
                ) from None
            except OSError as e:  # Dask raises OSError when it cannot connect in time
                where = args.scheduler or "a local cluster"
                raise _UsageError(f"cannot reach the Dask scheduler at {where}: {e}") from None
            results = xpu_zebin.compile_many(reqs, client=client, progress=not args.json)
    else:
        results = xpu_zebin.compile_many(reqs, jobs=args.jobs, progress=not args.json)
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
    for path, outcome in zip(args.files, results):
        if isinstance(outcome, CompileResult) and args.output_dir:
            out = Path(args.output_dir) / (Path(path).stem + ".zebin")
            out.write_bytes(outcome.binary)
        if args.json:
            print(
                json.dumps(
                    dict(input=path, **result_json(outcome, None, args.device, args.grf_mode))
                )
            )
        else:
            print(_describe(outcome, path))
    failed = sum(isinstance(r, BuildError) for r in results)
    if not args.json:
        print(f"{len(results) - failed} built, {failed} failed")
    return EXIT_OK if failed == 0 else EXIT_BUILD_ERROR


def cmd_info(args: argparse.Namespace) -> int:
    try:
        data = Path(args.zebin).read_bytes()
    except OSError as e:
        raise _UsageError(f"cannot read {args.zebin}: {e.strerror}") from e
    try:
        info = xpu_zebin.zebin_info(data)
    except BuildError as e:
        print(f"{args.zebin}: {e}", file=sys.stderr)
        return EXIT_BUILD_ERROR
    if args.json:
        print(json.dumps(info))
        return EXIT_OK
    print(f"{args.zebin}: zebin, .ze_info version {info['version']}")
    for k in info["kernels"]:
        print(
            f"  kernel {k['name']}: grf_count {k['grf_count']}, simd {k['simd_size']}, "
            f"spill_size {k['spill_size']}, private_size {k['private_size']}, "
            f"scratch {k['scratch_size']}"
        )
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """Build the register-pressure sample and show the GRF fallback at work."""
    ocloc = xpu_zebin.find_ocloc(args.ocloc)
    print(f"ocloc: {ocloc}")
    print(f"sample: OpenCL C kernel keeping {args.values} floats live across a loop (SIMD32)")
    source = samples.register_pressure_kernel(args.values)
    spirv = xpu_zebin.opencl_to_spirv(source, device=args.device, ocloc=ocloc)
    print(f"SPIR-V: {len(spirv)} bytes, kernels {xpu_zebin.validate_spirv(spirv)}")
    started = time.perf_counter()
    try:
        outcome: Union[CompileResult, BuildError] = xpu_zebin.compile(
            spirv, device=args.device, ocloc=ocloc, cache=False
        )
    except BuildError as e:
        outcome = e
    print(_describe(outcome, "demo"))
    print(f"wall time {time.perf_counter() - started:.2f} s (attempts run at once on idle cores)")
    return EXIT_OK if isinstance(outcome, CompileResult) else EXIT_BUILD_ERROR


def cmd_devices(args: argparse.Namespace) -> int:
    """List Level Zero devices (XPU_ZEBIN_SIMULATED_DEVICE=pvc simulates one)."""
    try:
        devices = xpu_zebin.devices()
    except BuildError as e:
        print(f"xpu-zebin: {e}", file=sys.stderr)
        return EXIT_BUILD_ERROR
    if args.json:
        print(json.dumps(devices))
        return EXIT_OK
    for d in devices:
        print(
            f"{d['index']}: {d['name']} (device id 0x{d['device_id']:04x}, arch {d['arch']}, "
            f"max work-group {d['max_work_group_size']}, sub-groups {d['sub_group_sizes']}"
            f"{', simulated' if d['simulated'] else ''})"
        )
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    """What the engine would use here, and why something is slow or off."""
    r = xpu_zebin.doctor(args.ocloc)
    if args.json:
        print(json.dumps(r))
        return EXIT_OK
    print(f"xpu-zebin {xpu_zebin.__version__} (Python {sys.version.split()[0]})")
    print(f"ocloc: {r['ocloc'] or 'not found: ' + str(r['ocloc_error'])}")
    if r["ocloc"]:
        print(f"compiler version: {r['compiler_version']}")
        print(f"libocloc: {r['libocloc'] or 'none'}")
        mode = r["worker_mode"]
        if r["worker_note"]:
            mode += f" ({r['worker_note']}; one ocloc process per compile)"
        print(f"offline workers: {mode}")
    if r["level_zero_devices"]:
        for d in r["level_zero_devices"]:
            sim = ", simulated" if d["simulated"] else ""
            print(f"Level Zero device {d['index']}: {d['name']} (arch {d['arch']}{sim}, "
                  f"driver {d['driver']})")  # fmt: skip
        isolated = xpu_zebin._isolated_default()
        note = r["level_zero_worker_note"]
        print(
            "Level Zero builds: "
            + ("in this process (XPU_ZEBIN_ISOLATED=0)" if not isolated else "isolated workers")
            + (f" (cannot start: {note})" if note else "")
        )
    else:
        print(f"Level Zero: {r['level_zero_error']}")
    size = r["cache_bytes"] / (1 << 20)
    print(f"cache: {r['cache_dir']} ({r['cache_entries']} entries, {size:.1f} MiB)")
    if r["core_slots_dir"]:
        busy = f"{r['cores_busy_on_host']} running a compiler on this host now"
        print(f"cores: {r['cores']} ({busy}; slots in {r['core_slots_dir']})")
    else:
        print(f"cores: {r['cores']} (not counted across processes: no usable slot directory)")
    return EXIT_OK


def cmd_target(args: argparse.Namespace) -> int:
    """The local device's target profile (what precompile builds for)."""
    from . import targets

    try:
        profile = targets.local(args.device)
    except BuildError as e:
        print(f"xpu-zebin: {e}", file=sys.stderr)
        return EXIT_BUILD_ERROR
    if args.ocloc is not None:  # named: it must be usable
        try:
            xpu_zebin.find_ocloc(args.ocloc)
        except BuildError as e:
            raise _UsageError(f"--ocloc: {e}") from None
    try:  # what its driver accepts: a farm then refuses a compiler the driver would refuse
        accepts = targets.probe_accepts(args.device, ocloc=args.ocloc)
    except BuildError as e:
        accepts = None
        print(f"xpu-zebin: what the driver accepts is not recorded: {e}", file=sys.stderr)
    if accepts is None and args.ocloc is not None:
        raise _UsageError(f"--ocloc {args.ocloc}: it cannot build the sample kernel")
    profile = dataclasses.replace(profile, accepts=accepts)
    text = json.dumps(profile.to_json(), indent=None if args.json else 2, sort_keys=True)
    if args.output:
        Path(args.output).write_text(text + "\n")
    if args.json or not args.output:
        print(text)
    return EXIT_OK


def _is_triton_spec(arg: str) -> bool:
    """``FILE.py:NAME`` or ``package.module:NAME``: a Triton kernel (or a list of kernel
    specs) to precompile, not a SPIR-V or OpenCL file."""
    where, sep, name = arg.rpartition(":")
    return bool(sep and where and name.isidentifier()) and (
        where.endswith(".py") or not Path(arg).exists()
    )


def _load_spec(arg: str) -> Any:
    """The object ``FILE.py:NAME`` or ``module:NAME`` names (the file or module is run:
    it is the user's own code, named on the command line)."""
    import importlib
    import importlib.util

    where, _, name = arg.rpartition(":")
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(where).stem, where)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {where}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except Exception as e:  # the user's own code, failing to import: said, not a traceback
        raise _UsageError(f"{arg}: {type(e).__name__}: {e}") from None
    if not hasattr(module, name):
        raise _UsageError(f"{arg}: {where} has no {name}")
    return getattr(module, name)


def _triton_specs(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Each Triton spec argument as ``xpu_zebin.triton.precompile`` takes kernels: a
    kernel with ``--signature``/``--constexpr``/``--config``, or a list of kernel dicts."""
    specs: List[Dict[str, Any]] = []
    for arg in (a for a in args.files if _is_triton_spec(a)):
        obj = _load_spec(arg)
        if isinstance(obj, (list, tuple)):
            specs += list(obj)
            continue
        if not args.signature:
            raise _UsageError(f"{arg}: a Triton kernel needs --signature NAME=TYPE,...")
        spec = {
            "kernel": obj,
            "signature": _pairs(args.signature, "--signature", json_values=False),
        }
        if args.constexpr:
            spec["constexprs"] = {}
            for item in args.constexpr:  # one NAME=VALUE each: a value may hold commas
                spec["constexprs"].update(_pairs(item, "--constexpr", json_values=True, one=True))
        if args.config:
            try:
                spec["configs"] = [json.loads(c) for c in args.config]
            except ValueError as e:
                raise _UsageError(f"--config: not JSON: {e}") from None
            if not all(isinstance(c, dict) for c in spec["configs"]):
                raise _UsageError("--config: each is a JSON object (constexprs, num_warps, ...)")
        specs.append(spec)
    return specs


def _pairs(text: str, option: str, *, json_values: bool, one: bool = False) -> Dict[str, Any]:
    """``a=x,b=y`` (``one``: a single ``a=x``) as a dict; with ``json_values``, each value
    is JSON if it parses."""
    out: Dict[str, Any] = {}
    for item in [text.strip()] if one else (i.strip() for i in text.split(",") if i.strip()):
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier() or not value.strip():
            raise _UsageError(f"{option}: expected NAME=VALUE, got {item!r}")
        value = value.strip()
        if json_values:
            try:
                value = json.loads(value)
            except ValueError:
                pass
        out[key.strip()] = value
    return out


def cmd_precompile(args: argparse.Namespace) -> int:
    """Native code for every input and target profile, into a bundle."""
    from . import bundle, targets

    try:
        profiles = [targets.load(t) for t in args.target]
        kernels = (
            bundle.triton_cache_kernels(args.from_triton_cache) if args.from_triton_cache else []
        )
    except (OSError, xpu_zebin.InvalidArgumentError) as e:
        raise _UsageError(str(e)) from None
    if args.from_triton_cache and not kernels:
        raise _UsageError(f"{args.from_triton_cache} holds no Triton SPIR-V kernels")
    specs = _triton_specs(args)
    files = [f for f in args.files if not _is_triton_spec(f)]
    if not kernels and not files and not specs:
        raise _UsageError("name SPIR-V (or .cl) files, Triton kernels (FILE.py:NAME), "
                          "or --from-triton-cache DIR")  # fmt: skip
    from . import triton as drop_in

    try:  # every spec and the output checked before anything is built
        drop_in.check_precompile_kernels(specs) if specs else None
        bundle._check_output(args.output)
        targets.check_compiler(profiles, args.ocloc, allow_mismatch=args.allow_compiler_mismatch)
    except xpu_zebin.InvalidArgumentError as e:
        raise _UsageError(str(e)) from None
    for path in files:
        spirv = _read_input(path, profiles[0].ocloc_device, args.ocloc)
        names = [args.kernel] if args.kernel else xpu_zebin.validate_spirv(spirv)
        kernels += [{"spirv": spirv, "name": n, "config": Path(path).name} for n in names]
    common = {"jobs": args.jobs, "progress": not args.json, "ocloc": args.ocloc,
              "allow_compiler_mismatch": args.allow_compiler_mismatch}  # fmt: skip
    manifest: Dict[str, Any] = {}
    failures: List[Dict[str, Any]] = []
    if kernels:
        manifest = bundle.precompile(kernels, profiles, args.output, **common)
        failures += manifest["run_failures"]
    if specs:
        manifest = drop_in.precompile(specs, profiles, args.output, **common)
        failures += manifest["run_failures"]
    return _print_manifest(args, manifest, failures)


def _print_manifest(
    args: argparse.Namespace, manifest: Dict[str, Any], failures: List[Dict[str, Any]]
) -> int:
    """The bundle's counts and this run's failures; exit 1 if this run had any."""
    if args.json:
        print(json.dumps(manifest))
    else:
        print(f"{args.output}: {len(manifest['entries'])} native entries, "
              f"{len(failures)} failures, "
              f"{len(manifest.get('triton_cache', []))} Triton cache entries")  # fmt: skip
        for f in failures:
            print(_printable(f"  not built: {f['kernel']} ({f['config']}) for "
                             f"{f['target'][:12]}: {f['kind']}: {f['message']}"))  # fmt: skip
    return EXIT_OK if not failures else EXIT_BUILD_ERROR


def _printable(text: str) -> str:
    """A bundle's strings are untrusted: no terminal control sequence reaches the screen."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def cmd_bundle(args: argparse.Namespace) -> int:
    """Check, show, import or pack a bundle."""
    from . import bundle, targets

    try:
        if args.action == "verify":
            report = bundle.verify(args.bundle)
            good, bad = len(report["ok"]), len(report["bad"])
            print(json.dumps(report) if args.json else f"{args.bundle}: {good} good, {bad} bad")
            for key, why in report["bad"] if not args.json else ():
                print(_printable(f"  bad: {key[:20]}: {why}"))
            return EXIT_OK if not report["bad"] else EXIT_BUILD_ERROR
        if args.action == "info":
            return _print_info(args, bundle.info(args.bundle))
        if args.action == "pack":
            if not args.output:
                raise _UsageError("bundle pack needs -o ARCHIVE")
            print(f"{args.output}: {bundle.pack(args.bundle, args.output)} files")
            return EXIT_OK
        if args.triton_cache:
            os.environ["TRITON_CACHE_DIR"] = args.triton_cache
        try:
            target = targets.load(args.target) if args.target else None
        except (OSError, xpu_zebin.InvalidArgumentError) as e:
            raise _UsageError(f"--target: {e}") from None
        where = bundle.install(args.bundle, args.into, target=target, triton=not args.no_triton,
                               replace=args.replace)  # fmt: skip
        print(f"installed: {where}")
        return EXIT_OK
    except xpu_zebin.InvalidArgumentError as e:
        print(_printable(f"xpu-zebin: {e}"), file=sys.stderr)
        return EXIT_BUILD_ERROR


def _print_info(args: argparse.Namespace, m: Dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(m))
        return EXIT_OK
    print(
        _printable(f"{args.bundle}: {m['format']}, xpu-zebin {m['package']}, Triton {m['triton']}")
    )
    for tid, t in m["targets"].items():
        print(_printable(f"  target {t.get('name')} ({t.get('ocloc_device')}, id {tid[:12]})"))
    for e in m["entries"]:
        where = f"{e['kernel']} [{e['config']}] for {e['target'][:12]}"
        print(_printable(f"  {where}: '{e['build_flags']}', n_spills {e['n_spills']}, "
                         f"{e['size']} B"))  # fmt: skip
    for t in m.get("triton_cache", []):
        kind = "native" if t["native"] else "SPIR-V"
        print(_printable(f"  Triton cache {t['hash'][:12]}: {t['kernel']} [{t['config']}] "
                         f"for {t['target'][:12]}, {kind}"))  # fmt: skip
    return EXIT_OK


def cmd_kinds(args: argparse.Namespace) -> int:
    for kind, description in xpu_zebin.error_kinds():
        print(f"{kind:20} {description}")
    return EXIT_OK


#: The longest ``--timeout`` the engine takes, in seconds.
MAX_TIMEOUT = 1e9


def _timeout(text: str) -> float:
    """``--timeout``: seconds, a finite number from 0 (no limit) to :data:`MAX_TIMEOUT`, as
    the engine takes them; anything else (inf, nan, negative, not a number) is a usage
    error here, before any input is read."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_TIMEOUT:  # false for nan
        raise argparse.ArgumentTypeError(
            f"expected seconds, a finite number from 0 (no limit) to 1e9, not {text!r}"
        )
    return value


def _jobs(text: str) -> int:
    """``--jobs``: a whole number of parallel compilers, at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 4096, not {text!r}")
    return value


def _add_compile_options(sp: argparse.ArgumentParser) -> None:
    """The options of ``compile`` and ``batch``: the fields of :class:`xpu_zebin.Options`."""
    sp.add_argument("--device", required=True, help="ocloc device, e.g. pvc, bmg, cri")
    sp.add_argument(
        "--build-flags", default="", help="IGC options, e.g. '-cl-intel-256-GRF-per-thread'"
    )
    sp.add_argument("--grf-mode", default="default", help="default, 128, 256, 512 or auto")
    sp.add_argument(
        "--num-warps", type=int, default=None, help="Triton num_warps (>32: no large GRF retry)"
    )
    sp.add_argument(
        "--max-grf-mode", default=None, help="largest GRF mode of the target: 128, 256 or 512"
    )
    sp.add_argument(
        "--spill-policy",
        default=None,
        help="when spills call for the large-GRF retry: upstream (default), any, never, "
        "slots:N or bytes:N (else $XPU_ZEBIN_SPILL_POLICY)",
    )
    sp.add_argument("--ocloc", default=None, help="ocloc to use (else $XPU_ZEBIN_OCLOC, else PATH)")
    sp.add_argument(
        "--timeout",
        type=_timeout,
        default=None,
        help="seconds per compiler run, at most 1e9 (0: no limit)",
    )
    sp.add_argument(
        "--no-cache", action="store_true", help="neither read nor write the binary cache"
    )
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xpu-zebin",
        description="SPIR-V to Intel GPU zebin with automatic large-GRF fallback.",
    )
    p.add_argument("--version", action="version", version=f"xpu-zebin {xpu_zebin.__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the engine does")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="compile one SPIR-V (or .cl) file")
    c.add_argument("input")
    c.add_argument("--kernel", default=None, help="kernel that must be an entry point")
    c.add_argument("-o", "--output", default=None, help="write the zebin here")
    _add_compile_options(c)
    c.set_defaults(func=cmd_compile)

    b = sub.add_parser("batch", help="compile many files concurrently")
    b.add_argument("files", nargs="+")
    b.add_argument("--jobs", type=_jobs, default=None, help="parallel compilers (default: cores)")
    b.add_argument("--output-dir", default=None, help="write <stem>.zebin files here")
    where = b.add_mutually_exclusive_group()
    where.add_argument(
        "--scheduler", default=None, help="run on this Dask scheduler (tcp://host:port)"
    )
    where.add_argument(
        "--dask-local",
        type=int,
        default=0,
        metavar="N",
        help="run on a local Dask cluster of N worker processes",
    )
    _add_compile_options(b)
    b.set_defaults(func=cmd_batch)

    i = sub.add_parser("info", help="summarise a zebin's .ze_info")
    i.add_argument("zebin")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_info)

    d = sub.add_parser("demo", help="build a sample that needs the large-GRF fallback")
    d.add_argument("--device", default="pvc")
    d.add_argument(
        "--values",
        type=int,
        default=samples.PTSS_OVERFLOW_VALUES,
        help="live values in the sample kernel (register pressure)",
    )
    d.add_argument("--ocloc", default=None)
    d.set_defaults(func=cmd_demo)

    v = sub.add_parser("devices", help="list Level Zero devices")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_devices)

    t = sub.add_parser("doctor", help="show the toolchain, workers, devices and cache in use")
    t.add_argument("--ocloc", default=None)
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_doctor)

    k = sub.add_parser("kinds", help="list the error kinds")
    k.set_defaults(func=cmd_kinds)
    _add_aot_commands(sub)
    return p


def _add_aot_commands(sub: Any) -> None:
    """``target``, ``precompile`` and ``bundle``: native code ahead of time."""
    t = sub.add_parser("target", help="the local device's target profile (JSON)")
    t.add_argument("--device", type=int, default=0, help="Level Zero device index")
    t.add_argument("-o", "--output", default=None, help="write the profile here")
    t.add_argument("--json", action="store_true", help="one line of JSON")
    t.add_argument("--ocloc", default=None,
                   help="also record whether the driver takes this ocloc's code (else "
                        "$XPU_ZEBIN_OCLOC, PATH)")  # fmt: skip
    t.set_defaults(func=cmd_target)

    p = sub.add_parser(
        "precompile", help="build SPIR-V/.cl files or Triton kernels for target profiles"
    )
    p.add_argument("files", nargs="*", metavar="INPUT",
                   help="SPIR-V or .cl files, or Triton kernels as FILE.py:NAME or module:NAME "
                        "(NAME: a kernel, or a list of dicts: kernel, signature, configs, "
                        "constexprs)")  # fmt: skip
    p.add_argument(
        "--from-triton-cache", default=None, metavar="DIR",
        help="also every SPIR-V kernel in this Triton cache directory (TRITON_CACHE_DIR)",
    )  # fmt: skip
    p.add_argument("--target", action="append", required=True, help="a profile file (repeat)")
    p.add_argument("-o", "--output", required=True, help="the bundle directory")
    p.add_argument("--kernel", default=None, help="only this kernel (default: every one)")
    p.add_argument("--signature", default=None, metavar="NAME=TYPE,...",
                   help="a Triton kernel's argument types, e.g. 'x=*fp32,n=i32'")  # fmt: skip
    p.add_argument("--constexpr", action="append", default=[], metavar="NAME=VALUE",
                   help="a Triton kernel's constexpr for every config (repeat)")  # fmt: skip
    p.add_argument("--config", action="append", default=[], metavar="JSON",
                   help="a config as JSON, e.g. '{\"constexprs\": {\"BLOCK\": 256}, "
                        "\"num_warps\": 4}' (repeat; default: the autotuner's)")  # fmt: skip
    p.add_argument("--jobs", type=_jobs, default=None, help="parallel compilers (default: cores)")
    p.add_argument("--ocloc", default=None, help="ocloc to use (else $XPU_ZEBIN_OCLOC, PATH)")
    p.add_argument("--allow-compiler-mismatch", action="store_true",
                   help="warn, instead of refusing, when a target's driver would refuse this "
                        "ocloc's code (its profile says so)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the manifest")
    p.set_defaults(func=cmd_precompile)

    b = sub.add_parser("bundle", help="verify, show, import or pack a bundle")
    b.add_argument("action", choices=["verify", "info", "import", "pack"])
    b.add_argument("bundle", help="a bundle directory, or an archive of one")
    b.add_argument(
        "--into", default=None, help="a directory of bundles to import into (default: the cache's)"
    )
    b.add_argument("--target", default=None, metavar="PROFILE",
                   help="import the Triton cache entries of this profile (default: this "
                        "device)")  # fmt: skip
    b.add_argument("--triton-cache", default=None, metavar="DIR",
                   help="Triton's cache to import into (default: TRITON_CACHE_DIR, "
                        "~/.triton/cache)")  # fmt: skip
    b.add_argument("--no-triton", action="store_true", help="do not touch Triton's cache")
    b.add_argument("--replace", action="store_true",
                   help="import: replace another installed bundle of the same name")  # fmt: skip
    b.add_argument("-o", "--output", default=None, help="pack: the archive file to write")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bundle)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except _UsageError as e:
        print(f"xpu-zebin: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BuildError as e:  # from reading inputs (.cl conversion, ocloc discovery)
        print(f"xpu-zebin: {e}", file=sys.stderr)
        return EXIT_BUILD_ERROR
    except KeyboardInterrupt:
        print("xpu-zebin: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

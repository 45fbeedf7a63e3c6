"""The commands that build and inspect: ``compile``, ``batch``, ``info``, ``demo``,
``devices``, ``doctor``, ``kinds``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import xpu_zebin
from xpu_zebin import BuildError, CompileResult, samples

from .common import (
    EXIT_BUILD_ERROR,
    EXIT_OK,
    UsageError,
    printable,
    read_file,
    read_input,
    timeout,
)

#: The demo's largest samples: about four times the live state of the one that overflows
#: PTSS (a build of minutes, not hours; each native build is bounded by ``--timeout`` too).
DEMO_MAX_VECTORS = 256
DEMO_MAX_VALUES = 8192


def _attempt_json(a: Any) -> dict:
    return dict(
        build_flags=a.build_flags,
        ok=a.ok,
        spill_size=a.spill_size,
        seconds=round(a.seconds, 3),
        started=round(a.started, 3),
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
            source=outcome.source,
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
        source=None,
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
            f"{outcome.spill_size}"
            + ("" if outcome.source == "compiled" else f" (from the {outcome.source})")
        )
    else:
        lines.append(f"{label}: FAILED: {outcome}")
    for i, a in enumerate(outcome.attempts, 1):
        state = f"ok, spill_size {a.spill_size}" if a.ok else f"failed: {a.error}"
        lines.append(
            f"  attempt {i}: flags '{a.build_flags}': {state} ({a.seconds:.2f} s, started at "
            f"{a.started:.2f} s)"
        )
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
        raise UsageError(e.message) from e


def cmd_compile(args: argparse.Namespace) -> int:
    options = _options(args, args.kernel)
    spirv = read_input(args.input, args.device, args.ocloc, stdin=True)
    try:
        outcome: Union[CompileResult, BuildError] = xpu_zebin.compile(
            spirv, device=args.device, options=options
        )
    except xpu_zebin.InvalidArgumentError as e:
        raise UsageError(e.message) from e
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
    inputs = [read_input(f, args.device, args.ocloc) for f in args.files]
    reqs = [dict(spirv=s, device=args.device, options=options) for s in inputs]
    if args.scheduler or args.dask_local:
        from .. import dask

        with contextlib.ExitStack() as stack:
            try:
                client = stack.enter_context(dask.cluster_client(args.scheduler, args.dask_local))
            except xpu_zebin.InvalidArgumentError as e:  # --dask-local below 1
                raise UsageError(e.message) from None
            except ImportError as e:
                raise UsageError(
                    f"Dask batches need `pip install 'xpu-zebin[dask]'` ({e})"
                ) from None
            except OSError as e:  # Dask raises OSError when it cannot connect in time
                where = args.scheduler or "a local cluster"
                raise UsageError(f"cannot reach the Dask scheduler at {where}: {e}") from None
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
    data = read_file(args.zebin, stdin=True)
    try:
        info = xpu_zebin.zebin_info(data)
    except BuildError as e:
        print(f"{args.zebin}: {e}", file=sys.stderr)
        return EXIT_BUILD_ERROR
    if args.json:
        from ..build_options import rules_report

        print(json.dumps({**info, "spill_rules": rules_report()}))
        return EXIT_OK
    print(f"{args.zebin}: zebin, .ze_info version {info['version']}")
    for k in info["kernels"]:
        print(
            f"  kernel {k['name']}: grf_count {k['grf_count']}, simd {k['simd_size']}, "
            f"spill_size {k['spill_size']}, private_size {k['private_size']}, "
            f"scratch {k['scratch_size']}"
        )
    return EXIT_OK


def _demo_sample(args: argparse.Namespace) -> tuple[str, str]:
    """What the demo's sample keeps live, and its source: bounded, as it is made from a
    number on the command line."""
    if args.values is None:
        vectors = samples.PTSS_OVERFLOW_VECTORS if args.vectors is None else args.vectors
        if not 8 <= vectors <= DEMO_MAX_VECTORS:
            raise UsageError(f"--vectors must be 8 to {DEMO_MAX_VECTORS}")
        return f"{vectors} double16 values", samples.ptss_overflow_kernel(vectors)
    if not 2 <= args.values <= DEMO_MAX_VALUES:
        raise UsageError(f"--values must be 2 to {DEMO_MAX_VALUES}")
    return f"{args.values} floats", samples.register_pressure_kernel(args.values)


def _overlap(attempts: Sequence[Any]) -> str:
    """What the attempts' start and end times say about how they ran."""
    if len(attempts) < 2:
        return "one attempt"
    first, second = attempts[0], attempts[1]
    together = min(first.started + first.seconds, second.started + second.seconds)
    together -= max(first.started, second.started)
    if together <= 0:
        return "the attempts ran one after the other"
    return (
        f"the attempts ran at once for {together:.2f} s: the second started "
        f"{second.started - first.started:.2f} s after the first"
    )


def cmd_demo(args: argparse.Namespace) -> int:
    """Build the register-pressure sample and show the GRF fallback at work."""
    kept, source = _demo_sample(args)
    ocloc = xpu_zebin.find_ocloc(args.ocloc)
    print(f"ocloc: {ocloc}")
    print(f"sample: OpenCL C kernel keeping {kept} live across a loop (SIMD32)")
    spirv = xpu_zebin.opencl_to_spirv(source, device=args.device, ocloc=ocloc)
    print(f"SPIR-V: {len(spirv)} bytes, kernels {xpu_zebin.validate_spirv(spirv)}")
    started = time.perf_counter()
    try:
        outcome: Union[CompileResult, BuildError] = xpu_zebin.compile(
            spirv, device=args.device, ocloc=ocloc, cache=False, timeout=args.timeout
        )
    except BuildError as e:
        outcome = e
    print(_describe(outcome, "demo"))
    print(f"wall time {time.perf_counter() - started:.2f} s ({_overlap(outcome.attempts)})")
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
    if getattr(args, "forget_refusals", False):
        forgotten = xpu_zebin._core.forget_compiler_refusals()
        print(f"forgot {forgotten} refused (compiler, driver) pair(s)", file=sys.stderr)
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
    from .fleet import stats_lines  # what every level did (xpu-zebin stats)

    for line in stats_lines(r["stats"])[2:]:
        print(printable(f"  {line}"))
    if r["core_slots_dir"]:
        busy = f"{r['cores_busy_on_host']} running a compiler on this host now"
        print(f"cores: {r['cores']} ({busy}; slots in {r['core_slots_dir']})")
    else:
        print(f"cores: {r['cores']} (not counted across processes: no usable slot directory)")
    for refusal in r["refused_compilers"]:
        try:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(refusal["when"]))
        except (OverflowError, OSError, ValueError):
            when = "an unknown time"
        print(printable(f"refused here: native code of {refusal['compiler'].split('|')[0]} by "
                        f"driver {refusal['driver']} (since {when}: {refusal['why'][:200]}); its "
                        "kernels go to the driver's own compiler (--forget-refusals clears "
                        "this)"))  # fmt: skip
    rules = r["spill_rules"]
    lts = rules["lts"]
    driver = f"driver {lts['driver'] or 'unknown'} is {'LTS' if lts['answer'] else 'rolling'}"
    if "error" in rules:
        print(f"spill rules: {rules['error']}; {driver} ({lts['source']})")
        return EXIT_OK
    print(
        f"spill rules (upstream line #{rules['current_line']}, checked {rules['last_checked']}); "
        f"{driver} ({lts['source']})"
    )
    for path in ("load_binary", "make_zebin", "compile", "compile_and_load"):
        rule = rules[path]
        where = f", from {rule['source']}" if "source" in rule else ""
        print(f"  {path}: rebuild in large GRF on {rule['describe']} ({rule['rule']}{where})")
    return EXIT_OK


def cmd_kinds(args: argparse.Namespace) -> int:
    for kind, description in xpu_zebin.error_kinds():
        print(f"{kind:20} {description}")
    return EXIT_OK


def add_compile_options(sp: argparse.ArgumentParser) -> None:
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
        help="when spills call for the large-GRF retry: upstream (today's upstream rule, "
        "#8147), upstream@LINE (an older one: 3.3, 7615, 7959, 8115), any, never, slots:N, "
        "bytes:N or min-bytes:N (else $XPU_ZEBIN_SPILL_POLICY)",
    )
    sp.add_argument("--ocloc", default=None, help="ocloc to use (else $XPU_ZEBIN_OCLOC, else PATH)")
    sp.add_argument(
        "--timeout",
        type=timeout,
        default=None,
        help="seconds per compiler run, at most 1e9 (0: no limit)",
    )
    sp.add_argument(
        "--no-cache", action="store_true", help="neither read nor write the binary cache"
    )
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")

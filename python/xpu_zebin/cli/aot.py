"""Native code ahead of time: ``target`` (a device's profile), ``precompile`` (SPIR-V,
``.cl`` files or Triton kernels into a bundle) and ``bundle`` (verify, info, import, pack)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

import xpu_zebin
from xpu_zebin import BuildError

from .common import EXIT_BUILD_ERROR, EXIT_OK, UsageError, jobs, printable, read_input


def cmd_target(args: argparse.Namespace) -> int:
    """The local device's target profile (what precompile builds for)."""
    from .. import targets

    try:
        profile = targets.local(args.device)
    except BuildError as e:
        print(f"xpu-zebin: {e}", file=sys.stderr)
        return EXIT_BUILD_ERROR
    if args.ocloc is not None:  # named: it must be usable
        try:
            xpu_zebin.find_ocloc(args.ocloc)
        except BuildError as e:
            raise UsageError(f"--ocloc: {e}") from None
    try:  # what its driver accepts: a farm then refuses a compiler the driver would refuse
        accepts = targets.probe_accepts(args.device, ocloc=args.ocloc)
    except BuildError as e:
        accepts = None
        print(f"xpu-zebin: what the driver accepts is not recorded: {e}", file=sys.stderr)
    if accepts is None and args.ocloc is not None:
        raise UsageError(f"--ocloc {args.ocloc}: it cannot build the sample kernel")
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
        raise UsageError(f"{arg}: {type(e).__name__}: {e}") from None
    if not hasattr(module, name):
        raise UsageError(f"{arg}: {where} has no {name}")
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
            raise UsageError(f"{arg}: a Triton kernel needs --signature NAME=TYPE,...")
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
                raise UsageError(f"--config: not JSON: {e}") from None
            if not all(isinstance(c, dict) for c in spec["configs"]):
                raise UsageError("--config: each is a JSON object (constexprs, num_warps, ...)")
        specs.append(spec)
    return specs


def _pairs(text: str, option: str, *, json_values: bool, one: bool = False) -> Dict[str, Any]:
    """``a=x,b=y`` (``one``: a single ``a=x``) as a dict; with ``json_values``, each value
    is JSON if it parses."""
    out: Dict[str, Any] = {}
    for item in [text.strip()] if one else (i.strip() for i in text.split(",") if i.strip()):
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier() or not value.strip():
            raise UsageError(f"{option}: expected NAME=VALUE, got {item!r}")
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
    from .. import bundle, targets
    from .. import triton as drop_in
    from ..bundle.build import check_output

    try:
        profiles = [targets.load(t) for t in args.target]
        kernels = drop_in.kernels_in_cache(args.from_triton_cache) if args.from_triton_cache else []
    except (OSError, xpu_zebin.InvalidArgumentError) as e:
        raise UsageError(str(e)) from None
    if args.from_triton_cache and not kernels:
        raise UsageError(f"{args.from_triton_cache} holds no Triton SPIR-V kernels")
    specs = _triton_specs(args)
    files = [f for f in args.files if not _is_triton_spec(f)]
    if not kernels and not files and not specs:
        raise UsageError("name SPIR-V (or .cl) files, Triton kernels (FILE.py:NAME), "
                          "or --from-triton-cache DIR")  # fmt: skip
    try:  # every spec and the output checked before anything is built
        drop_in.check_precompile_kernels(specs) if specs else None
        check_output(args.output)
        targets.check_compiler(profiles, args.ocloc, allow_mismatch=args.allow_compiler_mismatch)
    except xpu_zebin.InvalidArgumentError as e:
        raise UsageError(str(e)) from None
    for path in files:
        spirv = read_input(path, profiles[0].ocloc_device, args.ocloc)
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
            print(printable(f"  not built: {f['kernel']} ({f['config']}) for "
                             f"{f['target'][:12]}: {f['kind']}: {f['message']}"))  # fmt: skip
    return EXIT_OK if not failures else EXIT_BUILD_ERROR


def cmd_bundle(args: argparse.Namespace) -> int:
    """Check, show, import or pack a bundle."""
    from .. import bundle, targets
    from .. import triton as drop_in

    try:
        if args.action == "verify":
            report = bundle.verify(args.bundle)
            good, bad = len(report["ok"]), len(report["bad"])
            print(json.dumps(report) if args.json else f"{args.bundle}: {good} good, {bad} bad")
            for key, why in report["bad"] if not args.json else ():
                print(printable(f"  bad: {key[:20]}: {why}"))
            return EXIT_OK if not report["bad"] else EXIT_BUILD_ERROR
        if args.action == "info":
            return _print_info(args, bundle.info(args.bundle))
        if args.action == "sign":
            signer = xpu_zebin._core.bundle_sign(os.fspath(args.bundle))
            print(f"{args.bundle}: signed by {signer}")
            return EXIT_OK
        if args.action == "pack":
            if not args.output:
                raise UsageError("bundle pack needs -o ARCHIVE")
            print(f"{args.output}: {bundle.pack(args.bundle, args.output)} files")
            return EXIT_OK
        if args.triton_cache:
            os.environ["TRITON_CACHE_DIR"] = args.triton_cache
        try:
            target = targets.load(args.target) if args.target else None
        except (OSError, xpu_zebin.InvalidArgumentError) as e:
            raise UsageError(f"--target: {e}") from None
        where = drop_in.import_bundle(
            args.bundle, args.into, target=target, triton=not args.no_triton, replace=args.replace
        )
        print(f"imported: {where}")
        return EXIT_OK
    except xpu_zebin.InvalidArgumentError as e:
        print(printable(f"xpu-zebin: {e}"), file=sys.stderr)
        return EXIT_BUILD_ERROR


def _print_info(args: argparse.Namespace, m: Dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(m))
        return EXIT_OK
    print(
        printable(f"{args.bundle}: {m['format']}, xpu-zebin {m['package']}, Triton {m['triton']}")
    )
    for tid, t in m["targets"].items():
        print(printable(f"  target {t.get('name')} ({t.get('ocloc_device')}, id {tid[:12]})"))
    for e in m["entries"]:
        where = f"{e['kernel']} [{e['config']}] for {e['target'][:12]}"
        print(printable(f"  {where}: '{e['build_flags']}', n_spills {e['n_spills']}, "
                         f"{e['size']} B"))  # fmt: skip
    for t in m.get("triton_cache", []):
        kind = "native" if t["native"] else "SPIR-V"
        print(printable(f"  Triton cache {t['hash'][:12]}: {t['kernel']} [{t['config']}] "
                         f"for {t['target'][:12]}, {kind}"))  # fmt: skip
    return EXIT_OK


def add_commands(sub: Any) -> None:
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
    p.add_argument("--jobs", type=jobs, default=None, help="parallel compilers (default: cores)")
    p.add_argument("--ocloc", default=None, help="ocloc to use (else $XPU_ZEBIN_OCLOC, PATH)")
    p.add_argument("--allow-compiler-mismatch", action="store_true",
                   help="warn, instead of refusing, when a target's driver would refuse this "
                        "ocloc's code (its profile says so)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the manifest")
    p.set_defaults(func=cmd_precompile)

    b = sub.add_parser("bundle", help="verify, show, import, pack or sign a bundle")
    b.add_argument("action", choices=["verify", "info", "import", "pack", "sign"],
                   help="sign: with $XPU_ZEBIN_SIGNING_KEY (import and lookup then verify "
                        "it where $XPU_ZEBIN_TRUSTED_KEYS is set)")  # fmt: skip
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

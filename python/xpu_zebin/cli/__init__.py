"""The ``xpu-zebin`` command: compile, batch, info, demo, kinds.

Exit codes: 0 built, 1 build error, 2 usage error (bad arguments, unreadable input).

The commands live by concern: ``build`` (compile, batch, info, demo, devices, doctor,
kinds), ``aot`` (target, precompile, bundle), ``fleet`` (key, remote), ``common`` (what
they share).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional, Sequence

import xpu_zebin
from xpu_zebin import BuildError, samples

from . import aot, fleet
from .aot import cmd_bundle, cmd_precompile, cmd_target
from .build import (
    add_compile_options,
    cmd_batch,
    cmd_compile,
    cmd_demo,
    cmd_devices,
    cmd_doctor,
    cmd_info,
    cmd_kinds,
    result_json,
)
from .common import (
    EXIT_BUILD_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    MAX_TIMEOUT,
    UsageError,
    jobs,
    timeout,
)

__all__ = ["EXIT_BUILD_ERROR", "EXIT_OK", "EXIT_USAGE", "build_parser", "main", "result_json"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xpu-zebin",
        description="SPIR-V to Intel GPU zebin with automatic large-GRF fallback.",
    )
    p.add_argument("--version", action="version", version=f"xpu-zebin {xpu_zebin.__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the engine does")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="compile one SPIR-V (or .cl) file")
    c.add_argument("input", help="a SPIR-V or .cl file, or - for standard input")
    c.add_argument("--kernel", default=None, help="kernel that must be an entry point")
    c.add_argument("-o", "--output", default=None, help="write the zebin here")
    add_compile_options(c)
    c.set_defaults(func=cmd_compile)

    b = sub.add_parser("batch", help="compile many files concurrently")
    b.add_argument("files", nargs="+")
    b.add_argument("--jobs", type=jobs, default=None, help="parallel compilers (default: cores)")
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
    add_compile_options(b)
    b.set_defaults(func=cmd_batch)

    i = sub.add_parser("info", help="summarise a zebin's .ze_info")
    i.add_argument("zebin", help="a zebin file, or - for standard input")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_info)

    _add_demo(sub)

    v = sub.add_parser("devices", help="list Level Zero devices")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_devices)

    t = sub.add_parser("doctor", help="show the toolchain, workers, devices and cache in use")
    t.add_argument("--ocloc", default=None)
    t.add_argument(
        "--forget-refusals",
        action="store_true",
        help="forget the (compiler, driver) pairs whose native code the driver refused here",
    )
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_doctor)

    k = sub.add_parser("kinds", help="list the error kinds")
    k.set_defaults(func=cmd_kinds)
    aot.add_commands(sub)
    fleet.add_commands(sub)
    return p


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``demo``: one sample, sized by a bounded number, each compiler run bounded in time."""
    d = sub.add_parser("demo", help="build a sample that needs the large-GRF fallback")
    d.add_argument("--device", default="pvc")
    sample = d.add_mutually_exclusive_group()
    sample.add_argument(
        "--vectors",
        type=int,
        default=None,
        help=f"live double16 values in the sample kernel (default "
        f"{samples.PTSS_OVERFLOW_VECTORS}: register pressure; fp64: for a device without "
        "it, use --values)",
    )
    sample.add_argument(
        "--values",
        type=int,
        default=None,
        help="build the float sample with this many live values instead",
    )
    d.add_argument("--ocloc", default=None)
    d.add_argument(
        "--timeout",
        type=timeout,
        default=None,
        help="seconds per native build attempt (default $XPU_ZEBIN_TIMEOUT, else 900; 0: no limit)",
    )
    d.set_defaults(func=cmd_demo)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except UsageError as e:
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

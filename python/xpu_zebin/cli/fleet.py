"""``key generate`` (a farm's signing key) and ``remote stats | verify | purge`` (what the
fleet's store holds, what fails verification, and removing what no trusted key signed)."""

from __future__ import annotations

import argparse
import json
import os
import sys

import xpu_zebin

from .. import remote
from .common import EXIT_BUILD_ERROR, EXIT_OK, UsageError, printable


def cmd_key(args: argparse.Namespace) -> int:
    public = xpu_zebin._core.key_generate(os.fspath(args.path), args.name)
    print(f"secret key written to {args.path} (owner-only): sign with "
          f"{xpu_zebin._core.SIGNING_KEY_ENV}={args.path}", file=sys.stderr)  # fmt: skip
    print(public)
    return EXIT_OK


def cmd_remote(args: argparse.Namespace) -> int:
    cfg = remote.config()
    if cfg is None:
        raise UsageError(f"{remote.REMOTE_ENV} is not set: no remote store to look at")
    if args.action != "stats" and not xpu_zebin._core.trusted_keys_set():
        # With no key trusted every entry fails: purge would empty the store.
        raise UsageError(f"{args.action} needs {xpu_zebin._core.TRUSTED_KEYS_ENV}: the keys "
                         "whose entries are good")  # fmt: skip
    try:
        report = xpu_zebin._core.remote_survey(args.action)
    except OSError as e:
        print(printable(f"xpu-zebin: remote store {cfg['url']}: {e}"), file=sys.stderr)
        return EXIT_BUILD_ERROR
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['entries']} entries, {report['bytes']} bytes")
        for bad in report["bad"]:
            print(printable(f"  not trusted: {bad['key']}: {bad['why']}"))
        if args.action == "purge":
            print(f"purged {report['purged']} entries no trusted key signed")
    return EXIT_BUILD_ERROR if args.action == "verify" and report["bad"] else EXIT_OK


def stats_lines(s: dict) -> list:
    """``xpu-zebin stats`` as people read it (ccache's ``-s``)."""
    c = s["counters"]
    hits = sum(c[k] for k in ("hits_local", "hits_store", "hits_bundle", "hits_triton_cache"))
    retries = {k[len("large_grf_retries_"):]: v for k, v in c.items()
               if k.startswith("large_grf_retries_")}  # fmt: skip
    return [
        f"cache directory      {s['cache_dir']}",
        f"size                 {s['bytes'] / (1 << 20):.1f} MiB of {s['max_bytes'] / (1 << 20):.0f}"
        f" MiB, {s['entries']} entries",
        f"requests             {c['requests']}",
        f"hits                 {hits} (local {c['hits_local']}, store {c['hits_store']}, "
        f"bundle {c['hits_bundle']}, Triton cache {c['hits_triton_cache']})",
        f"compiles             {c['compiles']} ({c['compiler_microseconds'] / 1e6:.1f} s of "
        f"compiler)",
        f"waits for a build    {c['waits']} (another's build of the same kernel: "
        f"{c['wait_saved_microseconds'] / 1e6:.1f} s of compiler saved); Triton front ends "
        f"{c['waits_triton_front_end']} "
        f"({c['wait_saved_triton_front_end_microseconds'] / 1e6:.1f} s saved)",
        f"remembered failures  {c['remembered_failures']} (failed the same way before: not "
        f"built again)",
        "large-GRF retries    " + ", ".join(f"{k} {v}" for k, v in retries.items()),
        f"refused entries      untrusted {c['refused_untrusted']}, checksum "
        f"{c['refused_checksum']}, driver {c['refused_driver']}, too large "
        f"{c['refused_too_large']}",
        f"fleet's store        misses {c['misses_store']}, published {c['published_store']}, "
        f"errors {c['store_errors']}",
        f"evictions            {c['evictions']}"
        + (
            f" (cleaning: shard {k['next_shard']} of {k['shards']} next)"
            if (k := s.get("cleaning"))
            else ""
        ),
        f"saved by hits        {c['saved_microseconds'] / 1e6:.1f} s of compiler",
        f"entries written      {c['written_bytes'] / (1 << 20):.1f} MiB on disk, holding "
        f"{c['written_uncompressed_bytes'] / (1 << 20):.1f} MiB uncompressed"
        + (
            f" ({c['written_uncompressed_bytes'] / c['written_bytes']:.1f}x)"
            if c["written_bytes"]
            else ""
        ),
    ]


def cmd_stats(args: argparse.Namespace) -> int:
    s = xpu_zebin.stats(args.cache_dir, zero=args.zero, recount=args.recount)
    if args.json:
        print(json.dumps(s))
    else:
        print("\n".join(printable(line) for line in stats_lines(s)))
        if args.zero:
            print("counters set back to zero", file=sys.stderr)
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("stats", help="what the cache holds and what every level did for it")
    s.add_argument("--cache-dir", default=None, help="the cache (default: the user's)")
    s.add_argument("--zero", action="store_true", help="set the counters back to zero after")
    s.add_argument("--recount", action="store_true",
                   help="count every entry on disk again first")  # fmt: skip
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_stats)
    k = sub.add_parser("key", help="make a signing key for the fleet's store")
    k.add_argument("action", choices=["generate"])
    k.add_argument("path", help="where the secret key goes (a new, owner-only file)")
    k.add_argument("--name", default="xpu-zebin", help="the key's name, shown with it")
    k.set_defaults(func=cmd_key)
    r = sub.add_parser("remote", help="the fleet's store ($XPU_ZEBIN_REMOTE)")
    r.add_argument("action", choices=["stats", "verify", "purge"],
                   help="what is there / what fails verification / remove what no trusted "
                   "key signed")  # fmt: skip
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_remote)

"""The red-team probe: a test-only program the test tiers run *inside* a session's sandbox.

Frozen like the agent (``packaging/build-agent --program probe``) and brought into the box only
by the tests (``scripts/install-dev --with-probe`` adds it to the agent image as
``/app/agent/probe/probe``); the shipped agent carries none of this code. Without options it
prints a JSON report of the sandbox as seen from inside (``redteam_probe.report``) and exits;
``--probe-attack CATEGORY`` runs the batched attacks of ``redteam_probe.probes`` instead; the
containment tests run it with ``runsc exec``/``runsc run`` as the agent's uid.

Nothing of ``ironclawd`` (import-linter contract): it runs in a rootfs with no interpreter.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from redteam_probe import attacks, probes
from redteam_probe.report import JSON
from redteam_probe.report import probe as full_report


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="probe", description="IronClaw red-team probe: the sandbox as seen from inside"
    )
    parser.add_argument(
        "--probe-net",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="try TCP and UDP connects to HOST:PORT and report the errno",
    )
    parser.add_argument(
        "--probe-unix",
        action="append",
        default=[],
        metavar="PATH",
        help="try connecting to the Unix socket PATH and report the errno",
    )
    parser.add_argument(
        "--probe-path",
        action="append",
        default=[],
        metavar="PATH",
        help="report whether PATH exists, can be read (its SHA-256) or written",
    )
    parser.add_argument(
        "--probe-grep",
        action="append",
        default=[],
        metavar="HEX",
        help="search every readable file (incl. /proc/*/environ and cmdline) for "
        "these bytes, given in hex so that this process's own argv does not hold them",
    )
    parser.add_argument(
        "--probe-grpc",
        action="append",
        default=[],
        metavar="PATH=METHOD[=HEX]",
        help="call the gRPC METHOD (/pkg.Service/Name) on the Unix socket PATH "
        "with the request bytes HEX (default: none) and report the status code and response",
    )
    parser.add_argument(
        "--probe-attack",
        action="append",
        default=[],
        metavar="CATEGORY",
        help=f"run every attack of CATEGORY ({', '.join(probes.CATEGORIES)})",
    )
    parser.add_argument(
        "--probe-opt", action="append", default=[], metavar="KEY=VALUE", help="attack options"
    )
    parser.add_argument(
        "--hog-mib", type=int, default=0, metavar="N", help="touch N MiB of memory and exit"
    )
    return parser.parse_args(argv)


def hog(mib: int) -> int:
    """Touch ``mib`` MiB of memory, one page at a time (the cgroup-limit test runs this with
    ``runsc exec``; it gives the agent nothing it could not do with a loop of its own)."""
    chunks = []
    for _ in range(mib):
        chunk = bytearray(1024 * 1024)
        for offset in range(0, len(chunk), 4096):
            chunk[offset] = 1
        chunks.append(chunk)
    print(f"hog: holding {mib} MiB", flush=True)
    return 0


def _grep_needles(hexes: Sequence[str]) -> list[bytes]:
    """The --probe-grep needles; ValueError says which one is bad."""
    needles = []
    for text in hexes:
        try:
            needle = bytes.fromhex(text)
        except ValueError as exc:
            raise ValueError(f"--probe-grep {text!r}: expected hex: {exc}") from None
        if not needle:
            raise ValueError("--probe-grep: expected at least one byte")
        needles.append(needle)
    return needles


def run_probe(args: argparse.Namespace) -> int:
    """Print the JSON report (or only the attacks asked for); 2 for a bad argument."""
    try:
        for target in args.probe_net:
            attacks.parse_target(target)
        needles = _grep_needles(args.probe_grep)
        opts = dict(opt.partition("=")[::2] for opt in args.probe_opt)
        if args.probe_attack:  # attacks only: the passive report is another exec's job
            report: JSON = {"attacks": probes.run(args.probe_attack, opts)}
            json.dump(report, sys.stdout, sort_keys=True)
            sys.stdout.write("\n")
            return 0
    except ValueError as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return 2
    report = full_report(
        net_targets=args.probe_net,
        unix_paths=args.probe_unix,
        look_paths=args.probe_path,
        grep_needles=needles,
        grpc_calls=args.probe_grpc,
    )
    json.dump(report, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the probe; returns the process exit status."""
    args = _parse_args(argv)
    if args.hog_mib:
        return hog(args.hog_mib)
    return run_probe(args)

"""The command line of `make bench` and `make bench-plot` (``python hack/bench --help``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import bench
from bench.plot import plot
from bench.runs import run_all
from bench.scenario import REPO, SCALES

#: Results, run folders and the redrawn plot; git-ignored.
OUT_DIR = REPO / ".bench"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hack/bench", description=(bench.__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--scale", choices=sorted(SCALES), default="small")
    parser.add_argument("--clusters", type=int, default=None, help="override the scale's count")
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--skip-direct", action="store_true")
    parser.add_argument("--skip-gangs", action="store_true", help="skip h (the gang run)")
    parser.add_argument("--gangs", type=int, default=None, help="h: override the gang count")
    parser.add_argument(
        "--gang-pools", type=int, default=None, help="h: override the v6e 2x4 pool count"
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        type=int,
        const=100,
        default=0,
        metavar="HZ",
        help="sample the operator with py-spy (default 100 Hz) from the first create until "
        "every TSC is Ready, and after the restart until every TSC had a pass; raw stacks "
        "and a summary in the run's folder (the sampler takes CPU from the same cores: a "
        "profiled run's timings are not comparable)",
    )
    parser.add_argument(
        "--profile-restart",
        nargs="?",
        type=int,
        const=100,
        default=0,
        metavar="HZ",
        help="sample the restarted operator alone with py-spy (default 100 Hz), from its "
        "spawn until every TSC had a pass (profile-restart.txt): the burst's figures stay "
        "comparable, g is measured with the sampler on the same cores",
    )
    parser.add_argument(
        "--memtrace",
        action="store_true",
        help="run the operator under tracemalloc and split the heap it grew by between the "
        "first create and the end of the steady window, per cluster, by the code that "
        "allocated it (memtrace-operator.txt in the run's folder; results-<scale>-memtraced"
        ".json, not plotted: tracemalloc slows the operator and grows its RSS)",
    )
    parser.add_argument(
        "--ungated",
        action="store_true",
        help="the operator run's TSCs with reservation.policy None (rendering and the identity "
        "webhook, no gate, reservation or pod patch): the reservation's own cost, by "
        "difference with a normal run; results-<scale>-ungated.json, not plotted",
    )
    parser.add_argument(
        "--pin-at-admission",
        action="store_true",
        help="run the operator and its webhook with --pin-at-admission (each slice's unit "
        "held by replica index before its pods exist, the pods pinned by the webhook, no "
        "release patch); results-<scale>-pinned.json, not plotted",
    )
    parser.add_argument(
        "--status-batch-seconds",
        type=int,
        default=None,
        metavar="SECONDS",
        help="the operator's --status-batch-seconds (default: the scale's, 60 at large and "
        "0, the operator's default, below)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="PATH",
        help="only draw the figures against scale from .bench/results-*.json into PATH "
        "(.svg or .png; make bench-plot) and exit",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.plot:
        return plot(OUT_DIR, args.plot)
    scale = SCALES[args.scale]
    scale = replace(
        scale,
        clusters=args.clusters or scale.clusters,
        gangs=args.gangs or scale.gangs,
        gang_pools=args.gang_pools or scale.gang_pools,
        status_batch_seconds=(
            scale.status_batch_seconds
            if args.status_batch_seconds is None
            else args.status_batch_seconds
        ),
    )
    return run_all(
        args.scale,
        scale,
        OUT_DIR,
        steady_s=args.steady_seconds,
        profile_rate=args.profile,
        ungated=args.ungated,
        skip_direct=args.skip_direct,
        skip_gangs=args.skip_gangs,
        memtrace=args.memtrace,
        pinned=args.pin_at_admission,
        restart_profile_rate=args.profile_restart,
    )

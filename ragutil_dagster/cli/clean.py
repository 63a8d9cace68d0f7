"""``ragutil clean``: find, and with ``--delete`` remove, what no published artifact needs — objects
whose writers died before publishing, local copies of replaced objects, superseded scratch
versions — and the report folders of superseded configs (docs/scale.md, "Cleaning up")."""

from __future__ import annotations

import argparse
import time

HOUR = 3600.0


def _size(size: int) -> str:
    if size < 1000:
        return f"{size} B"
    scaled, unit = next(
        (size / 1000**power, unit)
        for power, unit in ((3, "GB"), (2, "MB"), (1, "kB"))
        if size >= 1000**power
    )
    return f"{scaled:.1f} {unit}"


def _hours(text: str) -> float:
    hours = float(text)
    if hours < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 or more")
    return hours


def _clean(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ragutil_dagster.definitions import build_resources
    from ragutil_dagster.tracking.report import superseded_reports

    store = build_resources(for_dagster=False)["store"]
    now, older_than = time.time(), args.older_than_hours * HOUR
    reports = superseded_reports(store, older_than, now)
    # A dead writer's object inside a superseded report folder goes with the folder: listed once.
    found = reports + [
        item
        for item in store.garbage(older_than, now)
        if item.local or not any(item.path.startswith(f"{folder.path}/") for folder in reports)
    ]
    for item in found:
        print(f"{_size(item.size):>10}  {item.reason}: {item.location}")
    total = _size(sum(item.size for item in found))
    if not found:
        print(f"nothing to clean (nothing unneeded untouched for {args.older_than_hours:g} h)")
    elif not args.delete:
        print(f"{len(found)} unneeded, {total}; run again with --delete to remove them")
    else:
        for item in tqdm(found, desc="delete", unit="item", disable=len(found) < 2):
            store.delete(item)
        print(f"deleted {len(found)}, {total}")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    clean = sub.add_parser(
        "clean",
        help="find (and with --delete remove) artifacts and working files nothing needs",
        description="List what no published artifact needs any more: objects of the artifact store "
        "($RAGUTIL_ARTIFACTS_URL) that no manifest names (their writers died or lost a race), local copies "
        "of replaced objects under $RAGUTIL_HOME/cache/artifacts, scratch versions superseded by a newer "
        "one ($RAGUTIL_SCRATCH_DIR), and report folders (reports/<experiment>-<fingerprint>/) of a config "
        "that is no longer the latest reported under its experiment's name. Only what was untouched for "
        "--older-than-hours is listed, so that uploads in progress are spared: keep it above your longest upload.",
    )
    clean.add_argument(
        "--older-than-hours",
        type=_hours,
        default=24.0,
        help="grace period: only what was last modified this long ago (default 24)",
    )
    clean.add_argument(
        "--delete", action="store_true", help="delete what is listed (default: list only)"
    )
    clean.set_defaults(func=_clean)

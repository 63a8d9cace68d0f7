"""``ragutil world build``: generate the synthetic world, train its reader LM and NLI model, and
fine-tune the answer NLI for real text."""

from __future__ import annotations

import argparse
import json


def _world_build(args: argparse.Namespace) -> int:
    # Imported here: torch and transformers load only for commands that need them.
    from ragutil_dagster.embedded.training import format_quality, train_all

    trained = train_all(args.out, size=args.size, seed=args.seed, progress=not args.quiet)
    print(f"world:  {trained.world_dir}")
    print(f"reader: {trained.reader_dir}")
    print(f"world NLI (embedded:world-nli): {trained.world_nli_dir}")
    if trained.answer_nli_dir is not None:
        print(f"answer NLI (embedded:nli):      {trained.answer_nli_dir}")
    print()
    print(format_quality(trained.quality))
    print(f"world NLI accuracy on fresh answer pairs of the world: {trained.nli_accuracy:.3f}")
    print(f"reader steps {trained.config.reader_steps}, NLI steps {trained.config.nli_steps}")
    for label, times in (("wall seconds", trained.seconds), ("CPU seconds", trained.cpu_seconds)):
        print(f"{label}: " + json.dumps({k: round(v, 1) for k, v in times.items()}))
    return 0


def _world_ship(args: argparse.Namespace) -> int:
    from ragutil_dagster.embedded.shipped import ship

    print(f"shipped into the package: {ship(args.build)}")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    world = sub.add_parser("world", help="the synthetic knowledge world and its trained models")
    world_sub = world.add_subparsers(dest="world_command", required=True)
    build = world_sub.add_parser(
        "build",
        help="generate the world, train its reader LM and NLI model and the answer NLI",
        description="Write OUT/world (BEIR folder + ground truth), OUT/reader, OUT/world-nli (the "
        "world's NLI) and OUT/nli (the answer NLI for real text; HF model directories) "
        "and OUT/build.json, then print the reader's quality table.",
    )
    build.add_argument("--out", required=True, help="output directory")
    build.add_argument("--seed", type=int, default=0, help="seed of world and training (default 0)")
    build.add_argument(
        "--size",
        choices=("default", "ci"),
        default="default",
        help="default: 500 entities, ~16 min of one CPU core; ci: 100, ~3 min",
    )
    build.add_argument("--quiet", action="store_true", help="no progress bars")
    build.set_defaults(func=_world_build)
    ship = world_sub.add_parser(
        "ship",
        help="copy a default-size build's reader and world NLI into the package",
        description="For maintainers: after a change to the world, its vocabulary or the training "
        "recipe, `ragutil world build --out DIR` and then this copy DIR's reader, "
        "world NLI and build.json into ragutil_dagster/embedded/shipped, which "
        "`ragutil run` installs instead of training.",
    )
    ship.add_argument("--build", required=True, help="a `ragutil world build --out` directory")
    ship.set_defaults(func=_world_ship)

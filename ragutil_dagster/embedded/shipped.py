"""The world's reader and NLI trained by the project and shipped in the package.

Training them takes a quarter of an hour on two CPU cores; generating the world takes seconds.
So the package carries the trained ``reader/`` and ``world-nli/`` of the default world (seed 0)
with the ``build.json`` of the training that made them, and :func:`install` writes the world and
copies them into a build directory. The weights are valid only for the world, tokenizer and
training configuration they were trained on: the build record holds a :func:`fingerprint` of
those, and :func:`install` refuses (returns None, with the reason) when the current code
generates something else — the caller then trains.

A maintainer who changes the world, the vocabulary or the training recipe retrains and ships:
``ragutil world build --out DIR`` then ``ragutil world ship --build DIR``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ragutil_dagster.embedded import layout
from ragutil_dagster.embedded.training import CONFIGS, FINGERPRINT_KEY, fingerprint
from ragutil_dagster.embedded.world import make_world, write_world
from ragutil_dagster.infra.files import write_text_atomic

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
SHIPPED_MODELS = (layout.READER, layout.WORLD_NLI)
SHIPPED_SIZE, SHIPPED_SEED = "default", 0


def shipped_record() -> dict | None:
    """The shipped ``build.json`` (None when the package ships no models)."""
    path = SHIPPED_DIR / layout.BUILD_RECORD
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def install(out_dir: str | Path, size: str = SHIPPED_SIZE, seed: int = SHIPPED_SEED) -> str:
    """Write the world of ``seed`` and ``size`` and copy the shipped models into ``out_dir``.

    Returns "" when installed, else why not (nothing shipped for this size and seed, or models
    trained on something else than the current code generates); ``out_dir`` is then left
    untouched. ``build.json`` is written last: a build directory with one is complete.
    """
    record = shipped_record()
    if record is None or (record["size"], record["seed"]) != (size, seed):
        return f"the package ships no world models for size {size!r} and seed {seed}"
    current = fingerprint(size, seed)
    if record[FINGERPRINT_KEY] != current:
        return (
            f"the shipped world models were trained on another world, vocabulary or "
            f"training configuration (fingerprint {record[FINGERPRINT_KEY][:12]}; the current "
            f"code gives {current[:12]})"
        )
    root = Path(out_dir)
    write_world(make_world(seed, CONFIGS[size].world_size), root / layout.WORLD)
    for name in SHIPPED_MODELS:
        staging = root / f".{name}.installing"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(SHIPPED_DIR / name, staging)
        shutil.rmtree(root / name, ignore_errors=True)
        staging.replace(root / name)
    write_text_atomic(
        root / layout.BUILD_RECORD, json.dumps({**record, "installed_from": "package"}, indent=2)
    )
    return ""


def ship(build_dir: str | Path) -> Path:
    """Copy a build's reader, world NLI and build record into the package; return the package's
    directory. The build must fit the current code (its fingerprint, recorded at training)."""
    build = Path(build_dir)
    record = json.loads((build / layout.BUILD_RECORD).read_text(encoding="utf-8"))
    current = fingerprint(record["size"], record["seed"])
    if record.get(FINGERPRINT_KEY) != current:
        raise ValueError(
            f"{build} was trained on another world, vocabulary or training "
            f"configuration than the current code's: rebuild it before shipping"
        )
    shutil.rmtree(SHIPPED_DIR, ignore_errors=True)
    SHIPPED_DIR.mkdir(parents=True)
    for name in SHIPPED_MODELS:
        shutil.copytree(build / name, SHIPPED_DIR / name)
    write_text_atomic(SHIPPED_DIR / layout.BUILD_RECORD, json.dumps(record, indent=2))
    return SHIPPED_DIR

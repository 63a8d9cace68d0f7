"""Building, once, the parts of the embedded world that an experiment uses: the world with its
reader and world NLI (installed from the package, or trained when they do not fit the current
code) and the answer NLI ``embedded:nli``. ``ragutil run``, ``ragutil score`` and bench call it
before anything runs. With a shared artifact store (``$RAGUTIL_ARTIFACTS_URL``) the build is
published there for workers whose home lacks it, and a home without one takes the published copy
rather than installing or training again (infra/shared.py)."""

from __future__ import annotations

import shutil

from ragutil_dagster.config import DatasetConfig, ExperimentConfig
from ragutil_dagster.data.qa import dataset_folder
from ragutil_dagster.embedded import layout
from ragutil_dagster.embedded.layout import EMBEDDED_PREFIX
from ragutil_dagster.infra.files import embedded_dir
from ragutil_dagster.infra.shared import (
    EMBEDDED_BUILD,
    publish_directory,
    published_directory,
    shared_store,
)

WORLD_ONLY_MODEL_NAMES = tuple(f"{EMBEDDED_PREFIX}{name}" for name in layout.WORLD_ONLY_MODELS)


def is_embedded_world(dataset: DatasetConfig | None) -> bool:
    """Whether ``dataset`` is the embedded synthetic world (None — records — never is): a synthetic
    dataset with no path, or with the path of this home's world."""
    if dataset is None or dataset.format != "synthetic":
        return False
    return (
        dataset.path is None
        or dataset_folder(dataset).resolve() == (embedded_dir() / layout.WORLD).resolve()
    )


def ensure_embedded_models(
    experiment: ExperimentConfig, size: str = "default", progress: bool = True
) -> None:
    """Build, once, what of the embedded world and models ``experiment`` uses: the world with its
    reader and world NLI (the package's trained models, in seconds; trained, ≈ 16 min of one core,
    when they do not fit the current code), and the answer NLI ``embedded:nli`` (≈ 10 min of 2
    cores) when the config names it."""
    target = embedded_dir()
    answer_nli, world_nli = target / layout.ANSWER_NLI, target / layout.WORLD_NLI
    if (
        answer_nli.is_dir()
        and not (answer_nli / layout.ANSWER_NLI_RECORD).is_file()
        and not world_nli.exists()
    ):
        # A build from before the answer NLI: its nli/ is the world's NLI.
        answer_nli.rename(world_nli)
    models = [g.model for g in experiment.generators] + [experiment.nli.model]
    needs_world = any(m in WORLD_ONLY_MODEL_NAMES for m in models) or any(
        is_embedded_world(d) for d in experiment.datasets
    )
    wanted = needs_world or f"{EMBEDDED_PREFIX}{layout.ANSWER_NLI}" in models
    published = (
        published_directory(EMBEDDED_BUILD)
        if wanted and not (target / layout.BUILD_RECORD).is_file()
        else None
    )
    if published is not None:
        # Another machine installed or trained the build and published it: take its copy.
        shutil.copytree(published, target, dirs_exist_ok=True)
    if needs_world and not (target / layout.BUILD_RECORD).is_file():
        from ragutil_dagster.embedded.shipped import install
        from ragutil_dagster.embedded.training import format_quality, train_all

        not_installed = install(target, size=size)
        if not_installed:
            print(
                f"The embedded world and models are missing, and {not_installed}: training them "
                f"into {target} (once, ≈ 16 min of one core).",
                flush=True,
            )
            trained = train_all(target, size=size, progress=progress, answer_nli_size=None)
            print(format_quality(trained.quality), flush=True)
        else:
            print(
                f"The embedded world and the package's trained reader and world NLI: installed "
                f"into {target}.",
                flush=True,
            )
    if f"{EMBEDDED_PREFIX}{layout.ANSWER_NLI}" in models:
        ensure_answer_nli(progress)
    if target.is_dir() and publish_directory(EMBEDDED_BUILD, target):
        print(
            f"The embedded world and models: published for every worker to "
            f"{shared_store().display(EMBEDDED_BUILD)}.",
            flush=True,
        )


def ensure_answer_nli(progress: bool = True) -> None:
    """Train the answer NLI ``embedded:nli`` into ``$RAGUTIL_HOME`` unless it is there (≈ 10 min
    of 2 cores)."""
    from ragutil_dagster.embedded.answer_nli import is_trained, train_answer_nli

    answer_nli = embedded_dir() / layout.ANSWER_NLI
    if not is_trained(answer_nli):
        print(
            f"The answer NLI is missing or was trained by an older version: training it into "
            f"{answer_nli} (once).",
            flush=True,
        )
        train_answer_nli(answer_nli, progress=progress)

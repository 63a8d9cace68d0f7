"""Imported by a test's Celery worker (``--include wipe_home``): before every step the worker's
``$RAGUTIL_HOME`` and scratch directory are deleted, so no step can read what an earlier step
left on the worker's disk."""

import os
import shutil

from celery import signals


@signals.task_prerun.connect
def _wipe(**_) -> None:
    for variable in ("RAGUTIL_HOME", "TMPDIR"):
        shutil.rmtree(os.environ[variable], ignore_errors=True)
        os.makedirs(os.environ[variable])

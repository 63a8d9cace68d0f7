"""Dagster's compute logs (each step's stdout and stderr) on the disk of the process that ran the step.

The Dagster instance travels to every step process as a reference holding its configuration, the
compute logs' directory included: Dagster's own ``LocalComputeLogManager`` would make a Celery
worker on another machine write under the launching machine's ``$RAGUTIL_HOME`` — a path that
may not exist or be writable there. This manager writes where it is configured to (the
instance's ``storage`` directory, as Dagster's default does), except in a process that sets
:data:`WORKER_LOGS_VARIABLE` — a Celery worker sets it to its own home — which writes there.
"""

from __future__ import annotations

import os

from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager

WORKER_LOGS_VARIABLE = "RAGUTIL_WORKER_COMPUTE_LOGS"


class WorkerComputeLogManager(LocalComputeLogManager):
    """``LocalComputeLogManager`` under ``$RAGUTIL_WORKER_COMPUTE_LOGS`` when set, else ``base_dir``."""

    def __init__(self, base_dir: str, polling_timeout: float | None = None, inst_data=None):
        super().__init__(
            os.environ.get(WORKER_LOGS_VARIABLE) or base_dir, polling_timeout, inst_data
        )

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> WorkerComputeLogManager:
        return cls(inst_data=inst_data, **config_value)

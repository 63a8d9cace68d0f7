"""One contender of tests/tracking/test_claims.py, run as its own process: find-or-create the
LoggedModel of one identity and open the MLflow run of one key, logging a few artifacts slowly;
print what it got as JSON.

Usage: race_worker.py TRACKING_URI HOME RUN_KEY READY_FILE GO_FILE. The worker imports everything,
creates READY_FILE and waits for GO_FILE, so the contenders start their race together."""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from ragutil_dagster.tracking import MlflowTracking
from ragutil_dagster.tracking.entities import ModelSpec, logged_model_id

uri, home, key, ready, go = sys.argv[1:6]
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.01)
tracking = MlflowTracking(home=home, tracking_uri=uri)
model = logged_model_id(
    tracking,
    tracking.experiment_id("ragutil/race"),
    ModelSpec("generator", "lm", "some/lm", None, "sha256:race"),
)
with (
    tracking.run("ragutil/race", key, "race", "partition", {}) as run,
    tempfile.TemporaryDirectory() as staging,
):
    start = time.time()
    for part in range(3):  # slow enough that unordered writers would overlap
        path = Path(staging) / f"part{part}.txt"
        path.write_text(str(os.getpid()))
        run.log_artifact(path, "scores")
        time.sleep(0.3)
    end = time.time()
print(
    json.dumps(
        {
            "pid": os.getpid(),
            "run_id": run.run_id,
            "reused": run.reused,
            "model_id": model,
            "start": start,
            "end": end,
        }
    )
)

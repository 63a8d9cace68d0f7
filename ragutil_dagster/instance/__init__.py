"""Plugins of the Dagster instance that ``runner.dagster_instance`` writes into ``dagster.yaml``:
the SQLite event log with pool-slot claims under a file lock (``event_log.py``) and step logs on
the disk of the process that ran the step (``compute_logs.py``)."""

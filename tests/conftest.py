"""Suite-wide settings: offline hubs, and a run that executed no test counts as a failure."""

import os

import pytest

# Tests never reach a model hub; anything that tries must fail fast.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or exitstatus != 0:
        return
    ran = len(reporter.stats.get("passed", [])) + len(reporter.stats.get("failed", []))
    if ran == 0:
        reporter.write_line("no test ran: every collected test was skipped", red=True)
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED

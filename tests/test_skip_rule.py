"""The suite's skip rule (``skip_or_fail`` in tests/conftest.py): something a test needs that is
missing or broken skips it on a developer's machine, and fails it under CI (``CI=true``, which
.ci/run sets), since CI installs everything; only a missing CUDA device or FAISS GPU build skips
everywhere."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from .conftest import require_vllm, skip_or_fail

TESTS = Path(__file__).parent
# Every way a test can skip itself, written out.
SKIP_CALL = re.compile(r"pytest\.(skip\(|importorskip\(|mark\.skipif\()")
# The hardware a CI machine may lack: the one reason a test may skip without skip_or_fail.
HARDWARE = re.compile(r"cuda|gpu", re.IGNORECASE)


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_a_missing_install_fails_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(
        pytest.fail.Exception, match=r"Chromium is not installed — CI=true: \.ci/run installs it"
    ):
        skip_or_fail("Chromium is not installed")


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_a_missing_install_skips_outside_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="^Chromium is not installed$"):
        skip_or_fail("Chromium is not installed")


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_a_vllm_that_does_not_import_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setitem(
        sys.modules, "vllm", None
    )  # `import vllm` now raises ImportError, as a broken build
    with pytest.raises(
        outcome, match=r"vLLM is not installed or does not import \(import of vllm halted"
    ):
        require_vllm()


def test_every_skip_goes_through_the_rule_or_names_missing_hardware() -> None:
    """No test skips by itself for anything .ci/run installs: it calls skip_or_fail (or a helper
    that does), and a direct skip names the CUDA / GPU hardware it lacks."""
    direct = [
        f"{path.relative_to(TESTS)}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        if path != Path(__file__)
        for line in path.read_text().splitlines()
        if SKIP_CALL.search(line) and not HARDWARE.search(line)
    ]
    assert direct == ["conftest.py: pytest.skip(reason)"], direct  # the rule's own skip

"""Errors of a whole run, as the ``ragutil`` command reports them (kept free of heavy imports:
the CLI loads this module for every command)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagster._utils.error import SerializableErrorInfo

# Errors in what the user supplied: reported as one line (exit status 2), not as a crash.
USER_ERRORS = frozenset({
    "ConfigError", "CorpusValidationError", "ModelUnavailableError", "EmptyGoldAnswerError",
    "IndexMismatchError", "PromptTooLongError", "FileNotFoundError", "ArtifactWriteError",
})


class StepFailedError(RuntimeError):
    """A step of the run failed; names the step, its Dagster run and the error that caused it."""

    def __init__(self, step: str, run_id: str, error: SerializableErrorInfo | None) -> None:
        cause = _root_cause(error) if error is not None else None
        self.step, self.run_id = step, run_id
        self.cause_type = cause.cls_name if cause is not None else None
        self.user_error = self.cause_type in USER_ERRORS
        detail = f"{cause.cls_name}: {cause.message.strip()}" if cause is not None else "see the Dagster run log"
        super().__init__(f"{step} failed: {detail} (Dagster run {run_id}; full log in `ragutil ui`)")


def _root_cause(error: SerializableErrorInfo) -> SerializableErrorInfo:
    """The innermost error of Dagster's wrapping chain (a user error when one is on the chain)."""
    chain = [error]
    while (nxt := chain[-1].cause or chain[-1].context) is not None:
        chain.append(nxt)
    return next((e for e in reversed(chain) if e.cls_name in USER_ERRORS), chain[-1])

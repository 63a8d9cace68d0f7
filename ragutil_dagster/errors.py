"""Every error a user can cause and fix, in one place (kept free of heavy imports: the CLI and the
pure metric library load this module).

Each subclasses :class:`UserError`; every ``ragutil`` command prints one as a single line and exits
with status 2, and ``ragutil run`` recognises one as the root cause of a failed Dagster step by its
class name (Dagster serialises errors by name), so the set of names is derived from the classes.
Each class also keeps its historical builtin base (``ValueError`` …) so ``except ValueError``
callers keep working.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class SerializedError(Protocol):
    """What ragutil reads of an error Dagster recorded for a failed step (its serialised form)."""

    cls_name: str | None
    message: str
    cause: SerializedError | None
    context: SerializedError | None


class UserError(Exception):
    """Something in what the user supplied (config, files, model names, servers) is wrong; the
    message names the record / field and how to fix it."""


class ConfigError(UserError, ValueError):
    """The experiment config is invalid; the message names the file and every bad field."""


class CorpusValidationError(UserError, ValueError):
    """A corpus, query or qrels record is malformed.

    Carries the file, the 1-based line (or row, for Parquet) and the field at fault, so a
    user can open the file at the right place. ``line`` is ``None`` when the problem is
    with the file as a whole (for example a missing column).
    """

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.message = message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{what} {message}")


class IndexMismatchError(UserError, ValueError):
    """A saved index was loaded against a different corpus, model or format than it was built for."""


class IndexFormatError(UserError, ValueError):
    """A saved index directory is incomplete or its manifest is unreadable."""


class IncompleteEmbeddingsError(UserError, RuntimeError):
    """Passage embeddings computed in shards are not all there, or some were recorded for another
    corpus or encoder; names the shards (their ``passage_embeddings`` partition keys)."""


class ModelUnavailableError(UserError, RuntimeError):
    """A model cannot be found locally and cannot be fetched; the message says how to provide it."""


class EmptyGoldAnswerError(UserError, ValueError):
    """A gold answer is empty (or has no tokens), so no prediction can be judged against it."""


class PromptTooLongError(UserError, ValueError):
    """A question does not fit the generator's context even without any passage."""


class UnparseableOutputError(UserError, ValueError):
    """A verbalized utility judgment did not follow the requested output format."""


class ValidityError(UserError, ValueError):
    """The validity experiments cannot run on a dataset: it has no relevance judgments (no
    positive passage in its qrels); names the dataset and the config field."""


class ArtifactWriteError(UserError, OSError):
    """A file could not be written for lack of space or permission; names the file and the fix."""


class ArtifactStoreError(UserError, OSError):
    """The artifact store's URL cannot be opened (no fsspec driver for its scheme) or an artifact
    cannot be read consistently."""


class CorruptGGUFError(ModelUnavailableError):
    """A file named as a GGUF model is not one, or is truncated or damaged."""


class UnsupportedGGUFError(ModelUnavailableError):
    """A valid GGUF file whose tensor types or architecture transformers cannot load."""


class ModelRegistryError(UserError, RuntimeError):
    """The MLflow model registry could not be asked about a model (unreachable, credentials
    refused, or an error of its own); names the registry and its error."""


class NothingToCompareError(UserError, LookupError):
    """An experiment has no finished partition run in the MLflow store to compare."""


class DatabaseUnavailableError(UserError, ConnectionError):
    """A database named as the Dagster instance or the MLflow store refuses connections."""


class BrokerUnavailableError(UserError, ConnectionError):
    """The Celery executor's broker refuses connections, or restarted during a run (the steps
    queued there are lost); names the URL and how to go on."""


class DistributedSetupError(UserError):
    """The Celery executor is chosen but a store its workers must share is still on this machine's
    disk, or a step's worker died more often than the executor retries."""


class ServerUnavailableError(UserError):
    """A request still failed after every retry (server down, overloaded or erroring)."""


class ServerResponseError(UserError):
    """The server answered something this backend cannot use (malformed JSON, missing fields,
    a refused request); ``status`` is the HTTP status of a refusal, None for an answer given."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class MissingLogprobsError(ServerResponseError):
    """The server's answer lacks the sampled tokens' log-probabilities SePer needs."""


class MissingAPIKeyError(UserError):
    """The configured API-key environment variable is not set."""


class CapabilityMissingError(UserError):
    """A configured metric needs something this backend or server cannot give (prompt
    log-probs from a chat-only endpoint, attention weights from an engine); names the metric."""


def _subclass_names(cls: type) -> set[str]:
    names = {cls.__name__}
    for sub in cls.__subclasses__():
        names |= _subclass_names(sub)
    return names


def is_user_error(err: BaseException) -> bool:
    """Whether ``err`` is the user's to fix (a missing file they named counts too)."""
    return isinstance(err, (UserError, FileNotFoundError))


def user_error_names() -> frozenset[str]:
    """Class names of every user error (subclasses defined elsewhere included)."""
    return frozenset(_subclass_names(UserError) | {"FileNotFoundError"})


class StepFailedError(RuntimeError):
    """A step of the run failed; names the step, its Dagster run and the error that caused it."""

    def __init__(self, step: str, run_id: str, error: SerializedError | None) -> None:
        cause = _root_cause(error) if error is not None else None
        self.step, self.run_id = step, run_id
        self.cause_type = cause.cls_name if cause is not None else None
        self.user_error = self.cause_type in user_error_names()
        detail = (
            f"{cause.cls_name}: {_own_message(cause)}"
            if cause is not None
            else "see the Dagster run log"
        )
        super().__init__(
            f"{step} failed: {detail} (Dagster run {run_id}; full log in `ragutil ui`)"
        )


INTERRUPTED = "DagsterExecutionInterruptedError"
"""What Dagster raises in a step stopped by SIGINT, or by SIGTERM, which it maps to SIGINT."""


def is_interruption(error: SerializedError | None) -> bool:
    """Whether a step's or run's error is Dagster's interruption, anywhere on its chain."""
    while error is not None:
        if error.cls_name == INTERRUPTED:
            return True
        error = error.cause or error.context
    return False


class RunInterruptedError(RuntimeError):
    """``ragutil run`` was stopped by SIGTERM or Ctrl-C; the partitions it finished are kept."""

    def __init__(self, step: str) -> None:
        self.step = step
        super().__init__(
            f"stopped by SIGTERM or Ctrl-C during {step}; the steps that finished are kept and "
            "`ragutil run` with the same config continues from there"
        )


def _own_message(error: SerializedError) -> str:
    """The error's message without the ``module.Class: `` prefix Dagster keeps on errors raised by
    an executor (a step's errors come without it)."""
    message = error.message.strip()
    prefix, separator, rest = message.partition(": ")
    return rest if separator and prefix.rsplit(".", 1)[-1] == error.cls_name else message


def _root_cause(error: SerializedError) -> SerializedError:
    """The innermost error of Dagster's wrapping chain (a user error when one is on the chain)."""
    chain = [error]
    while (nxt := chain[-1].cause or chain[-1].context) is not None:
        chain.append(nxt)
    names = user_error_names()
    return next((e for e in reversed(chain) if e.cls_name in names), chain[-1])

"""Reading a config: YAML (a key given twice is an error) validated into :class:`ExperimentConfig`,
every problem listed with its field path, an unknown key with the keys its section takes."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterator
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from ragutil_dagster.config.experiment import ExperimentConfig
from ragutil_dagster.errors import ConfigError


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The config model a field holds, looking inside ``list[...]`` and ``... | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        if found := _model_in(argument):
            return found
    return None


def _keys_at(location: tuple[str | int, ...]) -> list[str]:
    """The keys the config section holding ``location``'s last key accepts."""
    model: type[BaseModel] | None = ExperimentConfig
    for part in location[:-1]:
        if isinstance(part, int):  # an item of a list section
            continue
        field = model.model_fields.get(part) if model else None
        model = _model_in(field.annotation) if field else None
    return list(model.model_fields) if model else []


def _unknown_key_message(location: tuple[str | int, ...]) -> str:
    keys = _keys_at(location)
    close = difflib.get_close_matches(str(location[-1]), keys, n=1, cutoff=0.6)
    if close:
        return f"unknown key (a typo?); did you mean {close[0]!r}?"
    return f"unknown key (a typo?); this section takes: {', '.join(keys)}"


def _format_errors(err: ValidationError) -> Iterator[str]:
    for item in err.errors():
        location = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = _unknown_key_message(item["loc"])
        elif item["type"] == "value_error":  # the validators' own messages show the value
            message = message.removeprefix("Value error, ")
        elif item["type"] != "missing" and not isinstance(item["input"], (dict, list)):
            message = f"{message} (got {item['input']!r})"
        yield f"{location}: {message}"


def parse_config(
    data: object, source: str = "<config>", config_dir: Path | None = None
) -> ExperimentConfig:
    """Validate a parsed YAML/JSON object; every problem is listed with its field path. A prompt
    template's relative ``file:`` path is read from ``config_dir`` (default: the working directory)."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        return ExperimentConfig.model_validate(data, context={"config_dir": config_dir})
    except ValidationError as err:
        problems = list(_format_errors(err))
        if len(problems) == 1:  # one problem reads best as one line
            raise ConfigError(f"{source}: invalid experiment config: {problems[0]}") from None
        listed = "\n".join(f"  {problem}" for problem in problems)
        raise ConfigError(f"{source}: invalid experiment config\n{listed}") from None


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment YAML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such experiment config") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise ConfigError(
            f"{path}{where}: not valid YAML ({getattr(err, 'problem', err)})"
        ) from None
    if data is None:
        raise ConfigError(f"{path}: empty experiment config")
    return parse_config(data, str(path), path.parent)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: plain
    ``safe_load`` keeps the last value silently, so an edited config could lose a setting."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in this mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

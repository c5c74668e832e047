"""Read a YAML file or a mapping into a ``VmcpConfig``; every problem becomes one ``path: message`` line."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import yaml
from marshmallow import ValidationError

from vmcp_actors.exceptions import ConfigError

from ._model import VmcpConfig
from ._schema import VmcpSchema

ROOT_PATH = "config"
_SCHEMA_LEVEL = "_schema"

PathPart = str | int


def load_config(path: str | os.PathLike[str]) -> VmcpConfig:
    """Load and validate the YAML config at ``path``; raise ``ConfigError`` listing every problem."""
    where = os.fspath(path)
    data = _parse_yaml(read_text_file(where), where)
    if data is None:
        raise ConfigError([f"{where}: the file is empty (expected a mapping with name and backends)"])
    return config_from_mapping(data)


# Every config file this process read (absolute paths): a stdio child's sandbox hides
# them, since they hold other backends' env values (API keys).
_files_read: set[str] = set()


def config_files_read() -> frozenset[str]:
    return frozenset(_files_read)


def read_text_file(where: str) -> str:
    """The UTF-8 text of a config file; ``ConfigError`` saying why it cannot be read."""
    try:
        with open(where, encoding="utf-8") as file:
            _files_read.add(os.path.realpath(where))
            return file.read()
    except FileNotFoundError:
        raise ConfigError([f"{where}: no such file"]) from None
    except IsADirectoryError:
        raise ConfigError([f"{where}: is a directory, not a file"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{where}: is not UTF-8 text"]) from None
    except OSError as exc:
        raise ConfigError([f"{where}: cannot be read ({exc.strerror or exc})"]) from None


def config_from_mapping(data: Any) -> VmcpConfig:
    """Validate already-parsed config data (e.g. from ``yaml.safe_load``) into a ``VmcpConfig``."""
    if not isinstance(data, Mapping):
        raise ConfigError([f"{ROOT_PATH}: must be a mapping"])
    try:
        return VmcpSchema().load(data)
    except ValidationError as err:
        raise ConfigError(error_lines(err.messages)) from None
    except RecursionError:  # a YAML alias used inside itself (`a: &x [*x]`), or absurd nesting
        raise ConfigError([f"{ROOT_PATH}: nested too deeply (is a YAML alias used inside itself?)"]) from None


def error_lines(messages: Any) -> list[str]:
    """Flatten marshmallow's nested ``err.messages`` into ``path: message`` lines, sorted by path."""
    found: list[tuple[tuple[PathPart, ...], str]] = []
    _flatten(messages, (), found)
    found.sort(key=lambda item: (tuple(_sort_key(part) for part in item[0]), item[1]))
    lines: list[str] = []
    for path, message in found:
        line = f"{_render_path(path)}: {message}"
        if line not in lines:
            lines.append(line)
    return lines


def _flatten(messages: Any, path: tuple[PathPart, ...], found: list[tuple[tuple[PathPart, ...], str]]) -> None:
    if isinstance(messages, Mapping):
        for key, value in messages.items():
            # Schema-level errors belong to the thing the schema describes.
            _flatten(value, path if key == _SCHEMA_LEVEL else (*path, key), found)
    elif isinstance(messages, (list, tuple)):
        for message in messages:
            _flatten(message, path, found)
    else:
        found.append((path, str(messages)))


def _render_path(path: tuple[PathPart, ...]) -> str:
    if not path:
        return ROOT_PATH
    text = "" if isinstance(path[0], str) else ROOT_PATH
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _sort_key(part: PathPart) -> tuple[int, int, str]:
    # Indices sort as numbers, so backends[2] comes before backends[10].
    return (0, part, "") if isinstance(part, int) else (1, 0, str(part))


class _UniqueKeyLoader(yaml.SafeLoader):
    """``SafeLoader`` that rejects duplicate keys instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError([f"{where}: YAML syntax error{at}: {exc.problem}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{where}: YAML syntax error: {exc}"]) from None

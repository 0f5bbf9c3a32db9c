"""Reading a config file strictly: text only, no duplicate keys, no silent type coercion."""

from __future__ import annotations

import stat
import types
import typing
from pathlib import Path

import yaml

from rloo.errors import ConfigError


class _NoDuplicates(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (plain YAML keeps the last one)."""


def _mapping(loader, node, deep=False):
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {key!r} appears twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep)


_NoDuplicates.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)

# Lists and sections inside each other deeper than this are no config (a section holds keys, a key
# a list of values): a value nested 3000 deep ran PyYAML's recursive composer past Python's stack.
MAX_DEPTH = 32


def load_yaml(text: str, loader: type = yaml.SafeLoader):
    """The YAML value of `text`, or a yaml.YAMLError whose `problem` says in one line what is wrong:
    PyYAML's own, nesting deeper than MAX_DEPTH (checked on the parser's events, which are read
    without recursion, before the recursive composer runs), or a value Python cannot hold (an
    integer of more than 4300 digits, a date such as 2001-13-45: a ValueError from the constructor)."""
    depth = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise yaml.MarkedYAMLError(problem=f"lists or sections nested more than {MAX_DEPTH} deep")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1
    try:
        return yaml.load(text, Loader=loader)
    except ValueError as e:  # yaml.YAMLError is no ValueError: PyYAML's own errors pass through
        if "integer string conversion" in str(e):
            raise yaml.MarkedYAMLError(problem="an integer of more than 4300 digits") from None
        raise yaml.MarkedYAMLError(problem=f"a value Python cannot hold ({str(e).splitlines()[0]})") from None


def read_yaml_mapping(p: Path) -> dict:
    """The mapping in YAML file `p`, or a one-line ConfigError (missing, binary, invalid, duplicate key)."""
    if not p.is_file():
        raise ConfigError(f"config file {p} {_what_it_is(p)}; pass a YAML file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not a text (UTF-8) file; pass a YAML file") from None
    if "\0" in text:
        raise ConfigError(f"config file {p} is not a text file (it holds NUL bytes); pass a YAML file")
    try:
        loaded = load_yaml(text, _NoDuplicates) or {}
    except yaml.YAMLError as e:
        problem = (e.problem if isinstance(e, yaml.MarkedYAMLError) else None) or str(e).splitlines()[0]
        raise ConfigError(f"config file {p} is not valid YAML: {problem}") from e
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {p} must hold a mapping of keys to values")
    return loaded


def _what_it_is(p: Path) -> str:
    """What a path that is not a regular file is, for the message (a FIFO would block a read)."""
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    kinds = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISSOCK: "a socket"}
    kind = next((name for test, name in kinds.items() if test(mode)), "a device or other special file")
    return f"is {kind}, not a regular file"


def _kinds(annotation) -> set:
    """The scalar types a field accepts, without None (`int | None` -> {int})."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return {a for a in typing.get_args(annotation) if a is not type(None)}
    return {annotation}


def reject_coercions(cls, data):
    """Raise for a boolean where a number is expected and a number where a boolean is: pydantic
    would quietly turn `seed: true` into 1 and `share_prompt: 1` into True. (Strings are left to
    pydantic: YAML 1.1 reads `1e-4` as a string, and its messages for `epochs=zero` are clear.)"""
    if not isinstance(data, dict):
        return data
    for name, field in cls.model_fields.items():
        v, kinds = data.get(name), _kinds(field.annotation)
        if kinds <= {int, float} and isinstance(v, bool):
            want = "an integer" if kinds == {int} else "a number"
            raise ValueError(f"{name}: expected {want}, got {v!r} (a boolean)")
        if kinds == {bool} and isinstance(v, (int, float)) and not isinstance(v, bool):
            raise ValueError(f"{name}: expected true or false, got {v!r} (a number)")
    return data

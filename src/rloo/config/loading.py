"""A config from defaults, then an optional YAML file, then `key=value` overrides from the command
line (dotted keys reach nested sections: `rl.k=8`). Values are parsed as YAML scalars, so
`beta=0.1`, `eval_every=null` work. Errors are one line per problem, naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from rloo.config.base import describe_validation_error
from rloo.config.confcheck import load_yaml, read_yaml_mapping
from rloo.config.method_settings import AlgorithmSettings
from rloo.config.methods import METHOD_SPECS
from rloo.errors import ConfigError

C = TypeVar("C", bound=BaseModel)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["rl.k=8", "beta=0.1"]` -> nested dict. Values are YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (example: rl.k=8)")
        key, raw = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with another override of {p!r}")
        node[parts[-1]] = _value(key.strip(), raw)
    return out


def _value(key: str, raw: str) -> Any:
    """The YAML value of override `key=raw` (empty: None), or a one-line ConfigError naming both."""
    if not raw.strip():
        return None
    try:
        return load_yaml(raw)
    except yaml.YAMLError as e:
        problem = (e.problem if isinstance(e, yaml.MarkedYAMLError) else None) or str(e).splitlines()[0]
        shown = repr(raw) if len(raw) <= 80 else repr(raw[:60]) + f"... ({len(raw)} characters)"
        raise ConfigError(
            f"override {key}={shown} is not a valid YAML value ({problem}); fix it, or quote it to pass it as "
            f"text: {key}=\"'...'\""
        ) from None


def _merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for k, v in extra.items():
        merged[k] = _merge(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None, **values: Any) -> C:
    """Build `cls` from a YAML file, `key=value` overrides and keyword values (highest wins)."""
    data: dict[str, Any] = {}
    if path is not None:
        data = _without_dumped_defaults(read_yaml_mapping(Path(path)))
    data = _merge(data, parse_overrides(overrides or []))
    data = _merge(data, values)
    try:
        return cls(**data)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, cls)) from e


def _without_dumped_defaults(data: dict) -> dict:
    """A config.yaml saved by a version before each method had its own settings lists every method's
    keys (the other methods' at their defaults: that version refused any other value). Fed back with
    --config, such a complete dump keeps its method's keys and any other key set away from its
    default (still refused, in one line); a hand-written file is taken as written."""
    every = set(AlgorithmSettings.model_fields)
    for node in [data, *(v for v in data.values() if isinstance(v, dict))]:
        key = next((k for k in ("algorithm_settings", "algo") if isinstance(node.get(k), dict)), None)
        algorithm = node.get("algorithm")
        spec = METHOD_SPECS.get(algorithm) if isinstance(algorithm, str) else None
        if key is None or spec is None or not every <= set(node[key]):
            continue
        defaults, own = AlgorithmSettings().model_dump(mode="json"), spec.settings_model.model_fields
        node[key] = {k: v for k, v in node[key].items() if k in own or v != defaults.get(k, v)}
    return data


def describe_fields(cls: type[BaseModel], prefix: str = "") -> list[str]:
    """Lines `key (default): description` for every field, nested sections expanded."""
    lines = []
    for name, f in cls.model_fields.items():
        ann = f.annotation
        # optional sections (`dataset: DatasetSettings | None`) are listed key by key too
        ann = next((a for a in get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            if not f.is_required() and f.get_default(call_default_factory=True) is None:
                lines.append(f"{prefix}{name} = None: {f.description or ''} Set any {prefix}{name}.* key to enable it.")
            lines += describe_fields(ann, prefix + name + ".")
            continue
        default = "required" if f.is_required() else repr(f.get_default(call_default_factory=True))
        lines.append(f"{prefix}{name} = {default}: {f.description or ''}".rstrip(": "))
    return lines


def save_config(cfg: BaseModel, path: Path) -> None:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


# Sections renamed since 0.1: old name -> new name (also accepted on input, see AliasChoices).
RENAMED = {"algo": "algorithm_settings"}


def upgrade_saved_config(saved: dict) -> dict:
    """A config saved by an earlier version (a run folder's config.yaml, a checkpoint) with its
    renamed sections under their present names, at the top and one level down (`rl.algo`), and
    only its method's own keys in `algorithm_settings`, so it compares equal to the same settings
    written today."""
    out = {}
    for k, v in saved.items():
        v = upgrade_saved_config(v) if isinstance(v, dict) and k not in RENAMED.values() else v
        out[RENAMED.get(k, k)] = v
    algorithm = out.get("algorithm")
    spec = METHOD_SPECS.get(algorithm) if isinstance(algorithm, str) else None
    if spec is not None and isinstance(out.get("algorithm_settings"), dict):
        # saved before each method had its own settings: every method's keys, the others' at their defaults
        own = spec.settings_model.model_fields
        out["algorithm_settings"] = {k: v for k, v in out["algorithm_settings"].items() if k in own}
    return out

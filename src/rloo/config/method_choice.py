"""`algorithm` and `algorithm_settings`: the method, chosen from the table (rloo.config.methods), and
its own settings. `algorithm_settings:` is validated as the chosen method's settings model, so a
setting of another method that the user gave (in YAML, as `key=value`, or set on a model: pydantic's
model_fields_set) is refused in one line naming the methods that take it, whatever its value. The
RL sections (rloo.config.sections) are built on `MethodChoice`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, ClassVar

from pydantic import (
    AliasChoices,
    BaseModel,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from rloo.config.base import Strict
from rloo.config.method_settings import AlgorithmSettings
from rloo.config.methods import DEFAULT_METHOD, METHOD_SPECS, one_of, takers


class MethodChoice(Strict):
    """The method and its own settings (the first keys of the RL sections)."""

    algorithm: str = Field(
        default=DEFAULT_METHOD,
        description="The method: "
        + ", ".join(f"{s.name} ({s.summary})" if s.summary else s.name for s in METHOD_SPECS.values())
        + ".",
    )
    # the chosen method's own settings model (`_own_settings`); typed as every built-in key for the reader
    algorithm_settings: SerializeAsAny[AlgorithmSettings] = Field(
        default_factory=AlgorithmSettings,
        validate_default=True,
        validation_alias=AliasChoices("algorithm_settings", "algo"),
        description="The method's own settings (docs/methods.md): a key another method takes is refused; "
        "`algo:` is accepted too (the section's name until 0.1).",
    )
    # False where the section is shared by several methods (`rloo compare`'s rl section)
    checks_own_settings: ClassVar[bool] = True

    @field_validator("algorithm")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in METHOD_SPECS:  # the table, read now: a method added by add_method is known too
            expected = ", ".join(repr(n) for n in list(METHOD_SPECS)[:-1]) + f" or {list(METHOD_SPECS)[-1]!r}"
            raise PydanticCustomError(
                "literal_error",
                "Input should be {expected} (a method of your own: load the module that adds it with --plugin)",
                {"expected": expected},
            )
        return v

    @field_validator("algorithm_settings", mode="wrap")
    @classmethod
    def _own_settings(cls, v, handler, info: ValidationInfo):
        algorithm = info.data.get("algorithm")
        if algorithm not in METHOD_SPECS:  # refused by `_known`: no model to choose
            return handler(v)
        return own_settings(algorithm, v) if cls.checks_own_settings else every_method_settings(v)

    @model_validator(mode="after")
    def _settings_of_the_method(self):
        # `cfg.algorithm = ...` alone leaves the settings of the former method: set both
        own = METHOD_SPECS[self.algorithm].settings_model
        if self.checks_own_settings and type(self.algorithm_settings) is not own:
            raise ValueError(
                f"algorithm_settings holds {type(self.algorithm_settings).__name__}, not {own.__name__} of "
                f"algorithm={self.algorithm}: set both together"
            )
        return self


def given_settings(value: Any) -> Any:
    """The settings the user gave: a mapping's keys, or a model's explicitly set ones (its
    model_fields_set; a saved or default model's other keys were not given)."""
    if isinstance(value, BaseModel):
        return {k: v for k, v in value if k in value.model_fields_set}  # a model iterates (field, value)
    return dict(value) if isinstance(value, Mapping) else value  # anything else: the model refuses it


def own_settings(algorithm: str, value: Any) -> Strict:
    """`algorithm_settings` as the method's own settings model. A key the method does not take is
    refused whatever its value: naming the methods that take it, or as unknown (ValidationError,
    one error per key, located at the key)."""
    model = METHOD_SPECS[algorithm].settings_model
    if type(value) is model:
        return value
    given = given_settings(value)
    if isinstance(given, dict):
        foreign = [k for k in given if k not in model.model_fields and takers(k)]
        if foreign:
            raise ValidationError.from_exception_data(
                model.__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "foreign_setting",
                            "is a setting of {takers}, not of algorithm={algorithm}",
                            {"takers": one_of(takers(k)), "algorithm": algorithm},
                        ),
                        loc=(k,),
                        input=given[k],
                    )
                    for k in foreign
                ],
            )
    return model.model_validate(given)


def every_method_settings(value: Any) -> Strict:
    """`algorithm_settings` shared by several methods (`rloo compare`'s rl section): any method's
    keys, each checked by every method that takes it; a method's run takes the given ones it has
    (`shared_settings`)."""
    given = given_settings(value)
    if isinstance(given, dict):
        for spec in METHOD_SPECS.values():
            own = spec.settings_model
            own.model_validate({k: v for k, v in given.items() if k in own.model_fields})
    return _every_model(tuple(s.settings_model for s in METHOD_SPECS.values())).model_validate(given)


@cache
def _every_model(models: tuple[type[Strict], ...]) -> type[Strict]:
    """One model with every key of `models` (the first to define a key gives its field)."""
    fields: dict[str, Any] = {}
    for model in models:
        for key, f in model.model_fields.items():
            fields.setdefault(key, (f.annotation, f))
    return create_model("EveryMethodSettings", __base__=Strict, **fields)


def shared_settings(algorithm: str, shared: BaseModel) -> dict:
    """The settings of a section shared by several methods that `algorithm` takes: those given."""
    own = METHOD_SPECS[algorithm].settings_model.model_fields
    return {k: v for k, v in given_settings(shared).items() if k in own}

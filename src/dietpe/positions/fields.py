"""A position method's own config fields: name, default, check and a one-line doc.

A method declares the `DietConfig` fields it reads (`PositionMethod.fields`); `DietConfig` takes them from
the registry, applies their defaults, checks their values with the field's own check, and refuses a
non-default value of a field the chosen method does not read, naming the methods that read it. A field may
default differently in causal attention (`causal_default`: a value, or a function of the config's sizes),
resolved when the config is built, so a saved config names the value its model was built with. A field read
by several methods (T5's buckets, also TUPE-R's) is declared once, in its owner's file, and named by the
others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from dietpe.errors import ConfigError

#: `Field.causal_default` when the field defaults alike in every model
SAME = object()


def positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be a positive integer")


def optional_positive_int(name: str, value) -> None:
    if value is not None:
        positive_int(name, value)


def positive_float(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{name}={value!r} must be a positive finite number")


def boolean(name: str, value) -> None:
    if value not in (True, False):
        raise ConfigError(f"{name}={value!r} must be true or false")


@dataclass(frozen=True)
class Field:
    """One config field of a method: `check(name, value)` raises ConfigError for a bad value;
    `causal_default`, its default in causal self-attention (a causal LM, a method attached to a decoder):
    a value, or `f(config)` of the config's common fields (its sizes)."""

    name: str
    default: object
    check: Callable[[str, object], None]
    doc: str
    causal_default: object = SAME

    def validate(self, value) -> None:
        self.check(self.name, value)

    def default_for(self, config, causal: bool):
        """The default in a model built from `config` (its common fields set), causal or not."""
        if not causal or self.causal_default is SAME:
            return self.default
        return self.causal_default(config) if callable(self.causal_default) else self.causal_default

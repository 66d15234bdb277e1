"""A position method's own config fields: name, default, check and a one-line doc.

A method declares the `DietConfig` fields it reads (`PositionMethod.fields`); `DietConfig` takes them from
the registry, applies their defaults, checks their values with the field's own check, and refuses a
non-default value of a field the chosen method does not read, naming the methods that read it. A field read
by several methods (T5's buckets, also TUPE-R's) is declared once, in its owner's file, and named by the
others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from dietpe.errors import ConfigError


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
    """One config field of a method: `check(name, value)` raises ConfigError for a bad value."""

    name: str
    default: object
    check: Callable[[str, object], None]
    doc: str

    def validate(self, value) -> None:
        self.check(self.name, value)

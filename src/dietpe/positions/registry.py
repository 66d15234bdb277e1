"""The position methods, one line each; every fact about a method is in the method's own file.

DIET (Chen et al. 2021) and TUPE (Ke et al. 2021) sort methods by *where* position enters; each method class
states it once (`PositionMethod.traits`, see `dietpe.positions.method.Traits`), with its config fields and
their checks (`fields`, `check_config`), its builder (`from_config`) and its reference equation
(`reference_logit` and the input/value hooks). Everything else reads them from here: `DietConfig` (its method
fields, their defaults and checks; learned tables, Linformer, sharing, backends), the backend choice, the
pipeline's default segments and the papers' list of methods, `dietpe bench`, and the tests' matrices
(tests/positions/test_references.py holds every entry to its reference).

Adding a method
    1. One file `dietpe/positions/<method>.py` with a `PositionMethod` subclass that sets `name`, `traits`,
       `fields` (new `Field`s declared in that file; a field of another method imported from its owner's
       file), `from_config(config)`, `check_config(config)` where fields must agree with the sizes, the
       terms (`embed` / `layer_terms`), and its reference (`reference_logit`, plus `reference_embedding` or
       `reference_value` for input or value terms), written with loops straight from the paper.
    2. One line below: `MethodInfo.of(NewMethod),` (with its import).
    Nothing else: `DietConfig` takes the fields (keyword, default, check, save and load), `position=` accepts
    the name, and every test matrix, `dietpe bench` and the method lists pick it up from this table.
"""

from __future__ import annotations

from dataclasses import dataclass, fields as dataclass_fields

from transformers import PretrainedConfig

from dietpe.positions.absolute import LearnedAbsolute, NoPosition, Sinusoidal
from dietpe.positions.alibi import ALiBi
from dietpe.positions.bert_ad import BertAd
from dietpe.positions.diet import DietAbs, DietRel
from dietpe.positions.fields import Field
from dietpe.positions.fire import Fire
from dietpe.positions.kerple import Kerple
from dietpe.positions.method import PositionMethod, Traits
from dietpe.positions.rotary import Rotary
from dietpe.positions.shaw import Shaw
from dietpe.positions.t5 import T5
from dietpe.positions.tupe import TupeA, TupeR
from dietpe.positions.xlnet import XLNet


@dataclass(frozen=True, kw_only=True)
class MethodInfo(Traits):
    """A registered method: its name and class, and its traits as attributes (`REGISTRY[name].relative`)."""

    name: str
    method: type[PositionMethod]

    @classmethod
    def of(cls, method: type[PositionMethod]) -> "MethodInfo":
        traits = {f.name: getattr(method.traits, f.name) for f in dataclass_fields(Traits)}
        return cls(name=method.name, method=method, **traits)

    @property
    def fields(self) -> tuple[Field, ...]:
        return self.method.fields

    def build(self, config: PretrainedConfig) -> PositionMethod:
        return self.method.from_config(config)

    def uses(self, field: str) -> bool:
        """Whether the method reads the config field `field` (one of `FIELDS`)."""
        return any(f.name == field for f in self.method.fields)


REGISTRY: dict[str, MethodInfo] = {m.name: m for m in (
    MethodInfo.of(NoPosition),
    MethodInfo.of(LearnedAbsolute),
    MethodInfo.of(Sinusoidal),
    MethodInfo.of(Shaw),
    MethodInfo.of(XLNet),
    MethodInfo.of(T5),
    MethodInfo.of(TupeA),
    MethodInfo.of(TupeR),
    MethodInfo.of(BertAd),
    MethodInfo.of(DietAbs),
    MethodInfo.of(DietRel),
    MethodInfo.of(Rotary),
    MethodInfo.of(ALiBi),
    MethodInfo.of(Kerple),
    MethodInfo.of(Fire),
)}

#: every method field once, by name, in registry order: what `DietConfig` takes besides its common fields
FIELDS: dict[str, Field] = {f.name: f for m in REGISTRY.values() for f in m.fields}


def names(**traits) -> tuple[str, ...]:
    """The methods with the given trait values, e.g. names(learned_table=True), in registry order."""
    return tuple(n for n, m in REGISTRY.items() if all(getattr(m, k) == v for k, v in traits.items()))


def users(field: str) -> tuple[str, ...]:
    """The methods that read the config field `field`, in registry order."""
    return tuple(n for n, m in REGISTRY.items() if m.uses(field))

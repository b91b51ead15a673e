"""Tile parameters: the *how* of a kernel, kept apart from the spec, with their limits declared.

Each family declares a frozen ``Tiles`` subclass whose ``PARAMS`` list every field's allowed
values.  The declarations serve validation now and enumeration for a tuner later.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from codegen.spec import SpecError

MAX_THREADS_PER_BLOCK = 1024
STATIC_SHARED_LIMIT = 48 * 1024
DYNAMIC_SHARED_LIMIT = 227 * 1024
"""Opt-in dynamic shared memory per block on sm_90 (cudaFuncAttributeMaxDynamicSharedMemorySize)."""


@dataclass(frozen=True)
class TileParam:
    """The allowed values of one tile field: explicit ``choices``, or an integer range with a step."""

    name: str
    doc: str
    choices: tuple[Any, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None
    multiple_of: int = 1

    def allowed(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        step = f", a multiple of {self.multiple_of}" if self.multiple_of > 1 else ""
        return f"an integer in [{self.minimum}, {self.maximum}]{step}"

    def check(self, value: Any) -> None:
        if self.choices is not None:
            if value not in self.choices:
                raise SpecError(f"tiles.{self.name}", value, self.allowed())
            return
        if isinstance(value, bool) or not isinstance(value, int) or not (
            self.minimum <= value <= self.maximum and value % self.multiple_of == 0
        ):
            raise SpecError(f"tiles.{self.name}", value, self.allowed())

    def values(self) -> list[Any]:
        if self.choices is not None:
            return list(self.choices)
        first = -(-self.minimum // self.multiple_of) * self.multiple_of
        return list(range(first, self.maximum + 1, self.multiple_of))


@dataclass(frozen=True)
class Tiles:
    """Base of every family's tile object: validates each field against its declared ``TileParam``."""

    PARAMS: ClassVar[tuple[TileParam, ...]] = ()

    def __post_init__(self) -> None:
        for param in self.PARAMS:
            param.check(getattr(self, param.name))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Tiles":
        cls.check_fields(data)
        return cls(**data)

    @classmethod
    def check_fields(cls, data: dict[str, Any]) -> None:
        """Each field of ``data`` by itself: a known name with an allowed value.  How the fields fit
        together (and with a spec) is the family's check, once the rest are chosen."""
        params = {p.name: p for p in cls.PARAMS}
        for key, value in data.items():
            if key not in params:
                raise SpecError(f"tiles.{key}", value, f"unknown tile for this family; its tiles are {', '.join(sorted(params))}")
            params[key].check(value)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.to_dict().items())


def check_block(threads: int, field: str, value: Any) -> None:
    if threads > MAX_THREADS_PER_BLOCK:
        raise SpecError(field, value, f"gives {threads} threads per block; at most {MAX_THREADS_PER_BLOCK} are allowed")


def check_shared(nbytes: int, field: str, value: Any, dynamic: bool = False) -> None:
    """Static shared memory stops at 48 KB; dynamic goes to the sm_90 opt-in limit."""
    limit = DYNAMIC_SHARED_LIMIT if dynamic else STATIC_SHARED_LIMIT
    if nbytes > limit:
        kind = " (sm_90 opt-in dynamic shared memory)" if dynamic else ""
        raise SpecError(field, value, f"needs {nbytes} bytes of shared memory; at most {limit} are allowed{kind}")

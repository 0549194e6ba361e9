"""Target-family strategies: one object per family answers what a family decides.

``strategy(hw)`` gives the :class:`~.base.Family` of a hardware description (or of a
family name), ``family_of(target)`` that of a TVM target (or its dict, or its kind).
Adding a family is one new module here, defining ``FAMILY``, plus its entry in
``_MODULES``.
"""

from __future__ import annotations

from typing import Mapping

from ..errors import TargetError
from . import cpu, cuda, rocm
from .base import (CDNA_OCCUPANCY, CODE_OBJECT, CUDA_OCCUPANCY, PLAIN_OCCUPANCY, PTXAS,
                   Family)

_MODULES = (cpu, cuda, rocm)
FAMILIES: Mapping[str, Family] = {m.FAMILY.name: m.FAMILY for m in _MODULES}
_BY_KIND: Mapping[str, Family] = {f.tvm_kind: f for f in FAMILIES.values()}

__all__ = ["CDNA_OCCUPANCY", "CODE_OBJECT", "CUDA_OCCUPANCY", "FAMILIES", "Family",
           "PLAIN_OCCUPANCY", "PTXAS", "family_names", "family_of", "strategy"]


def family_names() -> tuple[str, ...]:
    """The known families, sorted."""
    return tuple(sorted(FAMILIES))


def strategy(hw) -> Family:
    """The family of ``hw``: a :class:`~tvm_fusion.targets.HardwareTarget` (or anything
    with a ``family`` attribute) or a family name.

    Raises
    ------
    TargetError
        An unknown family (the message lists the known ones).
    """
    name = hw if isinstance(hw, str) else getattr(hw, "family", None)
    found = FAMILIES.get(name) if isinstance(name, str) else None
    if found is None:
        raise TargetError(f"unknown target family {name!r}; known families: "
                          f"{', '.join(family_names())} (a new one is a module in "
                          "tvm_fusion/family/ registered in its __init__)")
    return found


def family_of(target, *, missing_ok: bool = False) -> Family | None:
    """The family of a ``tvm.target.Target``, a target dict or a TVM target kind name.

    Raises
    ------
    TargetError
        A kind no family builds for (the message lists the known kinds); with
        ``missing_ok``, None instead.
    """
    if isinstance(target, str):
        kind = target
    elif isinstance(target, Mapping):
        kind = target.get("kind")
    else:
        kind = str(target.kind.name)
    found = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if found is None and not missing_ok:
        raise TargetError(f"no target family for TVM target kind {kind!r}; known kinds: "
                          + ", ".join(f"{f.tvm_kind} ({f.name})" for f in FAMILIES.values()))
    return found

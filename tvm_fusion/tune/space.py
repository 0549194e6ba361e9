"""Search spaces declared in ``search_spaces/<family>.json``, turned into MetaSchedule spaces.

A file names, per target family (cpu, cuda, rocm), the schedule rules in the order
MetaSchedule applies them and every number they take: the multi-level tiling structure
and its limits, where a fused group's producers and epilogue are computed relative to the
anchor's tiles (inlining, ``reuse_write``, compute location), parallel / vector / unroll
limits, thread binding, shared-memory / LDS staging, postprocessors and mutation
probabilities. :func:`space_generator` builds a ``PostOrderApply`` from it. Unknown and
missing keys are refused with the key and the file named.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.schedule_rule import ReuseType
from tvm.target.codegen import target_has_features

from ..data import search_spaces_dir
from ..errors import TargetError, TvmFusionError
from ..family import FAMILIES, family_of, strategy
from ..schedules.cpu_rules import (MutateTileChoice, PlainConfig, PlainRule,
                                   RegisterTileConfig, RegisterTileRule, vector_shape)
from ..compat.fast_import import import_tensor_intrinsics
from ..compat.ms_compat import schedule_pools_like_reductions

SPACE_DIR = search_spaces_dir()
SCHEMA = "tvm-fusion/search-space"
VERSION = 1


class SearchSpaceError(TvmFusionError):
    """A search-space file that cannot be read, or does not fit its target."""


@dataclass(frozen=True, kw_only=True)
class Reuse:
    """Cache staging at tile levels (``req``: ``no`` / ``may`` / ``must``)."""

    req: str
    levels: tuple[int, ...]
    scope: str


@dataclass(frozen=True, kw_only=True)
class Tiling:
    """MultiLevelTiling: S/R structure, thread binds, limits, read/write staging."""

    structure: str
    tile_binds: tuple[str, ...] | None
    max_innermost_factor: int
    vector_load_lens: tuple[int, ...] | None
    reuse_read: Reuse | None
    reuse_write: Reuse | None


@dataclass(frozen=True, kw_only=True)
class Tensorize:
    """A tensor intrinsic tiled in when the target has every one of ``requires``."""

    intrin: str
    requires: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Inline:
    """AutoInline: which producers / consumers are inlined into the anchor."""

    into_producer: bool
    into_consumer: bool
    inline_const_tensor: bool
    disallow_if_then_else: bool
    require_injective: bool
    require_ordered: bool
    disallow_op: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class RFactor:
    """AddRFactor: parallelize reductions that lack spatial parallelism."""

    max_jobs_per_core: int
    max_innermost_factor: int


@dataclass(frozen=True, kw_only=True)
class CrossThreadReduction:
    """GPU block-wide reductions with these thread counts."""

    thread_extents: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class ParallelVectorizeUnroll:
    """Parallel extent per core, vector extent limit, sampled unroll depths."""

    max_jobs_per_core: int
    max_vectorize_extent: int
    unroll_max_steps: tuple[int, ...]
    unroll_explicit: bool


@dataclass(frozen=True, kw_only=True)
class ThreadBinding:
    """AutoBind for GPU blocks no other rule bound; ``warp_size`` must match the target."""

    warp_size: int
    max_threadblocks: int
    thread_extents: tuple[int, ...]
    max_threads_per_block: int


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """One target family's schedule space (see ``search_spaces/*.json``)."""

    family: str
    description: str
    rules: tuple[str, ...]
    tiling: Tiling
    tensorize: tuple[Tensorize, ...]
    inline: Inline | None
    rfactor: RFactor | None
    cross_thread_reduction: CrossThreadReduction | None
    parallel_vectorize_unroll: ParallelVectorizeUnroll | None
    random_compute_location: bool
    thread_binding: ThreadBinding | None
    register_tile: RegisterTileConfig | None
    depthwise: RegisterTileConfig | None
    plain: PlainConfig | None
    postprocs: tuple[str, ...]
    mutators: Mapping[str, float]
    notes: Mapping[str, str]
    origin: str


_SECTIONS = {"tiling": Tiling, "inline": Inline, "rfactor": RFactor,
             "cross_thread_reduction": CrossThreadReduction,
             "parallel_vectorize_unroll": ParallelVectorizeUnroll,
             "thread_binding": ThreadBinding, "register_tile": RegisterTileConfig,
             "depthwise": RegisterTileConfig, "plain": PlainConfig}
_TOP = ("schema", "version", "family", "description", "rules", "tiling", "tensorize",
        "inline", "rfactor", "cross_thread_reduction", "parallel_vectorize_unroll",
        "random_compute_location", "thread_binding", "register_tile", "depthwise", "plain",
        "postprocs", "mutators", "notes")
# tvm-fusion's own CPU rules (schedules/cpu_rules.py): a file without them reads as null
_OPTIONAL = ("register_tile", "depthwise", "plain")
_CPU_ONLY = ("register_tile", "depthwise", "plain")
# rule name -> the section that configures it (None: takes no numbers)
RULES = {"custom": None, "inline_constant_scalars": None, "inline": "inline",
         "rfactor": "rfactor", "tiling": "tiling",
         "cross_thread_reduction": "cross_thread_reduction",
         "parallel_vectorize_unroll": "parallel_vectorize_unroll",
         "random_compute_location": "random_compute_location",
         "thread_binding": "thread_binding", "register_tile": "register_tile",
         "depthwise": "depthwise", "plain": "plain"}
POSTPROCS = ("disallow_dynamic_loop", "rewrite_cooperative_fetch", "rewrite_unbound_block",
             "rewrite_parallel_vectorize_unroll", "rewrite_reduction_block",
             "rewrite_tensorize", "rewrite_layout", "verify_gpu_code")
MUTATORS = ("tile_size", "compute_location", "unroll", "parallel", "thread_binding",
            "tile_choice")


def _fields(cls) -> tuple[str, ...]:
    return tuple(cls.__dataclass_fields__)


def _check_keys(doc: Any, expected: tuple[str, ...], where: str, origin: str) -> None:
    if not isinstance(doc, dict):
        raise SearchSpaceError(f"{origin}: {where} must be a JSON object with keys "
                               f"{', '.join(expected)}; got {type(doc).__name__}")
    for key in doc:
        if key not in expected:
            raise SearchSpaceError(f"{origin}: unknown key {where}{key!r}. Expected keys "
                                   f"there: {', '.join(expected)}")
    for key in expected:
        if key not in doc:
            raise SearchSpaceError(f"{origin}: missing field {where}{key!r}. Expected keys "
                                   f"there: {', '.join(expected)}")


def _value(kind, v, where: str, origin: str):
    """Check one JSON value against a dataclass field's annotation text."""
    ok = {"int": lambda x: isinstance(x, int) and not isinstance(x, bool),
          "str": lambda x: isinstance(x, str),
          "bool": lambda x: isinstance(x, bool)}
    optional = kind.endswith(" | None")
    kind = kind.removesuffix(" | None")
    if v is None:
        if optional:
            return None
        raise SearchSpaceError(f"{origin}: {where} must not be null")
    if kind.startswith("tuple["):
        inner = kind[len("tuple["):].split(",")[0].strip()
        if not isinstance(v, list) or not all(ok[inner](x) for x in v):
            raise SearchSpaceError(f"{origin}: {where} must be a list of {inner}; got {v!r}")
        return tuple(v)
    if kind == "Reuse":
        _check_keys(v, _fields(Reuse), f"{where}.", origin)
        if v["req"] not in ("no", "may", "must"):
            raise SearchSpaceError(f"{origin}: {where}.req must be 'no', 'may' or 'must'; "
                                   f"got {v['req']!r}")
        return Reuse(req=v["req"], levels=_value("tuple[int, ...]", v["levels"],
                                                 f"{where}.levels", origin),
                     scope=_value("str", v["scope"], f"{where}.scope", origin))
    if not ok[kind](v):
        raise SearchSpaceError(f"{origin}: {where} must be {kind}; got {v!r}")
    return v


def _section(cls, doc, name: str, origin: str):
    # fields with a default were added later: files written before may omit them
    fields = cls.__dataclass_fields__.values()
    optional = {f.name for f in fields if f.default is not dataclasses.MISSING}
    if isinstance(doc, dict):
        doc = {**{k: None for k in optional if k not in doc}, **doc}
    _check_keys(doc, _fields(cls), f"{name}.", origin)
    return cls(**{f.name: _value(f.type, doc[f.name], f"{name}.{f.name}", origin)
                  for f in fields})


def space_from_dict(doc: Any, *, origin: str = "<dict>") -> SearchSpace:
    """Validate a search-space document and build a :class:`SearchSpace`.

    Parameters
    ----------
    doc : dict
        Parsed JSON in the ``search_spaces/*.json`` schema.
    origin : str
        Where it came from, for error messages.

    Raises
    ------
    SearchSpaceError
        Unknown or missing keys, wrong types, unknown rule / postprocessor / mutator
        names, or a configured section that no rule uses.
    """
    if isinstance(doc, dict):
        doc = {**{k: None for k in _OPTIONAL}, **doc}
    _check_keys(doc, _TOP, "", origin)
    if doc["schema"] != SCHEMA or doc["version"] != VERSION:
        raise SearchSpaceError(f"{origin}: schema {doc['schema']!r} version {doc['version']!r}"
                               f"; this tvm-fusion reads {SCHEMA!r} version {VERSION}")
    try:
        family = strategy(doc["family"])
    except TargetError:
        raise SearchSpaceError(f"{origin}: family {doc['family']!r} is not one of "
                               f"{', '.join(FAMILIES)}") from None
    sections = {}
    for name, cls in _SECTIONS.items():
        if doc[name] is None:
            if name == "tiling":
                raise SearchSpaceError(f"{origin}: 'tiling' must not be null")
            sections[name] = None
        else:
            sections[name] = _section(cls, doc[name], name, origin)
    rules = _value("tuple[str, ...]", doc["rules"], "rules", origin)
    for r in rules:
        if r not in RULES:
            raise SearchSpaceError(f"{origin}: unknown rule {r!r} in 'rules'. Known rules: "
                                   f"{', '.join(RULES)}")
    if len(set(rules)) != len(rules):
        raise SearchSpaceError(f"{origin}: 'rules' names a rule twice: {list(rules)}")
    rcl = _value("bool", doc["random_compute_location"], "random_compute_location", origin)
    configured = {k for k, v in sections.items() if v is not None}
    configured |= {"random_compute_location"} if rcl else set()
    used = {RULES[r] for r in rules} - {None}
    if configured - used or used - configured:
        raise SearchSpaceError(
            f"{origin}: sections {sorted(configured - used)} are configured but not in "
            f"'rules', and rules {sorted(used - configured)} have no section (null). Each "
            f"rule in 'rules' needs its section and each non-null section its rule")
    for name in _CPU_ONLY:
        if sections[name] is not None and not family.vector_fma_rules:
            raise SearchSpaceError(f"{origin}: rule {name!r} schedules vector FMAs of LLVM "
                                   f"CPUs; a {doc['family']!r} space cannot use it (remove "
                                   f"it from 'rules' and set {name!r} to null)")
    _check_cpu_rules(sections, origin)
    tensorize = doc["tensorize"]
    if not isinstance(tensorize, list):
        raise SearchSpaceError(f"{origin}: 'tensorize' must be a list of "
                               "{{\"intrin\": ..., \"requires\": [...]}}")
    tens = tuple(_section(Tensorize, t, f"tensorize[{i}]", origin)
                 for i, t in enumerate(tensorize))
    postprocs = _value("tuple[str, ...]", doc["postprocs"], "postprocs", origin)
    for p in postprocs:
        if p not in POSTPROCS:
            raise SearchSpaceError(f"{origin}: unknown postproc {p!r}. Known: "
                                   f"{', '.join(POSTPROCS)}")
    mut = doc["mutators"]
    if not isinstance(mut, dict):
        raise SearchSpaceError(f"{origin}: 'mutators' must map mutator names to probabilities")
    for k, v in mut.items():
        if k not in MUTATORS:
            raise SearchSpaceError(f"{origin}: unknown mutator {k!r}. Known: {', '.join(MUTATORS)}")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1:
            raise SearchSpaceError(f"{origin}: mutators.{k} must be a probability in [0, 1]; "
                                   f"got {v!r}")
    if "parallel" in mut and sections["parallel_vectorize_unroll"] is None:
        raise SearchSpaceError(f"{origin}: mutator 'parallel' takes max_jobs_per_core from "
                               "'parallel_vectorize_unroll', which is null")
    notes = doc["notes"]
    if not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
        raise SearchSpaceError(f"{origin}: 'notes' must map knob names to strings")
    knobs = set(_TOP) | set(_fields(Tiling))
    for k in notes:
        if k not in knobs:
            raise SearchSpaceError(f"{origin}: note on unknown knob {k!r}; notes explain "
                                   f"top-level sections or tiling fields")
    return SearchSpace(family=doc["family"], description=_value("str", doc["description"],
                       "description", origin), rules=rules, tensorize=tens,
                       random_compute_location=rcl, postprocs=postprocs,
                       mutators=MappingProxyType(dict(mut)),
                       notes=MappingProxyType(dict(notes)), origin=origin, **sections)


_MAX_VECTOR_REGISTERS = 32  # AVX-512 and Arm NEON; AVX2 has 16, checked per target


def _check_cpu_rules(sections, origin: str) -> None:
    """Numbers of the CPU rules that cannot give a schedule are refused at load time."""
    for name in ("register_tile", "depthwise"):
        cfg = sections[name]
        if cfg is None:
            continue
        if not cfg.row_limits:
            raise SearchSpaceError(f"{origin}: {name}.row_limits is empty; give at least one "
                                   f"row limit (e.g. [8, 4]), or set {name!r} to null")
        if not 0 <= cfg.spare_registers < _MAX_VECTOR_REGISTERS:
            raise SearchSpaceError(f"{origin}: {name}.spare_registers must be in 0.."
                                   f"{_MAX_VECTOR_REGISTERS - 1}; got {cfg.spare_registers}")
        room = _MAX_VECTOR_REGISTERS - cfg.spare_registers
        bad = [r for r in cfg.row_limits if not 1 <= r <= room]
        if bad:
            raise SearchSpaceError(
                f"{origin}: {name}.row_limits {list(cfg.row_limits)} has {bad}: a tile of "
                f"R rows holds at least R accumulators and a CPU has at most "
                f"{_MAX_VECTOR_REGISTERS} vector registers, {cfg.spare_registers} of them "
                f"spare; use row limits from 1 to {room}")
        if cfg.fill_percent is not None and not 1 <= cfg.fill_percent <= 100:
            raise SearchSpaceError(f"{origin}: {name}.fill_percent must be in 1..100 (the "
                                   f"least share of the fullest tile's accumulators a "
                                   f"sampled tile uses) or null; got {cfg.fill_percent}")
        if cfg.min_iterations < 0:
            raise SearchSpaceError(f"{origin}: {name}.min_iterations must be >= 0; got "
                                   f"{cfg.min_iterations}")
    plain = sections["plain"]
    if plain is not None and (plain.max_iterations < 1 or plain.max_unroll_vectors < 1):
        raise SearchSpaceError(f"{origin}: plain.max_iterations and plain."
                               f"max_unroll_vectors must be >= 1; got {plain.max_iterations} "
                               f"and {plain.max_unroll_vectors}")


def load_search_space(name_or_path: str | os.PathLike) -> SearchSpace:
    """Load ``search_spaces/<name>.json`` (``cpu``, ``cuda``, ``rocm``) or a JSON file.

    Parameters
    ----------
    name_or_path : str or os.PathLike
        A family name or a path to a ``.json`` file.

    Returns
    -------
    SearchSpace

    Raises
    ------
    SearchSpaceError
        Unknown name, unreadable file, or a document :func:`space_from_dict` refuses.
    """
    text = os.fspath(name_or_path)
    is_path = isinstance(name_or_path, os.PathLike) or text.endswith(".json") or os.sep in text
    path = Path(text) if is_path else SPACE_DIR / f"{text}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SPACE_DIR.glob("*.json")))
        raise SearchSpaceError(f"search space {text!r} not found ({path}). Known: {known}; "
                               "or pass a path to a .json file")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SearchSpaceError(f"{path}: cannot read the search space as JSON: {exc}") from exc
    return space_from_dict(doc, origin=str(path))


def space_for_target(target) -> SearchSpace:
    """The shipped space of a ``tvm.target.Target``'s family (llvm -> cpu)."""
    family = family_of(target, missing_ok=True)
    if family is None:
        raise SearchSpaceError(f"no search space for TVM target kind {str(target.kind.name)!r}"
                               "; known kinds: "
                               f"{', '.join(f.tvm_kind for f in FAMILIES.values())}")
    return load_search_space(family.name)


def _reuse(r: Reuse | None):
    return None if r is None else ReuseType(req=r.req, levels=list(r.levels), scope=r.scope)


def _tiling_rules(space: SearchSpace, target) -> list:
    t = space.tiling
    common = dict(structure=t.structure,
                  tile_binds=list(t.tile_binds) if t.tile_binds is not None else None,
                  max_innermost_factor=t.max_innermost_factor,
                  vector_load_lens=(list(t.vector_load_lens)
                                    if t.vector_load_lens is not None else None),
                  reuse_read=_reuse(t.reuse_read), reuse_write=_reuse(t.reuse_write))
    rules = []
    if family_of(target).vector_fma_rules:
        # like MetaSchedule's DefaultX86: the first intrinsic the CPU supports, if any
        for entry in space.tensorize:
            if target_has_features(list(entry.requires), target):
                import_tensor_intrinsics()
                if entry.intrin == "tvmf_dot_16x4_vnni":  # ours: schedules/vnni.py
                    from ..schedules.vnni import register_vnni_intrin
                    register_vnni_intrin()
                rules.append(ms.schedule_rule.MultiLevelTilingWithIntrin(
                    intrin_name=entry.intrin, **common))
                break
    rules.append(ms.schedule_rule.MultiLevelTiling(**common))
    return rules


def _check_target(space: SearchSpace, target) -> None:
    kind = str(target.kind.name)
    family = family_of(target, missing_ok=True)
    if family is not strategy(space.family):
        raise SearchSpaceError(f"{space.origin}: a {space.family!r} space cannot schedule "
                               f"for TVM target kind {kind!r}; use "
                               f"{family.name if family else '?'}.json")
    shape = vector_shape(target) if family.vector_fma_rules else None
    for name in ("register_tile", "depthwise"):
        cfg = getattr(space, name)
        if cfg is None or shape is None:
            continue
        room = shape[1] - cfg.spare_registers
        if max(cfg.row_limits) > room:
            raise SearchSpaceError(
                f"{space.origin}: {name}.row_limits go up to {max(cfg.row_limits)} rows but "
                f"this target has {shape[1]} vector registers and spare_registers is "
                f"{cfg.spare_registers}, which leaves {room} accumulators; use row limits "
                f"up to {room} for it")
    tb = space.thread_binding
    if tb is not None:
        warp = target.attrs.get("thread_warp_size")
        if warp is not None and int(warp) != tb.warp_size:
            raise SearchSpaceError(f"{space.origin}: thread_binding.warp_size is "
                                   f"{tb.warp_size} but the target's thread_warp_size is "
                                   f"{int(warp)}; fix the file or the target")
        cap = target.attrs.get("max_threads_per_block")
        if cap is not None and max(tb.thread_extents) > int(cap):
            raise SearchSpaceError(f"{space.origin}: thread_binding.thread_extents go up to "
                                   f"{max(tb.thread_extents)} threads but the target allows "
                                   f"{int(cap)} per block")


def space_generator(space: SearchSpace, target):
    """A MetaSchedule ``PostOrderApply`` with the rules, postprocessors and mutators of ``space``.

    Parameters
    ----------
    space : SearchSpace
    target : tvm.target.Target
        Its kind must be the space's family; CPU features decide the tensorize rule.

    Returns
    -------
    tvm.s_tir.meta_schedule.space_generator.PostOrderApply
    """
    _check_target(space, target)
    schedule_pools_like_reductions()
    sr, pp, mu = ms.schedule_rule, ms.postproc, ms.mutator
    rules = []
    for name in space.rules:
        if name == "custom":
            rules.append(sr.ApplyCustomRule())
        elif name == "inline_constant_scalars":
            rules.append(sr.InlineConstantScalars())
        elif name == "inline":
            i = space.inline
            rules.append(sr.AutoInline(
                into_producer=i.into_producer, into_consumer=i.into_consumer,
                inline_const_tensor=i.inline_const_tensor,
                disallow_if_then_else=i.disallow_if_then_else,
                require_injective=i.require_injective, require_ordered=i.require_ordered,
                disallow_op=list(i.disallow_op)))
        elif name == "rfactor":
            rules.append(sr.AddRFactor(max_jobs_per_core=space.rfactor.max_jobs_per_core,
                                       max_innermost_factor=space.rfactor.max_innermost_factor))
        elif name == "tiling":
            rules.extend(_tiling_rules(space, target))
        elif name == "cross_thread_reduction":
            rules.append(sr.CrossThreadReduction(
                thread_extents=list(space.cross_thread_reduction.thread_extents)))
        elif name == "parallel_vectorize_unroll":
            p = space.parallel_vectorize_unroll
            rules.append(sr.ParallelizeVectorizeUnroll(
                max_jobs_per_core=p.max_jobs_per_core,
                max_vectorize_extent=p.max_vectorize_extent,
                unroll_max_steps=list(p.unroll_max_steps), unroll_explicit=p.unroll_explicit))
        elif name == "random_compute_location":
            rules.append(sr.RandomComputeLocation())
        elif name == "register_tile":
            rules.append(RegisterTileRule(space.register_tile))
        elif name == "depthwise":
            rules.append(RegisterTileRule(space.depthwise, depthwise=True))
        elif name == "plain":
            rules.append(PlainRule(space.plain))
        elif name == "thread_binding":
            b = space.thread_binding
            rules.append(sr.AutoBind(max_threadblocks=b.max_threadblocks,
                                     thread_extents=list(b.thread_extents),
                                     max_threads_per_block=b.max_threads_per_block))
    makers = {
        "disallow_dynamic_loop": pp.DisallowDynamicLoop,
        "rewrite_cooperative_fetch": pp.RewriteCooperativeFetch,
        "rewrite_unbound_block": lambda: pp.RewriteUnboundBlock(
            max_threadblocks=space.thread_binding.max_threadblocks
            if space.thread_binding else 256),
        "rewrite_parallel_vectorize_unroll": pp.RewriteParallelVectorizeUnroll,
        "rewrite_reduction_block": pp.RewriteReductionBlock,
        # CPU intrinsics keep their init loop vectorized, as MetaSchedule's CPU default
        "rewrite_tensorize": lambda: pp.RewriteTensorize(
            vectorize_init_loop=strategy(space.family).vectorize_tensorize_init),
        "rewrite_layout": pp.RewriteLayout,
        "verify_gpu_code": pp.VerifyGPUCode,
    }
    postprocs = [makers[p]() for p in space.postprocs]
    if any(isinstance(r, sr.MultiLevelTilingWithIntrin) for r in rules) \
            and "rewrite_parallel_vectorize_unroll" in space.postprocs:
        from ..schedules.vnni import SerialAroundTensorize  # only with an intrinsic
        postprocs.insert(list(space.postprocs).index("rewrite_parallel_vectorize_unroll"),
                         SerialAroundTensorize())
    mutator_makers = {
        "tile_size": mu.MutateTileSize, "compute_location": mu.MutateComputeLocation,
        "unroll": mu.MutateUnroll, "thread_binding": mu.MutateThreadBinding,
        "tile_choice": MutateTileChoice,
        "parallel": lambda: mu.MutateParallel(
            max_jobs_per_core=space.parallel_vectorize_unroll.max_jobs_per_core),
    }
    mutators = {mutator_makers[k](): float(v) for k, v in space.mutators.items()}
    return ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=postprocs,
                                             mutator_probs=mutators)

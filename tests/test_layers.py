"""The package's layer order, read from its source: a lower stage never imports a higher
one, and no two modules import each other, directly or around a loop.

Every ``import`` and ``from ... import`` in every module of ``tvm_fusion`` counts, the
function-local and ``TYPE_CHECKING`` ones too: a cycle that only a deferred import keeps
from crashing is still a cycle. ``from pkg import sub`` counts as an import of the
submodule ``pkg.sub``; ``from pkg import name`` of anything else as one of ``pkg``.
Importing ``pkg.sub`` runs ``pkg/__init__.py`` first, so for the layer order a module
also imports its package (not the root ``tvm_fusion``, whose ``__init__`` is the public
API above everything); a package ``__init__`` that eagerly imports a higher stage
would drag it under every module it holds.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tvm_fusion"

# The layers, from the bottom. A module may import its own layer and the ones below.
# Names are relative to tvm_fusion; "x.*" is every submodule of x; the most specific
# pattern wins ("costmodel.cli" over "costmodel.*"). "" is tvm_fusion/__init__.py, the
# public API.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Import nothing of ours but each other: error types, environment knobs, hardware
    # specs and the target-family strategies (family/) they name, shipped data, model
    # sources, and compat/, the TVM work-arounds every stage above may need (the tensor
    # intrinsics' fast import and our builder, the float32 exp CPU builds lower as a
    # polynomial, MetaSchedule's quirks).
    ("base", ("errors", "config", "version", "data", "targets", "family", "family.*", "zoo",
              "embedded", "compat", "compat.*")),
    # ONNX in, Relax out; reference.py runs ONNX Runtime on the same inputs.
    ("frontend", ("frontend", "frontend.*", "reference")),
    # Graph simplification of the imported module, before the operator graph exists;
    # model_spec imports (and simplifies) the model a user names on the command line.
    ("simplify", ("simplify", "simplify.*", "model_spec")),
    ("graph", ("graph", "graph.*")),
    ("plan", ("plan", "plan.*")),
    # The tuning-log directory (MetaSchedule JSONL plus our manifest) and its tools.
    ("logs", ("logs", "logs.*")),
    # The schedule rules of every family, CPU (ours for MetaSchedule, VNNI, int8
    # depthwise) and GPU (DP4A, MFMA) side by side, the default schedule of a kernel
    # without a record, and the TIR check of a GPU schedule against the target's limits.
    ("schedules", ("schedules", "schedules.*")),
    # GPU toolchains (nvcc and ptxas, ROCm), limits and compiled resources, which kernels
    # plans with.
    ("gpu building blocks", ("gpu", "gpu.*")),
    # Model + logs -> the kernels to tune or build; its steps: kernels.schedulable (a plan
    # MetaSchedule can schedule, outlined) and kernels.prepack (layout-free weights).
    ("kernels", ("kernels", "kernels.*")),
    # The cost model's training data re-imports tuned models through kernels.
    ("costmodel", ("costmodel", "costmodel.*")),
    # Machine calibration, next to targets.py: it writes a target description, and with
    # --logs fits the cost model's CPU efficiency shares to the tuned kernels.
    ("calibration", ("calibrate",)),
    # The search: spaces, budget, build, measure, verify, the records it keeps.
    ("tune", ("tune", "tune.*")),
    ("deploy", ("deploy", "deploy.*")),
    ("offline, explore", ("offline", "offline.*", "explore", "explore.*")),
    # What a user starts: the public API, the command lines, the demo.
    ("entry points", ("", "__main__", "cli", "demo", "costmodel.cli", "offline.cli")),
)

# (importer, imported): imports that break the order on purpose. Each says why.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name relative to tvm_fusion -> (file, is_package)."""
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def _imports(mods) -> dict[str, dict[str, int]]:
    """importer -> {imported module of ours: first line}, over every import in its AST."""
    def ours(dotted: str) -> str | None:
        if dotted != "tvm_fusion" and not dotted.startswith("tvm_fusion."):
            return None
        name = dotted[len("tvm_fusion."):] if "." in dotted else ""
        while name not in mods:  # an attribute of a module: the module
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, dict[str, int]] = {}
    for mod, (path, is_pkg) in mods.items():
        package = ["tvm_fusion", *filter(None, mod.split("."))]
        if not is_pkg:
            package = package[:-1]
        found: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + [base]).strip(".")
                names = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    is_sub = sub.startswith("tvm_fusion") and sub[len("tvm_fusion."):] in mods
                    names.append(sub if is_sub else base)
            else:
                continue
            for name in names:
                target = ours(name)
                if target is not None and target != mod:
                    found.setdefault(target, node.lineno)
        edges[mod] = found
    return edges


def _layer_of(mod: str) -> int | None:
    best, best_len = None, -1
    for level, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if pattern == mod:
                return level
            if pattern.endswith(".*") and mod.startswith(pattern[:-1]):
                if len(pattern) > best_len:
                    best, best_len = level, len(pattern)
    return best


def _cycles(edges) -> list[list[str]]:
    """One shortest loop through each import that lies on one, each loop once."""
    def path(src, dst):  # breadth-first: the shortest import chain src -> ... -> dst
        prev, queue = {src: None}, [src]
        for v in queue:
            if v == dst:
                chain = []
                while v is not None:
                    chain.append(v)
                    v = prev[v]
                return chain[::-1]
            for w in sorted(edges.get(v, ())):
                if w not in prev:
                    prev[w] = v
                    queue.append(w)
        return None

    loops, seen = [], set()
    for a in sorted(edges):
        for b in sorted(edges[a]):
            back = path(b, a)
            if back and frozenset(back) not in seen:
                seen.add(frozenset(back))
                loops.append([a, *back[:-1]])
    return loops


def _name(mod: str) -> str:
    return f"tvm_fusion.{mod}" if mod else "tvm_fusion"


def test_every_module_has_a_layer():
    missing = sorted(m for m in _modules() if _layer_of(m) is None)
    assert not missing, ("modules with no layer in tests/test_layers.py LAYERS (add each "
                         f"to the row of its stage): {[_name(m) for m in missing]}")
    mods = _modules()
    stale = [p for _, patterns in LAYERS for p in patterns
             if not any(m == p or (p.endswith(".*") and m.startswith(p[:-1])) for m in mods)]
    assert not stale, f"LAYERS names modules that do not exist (moved?): {stale}"


def _where(mods, edges, a, b) -> str:
    line = edges[a][b] or "(its package's __init__.py runs first)"
    return f"{mods[a][0].relative_to(PACKAGE.parent)}:{line}"


def test_no_lower_layer_imports_a_higher_one():
    mods = _modules()
    edges = _imports(mods)
    for mod in mods:  # the package __init__ that importing mod runs first
        if "." in mod:
            edges[mod].setdefault(mod.rpartition(".")[0], 0)
    found = {(a, b) for a in edges for b in edges[a] if _layer_of(b) > _layer_of(a)}
    lines = [f"{_where(mods, edges, a, b)}: {_name(a)} (layer {LAYERS[_layer_of(a)][0]!r}) "
             f"imports {_name(b)} (layer {LAYERS[_layer_of(b)][0]!r}, higher)"
             for a, b in sorted(found - set(EXCEPTIONS))]
    assert not lines, "imports against the layer order:\n" + "\n".join(lines)
    unused = sorted(set(EXCEPTIONS) - found)
    assert not unused, f"no longer needed, delete from EXCEPTIONS: {unused}"


def test_no_import_cycles():
    mods = _modules()
    edges = _imports(mods)
    kept = {a: {b: line for b, line in targets.items() if (a, b) not in EXCEPTIONS}
            for a, targets in edges.items()}
    lines = []
    for loop in _cycles(kept):
        lines.append("cycle: " + " -> ".join(_name(m) for m in [*loop, loop[0]]))
        lines += [f"  {_where(mods, edges, a, b)}: {_name(a)} imports {_name(b)}"
                  for a, b in zip(loop, [*loop[1:], loop[0]])]
    assert not lines, "import cycles between modules:\n" + "\n".join(lines)


def test_the_package_never_imports_benchmarks_tests_or_notebooks():
    bad = []
    for mod, (path, _) in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            bad += [f"{_name(mod)}:{node.lineno} imports {n}" for n in names
                    if n.split(".")[0] in ("benchmarks", "tests", "notebooks")]
    assert not bad, bad


def test_the_checker_sees_what_it_must():
    # The walk itself: a function-local import, a relative one and a from-package
    # import of a submodule are all edges; an import of a name is one of its module.
    edges = _imports(_modules())
    assert "deploy.build" in edges["deploy.jit"]          # from .build import ...
    assert "graph" in edges["plan.cost"]                  # from ..graph import OpGraph
    assert "plan.apply" in edges["plan"]                  # package __init__
    assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [
        ["a", "b", "c"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []
    assert _layer_of("logs.dirs") < _layer_of("costmodel.model") < _layer_of("tune.driver")
    assert (_layer_of("compat.fast_import") < _layer_of("logs.manifest")
            < _layer_of("schedules.default") < _layer_of("gpu.resources")
            < _layer_of("kernels.prepare") < _layer_of("costmodel.group_data")
            < _layer_of("calibrate") < _layer_of("tune.driver") < _layer_of("deploy.build"))
    assert _layer_of("schedules.cpu_rules") == _layer_of("schedules.dp4a")  # side by side
    assert _layer_of("kernels.prepack") == _layer_of("kernels.schedulable") == _layer_of("kernels")
    reads = [_reads_a_variable(ast.parse(code).body[0].value) for code in (
        "os.environ.get('X')", "os.environ['X']", "os.getenv('X')", "'X' in os.environ",
        "dict(os.environ)")]
    assert reads == [True, True, True, True, False]  # passing the environment on is fine


def _reads_a_variable(node) -> bool:
    """``os.environ[...]``, ``os.environ.get(...)``, ``os.getenv(...)``, ``... in os.environ``."""
    def is_environ(n):
        return isinstance(n, ast.Attribute) and n.attr == "environ"
    if isinstance(node, ast.Subscript) and is_environ(node.value):
        return isinstance(node.ctx, ast.Load)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        f = node.func
        return (f.attr in ("get", "pop", "setdefault") and is_environ(f.value)) or \
            (f.attr == "getenv")
    if isinstance(node, ast.Compare):
        return any(is_environ(c) for c in node.comparators)
    return False


def test_only_config_reads_environment_knobs():
    # tvm_fusion/config.py declares every knob with its default and meaning; a stage
    # that reads a variable itself hides one from that list.
    found = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
             for mod, (path, _) in _modules().items() if mod != "config"
             for node in ast.walk(ast.parse(path.read_text())) if _reads_a_variable(node)]
    assert not found, f"environment read outside tvm_fusion/config.py: {found}"
    from tvm_fusion import config

    names = [k.name for k in config.KNOBS]
    assert len(set(names)) == len(names) and all(k.meaning for k in config.KNOBS)
    assert {v for v in vars(config).values() if isinstance(v, config.Knob)} == set(
        config.KNOBS), "a Knob of config.py is missing from config.KNOBS"

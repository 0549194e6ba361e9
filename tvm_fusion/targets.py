"""Hardware descriptions: ``hw_targets/<name>.json`` plus ``host``, detected at run time.

Units: FLOP/s (OP/s for int8), GB/s, GHz, bytes, microseconds. A "unit" is an SM
(NVIDIA), a CU (AMD, one GCD) or a core (CPU). ``peak_flops`` keys are
``<dtype>_<vector|matrix>``: vector = CUDA cores / vector ALUs / SIMD FMA (int8: DP4A,
VNNI), matrix = Tensor Cores / Matrix Cores (MFMA) / AMX. ``warp_size`` is 1 on CPUs;
``registers_per_unit`` counts 32-bit registers on GPUs and SIMD registers on CPUs.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import tvm

from .data import hw_targets_dir
from .errors import TargetError
from .family import family_names, strategy

HW_DIR = hw_targets_dir()
# A target's name is the directory tune writes under --logs: one plain path component.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
PEAK_KEYS = ("fp64_vector", "fp64_matrix", "fp32_vector", "fp32_matrix", "tf32_matrix",
             "fp16_vector", "fp16_matrix", "bf16_vector", "bf16_matrix", "fp8_matrix",
             "int8_vector", "int8_matrix")
INT_FIELDS = ("compute_units", "l1_bytes_per_unit", "shared_memory_bytes_per_unit",
              "shared_memory_bytes_per_block", "l2_bytes_per_unit", "llc_bytes",
              "registers_per_unit", "max_threads_per_unit", "warp_size",
              "max_threads_per_block", "vector_width_bits")
FLOAT_FIELDS = ("clock_ghz", "dram_bandwidth_gbs", "launch_overhead_us")
# Measured by `tvm-fusion calibrate` (calibrate.py); optional, so that descriptions
# without them keep their hardware hash. call_overhead_us: one serial kernel call through
# the Relax VM (the cost model's CPU_CALL_US where absent); cache_bandwidth_gbs: copy
# bandwidth of a buffer that stays in the cores' L2.
OPTIONAL_FLOAT_FIELDS = ("call_overhead_us", "cache_bandwidth_gbs")
# cpu_efficiency (CPUs, optional): the shares of peak tuned kernels reach, as
# tvm_fusion.plan.cpu_efficiency reads them; `tvm-fusion calibrate --logs` fits them.
# gemm, depthwise, vector in (0, 1]; accumulators >= 1.
CPU_EFFICIENCY_KEYS = ("gemm", "depthwise", "vector", "accumulators")
# and optionally conv_nchw (a conv vectorized along W in NCHW; absent: the gemm share)
# and the copy rate's shares a kernel's bytes move at by how it reads them (a reduction
# along the innermost axis, one over an outer axis, a transpose; absent: 1)
CPU_EFFICIENCY_OPTIONAL = ("conv_nchw", "reduction", "reduction_vector", "strided")
OPTIONAL_MAPPING_FIELDS = ("cpu_efficiency",)
PLAIN_FIELDS = ("name", "description", "family")  # strings without a source
# What a calibration measures or fits (`tvm-fusion calibrate`): the cost model's view of the
# hardware, not which hardware it is. The hardware hash leaves these out, so re-measuring a
# description, or `host` taking a shipped description's measured numbers, keys the same
# hardware the same way and orphans no tuning log.
CALIBRATED_FIELDS = ("clock_ghz", "peak_flops", "dram_bandwidth_gbs", "launch_overhead_us",
                     "call_overhead_us", "cache_bandwidth_gbs", "cpu_efficiency")
EXPECTED_KEYS = (*PLAIN_FIELDS, "tvm_config", "peak_flops", *INT_FIELDS, *FLOAT_FIELDS,
                 "features")
ALLOWED_KEYS = (*EXPECTED_KEYS, *OPTIONAL_FLOAT_FIELDS, *OPTIONAL_MAPPING_FIELDS)
# Hardware hashes a shipped description had before its values were re-measured. Tuning
# logs keyed by one of them were measured on the same machine with the same TVM target
# (tvm_config is unchanged: a new tvm_config is a new target), so they still apply; any
# other hash is refused (logs/dirs.py says what to do).
PREVIOUS_HASHES: dict[str, tuple[str, ...]] = {
    # before int8_vector (VNNI) joined peak_flops, 2026-12-01: tuning_logs/x86_zen4
    # and before its launch and call overheads took their measured values (10 -> 6.2 us)
    "x86_zen4": ("066daff19241055c9a5a57c4a2d0cf2a26e13a4fb4a767c522122f19602b8e50",
                 "3c43a2074906df40d2fdf45d718af3f0fc0de18d5abe7b23ee87f120925b4246"),
    # before int8_vector (DP4A) joined peak_flops, 2026-12-01: tuning_logs/h200; then
    # before launch_overhead_us took the value its records measure (3.6 us, was 4)
    "h200": ("b4eb3aefa657928c9c5a24ecac7620eb7c59acf1987561e59f7df922fac72418",
             "e37f79c4bf7c1e34de468e61c097ac60b79c87102f008460d231cb3caf104761"),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class HardwareTarget:
    """One piece of hardware as the planner, search spaces and cost model see it.

    Every number's citation is in ``sources`` under its field name
    (``peak_flops.<key>`` for peaks).
    """

    name: str
    description: str
    family: str
    tvm_config: Mapping[str, Any]
    compute_units: int
    clock_ghz: float
    peak_flops: Mapping[str, float]
    dram_bandwidth_gbs: float
    l1_bytes_per_unit: int
    shared_memory_bytes_per_unit: int
    shared_memory_bytes_per_block: int
    l2_bytes_per_unit: int
    llc_bytes: int
    registers_per_unit: int
    max_threads_per_unit: int
    warp_size: int
    max_threads_per_block: int
    vector_width_bits: int
    features: tuple[str, ...]
    launch_overhead_us: float
    sources: Mapping[str, str]
    call_overhead_us: float | None = None
    cache_bandwidth_gbs: float | None = None
    cpu_efficiency: Mapping[str, float] | None = None
    # values hashes of this hardware's earlier descriptions whose logs still apply (host:
    # the detected description before it took a shipped file's measured numbers)
    earlier_hashes: tuple[str, ...] = ()

    def __hash__(self) -> int:  # mappings are unhashable; the content hash stands in
        return hash(self.hardware_hash)

    def tvm_target(self):
        """Build the ``tvm.target.Target`` for this hardware.

        Returns
        -------
        tvm.target.Target
        """
        try:
            return tvm.target.Target(dict(self.tvm_config))
        except Exception as exc:  # TVM raises its own error types for bad configs
            raise TargetError(f"target {self.name!r}: TVM rejected tvm_config "
                              f"{dict(self.tvm_config)}: {exc}") from exc

    @property
    def peak_fp32_flops(self) -> float:
        """FP32 FLOP/s on the SIMT / vector / SIMD units."""
        return self.peak_flops["fp32_vector"]

    @property
    def peak_matrix_flops(self) -> float | None:
        """Best FP16/BF16 Tensor / Matrix Core FLOP/s, or None where there is none."""
        vals = [self.peak_flops[k] for k in ("fp16_matrix", "bf16_matrix") if k in self.peak_flops]
        return max(vals) if vals else None

    @property
    def usable_shared_memory_per_block(self) -> int:
        """Shared memory / LDS one TVM kernel may use: hardware limit capped by TVM's."""
        tvm_cap = self.tvm_config.get("max_shared_memory_per_block")
        hw = self.shared_memory_bytes_per_block
        return min(hw, int(tvm_cap)) if tvm_cap is not None else hw

    def to_json_dict(self) -> dict[str, Any]:
        """The description in the file schema (``{"value", "source"}`` per number)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in PLAIN_FIELDS}
        optional = tuple(k for k in (*OPTIONAL_FLOAT_FIELDS, *OPTIONAL_MAPPING_FIELDS)
                         if getattr(self, k) is not None)
        for key in (*EXPECTED_KEYS[len(PLAIN_FIELDS):], *optional):
            if key == "peak_flops":
                out[key] = {k: {"value": v, "source": self.sources[f"peak_flops.{k}"]}
                            for k, v in self.peak_flops.items()}
                continue
            val = getattr(self, key)
            val = (dict(val) if key in ("tvm_config", *OPTIONAL_MAPPING_FIELDS)
                   else list(val) if key == "features" else val)
            out[key] = {"value": val, "source": self.sources[key]}
        return out

    def _hash(self, leave_out: Iterable[str]) -> str:
        doc = self.to_json_dict()
        for key in ("description", *leave_out):
            doc.pop(key, None)
        values = {k: _strip_sources(v) for k, v in doc.items()}
        text = json.dumps(values, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def hardware_hash(self) -> str:
        """sha256 of the canonical JSON of what the hardware is, for tuning-log manifests.

        Sources and description are left out, so fixing a citation does not orphan logs;
        so are the calibrated numbers (:data:`CALIBRATED_FIELDS`), so measuring them
        again does not either.
        """
        return self._hash(CALIBRATED_FIELDS)

    @property
    def values_hash(self) -> str:
        """sha256 of every value, calibrated numbers included: the hardware hash that
        manifests recorded before the calibrated numbers left it."""
        return self._hash(())

    @property
    def previous_hashes(self) -> tuple[str, ...]:
        """Earlier hashes of this description whose logs still apply: the shipped file's
        re-measured ones, the values hash of this and earlier descriptions."""
        return (*PREVIOUS_HASHES.get(self.name, ()), self.values_hash, *self.earlier_hashes)

    def summary_row(self) -> dict[str, str]:
        """The key numbers as strings, one row of the ``tvm-fusion targets`` table."""
        cfg = self.tvm_config
        fam = strategy(self)
        unit = fam.unit_name
        if fam.core_caches:
            onchip = (f"L1d {format_bytes(self.l1_bytes_per_unit)}"
                      f" + L2 {format_bytes(self.l2_bytes_per_unit)}")
        else:
            label = fam.shared_memory_short
            onchip = f"{label} {format_bytes(self.shared_memory_bytes_per_unit)}"
        tensor = self.peak_matrix_flops
        return {
            "name": self.name,
            "family": self.family,
            "kind": str(cfg["kind"]),
            "arch/mcpu": str(cfg.get("arch") or cfg.get("mcpu") or "-"),
            "units": f"{self.compute_units} {unit}",
            "clock": f"{self.clock_ghz:.2f} GHz",
            "fp32 peak": _fmt_flops(self.peak_fp32_flops),
            "tensor peak": _fmt_flops(tensor) if tensor else "-",
            "DRAM BW": f"{self.dram_bandwidth_gbs:.0f} GB/s",
            "on-chip/unit": onchip,
            "launch": f"{self.launch_overhead_us:g} us",
        }


def _strip_sources(node: Any) -> Any:
    if isinstance(node, dict):
        if set(node) == {"value", "source"}:
            return node["value"]
        return {k: _strip_sources(v) for k, v in node.items()}
    return node


def _fmt_flops(flops: float) -> str:
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.0f} GFLOP/s"


_BYTE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(n: float) -> str:
    """``n`` bytes for people: binary units with their IEC names, three significant digits.

    The one byte formatter of the package: hardware sizes (``48 KiB``, ``1.25 MiB``,
    exact) in target summaries, and the DRAM bytes a fusion plan keeps on chip
    (``1.18 MiB``, ``-640 B``) in its text and HTML views.

    Parameters
    ----------
    n : int or float
        A byte count; negative ones keep their sign.

    Returns
    -------
    str
    """
    for unit, size in _BYTE_UNITS:
        if abs(n) >= size:
            value = n / size
            # from 100 on, whole units: .3g would write 1000-1023 KiB in e-notation
            return f"{value:.0f} {unit}" if abs(value) >= 100 else f"{value:.3g} {unit}"
    return f"{n:.0f} B"


def format_targets_table(targets: Iterable[HardwareTarget]) -> str:
    """Render ``summary_row`` of each target as an aligned text table.

    Parameters
    ----------
    targets : iterable of HardwareTarget

    Returns
    -------
    str
        Header, a dashed rule, one line per target; columns separated by two spaces.
    """
    rows = [t.summary_row() for t in targets]
    if not rows:
        return "(no targets)"
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols),
             "  ".join("-" * widths[c] for c in cols)]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in cols).rstrip() for r in rows]
    return "\n".join(lines)


def list_targets() -> list[str]:
    """Names accepted by :func:`load_target`: the shipped files plus ``host``."""
    return sorted(p.stem for p in HW_DIR.glob("*.json")) + ["host"]


def load_target(name_or_path: str | os.PathLike) -> HardwareTarget:
    """Load a hardware description by name (``a100``, ``host``...) or JSON file path.

    Parameters
    ----------
    name_or_path : str or os.PathLike
        A name from :func:`list_targets`, or a path to a ``.json`` description.

    Returns
    -------
    HardwareTarget

    Raises
    ------
    TargetError
        Unknown name, unreadable file, unknown or missing keys, malformed values,
        or a ``tvm_config`` that TVM rejects.
    """
    text = os.fspath(name_or_path)
    if text == "host":
        return detect_host()
    is_path = isinstance(name_or_path, os.PathLike) or text.endswith(".json") or os.sep in text
    path = Path(text) if is_path else HW_DIR / f"{text}.json"
    if not path.is_file():
        if is_path:
            raise TargetError(f"hardware description {path} does not exist")
        raise TargetError(f"unknown target {text!r}. Known targets: "
                          f"{', '.join(list_targets())}; or pass a path to a .json file.")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TargetError(f"{path}: cannot read hardware description as JSON: {exc}") from exc
    target = target_from_dict(doc, origin=str(path))
    if not is_path and target.name != text:
        raise TargetError(f"{path}: 'name' is {target.name!r}, expected {text!r} (the file name)")
    target.tvm_target()  # fail at load time, naming the file, if TVM rejects the config
    return target


def target_from_dict(doc: Any, *, origin: str = "<dict>") -> HardwareTarget:
    """Validate a description in the file schema and build a :class:`HardwareTarget`.

    Parameters
    ----------
    doc : dict
        Parsed JSON; every number as ``{"value": ..., "source": "..."}``.
    origin : str
        Where it came from, for error messages.
    """
    expected = ", ".join(EXPECTED_KEYS)
    if not isinstance(doc, dict):
        raise TargetError(f"{origin}: expected a JSON object with keys {expected}")
    for key in doc:
        if key not in ALLOWED_KEYS:
            raise TargetError(f"{origin}: unknown key {key!r}. Expected keys: {expected} "
                              f"(optional: {', '.join(OPTIONAL_FLOAT_FIELDS + OPTIONAL_MAPPING_FIELDS)})")
    for key in EXPECTED_KEYS:
        if key not in doc:
            raise TargetError(f"{origin}: missing field {key!r}. Expected keys: {expected}")
    for key in PLAIN_FIELDS:
        if not isinstance(doc[key], str) or not doc[key]:
            raise TargetError(f"{origin}: {key!r} must be a non-empty string, got {doc[key]!r}")
    if not NAME_RE.fullmatch(doc["name"]):
        raise TargetError(f"{origin}: 'name' is {doc['name']!r}, but a target's name is the "
                          "directory tune writes under --logs, so it must be one plain name "
                          "(letters, digits, '_', '-', '.', '+'; no '/'; not starting with "
                          "'.'), e.g. 'my_gpu'")
    try:
        family = strategy(doc["family"])
    except TargetError:
        raise TargetError(f"{origin}: 'family' must be one of {list(family_names())}, "
                          f"got {doc['family']!r}") from None
    sources: dict[str, str] = {}
    values: dict[str, Any] = {}

    def sourced(key: str, node: Any) -> Any:
        if not (isinstance(node, dict) and set(node) == {"value", "source"}
                and isinstance(node["source"], str) and node["source"].strip()):
            raise TargetError(f"{origin}: {key!r} must be {{\"value\": ..., \"source\": "
                              f"\"<non-empty citation>\"}}, got {node!r}")
        sources[key] = node["source"]
        return node["value"]

    for key in INT_FIELDS:
        val = sourced(key, doc[key])
        if isinstance(val, bool) or not isinstance(val, int) or val < 0:
            raise TargetError(f"{origin}: {key!r} value must be a non-negative integer, "
                              f"got {val!r}")
        values[key] = val
    for key in (*FLOAT_FIELDS, *(k for k in OPTIONAL_FLOAT_FIELDS if k in doc)):
        val = sourced(key, doc[key])
        if isinstance(val, bool) or not isinstance(val, (int, float)) or val < 0:
            raise TargetError(f"{origin}: {key!r} value must be a non-negative number, got {val!r}")
        values[key] = float(val)
    if "cpu_efficiency" in doc:
        values["cpu_efficiency"] = MappingProxyType(
            _cpu_efficiency(sourced("cpu_efficiency", doc["cpu_efficiency"]), origin))
    peaks = doc["peak_flops"]
    if not isinstance(peaks, dict) or "fp32_vector" not in peaks:
        raise TargetError(f"{origin}: 'peak_flops' must be an object with at least "
                          f"'fp32_vector'; allowed keys: {', '.join(PEAK_KEYS)}")
    flops: dict[str, float] = {}
    for key, node in peaks.items():
        if key not in PEAK_KEYS:
            raise TargetError(f"{origin}: unknown key 'peak_flops.{key}'. "
                              f"Expected keys: {', '.join(PEAK_KEYS)}")
        val = sourced(f"peak_flops.{key}", node)
        if isinstance(val, bool) or not isinstance(val, (int, float)) or val <= 0:
            raise TargetError(f"{origin}: 'peak_flops.{key}' must be a positive number, "
                              f"got {val!r}")
        flops[key] = float(val)
    cfg = sourced("tvm_config", doc["tvm_config"])
    kind = family.tvm_kind
    if not isinstance(cfg, dict) or cfg.get("kind") != kind:
        raise TargetError(f"{origin}: 'tvm_config' must be a TVM target dict with kind "
                          f"{kind!r} for family {doc['family']!r}, got {cfg!r}")
    feats = sourced("features", doc["features"])
    if not isinstance(feats, list) or not all(isinstance(f, str) for f in feats):
        raise TargetError(f"{origin}: 'features' value must be a list of strings, got {feats!r}")
    return HardwareTarget(
        name=doc["name"], description=doc["description"], family=doc["family"],
        tvm_config=MappingProxyType(dict(cfg)), peak_flops=MappingProxyType(flops),
        features=tuple(feats), sources=MappingProxyType(sources), **values)


def _cpu_efficiency(val: Any, origin: str) -> dict[str, float]:
    """Validate a ``cpu_efficiency`` value (see CPU_EFFICIENCY_KEYS)."""
    want = ", ".join(CPU_EFFICIENCY_KEYS)
    if not isinstance(val, dict) or not set(CPU_EFFICIENCY_KEYS) <= set(val) or \
            not set(val) <= set(CPU_EFFICIENCY_KEYS + CPU_EFFICIENCY_OPTIONAL):
        raise TargetError(f"{origin}: 'cpu_efficiency' value must be an object with the keys "
                          f"{want} (and optionally {', '.join(CPU_EFFICIENCY_OPTIONAL)}), "
                          f"got {val!r}")
    out = {}
    for key in (k for k in CPU_EFFICIENCY_KEYS + CPU_EFFICIENCY_OPTIONAL if k in val):
        v = val[key]
        top = None if key == "accumulators" else 1.0
        if (isinstance(v, bool) or not isinstance(v, (int, float))
                or not (v >= 1 if key == "accumulators" else 0 < v <= top)):
            rng = ">= 1" if top is None else "in (0, 1] (a share of the unit's peak)"
            raise TargetError(f"{origin}: 'cpu_efficiency.{key}' must be a number {rng}, "
                              f"got {v!r}")
        out[key] = float(v)
    return out


# ---- host: detected at run time -------------------------------------------------

# FMA units per core and their datapath width (bits) by LLVM CPU name: Zen 4 runs
# AVX-512 on 256-bit halves, Zen 5 and the Xeon-SP line have two full 512-bit FMAs.
_FMA_BY_MCPU = {
    "znver1": (2, 128), "znver2": (2, 256), "znver3": (2, 256), "znver4": (2, 256),
    "znver5": (2, 512), "haswell": (2, 256), "broadwell": (2, 256), "skylake": (2, 256),
    "alderlake": (2, 256), "raptorlake": (2, 256), "icelake-client": (2, 256),
    "tigerlake": (2, 256), "skylake-avx512": (2, 512), "cascadelake": (2, 512),
    "cooperlake": (2, 512), "icelake-server": (2, 512), "sapphirerapids": (2, 512),
    "emeraldrapids": (2, 512), "graniterapids": (2, 512),
}
_HOST_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512cd",
               "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16",
               "avx512_fp16", "avx512ifma", "avx512vbmi", "avx_vnni", "amx_tile",
               "amx_bf16", "amx_int8")
_SYS_CPU = Path("/sys/devices/system/cpu")


def _cpuinfo() -> dict[str, str]:
    """First processor block of /proc/cpuinfo as key -> value."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, val = line.partition(":")
            info[key.strip()] = val.strip()
    except OSError:
        pass
    return info


def _physical_cores(cpus: set[int]) -> int:
    """Distinct (package, core) pairs among the CPUs this process may run on."""
    cores = set()
    for cpu in cpus:
        topo = _SYS_CPU / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(),
                       (topo / "core_id").read_text().strip()))
        except OSError:
            return len(cpus)
    return len(cores) or len(cpus)


def _caches() -> dict[int, int]:
    """Data/unified cache size in bytes by level, for cpu0."""
    sizes: dict[int, int] = {}
    for idx in sorted((_SYS_CPU / "cpu0" / "cache").glob("index*")):
        try:
            if (idx / "type").read_text().strip() == "Instruction":
                continue
            level = int((idx / "level").read_text())
            size = (idx / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        mult = {"K": 1024, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        sizes[level] = int(size.rstrip("KMG")) * mult
    return sizes


def _clock_ghz(info: dict[str, str]) -> tuple[float, str]:
    max_freq = _SYS_CPU / "cpu0" / "cpufreq" / "cpuinfo_max_freq"
    try:
        return int(max_freq.read_text()) / 1e6, f"measured on this machine: {max_freq}"
    except (OSError, ValueError):
        pass
    try:
        return float(info["cpu MHz"]) / 1e3, ("measured on this machine: /proc/cpuinfo "
                                              "'cpu MHz' (current/nominal, not max boost)")
    except (KeyError, ValueError):
        return 2.0, "default estimate: no clock readable on this machine"


@functools.lru_cache(maxsize=1)
def detect_host() -> HardwareTarget:
    """Describe the machine this process runs on (``load_target("host")``).

    mcpu from TVM's ``target.llvm_get_system_cpu``; physical cores from
    ``os.sched_getaffinity``; flags from /proc/cpuinfo; caches from sysfs. DRAM
    bandwidth and launch overhead are documented defaults, not measurements.

    Returns
    -------
    HardwareTarget
    """
    mcpu = str(tvm.get_global_func("target.llvm_get_system_cpu")())
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    logical = set(os.sched_getaffinity(0))
    cores = _physical_cores(logical)
    caches = _caches()
    clock, clock_src = _clock_ghz(info)
    vec = 512 if "avx512f" in flags else 256 if "avx2" in flags else 128
    fma_units, fma_bits = _FMA_BY_MCPU.get(mcpu, (2, vec))
    fma_note = ("per-mcpu table in tvm_fusion/targets.py" if mcpu in _FMA_BY_MCPU
                else f"assumed: mcpu {mcpu} not in table, full vector width")
    lanes = fma_bits // 32
    here = "measured on this machine"
    model = info.get("model name", "unknown CPU")
    doc = {
        "name": "host",
        "description": f"this machine: {model}, LLVM CPU {mcpu}, {cores} physical cores "
                       f"available to this process",
        "family": "cpu",
        "tvm_config": {"value": {"kind": "llvm", "mcpu": mcpu, "num-cores": cores},
                       "source": f"{here}: tvm target.llvm_get_system_cpu and "
                                 "os.sched_getaffinity"},
        "compute_units": {"value": cores, "source": f"{here}: physical cores in "
                          f"os.sched_getaffinity ({len(logical)} logical CPUs)"},
        "clock_ghz": {"value": clock, "source": clock_src},
        "peak_flops": {"fp32_vector": {
            "value": cores * clock * 1e9 * fma_units * 2 * lanes,
            "source": f"derived: {cores} cores x {clock:.3g} GHz x {fma_units} FMA units x 2 x "
                      f"{lanes} fp32 lanes ({fma_bits}-bit FMA datapath, {fma_note})"},
            # VPDPBUSD does 4 int8 MACs per 32-bit lane where an FMA does 1.
            **({"int8_vector": {
                "value": 4 * cores * clock * 1e9 * fma_units * 2 * lanes,
                "source": f"derived: 4x the fp32 rate ({here}: /proc/cpuinfo has "
                          "avx512_vnni or avx_vnni; VPDPBUSD: 4 int8 MACs per 32-bit lane "
                          "on the same datapath)"}}
               if {"avx512_vnni", "avx_vnni"} & set(flags) else {})},
        "dram_bandwidth_gbs": {"value": 43.0, "source": "default estimate: ~43 GB/s copy "
                               "bandwidth measured on the development machine (DESIGN.md); "
                               "benchmarks measure it"},
        "l1_bytes_per_unit": {"value": caches.get(1, 32768), "source": f"{here}: "
                              "/sys/devices/system/cpu/cpu0/cache L1d"},
        "shared_memory_bytes_per_unit": {"value": 0, "source": "CPUs have no scratchpad"},
        "shared_memory_bytes_per_block": {"value": 0, "source": "CPUs have no scratchpad"},
        "l2_bytes_per_unit": {"value": caches.get(2, 0), "source": f"{here}: "
                              "/sys/devices/system/cpu/cpu0/cache L2"},
        "llc_bytes": {"value": caches.get(3, caches.get(2, 0)), "source": f"{here}: "
                      "/sys/devices/system/cpu/cpu0/cache last level"},
        "registers_per_unit": {"value": 32 if "avx512f" in flags else 16,
                               "source": f"{here}: 32 zmm with avx512f, else 16 ymm/xmm"},
        "max_threads_per_unit": {"value": max(1, len(logical) // cores),
                                 "source": f"{here}: logical CPUs per physical core"},
        "warp_size": {"value": 1, "source": "definition: CPUs have no lockstep thread groups"},
        "max_threads_per_block": {"value": 1, "source": "definition: a CPU task is one thread"},
        "vector_width_bits": {"value": vec, "source": f"{here}: /proc/cpuinfo flags "
                              "(512 with avx512f, 256 with avx2)"},
        "features": {"value": [f for f in _HOST_FLAGS if f in flags],
                     "source": f"{here}: /proc/cpuinfo flags"},
        "launch_overhead_us": {"value": 10.0, "source": "default estimate: per-parallel-region "
                               "overhead ~5-15 us on the development machine (DESIGN.md: "
                               "15-17 us per layout-only kernel); benchmarks measure it"},
    }
    detected = target_from_dict(doc, origin="host (detected)")
    detected.tvm_target()
    return _with_shipped_measurements(detected, doc)


def _with_shipped_measurements(detected: HardwareTarget, doc: dict) -> HardwareTarget:
    """``detected`` with the calibrated numbers of the shipped description of the same TVM
    target, where one ships (x86_zen4 on a 2-core Zen 4): measured overheads, bandwidths,
    peaks and efficiency shares instead of ``detect_host``'s estimates. The hardware hash
    is the same either way; logs keyed by the detected description's values still apply."""
    key = json.dumps(dict(detected.tvm_config), sort_keys=True)
    for path in sorted(HW_DIR.glob("*.json")):
        try:  # read the config alone: loading a GPU file builds its TVM target
            config = json.loads(path.read_text())["tvm_config"]["value"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # load_target(name) reports a broken file by name
        if json.dumps(config, sort_keys=True) != key:
            continue
        name = path.stem
        mine = load_target(name).to_json_dict()
        doc = {**doc, "description": f"{doc['description']}; measured numbers from "
                                     f"hw_targets/{name}.json (the same TVM target)"}
        for field in CALIBRATED_FIELDS:
            if field == "peak_flops":
                doc[field] = {k: {"value": v["value"], "source": f"{name}.json: {v['source']}"}
                              for k, v in mine[field].items()}
            elif field in mine:
                doc[field] = {"value": mine[field]["value"],
                              "source": f"{name}.json: {mine[field]['source']}"}
        adopted = target_from_dict(doc, origin=f"host (detected, numbers of {name})")
        return dataclasses.replace(adopted, earlier_hashes=(detected.values_hash,))
    return detected


def as_target(target: str | os.PathLike | HardwareTarget) -> HardwareTarget:
    """``target`` itself when it is a :class:`HardwareTarget`, else :func:`load_target` of it.

    What every stage that takes ``target="a100"`` or a loaded target calls first.
    """
    return target if isinstance(target, HardwareTarget) else load_target(target)

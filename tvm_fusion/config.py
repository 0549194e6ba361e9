"""Every environment variable tvm-fusion reads: its name, default and meaning.

This module is the only reader of them (``tests/test_layers.py`` holds that): a stage
asks its knob, e.g. ``config.JIT_CACHE.get()``, and ``tvm-fusion`` users find the whole
list here. Variables of TVM itself (``TVM_USE_RUNTIME_LIB``...) are TVM's, not listed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One environment variable.

    Attributes
    ----------
    name : str
    default : str or None
        What an unset (or empty) variable means; None: no value, the reader decides.
    meaning : str
    """

    name: str
    default: str | None
    meaning: str

    def get(self) -> str | None:
        """The variable's value, or :attr:`default` when it is unset or empty."""
        return os.environ.get(self.name) or self.default


MODEL_CACHE = Knob(
    name="TVM_FUSION_CACHE", default=os.path.join("~", ".cache", "tvm-fusion", "models"),
    meaning="where zoo models' wheels are downloaded and their .onnx files extracted")
JIT_CACHE = Knob(
    name="TVM_FUSION_JIT_CACHE", default=os.path.join("~", ".cache", "tvm-fusion", "jit"),
    meaning="where jit() caches an executable per model, target and input shapes")
COST_MODEL = Knob(
    name="TVM_FUSION_COST_MODEL", default=None,
    meaning="what tune(cost_model='auto') uses: 'none' (MetaSchedule's own model) or a "
            "saved model's path; unset: the model shipped for the target's hardware")
GROUP_MODEL = Knob(
    name="TVM_FUSION_GROUP_MODEL", default=None,
    meaning="what --group-model auto uses: 'none' (the analytical model) or a saved group "
            "model's path; unset: tuning_logs/group_model.json where one is shipped")
NVCC = Knob(
    name="TVM_FUSION_NVCC", default=None,
    meaning="path of nvcc for the CUDA resource checks; unset: nvcc on PATH, else "
            "/usr/local/cuda/bin/nvcc")
NB_TRIALS = Knob(
    name="TVM_FUSION_NB_TRIALS", default="64",
    meaning="tuning budget of the notebooks (the tests run them with 8)")
NB_ROUNDS = Knob(
    name="TVM_FUSION_NB_ROUNDS", default="200",
    meaning="boosting rounds of the cost model the third notebook trains (tests: 50)")
NB_POPULATION = Knob(
    name="TVM_FUSION_NB_POPULATION", default="512",
    meaning="population of the stock MetaSchedule search in the second notebook "
            "(MetaSchedule's default; tests: 16)")

KNOBS: tuple[Knob, ...] = (MODEL_CACHE, JIT_CACHE, COST_MODEL, GROUP_MODEL, NVCC, NB_TRIALS,
                           NB_ROUNDS, NB_POPULATION)

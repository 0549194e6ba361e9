"""Importing tvm_fusion changes nothing process-wide (issue 42, item 6).

The check runs in a fresh interpreter: this process imported tvm_fusion long ago, and
conftest.py sized TVM's thread pool, so any change would already be in place here. The
fresh one starts with TVM's thread-pool variables unset, records what a user's other TVM
code depends on, imports the package and every module in it, and compares.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHECK = r"""
import importlib, inspect, json, os, pkgutil
import tvm

exp_op = tvm.ir.Op.get("tirx.exp")
env, stack = dict(os.environ), inspect.stack
exp_rule = exp_op.get_attr("llvm.FLowerIntrinsic")

import tvm_fusion
modules = sorted(m.name for m in pkgutil.walk_packages(tvm_fusion.__path__, "tvm_fusion.")
                 if m.name != "tvm_fusion.__main__")  # runs the command line
for name in modules:
    importlib.import_module(name)
# what the parser swap of fast_import touches, imported now that it exists
parsers = [importlib.import_module(n)
           for n in importlib.import_module("tvm_fusion.compat.fast_import").PARSER_MODULES]

print(json.dumps({
    "modules": len(modules),
    "env_changed": sorted(k for k in set(env) | set(os.environ)
                          if env.get(k) != os.environ.get(k)),
    "stack_same": inspect.stack is stack,
    "parsers_use_inspect": all(p.inspect is inspect for p in parsers),
    "exp_rule_same": exp_op.get_attr("llvm.FLowerIntrinsic").same_as(exp_rule),
}))
"""


def _fresh_import() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TVM_NUM_THREADS", "TVM_BIND_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_tvm_fusion_leaves_environment_inspect_and_exp_lowering_alone():
    got = _fresh_import()
    assert got["modules"] > 50  # every module of the package was imported
    assert got["env_changed"] == []  # TVM_NUM_THREADS is set by entry points, not import
    assert got["stack_same"] and got["parsers_use_inspect"]
    assert got["exp_rule_same"]  # TVM's own exp lowering, the same function object


def test_entry_points_still_size_the_thread_pool(monkeypatch):
    # what import no longer does, the entry points' helper still does, keeping a choice
    from tvm_fusion import config

    for k in ("TVM_NUM_THREADS", "TVM_BIND_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    assert config.use_all_cores() == config.physical_cores()
    assert os.environ["TVM_NUM_THREADS"] == str(config.physical_cores())
    assert os.environ["TVM_BIND_THREADS"] == "0"
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    monkeypatch.setenv("TVM_BIND_THREADS", "1")
    assert config.use_all_cores() == 1 and os.environ["TVM_BIND_THREADS"] == "1"

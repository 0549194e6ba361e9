"""``python -m benchmarks``: the suite's one entry point lists and dispatches every tool.

Each command runs in a fresh process from the repository root, as a user types it; only
``--help`` is run, so no tool measures anything here.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from benchmarks.__main__ import COMMANDS, summary  # noqa: E402 - conftest puts REPO first


def _run(*args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` from the repository root, with the checkout on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_help_lists_every_subcommand_with_its_docstring_line():
    proc = _run("-m", "benchmarks", "--help")
    assert proc.returncode == 0, proc.stderr
    listed = {}
    for line in proc.stdout.split("\nwhat:\n", 1)[1].splitlines():
        name, _, text = line.strip().partition(" ")
        listed[name] = text.strip()
    assert list(listed) == list(COMMANDS)
    for name in ("peers", "coverage", "planner", "kernels", "int8", "perf", "gpu-resources"):
        assert listed[name], name
    assert listed["kernels"] == summary("kernel_table")
    assert listed["kernels"].startswith("Per-kernel table of a tuned model")
    assert not any("``" in text for text in listed.values())  # usage spans left out


def test_every_subcommand_is_a_module_with_a_main():
    for name, module in COMMANDS.items():
        tree = ast.parse((REPO / "benchmarks" / f"{module}.py").read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), name


def test_a_subcommand_gets_its_own_arguments_and_the_old_form_still_runs():
    new = _run("-m", "benchmarks", "planner", "--help")
    assert new.returncode == 0, new.stderr
    assert new.stdout.startswith("usage: python -m benchmarks planner")
    assert "--loo" in new.stdout  # planner_accuracy's own option
    old = _run("-m", "benchmarks.planner_accuracy", "--help")
    assert old.returncode == 0, old.stderr
    # the same parser: all but the usage block (wrapped by the program name's length)
    assert old.stdout.split("\n\n", 1)[1] == new.stdout.split("\n\n", 1)[1]


def test_an_unknown_or_missing_subcommand_exits_2_and_names_the_subcommands():
    for args in (["nope"], []):
        proc = _run("-m", "benchmarks", *args)
        assert proc.returncode == 2
        assert "planner" in proc.stderr and "gpu-resources" in proc.stderr

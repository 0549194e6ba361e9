"""Every notebook runs top to bottom with nbclient (small budgets), and is committed clean."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is in the test extras")
nbclient = pytest.importorskip("nbclient", reason="nbclient is in the test extras")

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def test_the_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {"01_fusion_plans.ipynb", "02_tune_and_deploy.ipynb", "03_cost_model.ipynb"} <= names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, \
                f"{path.name}: clear outputs before committing (notebooks/make_notebooks.py)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_FUSION_NB_TRIALS", "4")
    monkeypatch.setenv("TVM_FUSION_NB_ROUNDS", "50")
    monkeypatch.setenv("TVM_FUSION_NB_POPULATION", "16")  # for 4 trials, not 512
    monkeypatch.setenv("TVM_FUSION_JIT_CACHE", str(tmp_path / "jit"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(path.parents[1]), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=1200, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the cell on any error
    images = sum("image/png" in o.get("data", {}) for c in nb.cells
                 if c.cell_type == "code" for o in c.outputs)
    html = sum("text/html" in o.get("data", {}) for c in nb.cells
               if c.cell_type == "code" for o in c.outputs)
    assert images + html >= 2, "the notebook should show its plots and tables"

"""Notebook views: a plan draws and tabulates itself, plans compare, tuning logs plot."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import tvm_fusion as tf  # noqa: E402
from tvm_fusion.embedded import build_embedded_model  # noqa: E402
from tvm_fusion.errors import LogError, PlanError  # noqa: E402
from tvm_fusion.explore import (comparison_html, compare_targets, draw_plan,  # noqa: E402
                                open_logs, plan_html)
from tvm_fusion.explore.tuning import (kernel_results, plot_roofline,  # noqa: E402
                                       plot_tuning_curves, tuning_curve)
from tvm_fusion.plan import FusionPlan  # noqa: E402
from tvm_fusion.logs.logdb import read_run_times  # noqa: E402

from test_planner import matmul_softmax  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return tf.import_model(build_embedded_model(), name="embedded")


@pytest.fixture(scope="module")
def graph(model):
    return tf.build_graph(model.mod)


def test_plan_html_draws_every_op_and_lists_kernels_and_rejections(graph):
    plan = tf.plan_fusion(graph, "a100")
    html = plan_html(plan)
    assert "<svg" in html
    for g in plan.groups:
        assert g.name in html
    for r in plan.rejected:
        assert r.reason.split(";")[0][:40].replace("'", "&#x27;") in html
    fig = draw_plan(plan)
    points = sum(len(c.get_offsets()) for c in fig.axes[0].collections)
    assert points == len(graph.nodes)
    # Edges inside a kernel are drawn in the kernel's colour, the rest grey and dashed.
    group_of = plan.group_of()
    inside = sum(group_of[a] == group_of[b] for a, b in plan.edges)
    assert 0 < inside < len(plan.edges)


def test_edges_survive_json_so_a_stored_plan_still_draws(graph, tmp_path):
    plan = tf.plan_fusion(graph, "x86_avx2")
    plan.save(tmp_path / "p.json")
    back = FusionPlan.load(tmp_path / "p.json")
    assert back.edges == plan.edges and back.hash == plan.hash
    assert "<svg" in plan_html(back)
    # A plan written before edges were stored still renders its tables.
    doc = json.loads((tmp_path / "p.json").read_text())
    del doc["edges"]
    old = FusionPlan.from_json(doc)
    assert "graph not drawn" in plan_html(old)
    with pytest.raises(PlanError, match="no graph edges"):
        draw_plan(old)


def test_compare_names_the_kernels_fuseops_splits(graph):
    cost = tf.plan_fusion(graph, "a100")
    rules = tf.plan_fusion(graph, "a100", planner="fuseops")
    cmp = cost.compare(rules)
    assert not cmp.same and cost.compare(cost).same
    mine = {frozenset(g.nodes) for g in cost.groups}
    theirs = {frozenset(g.nodes) for g in rules.groups}
    assert {frozenset(g.nodes) for g in cmp.only_a} == mine - theirs
    assert {frozenset(g.nodes) for g in cmp.only_b} == theirs - mine
    text = str(cmp)
    assert len(text.splitlines()) == 1 + len(cmp.only_a)
    assert "softmax#15" in text and "a100/fuseops" in text
    assert "softmax#15" in comparison_html(cmp)


def test_jupyter_shows_plans_comparisons_and_cost_models_as_html(graph):
    # The core objects have no HTML of their own; importing explore registers its views.
    from IPython.core.interactiveshell import InteractiveShell

    from tvm_fusion import explore

    shell = InteractiveShell.instance()
    explore._register_html_views()
    cost = tf.plan_fusion(graph, "a100")
    shown = shell.display_formatter.format(cost)[0]
    assert "<svg" in shown["text/html"]  # plan_html's drawing (it holds a timestamp)
    assert all(g.name in shown["text/html"] for g in cost.groups)
    cmp = cost.compare(tf.plan_fusion(graph, "a100", planner="fuseops"))
    assert shell.display_formatter.format(cmp)[0]["text/html"] == comparison_html(cmp)
    from tvm_fusion.costmodel import RankModel

    html = shell.display_formatter.formatters["text/html"]
    assert html.lookup_by_type(RankModel) is explore.cost_model_html


def test_compare_refuses_plans_of_different_graphs(graph):
    other = tf.build_graph(matmul_softmax(256).mod)
    with pytest.raises(PlanError, match="different graphs"):
        tf.plan_fusion(graph, "a100").compare(tf.plan_fusion(other, "a100"))


def test_targets_side_by_side_show_where_the_hardware_differs():
    # GEMM + softmax: fused on a Zen 4 (its 8 MB of scores would make a DRAM round trip;
    # its 1 MB weight fits a core's L2 across rows), refused on GPUs, whose dlight would
    # split it (see test_planner).
    graph = tf.build_graph(matmul_softmax(16384, 128, 16).mod)
    cmp = compare_targets(graph, ("x86_zen4", "a100", "mi250x"))
    assert [len(p.groups) for p in cmp.plans.values()] == [1, 2, 2]
    assert cmp.differing_nodes() == [0, 1]
    html = cmp._repr_html_()
    assert "matmul#0" in html and "softmax#1" in html and "(alone)" in html
    assert "2 operators are grouped differently" in str(cmp)


@pytest.fixture(scope="module")
def tuned(model, tmp_path_factory):
    import logging

    # A handler without a name on MetaSchedule's logger (pytest's log capture leaves
    # some) crashed its logger set-up inside tune(); tuning must not care.
    stray = logging.NullHandler()
    logging.getLogger("tvm.s_tir.meta_schedule").addHandler(stray)
    logs = tmp_path_factory.mktemp("logs")
    report = tf.tune(model, "host", trials=8, logs=logs, progress=False)
    yield logs, report
    logging.getLogger("tvm.s_tir.meta_schedule").removeHandler(stray)  # tune() dropped it


def test_kernel_results_and_curve_read_what_tuning_measured(model, tuned, tmp_path):
    logs, report = tuned
    kernels = kernel_results(model, "host", logs)
    assert sorted(k.name for k in kernels) == sorted(t.name for t in report.tasks)
    by_name = {t.name: t for t in report.tasks}
    for k in kernels:
        assert k.bytes > 0
        if by_name[k.name].best_us is not None:
            assert k.best_us == pytest.approx(by_name[k.name].best_us, rel=1e-6)
    assert any("conv2d" in k.name and k.flops > 1e6 for k in kernels)

    hashes, records = read_run_times(logs / "host" / "candidates")
    raw = tuning_curve(model, "host", logs, baseline=False)
    assert len(raw.trials) == len(records) and raw.trials[0] == 1
    assert all(b <= a + 1e-12 for a, b in zip(raw.est_ms, raw.est_ms[1:]))
    assert raw.tasks == len(kernels) and raw.est_ms[-1] > 0
    # With the baseline, unmeasured kernels count at their default schedule's time: the
    # curve starts at the untuned model and ends where the raw one does once every
    # kernel has a measurement.
    curve = tuning_curve(model, "host", logs)
    assert curve.baseline and len(curve.trials) == len(records)
    if curve.unmeasured == 0:
        assert curve.est_ms[-1] == pytest.approx(raw.est_ms[-1])

    # The log view lists each kernel with its best verified time.
    view = open_logs(logs)
    best = view.best_us()["host"]
    for t in report.tasks:
        if t.best_us is not None:
            # The view shows the mean of the best record's repeats, the report the median
            # of the candidates' (one slow repeat on a loaded machine moved a mean 2.7x):
            # the same kernel's measurements, so the same order of magnitude, not equal.
            assert t.name in best and best[t.name] > 0
            assert 0.1 < (best[t.name] + 0.05) / (t.best_us + 0.05) < 10
    assert all(t.name in view._repr_html_() for t in report.tasks if t.best_us is not None)

    plot_tuning_curves([curve]).savefig(tmp_path / "curve.png")
    plot_roofline(kernels, "host").savefig(tmp_path / "roof.png")
    for name in ("curve.png", "roof.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_views_of_an_untuned_model_say_what_to_do(model, tmp_path):
    with pytest.raises(LogError, match="manifest"):
        kernel_results(model, "host", tmp_path)

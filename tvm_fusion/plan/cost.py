"""Analytical cost of a candidate kernel on a target.

A roofline over the bytes that cross DRAM (the group's external inputs and outputs;
intermediates stay on chip) and the group's FLOPs, plus the per-kernel launch overhead
(on a CPU: the cost of opening a parallel region).
"""

from __future__ import annotations

from typing import Iterable

from ..graph import OpGraph


def group_traffic(graph: OpGraph, nodes: Iterable[int]) -> tuple[float, int]:
    """FLOPs and DRAM bytes of a group: external reads once, outputs leaving it once."""
    members = set(nodes)
    users = graph.consumers()
    flops = 0.0
    traffic = 0
    for nid in members:
        node = graph.nodes[nid]
        flops += node.flops
        internal_in = sum(graph.nodes[p].bytes_written for p in node.inputs if p in members)
        traffic += max(node.bytes_read - internal_in, 0)
        escapes = nid in graph.outputs or any(u not in members for u in users[nid])
        traffic += node.bytes_written if escapes else 0
    return flops, traffic


def estimate_us(graph: OpGraph, nodes: Iterable[int], hw) -> float:
    """Predicted time of one kernel computing ``nodes`` on ``hw``, in microseconds.

    Parameters
    ----------
    graph : OpGraph
    nodes : iterable of int
        Node ids of the group.
    hw : HardwareTarget
        Supplies peak FP32 FLOP/s, DRAM bandwidth and launch overhead.
    """
    flops, traffic = group_traffic(graph, nodes)
    compute_s = flops / hw.peak_fp32_flops
    memory_s = traffic / (hw.dram_bandwidth_gbs * 1e9)
    return max(compute_s, memory_s) * 1e6 + hw.launch_overhead_us

"""Graph stage: legalize a Relax module and read it as a graph of TIR operators."""

from .op_graph import OpGraph, OpNode, build_graph, legalize

__all__ = ["OpGraph", "OpNode", "build_graph", "legalize"]

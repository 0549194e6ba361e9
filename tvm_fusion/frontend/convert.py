"""Run TVM's Relax ONNX converter with clear errors.

The stock converter reports only the first unsupported op type, prints to stdout on
failure and does not say which node failed. This wrapper checks every op type up
front and remembers the node being converted, so failures name it.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator, Mapping

import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from tvm_fusion.errors import ModelImportError, UnsupportedOpError

from .fold import default_opset
from .quant import CONVERTERS
from .shapes import TensorInfo

# Handled inside the converter's node loop rather than through its converter map.
_BUILTIN_OPS = frozenset({"If", "Constant"})
# onnxruntime's contrib (com.microsoft) integer ops, which quantize_dynamic and
# quantize_static write with some options; the standard ones are converted.
_DYNAMIC_QUANT_OPS = frozenset({
    "DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention",
    "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearConcat", "QLinearGlobalAveragePool",
    "QGemm", "QLinearLeakyRelu", "QLinearSoftmax", "QLinearAveragePool"})


def check_supported(model: onnx.ModelProto, source: str) -> None:
    """Raise UnsupportedOpError listing every op type the converter lacks.

    Nodes inside ``If`` branches are checked too: the converter walks them as well. Ops
    outside the default domain are named with it (``com.microsoft.DynamicQuantizeLSTM``).
    """
    supported = set(onnx_frontend._get_convert_map()) | _BUILTIN_OPS | set(CONVERTERS)  # noqa: SLF001
    missing: dict[str, list[str]] = {}
    for node in _all_nodes(model.graph):
        if node.op_type not in supported:
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            missing.setdefault(op, []).append(_node_label(node))
    if missing:
        rows = [f"  {op}: {len(names)} node(s), e.g. {names[0]!r}"
                for op, names in sorted(missing.items())]
        dynamic = sorted(op for op in missing if op.rpartition(".")[2] in _DYNAMIC_QUANT_OPS)
        fix = (f"{', '.join(dynamic)} are onnxruntime contrib (com.microsoft) integer ops, "
               "which TVM cannot import: quantize the float model with standard ops "
               "(quantize_static with QuantFormat.QDQ, or quantize_dynamic, which writes "
               "DynamicQuantizeLinear + MatMulInteger/ConvInteger; all of these import)."
               if dynamic else
               "Re-export the model without them (e.g. a lower opset or decomposed ops).")
        raise UnsupportedOpError(
            f"{source} uses {len(missing)} operator type(s) that TVM's ONNX importer "
            "cannot convert (after constant folding):\n" + "\n".join(rows) + "\n" + fix)


def convert(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]],
            dtypes: Mapping[str, str], source: str) -> tvm.IRModule:
    """Convert a checked, folded model to a Relax module with embedded weights."""
    opset = default_opset(model)
    importer = _TrackingImporter(
        {k: list(v) for k, v in shapes.items()}, dict(dtypes), keep_params_in_input=False)
    # The converter prints its inputs to stdout on failure and warns about every renamed
    # input; the error raised below carries what matters.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            return importer.from_onnx(model.graph, opset)
        except Exception as err:  # noqa: BLE001 - any converter failure is an import error
            op, name = importer.current_node
            where = f"node {name!r} ({op})" if op else "the graph"
            raise ModelImportError(
                f"TVM's ONNX importer failed on {where} of {source}: "
                f"{type(err).__name__}: {_first_lines(str(err))}") from err


def struct_tensor_infos(ty: relax.Type, names: list[str]) -> tuple[TensorInfo, ...]:
    """TensorInfos of a Relax tensor or tuple type; unknown dims are -1."""
    fields = list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]
    return tuple(TensorInfo(name, _dims(f), str(f.dtype)) for name, f in zip(names, fields))


def _dims(ty: relax.Type) -> tuple[int, ...]:
    shape = getattr(ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return (-1,) * max(int(getattr(ty, "ndim", 0)), 0)  # unknown rank reads as ()
    return tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else -1 for d in shape.values)


class _TrackingImporter(onnx_frontend.ONNXGraphImporter):
    """The stock importer, remembering the node it is converting."""

    current_node: tuple[str, str] = ("", "")

    def _parse_value_proto(self, value_proto):
        # Called once per top-level node before the node is checked and converted.
        if isinstance(value_proto, onnx.NodeProto):
            self.current_node = (value_proto.op_type, _node_label(value_proto))
        return super()._parse_value_proto(value_proto)

    def _check_for_unsupported_ops(self, graph):
        # check_supported() ran already, knowing the converters of frontend/quant.py.
        return None

    def _convert_operator(self, op_name, inputs, attrs, opset):
        # Also the only hook on nodes inside If branches.
        self.current_node = (op_name, attrs.get("tvm_custom", {}).get("name") or
                             self.current_node[1])
        if op_name in CONVERTERS:  # integer ops (frontend/quant.py)
            sym = CONVERTERS[op_name](self.bb, inputs, attrs, opset)
            if sym is not None:
                return self.bb.normalize(sym)
        return super()._convert_operator(op_name, inputs, attrs, opset)


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                yield from _all_nodes(sub)


def _node_label(node: onnx.NodeProto) -> str:
    return node.name or f"<unnamed, output {node.output[0] if node.output else '?'}>"


def _first_lines(text: str, limit: int = 400) -> str:
    # Converter messages may embed a whole Relax function; its first lines say why.
    head = " ".join(line.strip() for line in text.strip().splitlines()[:3])
    return head if len(head) <= limit else head[:limit] + " ..."

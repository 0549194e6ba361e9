"""Small hand-built ONNX models for the regression tests of tuple-valued, data-dependent
and recurrent operators (onnx.helper, a few KB each, built in memory)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

_vi = h.make_tensor_value_info


def make(name, nodes, inputs, outputs, inits=(), opset=13) -> onnx.ModelProto:
    """A checked model of one graph."""
    graph = h.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def const(name, value, dtype=np.float32):
    return nh.from_array(np.asarray(value, dtype), name)


def split13() -> onnx.ModelProto:
    """Relu, Split (opset 13: sizes as an input), a piece each to Mul and Sigmoid, Concat."""
    return make("split13", [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("Split", ["r", "sizes"], ["a", "b"], axis=1, name="split0"),
        h.make_node("Mul", ["a", "two"], ["a2"]),
        h.make_node("Sigmoid", ["b"], ["b2"]),
        h.make_node("Concat", ["a2", "b2"], ["y"], axis=1),
    ], [_vi("x", T.FLOAT, [1, 8, 4, 4])], [_vi("y", T.FLOAT, [1, 8, 4, 4])],
        [const("sizes", [2, 6], np.int64), const("two", 2.0)])


def split18() -> onnx.ModelProto:
    """Split in three (opset 18: ``num_outputs``); the pieces are added and multiplied,
    and one piece is also a model output."""
    return make("split18", [
        h.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3, name="split0"),
        h.make_node("Add", ["a", "b"], ["ab"]),
        h.make_node("Mul", ["ab", "c"], ["y"]),
    ], [_vi("x", T.FLOAT, [1, 9, 4])],
        [_vi("y", T.FLOAT, [1, 3, 4]), _vi("c", T.FLOAT, [1, 3, 4])], opset=18)


def split_gemm(rows=64, cols=64) -> onnx.ModelProto:
    """Relu, Split in two along the columns, each piece into its own MatMul (which takes
    no fused prologue), the products added: the Split can only stay a kernel with two
    outputs (fused with the Relu before it)."""
    rng = np.random.default_rng(0)
    half = cols // 2
    return make("split_gemm", [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("Split", ["r", "sizes"], ["a", "b"], axis=1, name="split0"),
        h.make_node("MatMul", ["a", "w1"], ["p"]),
        h.make_node("MatMul", ["b", "w2"], ["q"]),
        h.make_node("Add", ["p", "q"], ["y"]),
    ], [_vi("x", T.FLOAT, [rows, cols])], [_vi("y", T.FLOAT, [rows, 16])],
        [const("sizes", [half, half], np.int64),
         const("w1", rng.standard_normal((half, 16))), const("w2", rng.standard_normal((half, 16)))])


def topk() -> onnx.ModelProto:
    """Relu, TopK (k=4 of 16, values and indices), the values doubled."""
    return make("topk", [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("TopK", ["r", "k"], ["v", "i"], axis=-1, name="topk0"),
        h.make_node("Mul", ["v", "two"], ["y"]),
    ], [_vi("x", T.FLOAT, [2, 16])], [_vi("y", T.FLOAT, [2, 4]), _vi("i", T.INT64, [2, 4])],
        [const("k", [4], np.int64), const("two", 2.0)])


def nms() -> onnx.ModelProto:
    """NonMaxSuppression of 6 boxes, one class, at most 3 kept (the number kept depends
    on the boxes)."""
    return make("nms", [
        h.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "thresh"],
                    ["selected"], name="nms0"),
    ], [_vi("boxes", T.FLOAT, [1, 6, 4]), _vi("scores", T.FLOAT, [1, 1, 6])],
        [_vi("selected", T.INT64, [None, 3])],
        [const("max_out", [3], np.int64), const("iou", [0.5]), const("thresh", [0.0])])


def nms_inputs(seed=0) -> list[np.ndarray]:
    """Well-formed boxes (y1, x1 < y2, x2) with several overlaps, and scores."""
    rng = np.random.default_rng(seed)
    low = rng.uniform(0, 1, (1, 6, 2)).astype(np.float32)
    boxes = np.concatenate([low, low + rng.uniform(0.2, 0.6, (1, 6, 2)).astype(np.float32)], -1)
    return [boxes, rng.uniform(0, 1, (1, 1, 6)).astype(np.float32)]


def nonzero() -> onnx.ModelProto:
    """NonZero of a Relu: the number of columns of the result depends on the data."""
    return make("nonzero", [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("NonZero", ["r"], ["y"], name="nonzero0"),
    ], [_vi("x", T.FLOAT, [3, 4])], [_vi("y", T.INT64, [2, None])])


def branchy() -> onnx.ModelProto:
    """A top-level If on the value of input ``sr``: Relu when sr == 16000, else Neg."""
    then = h.make_graph([h.make_node("Relu", ["x"], ["t"])], "then", [],
                        [_vi("t", T.FLOAT, [1, 8])])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [],
                         [_vi("e", T.FLOAT, [1, 8])])
    return make("branchy", [
        h.make_node("Equal", ["sr", "rate"], ["is16k"]),
        h.make_node("If", ["is16k"], ["y"], then_branch=then, else_branch=other),
    ], [_vi("x", T.FLOAT, [1, 8]), _vi("sr", T.INT64, [])], [_vi("y", T.FLOAT, [1, 8])],
        [const("rate", 16000, np.int64)], opset=18)


def recurrent(op="LSTM", *, seq=5, batch=2, inp=3, hidden=4, direction="forward", layout=0,
              initial=True, peepholes=False, opset=14, seed=0, **attrs) -> onnx.ModelProto:
    """One ONNX LSTM, GRU or RNN node with random constant weights and biases; X (and,
    with ``initial``, the initial states) are inputs; every output is a model output."""
    rng = np.random.default_rng(seed)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    dirs = 2 if direction == "bidirectional" else 1
    inits = [const("W", rng.uniform(-0.5, 0.5, (dirs, gates * hidden, inp))),
             const("R", rng.uniform(-0.5, 0.5, (dirs, gates * hidden, hidden))),
             const("B", rng.uniform(-0.5, 0.5, (dirs, 2 * gates * hidden)))]
    x_shape = [batch, seq, inp] if layout else [seq, batch, inp]
    s_shape = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    y_shape = [batch, seq, dirs, hidden] if layout else [seq, dirs, batch, hidden]
    inputs = [_vi("X", T.FLOAT, x_shape)]
    names = ["X", "W", "R", "B", ""]
    states = ["h0", "c0"] if op == "LSTM" else ["h0"]
    if initial:
        names += states
        inputs += [_vi(s, T.FLOAT, s_shape) for s in states]
    if peepholes:
        names += [""] * (7 - len(names)) + ["P"]
        inits.append(const("P", rng.uniform(-0.5, 0.5, (dirs, 3 * hidden))))
    outs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    if opset >= 14:
        attrs["layout"] = layout
    node = h.make_node(op, names, outs, name=f"{op.lower()}0", hidden_size=hidden,
                       direction=direction, **attrs)
    return make(f"{op.lower()}_case", [node], inputs,
                [_vi("Y", T.FLOAT, y_shape)] + [_vi(o, T.FLOAT, s_shape) for o in outs[1:]],
                inits, opset=opset)


def compress() -> onnx.ModelProto:
    """The positive entries of x (Compress by a mask), then doubled: a tensor of run-time
    size that a following op must read."""
    return make("compress", [
        h.make_node("Greater", ["x", "zero"], ["m"]),
        h.make_node("Compress", ["x", "m"], ["p"], name="compress0"),
        h.make_node("Mul", ["p", "two"], ["y"]),
    ], [_vi("x", T.FLOAT, [8])], [_vi("y", T.FLOAT, [None])],
        [const("zero", 0.0), const("two", 2.0)], opset=11)


def unique() -> onnx.ModelProto:
    """Unique rows of x with all four outputs (sizes known only at run time)."""
    return make("unique", [
        h.make_node("Unique", ["x"], ["y", "idx", "inv", "cnt"], sorted=1, axis=0,
                    name="unique0"),
    ], [_vi("x", T.FLOAT, [6, 2])], [_vi("y", T.FLOAT, [None, 2]), _vi("idx", T.INT64, [None]),
                                     _vi("inv", T.INT64, [None]), _vi("cnt", T.INT64, [None])],
        opset=11)


def nonzero_then_cast() -> onnx.ModelProto:
    """NonZero whose result another op reads (a Cast to float)."""
    return make("nonzero_cast", [
        h.make_node("NonZero", ["x"], ["i"], name="nonzero0"),
        h.make_node("Cast", ["i"], ["y"], to=T.FLOAT),
    ], [_vi("x", T.FLOAT, [3, 4])], [_vi("y", T.FLOAT, [2, None])])


def conv_se_chain(*, channels=16, size=16, seed=0) -> onnx.ModelProto:
    """Conv-HardSwish, depthwise conv-Relu, squeeze-excite (GlobalAveragePool, 1x1 conv,
    Relu, 1x1 conv, HardSigmoid, Mul), 1x1 conv, residual Add, Relu, then MaxPool,
    Resize and Concat: the ops a channel-blocked layout has to keep blocked."""
    rng = np.random.default_rng(seed)
    c, q = channels, max(channels // 4, 1)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32) * (2.0 / np.prod(shape[1:])) ** 0.5

    inits = [const("w0", w(c, 3, 3, 3)), const("b0", rng.standard_normal(c) * 0.1),
             const("wd", w(c, 1, 3, 3)), const("bd", rng.standard_normal(c) * 0.1),
             const("ws1", w(q, c, 1, 1)), const("bs1", rng.standard_normal(q) * 0.1),
             const("ws2", w(c, q, 1, 1)), const("bs2", rng.standard_normal(c) * 0.1),
             const("wp", w(c, c, 1, 1)), const("bp", rng.standard_normal(c) * 0.1),
             const("scales", [1.0, 1.0, 2.0, 2.0])]
    return make("conv_se_chain", [
        h.make_node("Conv", ["x", "w0", "b0"], ["c0"], kernel_shape=[3, 3], pads=[1] * 4,
                    strides=[2, 2]),
        h.make_node("HardSwish", ["c0"], ["a0"]),
        h.make_node("Conv", ["a0", "wd", "bd"], ["cd"], kernel_shape=[3, 3], pads=[1] * 4,
                    group=c),
        h.make_node("Relu", ["cd"], ["ad"]),
        h.make_node("GlobalAveragePool", ["ad"], ["s0"]),
        h.make_node("Conv", ["s0", "ws1", "bs1"], ["s1"], kernel_shape=[1, 1]),
        h.make_node("Relu", ["s1"], ["s2"]),
        h.make_node("Conv", ["s2", "ws2", "bs2"], ["s3"], kernel_shape=[1, 1]),
        h.make_node("HardSigmoid", ["s3"], ["s4"], alpha=1 / 6, beta=0.5),
        h.make_node("Mul", ["ad", "s4"], ["se"]),
        h.make_node("Conv", ["se", "wp", "bp"], ["cp"], kernel_shape=[1, 1]),
        h.make_node("Add", ["cp", "a0"], ["r0"]),
        h.make_node("Relu", ["r0"], ["r1"]),
        h.make_node("MaxPool", ["r1"], ["m0"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Resize", ["m0", "", "scales"], ["u0"], mode="nearest"),
        h.make_node("Concat", ["u0", "r1"], ["y"], axis=1),
    ], [_vi("x", T.FLOAT, [1, 3, size, size])],
        [_vi("y", T.FLOAT, [1, 2 * c, size // 2, size // 2])], inits, opset=14)


def lcnet_block(*, channels=16, size=8, seed=0) -> onnx.ModelProto:
    """PP-LCNetV3's block as PP-OCRv4 rec exports it: depthwise conv, HardSwish written
    out (Add 3, Clip with input bounds, Mul, Div 6), a learnable scalar scale and bias
    (shape-(1,) constants), then a 1x1 conv."""
    rng = np.random.default_rng(seed)
    c = channels
    one = lambda name, v: const(name, np.array([v], np.float32))  # noqa: E731
    inits = [const("wd", rng.standard_normal((c, 1, 3, 3)) * 0.4),
             const("bd", rng.standard_normal(c) * 0.1),
             const("wp", rng.standard_normal((c, c, 1, 1)) * 0.3),
             one("three", 3.0), one("six", 6.0), one("scale", 1.25), one("bias", -0.5),
             const("lo", np.array(0.0, np.float32)), const("hi", np.array(6.0, np.float32))]
    return make("lcnet_block", [
        h.make_node("Conv", ["x", "wd", "bd"], ["cd"], kernel_shape=[3, 3], pads=[1] * 4,
                    group=c),
        h.make_node("Add", ["cd", "three"], ["a0"]),
        h.make_node("Clip", ["a0", "lo", "hi"], ["a1"]),
        h.make_node("Mul", ["cd", "a1"], ["a2"]),
        h.make_node("Div", ["a2", "six"], ["a3"]),
        h.make_node("Mul", ["scale", "a3"], ["a4"]),
        h.make_node("Add", ["a4", "bias"], ["a5"]),
        h.make_node("Conv", ["a5", "wp"], ["y"], kernel_shape=[1, 1]),
    ], [_vi("x", T.FLOAT, [1, c, size, size])], [_vi("y", T.FLOAT, [1, c, size, size])],
        inits)


def conv_leaky_pool(*, channels=16, size=8, alpha=0.1, seed=0) -> onnx.ModelProto:
    """AECMOS' stage: conv, LeakyRelu, 2x2 max pool, conv."""
    rng = np.random.default_rng(seed)
    c = channels
    inits = [const("w0", rng.standard_normal((c, c, 3, 3)) * 0.2),
             const("b0", rng.standard_normal(c) * 0.1),
             const("w1", rng.standard_normal((c, c, 3, 3)) * 0.2)]
    return make("conv_leaky_pool", [
        h.make_node("Conv", ["x", "w0", "b0"], ["c0"], kernel_shape=[3, 3], pads=[1] * 4),
        h.make_node("LeakyRelu", ["c0"], ["l0"], alpha=alpha),
        h.make_node("MaxPool", ["l0"], ["p0"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["p0", "w1"], ["y"], kernel_shape=[3, 3], pads=[1] * 4),
    ], [_vi("x", T.FLOAT, [1, c, size, size])], [_vi("y", T.FLOAT, [1, c, size // 2, size // 2])],
        inits)


def conv_relu_end_pad(*, channels=16, size=12, seed=0) -> onnx.ModelProto:
    """PP-OCRv6's stem: conv, bias, ReLU, then a pad of one row and column at the high
    edge only (which TVM marks elementwise), then a 2x2 stride-2 conv."""
    rng = np.random.default_rng(seed)
    c = channels
    inits = [const("w0", rng.standard_normal((c, 3, 3, 3)) * 0.3),
             const("b0", rng.standard_normal(c) * 0.1),
             const("w1", rng.standard_normal((c, c, 2, 2)) * 0.2),
             const("pads", [0, 0, 0, 0, 0, 0, 1, 1], np.int64)]
    half = (size + 1) // 2
    return make("conv_relu_end_pad", [
        h.make_node("Conv", ["x", "w0", "b0"], ["c0"], kernel_shape=[3, 3], pads=[1] * 4),
        h.make_node("Relu", ["c0"], ["r0"]),
        h.make_node("Pad", ["r0", "pads"], ["p0"]),
        h.make_node("Conv", ["p0", "w1"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ], [_vi("x", T.FLOAT, [1, 3, size, size])], [_vi("y", T.FLOAT, [1, c, half, half])],
        inits)


def int8_weight_matmul(rows=16, k=64, n=48, *, zero_point=False) -> onnx.ModelProto:
    """A weight-only int8 GEMM as exporters write it: an int8 initializer -> Cast ->
    (Sub of a zero point) -> Mul by a per-column scale -> MatMul, then Add and Relu."""
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    nodes = [h.make_node("Cast", ["w"], ["wf"], to=T.FLOAT, name="w_cast")]
    if zero_point:
        nodes.append(h.make_node("Sub", ["wf", "zp"], ["wz"], name="w_sub"))
    nodes += [
        h.make_node("Mul", ["wz" if zero_point else "wf", "scale"], ["wd"], name="w_scale"),
        h.make_node("MatMul", ["x", "wd"], ["p"], name="matmul0"),
        h.make_node("Add", ["p", "b"], ["pb"]),
        h.make_node("Relu", ["pb"], ["y"]),
    ]
    return make("int8_weight_matmul", nodes, [_vi("x", T.FLOAT, [rows, k])],
                [_vi("y", T.FLOAT, [rows, n])],
                [nh.from_array(w, "w"), const("scale", rng.uniform(0.001, 0.01, (n,))),
                 const("zp", rng.integers(-3, 3, (n,))), const("b", rng.standard_normal(n))])


def quant_halves(scale: float, lo: int = -140, hi: int = 140) -> np.ndarray:
    """float32 x with ``x / scale`` exactly on ``k + 0.5`` for k in [lo, hi) where such x
    exists (so round-half-even is what decides), plus out-of-range k (saturation)."""
    s = np.float32(scale)
    out = []
    for k in range(lo, hi):
        c = np.float32((k + 0.5) * float(s))
        for x in (c, np.nextafter(c, np.float32(np.inf)), np.nextafter(c, np.float32(-np.inf))):
            if np.float32(x) / s == np.float32(k + 0.5):
                out.append(x)
                break
    return np.array(out, np.float32)


def quantize_ops(n: int) -> onnx.ModelProto:
    """QuantizeLinear (int8, uint8, per-axis, no zero point) and DynamicQuantizeLinear
    side by side, one output each; inputs ``a``/``b`` of shape (n,), ``c`` (2, n), ``d``
    (n,)."""
    return make("quantize_ops", [
        h.make_node("QuantizeLinear", ["a", "sa", "za"], ["qa"], name="q_int8"),
        h.make_node("QuantizeLinear", ["b", "sb", "zb"], ["qb"], name="q_uint8"),
        h.make_node("QuantizeLinear", ["c", "sc", "zc"], ["qc"], axis=0, name="q_axis"),
        h.make_node("QuantizeLinear", ["b", "sb"], ["qn"], name="q_nozp"),
        h.make_node("DynamicQuantizeLinear", ["d"], ["qd", "sd", "zd"], name="dql"),
    ], [_vi("a", T.FLOAT, [n]), _vi("b", T.FLOAT, [n]), _vi("c", T.FLOAT, [2, n]),
        _vi("d", T.FLOAT, [n])],
        [_vi("qa", T.INT8, [n]), _vi("qb", T.UINT8, [n]), _vi("qc", T.INT8, [2, n]),
         _vi("qn", T.UINT8, [n]), _vi("qd", T.UINT8, [n]), _vi("sd", T.FLOAT, []),
         _vi("zd", T.UINT8, [])],
        [const("sa", 0.0123), const("za", 1, np.int8), const("sb", 0.37),
         const("zb", 128, np.uint8), const("sc", [0.0123, 0.37]), const("zc", [-3, 5], np.int8)])


def integer_gemms(seed=0) -> onnx.ModelProto:
    """ConvInteger, MatMulInteger, QLinearConv (per-channel weights, int32 bias) and
    QLinearMatMul on uint8 activations ``x`` (1, 8, 6, 6) and ``m`` (6, 32)."""
    rng = np.random.default_rng(seed)
    u8 = lambda *s: rng.integers(0, 256, s).astype(np.uint8)  # noqa: E731
    s8 = lambda *s: rng.integers(-128, 128, s).astype(np.int8)  # noqa: E731
    inits = [
        nh.from_array(u8(16, 8, 3, 3), "wu"), const("xz", 131, np.uint8),
        const("wuz", 120, np.uint8),
        nh.from_array(s8(32, 24), "wm"), const("wmz", 3, np.int8),
        const("xs", 0.02), nh.from_array(s8(16, 8, 3, 3), "wq"),
        const("wqs", rng.uniform(0.002, 0.01, 16)), const("wqz", np.zeros(16), np.int8),
        const("ys", 0.05), const("yz", 110, np.uint8),
        const("bq", rng.integers(-2000, 2000, 16), np.int32),
        const("ms", 0.03), const("wms", 0.004), const("ys2", 0.7), const("yz2", 120, np.uint8),
    ]
    return make("integer_gemms", [
        h.make_node("ConvInteger", ["x", "wu", "xz", "wuz"], ["ci"], pads=[1, 1, 1, 1],
                    name="conv_integer"),
        h.make_node("MatMulInteger", ["m", "wm", "xz", "wmz"], ["mi"], name="matmul_integer"),
        h.make_node("QLinearConv", ["x", "xs", "xz", "wq", "wqs", "wqz", "ys", "yz", "bq"],
                    ["qc"], strides=[2, 2], name="qlinear_conv"),
        h.make_node("QLinearMatMul", ["m", "ms", "xz", "wm", "wms", "wmz", "ys2", "yz2"],
                    ["qm"], name="qlinear_matmul"),
    ], [_vi("x", T.UINT8, [1, 8, 6, 6]), _vi("m", T.UINT8, [6, 32])],
        [_vi("ci", T.INT32, [1, 16, 6, 6]), _vi("mi", T.INT32, [6, 24]),
         _vi("qc", T.UINT8, [1, 16, 2, 2]), _vi("qm", T.UINT8, [6, 24])], inits)


def qdq_chain(seed=0) -> onnx.ModelProto:
    """QDQ as quantize_static writes it: x -> Q -> DQ -> Conv (padded, per-channel int8
    weight, zero point 0; bias) -> Relu -> Q -> DQ -> Flatten -> MatMul (int8 weight) ->
    Q -> DQ -> y. Activation zero points are not 0, so the padding must carry them."""
    rng = np.random.default_rng(seed)
    wc = rng.integers(-127, 128, (16, 8, 3, 3)).astype(np.int8)
    wm = rng.integers(-127, 128, (16 * 8 * 8, 10)).astype(np.int8)
    inits = [
        const("s0", 0.02), const("z0", 120, np.uint8),
        nh.from_array(wc, "wc"), const("wcs", rng.uniform(0.002, 0.01, 16)),
        const("wcz", np.zeros(16), np.int8), const("bc", rng.standard_normal(16) * 0.1),
        const("s1", 0.03), const("z1", 7, np.uint8),
        nh.from_array(wm, "wm"), const("wms", 0.004), const("wmz", 0, np.int8),
        const("s2", 0.05), const("z2", 128, np.uint8), const("shape", [1, -1], np.int64),
    ]
    return make("qdq_chain", [
        h.make_node("QuantizeLinear", ["x", "s0", "z0"], ["xq"]),
        h.make_node("DequantizeLinear", ["xq", "s0", "z0"], ["xd"]),
        h.make_node("DequantizeLinear", ["wc", "wcs", "wcz"], ["wcd"], axis=0),
        h.make_node("Conv", ["xd", "wcd", "bc"], ["c"], pads=[1, 1, 1, 1], name="conv0"),
        h.make_node("Relu", ["c"], ["r"]),
        h.make_node("QuantizeLinear", ["r", "s1", "z1"], ["rq"]),
        h.make_node("DequantizeLinear", ["rq", "s1", "z1"], ["rd"]),
        h.make_node("Reshape", ["rd", "shape"], ["f"]),
        h.make_node("DequantizeLinear", ["wm", "wms", "wmz"], ["wmd"]),
        h.make_node("MatMul", ["f", "wmd"], ["m"], name="matmul0"),
        h.make_node("QuantizeLinear", ["m", "s2", "z2"], ["mq"]),
        h.make_node("DequantizeLinear", ["mq", "s2", "z2"], ["y"]),
    ], [_vi("x", T.FLOAT, [1, 8, 8, 8])], [_vi("y", T.FLOAT, [1, 10])], inits)


def depthwise_pair(*, channels=16, size=8, seed=0) -> onnx.ModelProto:
    """Depthwise 3x3 conv, Relu, 1x1 conv, residual Add of the input: every conv blocks."""
    rng = np.random.default_rng(seed)
    c = channels
    return make("depthwise_pair", [
        h.make_node("Conv", ["x", "wd"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=c),
        h.make_node("Relu", ["d"], ["r"]),
        h.make_node("Conv", ["r", "wp", "bp"], ["p"], kernel_shape=[1, 1]),
        h.make_node("Add", ["p", "x"], ["y"]),
    ], [_vi("x", T.FLOAT, [1, c, size, size])], [_vi("y", T.FLOAT, [1, c, size, size])],
        [const("wd", rng.standard_normal((c, 1, 3, 3)) / 3),
         const("wp", rng.standard_normal((c, c, 1, 1)) / c ** 0.5),
         const("bp", rng.standard_normal(c) * 0.1)])


def dynamic_matmul(rows=32, k=128, n=64, seed=0) -> onnx.ModelProto:
    """quantize_dynamic's form of a linear layer: DynamicQuantizeLinear of the float
    input, MatMulInteger with an int8 weight (zero point 0), Cast, Mul by the product
    of the two scales."""
    rng = np.random.default_rng(seed)
    return make("dynamic_matmul", [
        h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
        h.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"], name="matmul_integer"),
        h.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
        h.make_node("Mul", ["xs", "ws"], ["s"]),
        h.make_node("Mul", ["accf", "s"], ["y"]),
    ], [_vi("x", T.FLOAT, [rows, k])], [_vi("y", T.FLOAT, [rows, n])],
        [nh.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "w"),
         const("wz", 0, np.int8), const("ws", 0.01)])


def dynamic_matmul_heads(rows=32, k=64, heads=6, head=64, seed=0) -> onnx.ModelProto:
    """An int8 T5 encoder's Q/K/V projection as quantize_dynamic writes it:
    DynamicQuantizeLinear, MatMulInteger (int8 weight), Cast, Mul by the scales, then
    the reshape to heads and the transpose to (1, heads, rows, head): the GEMM's
    epilogue changes its layout."""
    rng = np.random.default_rng(seed)
    n = heads * head
    return make("dynamic_matmul_heads", [
        h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
        h.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"], name="matmul_integer"),
        h.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
        h.make_node("Mul", ["xs", "ws"], ["s"]),
        h.make_node("Mul", ["accf", "s"], ["m"]),
        h.make_node("Reshape", ["m", "shape"], ["r"]),
        h.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3]),
    ], [_vi("x", T.FLOAT, [1, rows, k])], [_vi("y", T.FLOAT, [1, heads, rows, head])],
        [nh.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "w"),
         const("wz", 0, np.int8), const("ws", 0.01),
         const("shape", [1, rows, heads, head], np.int64)])


def u8_matmul_integer(rows=16, k=128, n=64, seed=0) -> onnx.ModelProto:
    """One MatMulInteger of a uint8 input (zero point 128) and an int8 weight: a single
    integer GEMM kernel."""
    rng = np.random.default_rng(seed)
    return make("u8_matmul_integer", [
        h.make_node("MatMulInteger", ["x", "w", "xz", "wz"], ["y"], name="matmul_integer"),
    ], [_vi("x", T.UINT8, [rows, k])], [_vi("y", T.INT32, [rows, n])],
        [nh.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "w"),
         const("xz", 128, np.uint8), const("wz", 0, np.int8)])


def qdq_matmul_s8(rows=128, k=256, n=128, seed=0) -> onnx.ModelProto:
    """QDQ with int8 (signed, symmetric) activations, as quantize_static writes with
    activation_type=QInt8: Q -> DQ -> MatMul(DQ of an int8 weight) -> Q -> DQ."""
    rng = np.random.default_rng(seed)
    return make("qdq_matmul_s8", [
        h.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        h.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        h.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"]),
        h.make_node("MatMul", ["xd", "wd"], ["m"], name="matmul0"),
        h.make_node("QuantizeLinear", ["m", "sy", "zy"], ["mq"]),
        h.make_node("DequantizeLinear", ["mq", "sy", "zy"], ["y"]),
    ], [_vi("x", T.FLOAT, [rows, k])], [_vi("y", T.FLOAT, [rows, n])],
        [const("sx", 0.02), const("zx", 0, np.int8),
         nh.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "w"),
         const("sw", 0.004), const("zw", 0, np.int8), const("sy", 0.1), const("zy", 0, np.int8)])


def qdq_stem_depthwise(channels=16, size=16, seed=0) -> onnx.ModelProto:
    """The head of a quantized MobileNet, QDQ with power-of-two scales (ONNX Runtime's
    output exact): x (3 channels) -> Q -> DQ -> the stem Conv 3x3 stride 2 (pads with
    the zero point 128) -> Relu -> Q -> DQ -> depthwise Conv 3x3 (zero point 3 pads)
    -> Q -> DQ -> depthwise Conv 5x5 stride 2 (zero point 0, bias) -> Q -> DQ -> y."""
    rng = np.random.default_rng(seed)
    c = channels
    w0 = rng.integers(-127, 128, (c, 3, 3, 3)).astype(np.int8)
    w1 = rng.integers(-127, 128, (c, 1, 3, 3)).astype(np.int8)
    w2 = rng.integers(-127, 128, (c, 1, 5, 5)).astype(np.int8)
    inits = [
        const("s0", 2.0 ** -5), const("z0", 128, np.uint8),
        nh.from_array(w0, "w0"), const("w0s", 2.0 ** -rng.integers(7, 10, c)),
        const("w0z", np.zeros(c), np.int8),
        const("s1", 2.0 ** -2), const("z1", 3, np.uint8),
        nh.from_array(w1, "w1"), const("w1s", 2.0 ** -rng.integers(6, 9, c)),
        const("w1z", np.zeros(c), np.int8),
        const("s2", 2.0 ** -1), const("z2", 0, np.uint8),
        nh.from_array(w2, "w2"), const("w2s", 2.0 ** -8), const("w2z", 0, np.int8),
        const("b2", rng.integers(-64, 64, c) * 2.0 ** -9),
        const("s3", 2.0 ** -1), const("z3", 128, np.uint8),
    ]
    return make("qdq_stem_depthwise", [
        h.make_node("QuantizeLinear", ["x", "s0", "z0"], ["xq"]),
        h.make_node("DequantizeLinear", ["xq", "s0", "z0"], ["xd"]),
        h.make_node("DequantizeLinear", ["w0", "w0s", "w0z"], ["w0d"], axis=0),
        h.make_node("Conv", ["xd", "w0d"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2],
                    name="stem"),
        h.make_node("Relu", ["c0"], ["r0"]),
        h.make_node("QuantizeLinear", ["r0", "s1", "z1"], ["r0q"]),
        h.make_node("DequantizeLinear", ["r0q", "s1", "z1"], ["r0d"]),
        h.make_node("DequantizeLinear", ["w1", "w1s", "w1z"], ["w1d"], axis=0),
        h.make_node("Conv", ["r0d", "w1d"], ["c1"], pads=[1, 1, 1, 1], group=c, name="dw3x3"),
        h.make_node("QuantizeLinear", ["c1", "s2", "z2"], ["c1q"]),
        h.make_node("DequantizeLinear", ["c1q", "s2", "z2"], ["c1d"]),
        h.make_node("DequantizeLinear", ["w2", "w2s", "w2z"], ["w2d"]),
        h.make_node("Conv", ["c1d", "w2d", "b2"], ["c2"], pads=[2, 2, 2, 2], strides=[2, 2],
                    group=c, name="dw5x5"),
        h.make_node("QuantizeLinear", ["c2", "s3", "z3"], ["c2q"]),
        h.make_node("DequantizeLinear", ["c2q", "s3", "z3"], ["y"]),
    ], [_vi("x", T.FLOAT, [1, 3, size, size])],
        [_vi("y", T.FLOAT, [1, c, size // 4, size // 4])], inits)


def qdq_convs(channels=16, size=8, seed=0, depthwise=False) -> onnx.ModelProto:
    """QDQ as quantize_static writes it, with scales that are powers of two (so that
    every float step is exact and ONNX Runtime's output is bit-exact to compare with):
    x -> Q -> DQ -> Conv 1x1 (2x the channels, per-channel int8 weight, bias) -> Relu
    -> Q -> DQ -> Conv 3x3 (padded: the zero point 3 must pad) -> Q -> DQ -> y. With
    ``depthwise`` the 3x3 is depthwise on the 2x channels (a MobileNet block's start)."""
    rng = np.random.default_rng(seed)
    c = channels
    w1 = rng.integers(-127, 128, (2 * c, c, 1, 1)).astype(np.int8)
    w2 = rng.integers(-127, 128, (2 * c, 1, 3, 3) if depthwise else (c, 2 * c, 3, 3)
                      ).astype(np.int8)
    out = 2 * c if depthwise else c
    inits = [
        const("s0", 2.0 ** -5), const("z0", 128, np.uint8),
        nh.from_array(w1, "w1"), const("w1s", 2.0 ** -rng.integers(7, 10, 2 * c)),
        const("w1z", np.zeros(2 * c), np.int8),
        const("b1", rng.integers(-64, 64, 2 * c) * 2.0 ** -9),
        const("s1", 2.0 ** -2), const("z1", 3, np.uint8),
        nh.from_array(w2, "w2"), const("w2s", 2.0 ** -9), const("w2z", 0, np.int8),
        const("s2", 2.0 ** -1), const("z2", 100, np.uint8),
    ]
    return make("qdq_convs", [
        h.make_node("QuantizeLinear", ["x", "s0", "z0"], ["xq"]),
        h.make_node("DequantizeLinear", ["xq", "s0", "z0"], ["xd"]),
        h.make_node("DequantizeLinear", ["w1", "w1s", "w1z"], ["w1d"], axis=0),
        h.make_node("Conv", ["xd", "w1d", "b1"], ["c1"], name="conv1x1"),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("QuantizeLinear", ["r1", "s1", "z1"], ["r1q"]),
        h.make_node("DequantizeLinear", ["r1q", "s1", "z1"], ["r1d"]),
        h.make_node("DequantizeLinear", ["w2", "w2s", "w2z"], ["w2d"]),
        h.make_node("Conv", ["r1d", "w2d"], ["c2"], pads=[1, 1, 1, 1], name="conv3x3",
                    group=2 * c if depthwise else 1),
        h.make_node("QuantizeLinear", ["c2", "s2", "z2"], ["c2q"]),
        h.make_node("DequantizeLinear", ["c2q", "s2", "z2"], ["y"]),
    ], [_vi("x", T.FLOAT, [1, c, size, size])], [_vi("y", T.FLOAT, [1, out, size, size])], inits)


def relu6_pointwise(*, channels=16, out_channels=16, size=8, seed=0) -> onnx.ModelProto:
    """A MobileNet step: a 1x1 conv, ReLU6 (Clip with bounds as inputs), a 1x1 conv and a
    HardSwish. The ONNX importer writes the first clip as TOPI ``call_tir``s and the
    second as ``R.clip`` with scalar bounds."""
    rng = np.random.default_rng(seed)
    c, o = channels, out_channels
    inits = [const("w1", rng.standard_normal((o, c, 1, 1)) * (1 / np.sqrt(c))),
             const("w2", rng.standard_normal((o, o, 1, 1)) * (1 / np.sqrt(o))),
             const("lo", np.array(0.0, np.float32)), const("hi", np.array(6.0, np.float32))]
    return make("relu6_pointwise", [
        h.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[1, 1]),
        h.make_node("Clip", ["c1", "lo", "hi"], ["r6"]),
        h.make_node("Conv", ["r6", "w2"], ["c2"], kernel_shape=[1, 1]),
        h.make_node("HardSwish", ["c2"], ["y"]),
    ], [_vi("x", T.FLOAT, [1, c, size, size])], [_vi("y", T.FLOAT, [1, o, size, size])],
        inits, opset=14)

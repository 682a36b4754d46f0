"""The GGUF header reader against gguf-py's reader, and bad input: every truncation and
random corruption of a real header ends in a ValueError (never another exception, a hang
or a huge allocation)."""
import struct

import numpy as np
import pytest
from gguf import GGUFReader

from cera.errors import BadFile, ModelNotFound
from cera.gguf_file import GGUFFile, NeedMoreBytes, PrefixSource
from cera.reference import Reference
from synth import write_model, write_variant


class BytesSource:
    def __init__(self, data: bytes):
        self.data, self.size = data, len(data)

    def read(self, offset, n):
        return self.data[offset: offset + n]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_variant(tmp_path_factory.mktemp("gguf") / "m.gguf", "qwen2_q8_0")
    return path, path.read_bytes()


def parse(data: bytes) -> GGUFFile:
    return GGUFFile(BytesSource(data))


def test_matches_gguf_py(model):
    path, _ = model
    ours, theirs = GGUFFile.open(path), GGUFReader(path)
    assert len(ours.tensors) == len(theirs.tensors)
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert (info.offset, info.nbytes, info.ggml_type) == (t.data_offset, t.n_bytes, t.tensor_type)
        assert info.ne == tuple(int(d) for d in t.shape)
        assert ours.read(t.name) == bytes(t.data.tobytes())
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        assert ours.metadata[key] == pytest.approx(value) if isinstance(value, float) else ours.metadata[key] == value


def test_prefix_source_asks_for_more(model):
    _, data = model
    g = parse(data)
    with pytest.raises(NeedMoreBytes) as more:
        GGUFFile(PrefixSource(data[:1000], len(data)))
    assert more.value.needed > 1000
    assert GGUFFile(PrefixSource(data[:g.data_offset], len(data))).tensors.keys() == g.tensors.keys()


@pytest.mark.parametrize("patch, message", [
    (lambda d: b"GGUX" + d[4:], "magic"),
    (lambda d: d[:4] + struct.pack("<I", 1) + d[8:], "version 1"),
    (lambda d: d[:4] + struct.pack("<I", 4) + d[8:], "version 4"),
    (lambda d: d[:8] + struct.pack("<Q", 1 << 40) + d[16:], "absurd"),
    (lambda d: d[:16] + struct.pack("<Q", 1 << 50) + d[24:], "absurd"),
    (lambda d: d[:100], "absurd for a 100-byte file"),
    (lambda d: d[:parse(d).data_offset - 40], "truncated"),
    (lambda d: d[:-64], "past end of file"),
    (lambda d: b"", "magic"),
])
def test_bad_files_say_what_is_wrong(model, patch, message):
    _, data = model
    with pytest.raises(ValueError, match=message):
        parse(patch(data))


def _tensor_info_offset(data: bytes, g: GGUFFile, name: str) -> int:
    return data.index(struct.pack("<Q", len(name)) + name.encode())


def test_unknown_type_and_duplicate_names(model):
    _, data = model
    g = parse(data)
    first, second = next((a, b) for a in g.tensors for b in g.tensors if a != b and len(a) == len(b))
    at = _tensor_info_offset(data, g, first) + 8 + len(first)
    n_dims = struct.unpack_from("<I", data, at)[0]
    type_at = at + 4 + 8 * n_dims
    with pytest.raises(ValueError, match=f"tensor {first} has unknown ggml type id 99"):
        parse(data[:type_at] + struct.pack("<I", 99) + data[type_at + 4:])
    at2 = _tensor_info_offset(data, g, second) + 8   # second's name, overwritten with first's
    with pytest.raises(ValueError, match="duplicate tensor name"):
        parse(data[:at2] + first.encode() + data[at2 + len(first):])


def test_every_truncation_is_a_value_error(model):
    _, data = model
    g = parse(data)
    cuts = sorted(set(np.random.default_rng(0).integers(0, g.data_offset, 300).tolist()) | {0, 3, 4, 8, 24})
    for cut in cuts:
        with pytest.raises(ValueError):
            parse(data[:cut])


def test_random_corruption_never_escapes_as_another_error(model):
    """Flip bytes in the header: the reader either parses or raises ValueError."""
    _, data = model
    header = parse(data).data_offset
    rng = np.random.default_rng(1)
    outcomes = {"parsed": 0, "ValueError": 0}
    for _ in range(400):
        corrupt = bytearray(data)
        for at in rng.integers(0, header, rng.integers(1, 8)):
            corrupt[at] = rng.integers(0, 256)
        try:
            parse(bytes(corrupt))
            outcomes["parsed"] += 1
        except ValueError:
            outcomes["ValueError"] += 1
    print(outcomes)
    assert outcomes["ValueError"] > 0


@pytest.mark.parametrize("arch", ["qwen2", "phi3"])
def test_a_split_model_opens_from_its_first_part_as_the_whole(tmp_path, arch):
    """A model split in two as llama.cpp's gguf-split does (gguf's writer, split_max_tensors):
    its first part's path gives the whole model's metadata, tensor bytes and logits (phi3: its
    fused matrices read as their parts once the parts are joined, as in one file)."""
    whole = GGUFFile.open(write_model(tmp_path / "whole.gguf", arch, wtype="q8_0"))
    first = write_model(tmp_path / "split.gguf", arch, wtype="q8_0", split_max_tensors=len(whole.tensors) // 2 + 1)
    parts = sorted(tmp_path.glob("split-*.gguf"))
    assert [p.name for p in parts] == ["split-00001-of-00002.gguf", "split-00002-of-00002.gguf"] and first == parts[0]
    split = GGUFFile.open(first)
    assert split.source.size == sum(p.stat().st_size for p in parts)
    assert split.tensors.keys() == whole.tensors.keys() and split.fused == whole.fused
    for name in whole.tensors:
        assert split.read(name) == whole.read(name), name
    assert {k: v for k, v in split.metadata.items() if not k.startswith("split.")} == whole.metadata
    tokens = [1, 5, 9, 2]
    np.testing.assert_array_equal(Reference(split, 16).forward(tokens, 0), Reference(whole, 16).forward(tokens, 0))


def test_a_split_model_needs_its_first_part_and_every_part(tmp_path):
    n = len(GGUFFile.open(write_model(tmp_path / "whole.gguf", "llama")).tensors)
    first = write_model(tmp_path / "split.gguf", "llama", split_max_tensors=n // 2 + 1)
    second = tmp_path / "split-00002-of-00002.gguf"
    with pytest.raises(BadFile, match="not the first of the 2 parts"):
        GGUFFile.open(second)
    renamed = first.rename(tmp_path / "split-first.gguf")
    with pytest.raises(BadFile, match="the other parts cannot be found"):
        GGUFFile.open(renamed)
    renamed.rename(first)
    second.unlink()
    with pytest.raises(ModelNotFound, match="split-00002-of-00002.gguf"):
        GGUFFile.open(first)

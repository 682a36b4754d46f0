"""scripts/bench_kernels.py, the one maintained A/B script of the weight kernels, on its tiny
shapes: the builders' knobs from its command line (two matvec thread counts, integer x one and
two rows a thread, a matmul tiling, decode attention's heads a workgroup and splits),
one timed run each, so that it cannot rot."""
import re

from script_module import load

bench_kernels = load("bench_kernels")
FIGURES = r" +\d+\.\d+ ms +\d+\.\d+ GB/s +\d+\.\d+ GFLOP/s"


def test_bench_kernels_prints_its_figures(gpu, capsys):
    bench_kernels.main(["--model", "tiny", "--rows", "8", "--pos", "0", "--tpr", "4,16", "--tiles", "64x32x32x4x4",
                        "--variants", "f32", "--depth", "70", "--min-time", "0"], device=gpu.device)
    out = capsys.readouterr().out
    tprs = re.findall(rf"^  matvec attn_q Q4_K 96x256{FIGURES}  (?:sg|wg) tpr (\d+) wg 256", out, re.M)
    assert {"4", "16"} <= set(tprs), out   # and the builder's, where it is neither
    assert re.search(rf"^  matvec ffn_gate\+up Q4_0 40x64{FIGURES}  (?:sg|wg) tpr \d+ wg 256 \(builder\)$", out, re.M), out
    for name in ("attn_q Q4_K 96x256", r"ffn_gate\+up Q4_0 40x64"):
        assert re.search(rf"^  matmul 8 rows {name} f32{FIGURES}  tiles 64x32x32x4x4, \d+ B$", out, re.M), out
        assert re.search(rf"^  {name} +(?:sg|wg) tpr \d+ wg 256 +\d+\.\d   (?:sg|wg) tpr \d+ wg 256", out, re.M), out
    assert re.search(rf"^  prefill attention 8 rows at pos 0 \(2/1x32\){FIGURES}$", out, re.M), out
    assert re.search(rf"^  decode attention at depth 70 \(2/1x32 f16\){FIGURES}  heads \d split 64 \(builder\)$", out,
                     re.M), out


def test_bench_kernels_sweeps_rows_per_thread(gpu, capsys):
    bench_kernels.main(["--model", "tiny", "--only", "matvec", "--matrices", "attn_q", "--tpr", "4", "--x-bits", "24",
                        "--rpt", "1,2", "--min-time", "0"], device=gpu.device)
    out = capsys.readouterr().out
    for config in ("tpr 4 wg 256 x24", "tpr 4 wg 256 x24 rpt 2"):
        assert re.search(rf"^  matvec attn_q Q4_K 96x256{FIGURES}  (?:sg|wg) {config}$", out, re.M), out


def test_bench_kernels_reads_x_records_where_decode_does(gpu, capsys, monkeypatch):
    """Where the model's x has records (RECORD_MIN_K lowered for the tiny shapes), an integer-x
    matvec reads x's record, as decode's would; without, it converts x itself."""
    argv = ["--model", "tiny", "--only", "matvec", "--matrices", "attn_q", "--x-bits", "24", "--min-time", "0"]
    bench_kernels.main(argv, device=gpu.device)
    assert re.search(rf"^  matvec attn_q Q4_K 96x256{FIGURES}  (?:sg|wg) tpr \d+ wg 256 x24$", capsys.readouterr().out, re.M)
    monkeypatch.setattr(bench_kernels.matvec, "RECORD_MIN_K", 0)
    bench_kernels.main(argv, device=gpu.device)
    out = capsys.readouterr().out
    assert re.search(rf"^  matvec attn_q Q4_K 96x256{FIGURES}  (?:sg|wg) tpr \d+ wg 256 x24 rec$", out, re.M), out


def test_bench_kernels_sweeps_decode_attention(gpu, capsys):
    bench_kernels.main(["--model", "tiny", "--only", "decode", "--depth", "100", "--heads", "1,2,3", "--split", "32,64",
                        "--min-time", "0"], device=gpu.device)
    out = capsys.readouterr().out
    for heads in (1, 2):
        for split in (32, 64):
            assert re.search(rf"^  decode attention at depth 100 \(2/1x32 f16\){FIGURES}  heads {heads} split {split}$",
                             out, re.M), out
    assert "3 heads a workgroup (expected a divisor of the GQA group, 2); left out" in out, out

"""scripts/h200/table.py: the run history it appends holds the rows of the table it prints, once."""
import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LATEST = ROOT / "docs" / "perf" / "latest"


def table(history: Path, *extra: str) -> str:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "h200" / "table.py"), str(LATEST), "smollm2",
                           "qwen15", "--history", str(history), *extra],
                          capture_output=True, text=True, check=True).stdout


def test_history_holds_the_printed_rows_once(tmp_path):
    history = tmp_path / "history.csv"
    printed = table(history, "--date", "2026-12-04", "--source", "latest")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in printed.splitlines()
             if line.startswith("| smollm2") or line.startswith("| qwen15")]
    rows = list(csv.DictReader(history.open()))
    assert len(rows) == len(cells) > 0
    for (model, engine, decode, prefill, _), row in zip(cells, rows):
        assert (row["model"], row["engine"]) == (model, engine)
        assert (int(row["decode_tok_s"]), int(row["prefill_tok_s"])) == \
            (int(decode.replace(",", "")), int(prefill.replace(",", "")))
        assert (row["date"], row["source"], row["gpu"], row["depth"]) == ("2026-12-04", "latest", "NVIDIA H200", "512")
    assert table(history, "--date", "2026-12-04", "--source", "latest") == printed
    assert list(csv.DictReader(history.open())) == rows


def test_no_history_leaves_no_file(tmp_path):
    table(tmp_path / "none.csv", "--history", "")
    assert not (tmp_path / "none.csv").exists()

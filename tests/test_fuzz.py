"""The fuzz campaign (tests/fuzz.py) over GGUF headers, LoRA adapters and chat templates: every
case ends in a result or a typed error, and no case grows the process's peak memory past
PEAK_BOUND. The default run takes a sample; the slow set runs the issue's million cases.
How long the slowest case takes is printed by `python tests/fuzz.py`, not asserted here."""
import pytest

import fuzz

PEAK_BOUND = 512 << 20   # bytes; the SmolLM2 header's own load adds about 26 MiB


def check(report: fuzz.Report) -> None:
    report.print()
    assert report.escapes == []
    peak, kind, index, name = report.peak()
    assert peak < PEAK_BOUND, f"{kind} case {index} ({name}) added {peak >> 20} MiB to peak memory"


@pytest.mark.parametrize("host", list(fuzz.HOSTS))
def test_a_sample_of_cases_ends_in_results_or_typed_errors(host, tmp_path):
    cases = 1500 if host == "native" else 300   # the page's pure tokenizer builds SmolLM2's vocabulary slower
    report = fuzz.campaign(cases, seed=1, kind="all", workers=1, out=str(tmp_path), chunk=cases, host=host)
    assert sum(f.cases for f in report.by_kind.values()) == cases
    assert set(report.by_kind) == set(fuzz.KINDS)
    check(report)


@pytest.mark.slow
def test_a_million_cases_end_in_results_or_typed_errors(tmp_path):
    check(fuzz.campaign(1_000_000, seed=0, kind="all", workers=2, out=str(tmp_path)))

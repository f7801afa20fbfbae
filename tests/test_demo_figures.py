"""The README's `make demo` figures are a kept run's, not remembered ones: README.md names one raw
file under results/demo_result/ (written by benchmarks/experiments/demo_result.py from the runs
of the Makefile's demo target) and states its figures, and this checks that they agree: the four
greedy success rates after PPO and its iterations, the SFT warm start's final loss and greedy
success. It also checks that the file was made by the demo as it is now (the Makefile's demo
commands, the settings of the two configs), so that changing the demo without running it again
and citing the new file fails here. docs/results.md cites the same file (among any earlier ones)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.experiments import demo_result

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS_MD = ROOT / "docs" / "results.md"
CITED = re.compile(r"results/demo_result/[\w.-]+\.json")
# "greedy success **0.95 / 0.97 / 1.00 / 0.98** after 55 PPO iterations", in the order of demo_result.SETS;
# a line break may stand for any space (the README is wrapped)
PPO_FIGURES = re.compile(
    r"greedy\s+success\s+\**([\d.]+)\s+/\s+([\d.]+)\s+/\s+([\d.]+)\s+/\s+([\d.]+)\**\s+after\s+(\d+)\s+PPO\s+iterations"
)
SFT_FIGURES = re.compile(
    r"SFT\s+warm\s+start\s+\(final\s+loss\s+([\d.]+),\s+greedy\s+success\s+([\d.]+)\s+on\s+held-out\s+questions"
)


@pytest.fixture(scope="module")
def kept() -> tuple[Path, dict]:
    paths = sorted(set(CITED.findall(README.read_text())))
    assert len(paths) == 1, f"README.md should cite exactly one results/demo_result/ file, cites {paths}"
    path = ROOT / paths[0]
    assert path.is_file(), f"README.md cites {paths[0]}, which does not exist"
    return path, json.loads(path.read_text())


@pytest.mark.timeout(60)
def test_readme_states_the_kept_runs_figures(kept):
    path, data = kept
    text = README.read_text()
    m = PPO_FIGURES.search(text)
    assert m, "README.md: no 'greedy success A / B / C / D after N PPO iterations' sentence"
    ppo = data["result"]["ppo"]
    stated = [m.group(i) for i in range(1, 5)]
    kept_figures = [f"{ppo['success'][name]:.2f}" for name in demo_result.SETS]
    assert stated == kept_figures, (
        f"README.md states {stated} ({', '.join(demo_result.SETS)}); {path.name} holds {kept_figures}: "
        "change both together (run benchmarks/experiments/demo_result.py and cite its file)"
    )
    assert int(m.group(5)) == ppo["iterations_run"], (m.group(5), ppo["iterations_run"])
    s = SFT_FIGURES.search(text)
    assert s, "README.md: no 'SFT warm start (final loss L, greedy success S on held-out questions' phrase"
    sft = data["result"]["sft"]
    assert [s.group(1), s.group(2)] == [f"{sft['final_loss']:.4f}", f"{sft['success']['heldout']:.2f}"], (
        s.groups(),
        sft["final_loss"],
        sft["success"],
    )


@pytest.mark.timeout(60)
def test_the_kept_file_is_the_demo_as_it_is_now(kept):
    path, data = kept
    result = data["result"]
    assert result["commands"] == demo_result.demo_commands(), (
        f"the Makefile's demo target changed since {path.name} was kept: run "
        "benchmarks/experiments/demo_result.py and cite its new file"
    )
    now = {p: demo_result.config_digest(p) for p in result["configs"]}
    changed = sorted(p for p in now if now[p] != result["configs"][p])
    assert not changed, (
        f"the settings of {changed} changed since {path.name} was kept: run "
        "benchmarks/experiments/demo_result.py and cite its new file"
    )
    assert result["ppo"]["iterations_run"] == result["ppo"]["iterations_configured"], "the kept PPO run stopped early"
    assert data["provenance"]["script"] == "benchmarks/experiments/demo_result.py"


@pytest.mark.timeout(60)
def test_docs_results_cites_the_same_file(kept):
    path, _ = kept
    cited = set(CITED.findall(RESULTS_MD.read_text()))  # it may cite earlier runs too
    assert str(path.relative_to(ROOT)) in cited, f"docs/results.md does not cite {path.relative_to(ROOT)}"

"""What the interleaved benchmarks share: the spread of a side's measurements, and writing the
results JSON under benchmarks/results/ (git-ignored, each script's latest run). The raw output with
its provenance, kept per run, goes to results/ through agent_gym/provenance.py's write_raw."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Iterable

RESULTS = Path(__file__).resolve().parent / "results"


def spread(values: Iterable[float], scale: float = 1.0) -> dict[str, float]:
    """Median, min and max of ``values`` (each times ``scale``)."""
    v = [scale * x for x in values]
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


def save(name: str, out: dict[str, Any]) -> Path:
    """Write ``out`` to benchmarks/results/NAME.json and say where."""
    path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")
    return path


def write_json(out: str | Path, result: dict[str, Any]) -> None:
    """Write ``result`` to ``out`` (a script's ``--out``, under benchmarks/results/ by default)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")

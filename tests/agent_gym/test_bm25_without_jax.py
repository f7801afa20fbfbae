"""bm25s must not start JAX: on a GPU machine with JAX installed, its import-time top-k made XLA
take 75% of the GPU before the policy loaded. A stand-in ``jax`` package on the path records
whether anything imports it; the real JAX is not installed here (it is on the GPU machines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("bm25s")

SCRIPT = textwrap.dedent(
    """
    import json, sys
    {before}
    from agent_gym.retrievers.bm25 import BM25Retriever
    r = BM25Retriever([{{"id": "0", "title": "Paris", "text": "Paris is the capital of France."}},
                       {{"id": "1", "title": "Rome", "text": "Rome is the capital of Italy."}}], cache=False)
    hits = r.search(["capital of France"], k=1)
    seen_during_build = "jax" in sys.modules
    import jax  # the user's own import still works afterwards
    print(json.dumps({{"titles": [p.title for p in hits[0]], "jax_during_build": seen_during_build,
                       "jax_after": jax.__name__}}))
    """
)


def _run(tmp_path: Path, code: str) -> tuple[dict | None, list[str]]:
    fake = tmp_path / "site" / "jax"
    fake.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "jax_imports.log"
    (fake / "__init__.py").write_text(f"open({str(log)!r}, 'a').write('jax\\n')\n")
    (fake / "lax.py").write_text(
        f"open({str(log)!r}, 'a').write('jax.lax\\n')\ndef top_k(x, k):\n    open({str(log)!r}, 'a').write('top_k\\n')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = log.read_text().split() if log.exists() else []
    out = proc.stdout.strip().splitlines()
    return (json.loads(out[-1]) if out and out[-1].startswith("{") else None), lines


def test_a_plain_bm25s_import_runs_jax_so_the_stand_in_would_see_it(tmp_path):
    _, calls = _run(tmp_path, "import bm25s")
    assert "top_k" in calls  # bm25s itself calls jax.lax.top_k at import when it finds JAX


@pytest.mark.parametrize("before", ["", "import jax"])
def test_the_retriever_imports_bm25s_without_running_jax(tmp_path, before):
    out, calls = _run(tmp_path, SCRIPT.format(before=before))
    assert out is not None and out["titles"] == ["Paris"]
    assert "top_k" not in calls
    assert out["jax_after"] == "jax"
    if not before:
        assert out["jax_during_build"] is False and calls == ["jax"]  # only the script's own import

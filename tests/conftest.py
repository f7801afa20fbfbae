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

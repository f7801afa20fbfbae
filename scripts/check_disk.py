"""Warn before `make test`'s set-up when the disk looks too small for the venvs it must build.

    python3 scripts/check_disk.py            # from the repository root (the Makefile does this)

The set-up of a venv that is missing writes its whole size before scripts/dedupe_venvs.py can
share its files with the others; the figures below are what each venv took on a clean clone
(2026-11-26, before deduplication). A full disk stops pip midway with "No space left on device";
this says beforehand how much room the set-up wants and how much there is, and the set-up then
goes on (the sizes are estimates, and a venv that was built stays built for the next try).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

# venv directory, its stamp (present once its set-up finished), its size in GB when built alone
VENVS = {
    ".venv": (".agent_gym_installed", 3.1),
    ".venv-vllm": (".agent_gym_vllm_stamp", 2.7),
    ".venv-rllib": (".agent_gym_rllib_stamp", 1.8),
    ".venv-verifiers": (".agent_gym_verifiers_stamp", 0.6),
}
MARGIN_GB = 1.0  # pip's downloads and unpacking, the tests' SFT fixture, the tests' temporary files


def needed_gb(root: Path) -> tuple[float, list[str]]:
    missing = [name for name, (stamp, _) in VENVS.items() if not (root / name / stamp).exists()]
    return sum(VENVS[name][1] for name in missing), missing


def main() -> int:
    root = Path.cwd()
    need, missing = needed_gb(root)
    if not missing:
        return 0
    free = shutil.disk_usage(root).free / 1e9
    if free < need + MARGIN_GB:
        print(
            f"warning: the set-up will build {', '.join(missing)}: about {need:.1f} GB, plus "
            f"{MARGIN_GB:.0f} GB for downloads and test files, but {root} has {free:.1f} GB free. "
            "If pip stops with 'No space left on device', free some space (old clones, "
            "~/.cache/pip, runs/) and run `make test` again: finished venvs are kept.",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

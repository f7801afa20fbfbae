"""Hard-link the files that the project's venvs hold in identical copies.

    python3 scripts/dedupe_venvs.py .venv .venv-vllm .venv-rllib .venv-verifiers

`make test` builds four venvs, three of them around the same CPU torch wheel, and most of their
size is the same packages unpacked three or four times (measured on a clean clone: 9.1 GB of
files, 2.9 GB of them duplicates; torch alone 1.4 GB). Disk is the scarce resource on the machines
CI runs on (a run failed with "No space left on device" while the venvs were set up), so after
each set-up phase the duplicates are replaced by hard links to one copy.

A file is linked to an earlier venv's file only when both have the same path relative to their
venv's root, the same size and permission bits and the same bytes (compared in full), and the two
lie on one filesystem. Each replacement is atomic (a new link under a temporary name, renamed over
the old file), so a reader never sees a missing file. It is safe for later installs: pip removes
files before it writes new ones, so upgrading a package in one venv writes new files there and
leaves the other venv's links as they were. Only standard-library code: it runs with any python3.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import stat
import sys
from pathlib import Path

MIN_SIZE = 4096  # smaller files save less than the work of comparing them


def _files(root: Path):
    """Relative path -> os.stat_result of each regular file under root (no symlinks followed)."""
    out = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size >= MIN_SIZE:  # lstat: a symlink is not regular
                out[os.path.relpath(path, root)] = st
    return out


def _link_over(source: str, target: str) -> None:
    tmp = f"{target}.dedupe-{os.getpid()}"
    os.link(source, tmp)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def dedupe(roots: list[Path], dry_run: bool = False) -> tuple[int, int]:
    """Link every duplicate in roots[1:] to the first venv's copy; returns (files, bytes) saved.

    Bytes already shared (the two paths are one inode) are not counted again.
    """
    seen: dict[tuple[str, int], list[tuple[str, os.stat_result]]] = {}
    linked = saved = 0
    for root in roots:
        for rel, st in sorted(_files(root).items()):
            path = str(root / rel)
            candidates = seen.setdefault((rel, st.st_size), [])
            for first, fst in candidates:
                if (fst.st_dev, fst.st_ino) == (st.st_dev, st.st_ino):
                    break  # already one file
                if fst.st_dev != st.st_dev or fst.st_mode != st.st_mode:
                    continue
                if filecmp.cmp(first, path, shallow=False):
                    if not dry_run:
                        _link_over(first, path)
                    linked += 1
                    saved += st.st_size
                    break
            else:
                candidates.append((path, st))
    return linked, saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("venvs", nargs="+", type=Path, help="venv directories; missing ones are skipped")
    parser.add_argument("--dry-run", action="store_true", help="count the duplicates, link nothing")
    args = parser.parse_args(argv)
    roots = [v.resolve() for v in args.venvs if v.is_dir()]
    if len(roots) < 2:
        print(f"dedupe_venvs: {len(roots)} venv(s) present, nothing to share")
        return 0
    linked, saved = dedupe(roots, dry_run=args.dry_run)
    verb = "would link" if args.dry_run else "linked"
    print(f"dedupe_venvs: {verb} {linked} duplicate files across {len(roots)} venvs, {saved / 1e9:.2f} GB freed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

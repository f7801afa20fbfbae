"""The set-up's disk helpers: scripts/dedupe_venvs.py and scripts/check_disk.py."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
dedupe_venvs = load_script("dedupe_venvs")
check_disk = load_script("check_disk")
pytestmark = pytest.mark.timeout(120)

SITE = Path("lib") / "python3.11" / "site-packages"


def _write(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


def _inode(path: Path) -> int:
    return os.lstat(path).st_ino


def test_links_identical_files_and_nothing_else(tmp_path):
    a, b, c = (tmp_path / n for n in ("a", "b", "c"))
    big = os.urandom(10_000)
    for v in (a, b, c):
        _write(v / SITE / "torch" / "lib.so", big)
    # Same path and size, other bytes (another version of a package).
    _write(a / SITE / "pkg" / "mod.py", b"x" * 5000)
    _write(b / SITE / "pkg" / "mod.py", b"y" * 5000)
    # Same bytes under another path: not the same file of the same package.
    _write(a / SITE / "one.py", big)
    _write(b / SITE / "two.py", big)
    # Same bytes, other permission bits (one inode has one mode).
    _write(a / "bin" / "tool", big, 0o755)
    _write(b / "bin" / "tool", big, 0o644)
    # Too small to be worth it.
    _write(a / SITE / "small.py", b"s" * 100)
    _write(b / SITE / "small.py", b"s" * 100)
    # A symlink is left a symlink.
    (b / "lib64").symlink_to("lib")
    (a / "lib64").symlink_to("lib")

    linked, saved = dedupe_venvs.dedupe([a, b, c], dry_run=True)
    assert (linked, saved) == (2, 20_000)
    assert _inode(a / SITE / "torch" / "lib.so") != _inode(b / SITE / "torch" / "lib.so")  # dry run

    linked, saved = dedupe_venvs.dedupe([a, b, c])
    assert (linked, saved) == (2, 20_000)
    first = _inode(a / SITE / "torch" / "lib.so")
    assert _inode(b / SITE / "torch" / "lib.so") == first == _inode(c / SITE / "torch" / "lib.so")
    assert (c / SITE / "torch" / "lib.so").read_bytes() == big
    for rel in ("pkg/mod.py", "small.py"):
        assert _inode(a / SITE / rel) != _inode(b / SITE / rel)
    assert (b / SITE / "pkg" / "mod.py").read_bytes() == b"y" * 5000
    assert _inode(a / SITE / "one.py") != _inode(b / SITE / "two.py")
    assert _inode(a / "bin" / "tool") != _inode(b / "bin" / "tool")
    assert (b / "lib64").is_symlink()
    assert not list(tmp_path.rglob("*.dedupe-*"))  # no temporary link left behind

    # Idempotent: a second pass finds nothing more.
    assert dedupe_venvs.dedupe([a, b, c]) == (0, 0)

    # An upgrade in one venv (pip removes a file, then writes the new one) leaves the others alone.
    (b / SITE / "torch" / "lib.so").unlink()
    _write(b / SITE / "torch" / "lib.so", b"new" * 4000)
    assert (a / SITE / "torch" / "lib.so").read_bytes() == big
    assert (c / SITE / "torch" / "lib.so").read_bytes() == big


def test_linked_package_imports_in_real_venvs(tmp_path):
    # Two real venvs, one real pure-python package copied into each (pytest_timeout, from this
    # interpreter), deduplicated, then imported by each venv's own python.
    import pytest_timeout

    src = Path(pytest_timeout.__file__)
    venvs = []
    for name in ("v1", "v2"):
        venv = tmp_path / name
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
        site = next((venv / "lib").glob("python3*/site-packages"))
        shutil.copy2(src, site / src.name)
        venvs.append((venv, site / src.name))
    linked, _ = dedupe_venvs.dedupe([v for v, _ in venvs])
    assert linked >= 1  # the package, and the venvs' own identical files (bin/Activate.ps1)
    assert _inode(venvs[0][1]) == _inode(venvs[1][1])
    for venv, _ in venvs:
        out = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import pytest_timeout, sys; print(pytest_timeout.__file__)"],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": os.environ.get("PATH", "")},
        )
        # pytest_timeout imports pytest, which these bare venvs lack: the import must get that far
        # (the linked file was found and run), so the error names pytest, not pytest_timeout.
        assert "No module named 'pytest'" in out.stderr, out.stderr


def test_cli_skips_missing_venvs(tmp_path, capsys):
    assert dedupe_venvs.main([str(tmp_path / "nope"), str(tmp_path)]) == 0
    assert "1 venv(s) present" in capsys.readouterr().out


def test_check_disk_warns_only_when_short(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    # Venvs bigger than the disk: warned, with the figures and what to do; the set-up goes on.
    monkeypatch.setattr(check_disk, "VENVS", {".venv": (".stamp", free_gb + 10), ".venv-x": (".s2", 1.0)})
    assert check_disk.main() == 0
    err = capsys.readouterr().err
    assert "will build .venv, .venv-x" in err and "No space left on device" in err
    assert f"{free_gb:.1f} GB free" in err
    # Once the big venv is built (its stamp exists), only the small one is left: no warning.
    _write(tmp_path / ".venv" / ".stamp", b"")
    assert check_disk.main() == 0
    assert capsys.readouterr().err == ""
    # Nothing left to build: nothing to say.
    _write(tmp_path / ".venv-x" / ".s2", b"")
    assert check_disk.main() == 0
    assert capsys.readouterr().err == ""


def test_check_disk_knows_every_stamp_the_setup_writes():
    # The stamps it looks for are the ones the Makefile and the set-up scripts write.
    text = (ROOT / "Makefile").read_text() + "".join(p.read_text() for p in (ROOT / "scripts").glob("setup_*.sh"))
    for venv, (stamp, _) in check_disk.VENVS.items():
        assert stamp in text, (venv, stamp)
    assert set(check_disk.VENVS) == {".venv", ".venv-vllm", ".venv-rllib", ".venv-verifiers"}

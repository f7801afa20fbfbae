"""The trajectory viewer (agent_gym/view.py), checked in a real headless Chromium.

The trajectories come from a real run: a tiny GRPO run of the project's trainer (random tiny
model, so its episodes fail), plus one iteration file of FactChain episodes played by the env's
own demonstrator and by a wrong answerer (successes, failures, tool calls), written with the
trainer's ``episode_record`` (per-step tool-call statuses and reward components included).

The browser test needs Debian's chromium (``apt-get install -y chromium``, done by ``make
setup``) and the ``playwright`` package (the ``dev`` extra); it skips, naming the fix, without them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_gym.view import ViewerError, build_page_data, normalize, write_viewer

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("AGENT_GYM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _scripted_records(n_oracle: int = 3, n_wrong: int = 2) -> list[dict]:
    """FactChain episodes from the env's demonstrator and a wrong answer, as the trainer writes
    trajectory records (``episode_record`` of the env's ``Episode``)."""
    import gymnasium as gym

    import agent_gym  # noqa: F401  (registers the ids)
    from trainers.sources import episode_record

    env = gym.make("AgentR1/FactChain-v0").unwrapped
    recs = []
    for k in range(n_oracle + n_wrong):
        env.reset(seed=k, options={"task_index": k})
        texts = env.demonstration(env.task) if k < n_oracle else ["<answer>nobody at all</answer>"]
        info: dict = {}
        for text in texts:
            _, _, term, trunc, info = env.step(env.encode_turn(text))
            if term or trunc:
                break
        recs.append(episode_record(info["trajectory"], env.tokenizer, group=k))
    return recs


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    pytest.importorskip("torch", reason="the viewer test trains a tiny run; install the train extra (make setup)")
    from trainers.compose import build_trainer
    from trainers.config import TrainConfig

    run = tmp_path_factory.mktemp("viewer") / "run"
    cfg = TrainConfig(
        run_dir=str(run),
        env_id="AgentR1/FactChain-v0",
        eval_env_kwargs={"split": "test"},
        algo="grpo",
        iterations=2,
        tasks_per_iter=2,
        group_size=2,
        minibatch_size=4,
        max_turn_tokens=16,
        eval_every=100,
        eval_tasks=2,
        tensorboard=False,
        progress_bar=False,
        torch_threads=1,
        log_trajectories=4,
        env_kwargs={"tools_in_prompt": False},
    )
    tr = build_trainer(cfg)
    tr.setup()
    try:
        tr.train()
    finally:
        tr.cleanup()
    with open(run / "trajectories" / "iter_00002.jsonl", "w") as f:
        for r in _scripted_records():
            f.write(json.dumps(r) + "\n")
    return run


def _records(run: Path) -> list[list[dict]]:
    files = sorted((run / "trajectories").glob("iter_*.jsonl"))
    return [[json.loads(x) for x in f.read_text().splitlines()] for f in files]


# -- data, without a browser -------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_page_data_matches_the_files(run_dir):
    from agent_gym.tokenizer import default_tokenizer

    tok = default_tokenizer()
    data = build_page_data(run_dir / "trajectories")
    files = _records(run_dir)
    assert [it["iteration"] for it in data["iterations"]] == [0, 1, 2]
    for it, recs in zip(data["iterations"], files):
        assert len(it["trajectories"]) == len(recs)
        for t, rec in zip(it["trajectories"], recs):
            assert "".join(t["tokens"]) == tok.decode(
                rec["token_ids"], skip_special_tokens=False
            ) or "\ufffd" in "".join(t["tokens"])
            assert t["roles"].count("A") == sum(rec["loss_mask"])
            prompt_len = rec.get("prompt_len", rec["step_spans"][0][0])
            assert t["roles"][:prompt_len] == "P" * prompt_len
            assert len(t["steps"]) == len(rec["step_rewards"])
    assert "rollout/reward_mean" in data["iterations"][0]["metrics"]
    scripted = data["iterations"][2]["trajectories"]
    assert [t["success"] for t in scripted] == [True, True, True, False, False]
    assert any("ok" in s.get("statuses", []) for t in scripted for s in t["steps"])


@pytest.mark.timeout(300)
def test_cli_writes_one_self_contained_page(run_dir, tmp_path):
    out = tmp_path / "page.html"
    r = subprocess.run(
        [sys.executable, "-m", "agent_gym.view", str(run_dir / "trajectories"), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert "13 trajectories" in r.stdout  # 4 + 4 logged by the trainer, 5 scripted
    page = out.read_text()
    # Self-contained: no external script, style, image or font, and no network fetch in the code.
    for needle in ("<script src", "<link", "http://", "https://", "fetch(", "XMLHttpRequest", "@import"):
        assert needle not in page, needle


def test_bad_input_errors_name_file_and_fix(tmp_path):
    d = tmp_path / "trajectories"
    d.mkdir()
    with pytest.raises(ViewerError, match="no iter_XXXXX.jsonl"):
        build_page_data(d)
    (d / "iter_00000.jsonl").write_text('{"token_ids": [1, 2], "loss_mask": [0, 1]}\n{"token_ids": [1, 2], "loss')
    with pytest.raises(ViewerError, match=r"iter_00000.jsonl:2: not valid JSON"):
        build_page_data(d)
    (d / "iter_00000.jsonl").write_text('{"token_ids": [1, 2]}\n')
    with pytest.raises(ViewerError, match=r"iter_00000.jsonl:1: key 'loss_mask' is missing"):
        build_page_data(d)
    (d / "iter_00000.jsonl").write_text('{"token_ids": [1, 2], "loss_mask": [0], "text": "x"}\n')
    with pytest.raises(ViewerError, match="same length"):
        build_page_data(d)
    # A tokenizer that does not decode the ids back to the record's text is refused.
    (d / "iter_00000.jsonl").write_text('{"token_ids": [300, 301], "loss_mask": [0, 1], "text": "not this"}\n')
    with pytest.raises(ViewerError, match="--tokenizer"):
        build_page_data(d)
    with pytest.raises(ViewerError, match="does not exist"):
        build_page_data(tmp_path / "nowhere")


def test_normalize_without_optional_fields():
    t = normalize({"token_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 0]}, list("abcde"))
    assert t["roles"] == "PPAAE" and t["mask_sum"] == 2 and t["steps"] == [] and t["success"] is None
    # Per-token advantages are shown; a list of the wrong length is dropped rather than misaligned.
    assert normalize({"token_ids": [1, 2], "loss_mask": [0, 1], "advantages": [0.0, 0.5]}, ["a", "b"])[
        "advantages"
    ] == [0.0, 0.5]
    assert normalize({"token_ids": [1, 2], "loss_mask": [0, 1], "advantages": [0.5]}, ["a", "b"])["advantages"] is None


# -- the page in a real browser ----------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        pytest.skip(
            f"chromium not found at {CHROMIUM}; install it with `apt-get install -y chromium` "
            "(make setup does) or set AGENT_GYM_CHROMIUM"
        )
    sync_api = pytest.importorskip(
        "playwright.sync_api",
        reason="playwright is missing; pip install playwright (the dev extra: pip install -e .[dev])",
    )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"),
            args=CHROMIUM_ARGS,
            timeout=60_000,
        )
        yield b
        b.close()


@pytest.mark.timeout(300)
def test_page_in_headless_chromium(run_dir, browser, tmp_path):
    page_path, _ = write_viewer(run_dir / "trajectories", tmp_path / "viewer.html")
    files = _records(run_dir)
    page = browser.new_page()
    errors: list[str] = []
    requests: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("request", lambda r: requests.append(r.url))
    page.goto(page_path.resolve().as_uri())

    def cards():
        return page.locator("#list .card")

    def check_iteration(k: int, recs: list[dict], shown: list[int]) -> None:
        assert page.locator("#itlabel").inner_text().startswith(f"iteration {k} ")
        assert cards().count() == len(shown)
        for j, i in enumerate(shown):
            card = cards().nth(j)
            assert card.get_attribute("data-index") == str(i)
            # The highlighted agent tokens are exactly the loss mask's ones.
            assert card.locator(".tok.agent").count() == sum(recs[i]["loss_mask"])
            assert card.locator(".tok").count() == len(recs[i]["token_ids"])
            assert card.locator("tr.step").count() == len(recs[i]["step_rewards"])

    # Step forward through every iteration with the button, then back with the arrow key.
    assert page.locator("#prev").is_disabled()
    for k, recs in enumerate(files):
        if k:
            page.click("#next")
        check_iteration(k, recs, list(range(len(recs))))
    assert page.locator("#next").is_disabled()
    page.keyboard.press("ArrowLeft")
    check_iteration(1, files[1], list(range(len(files[1]))))
    page.locator("#slider").fill("2")  # the slider jumps too
    recs = files[2]
    check_iteration(2, recs, list(range(len(recs))))

    # Filters: success, failure, reward range.
    page.select_option("#success", "success")
    check_iteration(2, recs, [i for i, r in enumerate(recs) if r["success"]])
    assert cards().count() == 3
    page.select_option("#success", "fail")
    check_iteration(2, recs, [i for i, r in enumerate(recs) if not r["success"]])
    page.select_option("#success", "all")
    rewards = [sum(r["step_rewards"]) for r in recs]
    threshold = sorted(rewards)[len(rewards) // 2]
    page.fill("#rmin", str(threshold))
    check_iteration(2, recs, [i for i, r in enumerate(rewards) if r >= threshold])
    page.fill("#rmin", "")
    page.fill("#rmax", str(min(rewards) - 1))
    assert cards().count() == 0 and page.locator(".empty").count() == 1
    page.fill("#rmax", "")
    # Filters stay on while stepping: iteration 0's episodes (random model) all fail.
    page.select_option("#success", "success")
    page.click("#prev")
    page.click("#prev")
    check_iteration(0, files[0], [i for i, r in enumerate(files[0]) if r["success"]])
    page.select_option("#success", "all")

    # Per-step tool-call statuses of a demonstrated episode are on the page.
    page.locator("#slider").fill("2")
    first = cards().nth(0)
    assert "ok" in first.locator("tr.step").nth(0).inner_text()
    assert "reward components" in first.inner_text()
    # Hiding the prompt hides prompt tokens only.
    page.uncheck("#showprompt")
    assert first.locator(".tok.prompt").first.is_hidden()
    assert cards().nth(0).locator(".tok.agent").first.is_visible()

    assert not errors, errors
    assert all(u.startswith("file://") for u in requests), requests
    page.close()

"""The trajectory viewer colours each trained token (loss mask 1) by its advantage, on a diverging
scale: blue pushed up (A > 0), red pushed down (A < 0), the intensity |A| over the iteration's
largest |A|; untrained tokens are left uncoloured. Where a record has per-token importance ratios,
a second view colours by the ratio: purple above 1, orange below, full at the PPO clip (|r - 1| >=
0.2). Checked in the page's data (the HTML) and in the page as a real headless Chromium draws it.

Colours: white blended towards the end colour by t, each channel ``floor(255 + t * (end - 255) + 0.5)``;
blue (33, 102, 172), red (178, 24, 43), purple (94, 60, 153), orange (230, 97, 1).
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from agent_gym.view import build_page_data, normalize, render_html, write_viewer
from tests.agent_gym.test_view import CHROMIUM, CHROMIUM_ARGS

# Tokens:        0 prompt  1 agent  2 agent  3 agent  4 env   5 agent  6 agent
MASK = [0, 1, 1, 1, 0, 1, 1]
ADVANTAGES = [9.0, 2.0, -1.0, 0.5, 7.0, 0.0, -2.0]  # off-mask values are ignored (not trained on)
RATIOS = [1.0, 1.1, 0.9, 1.3, 1.0, 1.0, 0.95]
WANT_ADV = [
    None,
    "rgb(33,102,172)",  # A = 2: full blue (the largest |A| on the mask is 2)
    "rgb(217,140,149)",  # A = -1: red at t = 0.5 (255 - 38.5, 255 - 115.5, 255 - 106)
    "rgb(200,217,234)",  # A = 0.5: blue at t = 0.25 (255 - 55.5, 255 - 38.25, 255 - 20.75)
    None,
    "rgb(255,255,255)",  # A = 0: trained, not pushed
    "rgb(178,24,43)",
]  # A = -2: full red
WANT_RATIO = [
    None,
    "rgb(175,158,204)",  # r = 1.1: purple at t = 0.5 (255 - 80.5, 255 - 97.5, 255 - 51)
    "rgb(243,176,128)",  # r = 0.9: orange at t = 0.5 (255 - 12.5, 255 - 79, 255 - 127)
    "rgb(94,60,153)",  # r = 1.3: past the clip, full purple
    None,
    "rgb(255,255,255)",  # r = 1: on-policy
    "rgb(249,216,192)",
]  # r = 0.95: orange at t = 0.25 (255 - 6.25, 255 - 39.5, 255 - 63.5)
# t is rounded to 4 decimals first (|0.9 - 1| / 0.2 is 0.49999999999999989 in floats: 0.5).


def _write_run(tmp_path):
    d = tmp_path / "run" / "trajectories"
    d.mkdir(parents=True)
    rec = {
        "token_ids": [10, 11, 12, 13, 14, 15, 16],
        "tokens": list("pabcedf"),
        "loss_mask": MASK,
        "advantages": ADVANTAGES,
        "ratios": RATIOS,
        "reward": 1.0,
        "success": True,
    }
    plain = {"token_ids": [10, 11, 12], "tokens": list("pxy"), "loss_mask": [0, 1, 1], "reward": 0.0, "success": False}
    (d / "iter_00000.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps(plain) + "\n")
    return d


def test_colours_in_the_page_data(tmp_path):
    data = build_page_data(_write_run(tmp_path))
    it = data["iterations"][0]
    assert it["adv_scale"] == 2.0
    t, plain = it["trajectories"]
    assert t["adv_colours"] == WANT_ADV and t["ratio_colours"] == WANT_RATIO
    # A record without advantages or ratios has no colours (its tokens keep their role colours).
    assert plain["adv_colours"] is None and plain["ratio_colours"] is None
    # The same colours are in the written HTML (the page's inline data).
    page = render_html(data)
    payload = json.loads(
        re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.DOTALL)
        .group(1)
        .replace("<\\/", "</")
    )
    assert payload["iterations"][0]["trajectories"][0]["adv_colours"] == WANT_ADV


def test_ratios_of_the_wrong_length_are_dropped():
    t = normalize({"token_ids": [1, 2], "loss_mask": [0, 1], "ratios": [1.0]}, ["a", "b"])
    assert t["ratios"] is None


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


def _css(colour):  # how the browser reports a colour: rgb(r, g, b); no background: transparent
    return "rgba(0, 0, 0, 0)" if colour is None else colour.replace(",", ", ")


@pytest.mark.timeout(300)
def test_colours_in_headless_chromium(tmp_path, browser):
    page_path, _ = write_viewer(_write_run(tmp_path), tmp_path / "viewer.html")
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_path.resolve().as_uri())
    toks = page.locator("#list .card").nth(0).locator(".tok")
    plain = page.locator("#list .card").nth(1).locator(".tok")

    def backgrounds(loc):
        return loc.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")

    # A page whose records have advantages opens coloured by advantage.
    assert page.locator("#colour").input_value() == "advantage"
    assert backgrounds(toks) == [_css(c) for c in WANT_ADV]
    assert toks.nth(1).get_attribute("title").endswith(" · adv 2 · ratio 1.100")
    # Text stays readable: white on the two full colours, dark elsewhere.
    colours = toks.evaluate_all("els => els.map(e => getComputedStyle(e).color)")
    assert colours[1] == colours[6] == "rgb(255, 255, 255)" and colours[3] != "rgb(255, 255, 255)"
    # Trajectories without advantages keep their role colours (agent tokens light blue).
    assert backgrounds(plain) == ["rgb(240, 240, 240)", "rgb(207, 232, 255)", "rgb(207, 232, 255)"]
    assert "max |A| 2" in page.locator("#scale").inner_text()

    page.select_option("#colour", "ratio")
    assert backgrounds(toks) == [_css(c) for c in WANT_RATIO]
    page.select_option("#colour", "role")  # the role colours: prompt grey, agent light blue, env yellow
    agent, env = "rgb(207, 232, 255)", "rgb(255, 241, 199)"
    assert backgrounds(toks) == ["rgb(240, 240, 240)", agent, agent, agent, env, agent, agent]
    assert not errors, errors
    page.close()

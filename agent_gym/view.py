"""Trajectory viewer: one self-contained HTML page for a run's logged trajectories.

    python -m agent_gym.view runs/<run>/trajectories/            # writes runs/<run>/trajectories.html
    python -m agent_gym.view runs/<run>/trajectories/ -o page.html --tokenizer Qwen/Qwen2.5-3B-Instruct

The page has no network access and needs none: the data, the script and the styles are inline.
It shows, per trajectory, every token coloured by role (prompt, agent tokens under the loss
mask, env/tool tokens), the per-step rewards, the reward components, tool-call statuses, answer
scores and advantages where the record has them; it filters by success and by a reward range,
and steps through iterations (buttons, a slider, or the left/right arrow keys). See docs/viewer.md.

Colours by advantage and ratio (decision): where records carry per-token ``advantages``, each
trained token (loss mask 1) is coloured on a diverging scale, blue where the update pushed it up
(A > 0) and red where it pushed it down (A < 0), the intensity ``|A|`` over the iteration's largest
``|A|`` on the mask (one scale per iteration, so trajectories compare; a GRPO trajectory has one
advantage on all its tokens), and untrained tokens are left uncoloured. Where records carry
per-token importance ratios (``ratios``), a second view colours trained tokens purple for r > 1 and
orange for r < 1, full at the PPO clip (``|r - 1| >= 0.2``, a fixed scale: on-policy ratios are 1
up to rounding, and scaling them to their own maximum would show noise at full colour). The
colours are computed here (``token_colours``) and written in the page's data; a select switches
between them and the role colours.

Token text (decision): the trajectory files hold token ids, not per-token strings, so the viewer
loads the run's tokenizer, resolved from ``<run>/config.yaml`` the way the trainer resolves it
(``tokenizer``, else ``init_from`` for ``model: tiny``, else ``model``; the built-in tokenizer for
a plain ``tiny`` run), or from ``--tokenizer``. A record that carries ``tokens`` (one string per
id) is shown as is. When a record carries ``text`` (the trainer's decoded trajectory), the page
is only written if the tokenizer decodes the ids back to that text, so a wrong tokenizer fails
with an error instead of showing wrong words.

Records are read tolerantly: the fields below are looked up at the top level, then under
``stats`` (the trainer's per-episode facts), then under ``episode``; missing optional ones are
left out of the page. ``token_ids`` and ``loss_mask`` are required.
"""

from __future__ import annotations

import html
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from agent_gym.cli_errors import ArgumentParser, UserError, command, prog_name, report
from agent_gym.tokenizer import load_tokenizer

_ITER_FILE = re.compile(r"iter_(\d+)\.jsonl$")

# Field names accepted for each viewer field (first match wins).
_ALIASES: dict[str, tuple[str, ...]] = {
    "prompt_len": ("prompt_len",),
    "step_spans": ("step_spans",),
    "step_rewards": ("step_rewards",),
    "success": ("success",),
    "reward": ("reward", "total_reward"),
    "task_index": ("task_index",),
    "group": ("group",),
    "turns": ("turns",),
    "truncation_reason": ("truncation_reason",),
    "answer": ("answer",),
    "answer_scores": ("answer_scores",),
    "reward_components": ("reward_components",),
    "call_statuses": ("call_statuses", "tool_statuses"),
    "step_reward_components": ("step_reward_components",),
    "step_call_statuses": ("step_call_statuses", "step_tool_statuses"),
    "advantages": ("advantages", "token_advantages"),
    "advantage": ("advantage",),
    "ratios": ("ratios", "importance_ratios", "token_ratios"),
    "tokens": ("tokens", "token_strs"),
}


class ViewerError(UserError, ValueError):
    """The trajectory files cannot be shown as they are; the message says why and what to do."""


def _lookup(rec: dict[str, Any], key: str) -> Any:
    for scope in (rec, rec.get("stats"), rec.get("episode")):
        if isinstance(scope, dict):
            for name in _ALIASES[key]:
                if name in scope and scope[name] is not None:
                    return scope[name]
    return None


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


# -- reading ---------------------------------------------------------------------------------


def find_iteration_files(path: str | Path) -> list[tuple[int, Path]]:
    """``(iteration, file)`` pairs, sorted, from a trajectories dir, a run dir or one file."""
    p = Path(path)
    if p.is_dir() and (p / "trajectories").is_dir() and not any(p.glob("iter_*.jsonl")):
        p = p / "trajectories"
    files = [p] if p.is_file() else sorted(p.glob("iter_*.jsonl")) if p.is_dir() else []
    if not p.exists():
        raise ViewerError(f"{p} does not exist; pass a run's trajectories directory, e.g. runs/<run>/trajectories/")
    out = []
    for f in files:
        m = _ITER_FILE.search(f.name)
        out.append((int(m.group(1)) if m else 0, f))
    if not out:
        raise ViewerError(
            f"no iter_XXXXX.jsonl files in {p}; the trainer writes them to <run>/trajectories/ "
            "(config log_trajectories > 0)"
        )
    return sorted(out)


def read_records(path: Path) -> list[dict[str, Any]]:
    recs = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise ViewerError(
                f"{path}:{lineno}: not valid JSON ({e}); was the file cut by a kill? "
                "Delete the line or the file and run the viewer again."
            ) from e
        if not isinstance(rec, dict):
            raise ViewerError(f"{path}:{lineno}: expected a JSON object per line, got {type(rec).__name__}")
        for key in ("token_ids", "loss_mask"):
            if not isinstance(rec.get(key), list):
                raise ViewerError(
                    f"{path}:{lineno}: key {key!r} is missing or not a list; the viewer needs "
                    "token_ids and loss_mask in every trajectory record"
                )
        if len(rec["token_ids"]) != len(rec["loss_mask"]):
            raise ViewerError(
                f"{path}:{lineno}: token_ids has {len(rec['token_ids'])} entries but loss_mask "
                f"has {len(rec['loss_mask'])}; they must be the same length"
            )
        recs.append(rec)
    return recs


def run_tokenizer(run_dir: Path, spec: str | None = None) -> Any:
    """The tokenizer a run used (see the module docstring), or ``spec`` when given."""
    if spec is not None:
        return load_tokenizer(spec)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        return load_tokenizer(None)
    import yaml  # deferred: yaml (~20 ms) stays out of `agent-gym-view --help`; only a run's config.yaml needs it

    cfg = yaml.safe_load(cfg_path.read_text()) or {}
    if isinstance(cfg.get("model"), dict):  # a sectioned config (trainers.config); older runs' are flat
        cfg = cfg["model"] | {"model": cfg["model"].get("name", "tiny")}
    if cfg.get("tokenizer"):
        return load_tokenizer(cfg["tokenizer"])
    model = cfg.get("model", "tiny")
    if model == "tiny":
        return load_tokenizer(cfg["init_from"]) if cfg.get("init_from") else load_tokenizer(None)
    return load_tokenizer(model)


def token_strings(ids: Sequence[int], decode: Callable[[list[int]], str], cache: dict[int, str]) -> list[str]:
    """One display string per id (each id decoded alone, memoized)."""
    out = []
    for t in ids:
        s = cache.get(t)
        if s is None:
            s = cache[t] = decode([int(t)])
        out.append(s)
    return out


# -- one record to the page's shape ------------------------------------------------------------


def normalize(rec: dict[str, Any], tokens: list[str]) -> dict[str, Any]:
    """The fields the page uses, with roles as one char per token: P prompt, A agent, E env."""
    ids, mask = rec["token_ids"], rec["loss_mask"]
    spans = _lookup(rec, "step_spans") or []
    prompt_len = _lookup(rec, "prompt_len")
    if prompt_len is None:  # the first agent token ends the prompt
        prompt_len = spans[0][0] if spans else next((i for i, m in enumerate(mask) if m), len(ids))
    roles = "".join("A" if m else ("P" if i < prompt_len else "E") for i, m in enumerate(mask))
    step_rewards = [_finite(r) for r in (_lookup(rec, "step_rewards") or [])]
    step_comps = _lookup(rec, "step_reward_components") or []
    step_status = _lookup(rec, "step_call_statuses") or []
    steps = []
    for k in range(max(len(spans), len(step_rewards))):
        step: dict[str, Any] = {
            "span": spans[k] if k < len(spans) else None,
            "reward": step_rewards[k] if k < len(step_rewards) else None,
        }
        if k < len(step_comps):
            step["components"] = step_comps[k]
        if k < len(step_status):
            step["statuses"] = step_status[k]
        steps.append(step)
    reward = _finite(_lookup(rec, "reward"))
    if reward is None and step_rewards:
        reward = float(sum(r for r in step_rewards if r is not None))
    success = _lookup(rec, "success")
    advantages = _per_token(_lookup(rec, "advantages"), len(ids))
    ratios = _per_token(_lookup(rec, "ratios"), len(ids))
    statuses = _lookup(rec, "call_statuses")
    if isinstance(statuses, list):  # per call: count them
        counts: dict[str, int] = {}
        for s in statuses:
            s = s.get("status") if isinstance(s, dict) else s
            counts[str(s)] = counts.get(str(s), 0) + 1
        statuses = counts
    return {
        "task_index": _lookup(rec, "task_index"),
        "group": _lookup(rec, "group"),
        "reward": reward,
        "success": None if success is None else bool(success),
        "turns": _lookup(rec, "turns"),
        "truncation_reason": _lookup(rec, "truncation_reason"),
        "answer": _lookup(rec, "answer"),
        "answer_scores": _lookup(rec, "answer_scores") or {},
        "reward_components": _lookup(rec, "reward_components") or {},
        "call_statuses": statuses or {},
        "advantage": _finite(_lookup(rec, "advantage")),
        "advantages": [round(float(a), 4) for a in advantages] if advantages is not None else None,
        "ratios": [round(float(r), 4) for r in ratios] if ratios is not None else None,
        "steps": steps,
        "roles": roles,
        "tokens": tokens,
        "ids": [int(t) for t in ids],
        "mask_sum": int(sum(1 for m in mask if m)),
    }


def _per_token(values: Any, n: int) -> list[Any] | None:
    """``values`` when it is one per token, else None: shown nowhere rather than misaligned."""
    return values if isinstance(values, list) and len(values) == n else None


# Diverging scales (ColorBrewer's RdBu and PuOr ends): white at 0, these at full intensity.
ADV_UP, ADV_DOWN = (33, 102, 172), (178, 24, 43)  # blue: pushed up (A > 0); red: pushed down
RATIO_UP, RATIO_DOWN = (94, 60, 153), (230, 97, 1)  # purple: r > 1 (more likely now); orange: r < 1
RATIO_FULL = 0.2
"""``|r - 1|`` at which a ratio's colour is full: PPO's default clip (``algorithm.clip_low/high``)."""


def blend(t: float, end: tuple[int, int, int]) -> str:
    """White blended towards ``end`` by ``t`` in [0, 1] (rounded to 4 decimals first, so that float
    noise cannot move a channel), as CSS: each channel ``floor(255 + t * (end - 255) + 0.5)``."""
    t = round(min(max(t, 0.0), 1.0), 4)
    return "rgb({},{},{})".format(*(math.floor(255 + t * (c - 255) + 0.5) for c in end))


def token_colours(
    values: list[float] | None,
    roles: str,
    scale: float,
    signed: Any,
    up: tuple[int, int, int],
    down: tuple[int, int, int],
) -> list[str | None] | None:
    """One CSS colour per trained token (role ``A``), None elsewhere (and for a value that is not
    finite); None without ``values``. ``signed(v)`` is the signed distance from neutral (A, or
    r - 1), coloured ``up`` above 0 and ``down`` below, at intensity ``|signed(v)| / scale``
    (0 when ``scale`` is 0: every value neutral, white)."""
    if values is None:
        return None
    out: list[str | None] = []
    for v, role in zip(values, roles):
        d = signed(v) if role == "A" and _finite(v) is not None else None
        out.append(None if d is None else blend(abs(d) / scale if scale > 0 else 0.0, up if d >= 0 else down))
    return out


def add_colours(trajs: list[dict[str, Any]]) -> float:
    """Set ``adv_colours`` and ``ratio_colours`` of one iteration's normalized trajectories;
    returns the advantage scale, the largest ``|A|`` on their trained tokens (0 without any)."""
    scale = max(
        (
            abs(a)
            for t in trajs
            if t["advantages"]
            for a, r in zip(t["advantages"], t["roles"])
            if r == "A" and _finite(a) is not None
        ),
        default=0.0,
    )
    for t in trajs:
        t["adv_colours"] = token_colours(t["advantages"], t["roles"], scale, float, ADV_UP, ADV_DOWN)
        t["ratio_colours"] = token_colours(
            t["ratios"], t["roles"], RATIO_FULL, lambda r: float(r) - 1.0, RATIO_UP, RATIO_DOWN
        )
    return scale


def build_page_data(path: str | Path, tokenizer: Any = None) -> dict[str, Any]:
    """Everything the page shows, as one JSON-able dict."""
    files = find_iteration_files(path)
    traj_dir = files[0][1].parent
    run_dir = traj_dir.parent if traj_dir.name == "trajectories" else traj_dir
    cache: dict[int, str] = {}
    decode = None
    iterations = []
    for it, f in files:
        trajs = []
        for lineno, rec in enumerate(read_records(f), 1):
            tokens = _lookup(rec, "tokens")
            if tokens is None or len(tokens) != len(rec["token_ids"]):
                if decode is None:
                    tok = tokenizer if tokenizer is not None else run_tokenizer(run_dir)
                    decode = lambda ids, tok=tok: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
                    check = tok
                if (
                    isinstance(rec.get("text"), str)
                    and check.decode(rec["token_ids"], skip_special_tokens=False) != rec["text"]
                ):
                    raise ViewerError(
                        f"{f}:{lineno}: the tokenizer does not decode token_ids back to the record's "
                        "text, so it is not the run's tokenizer; pass the right one with --tokenizer "
                        "(a directory with tokenizer.json or a hub name)"
                    )
                tokens = token_strings(rec["token_ids"], decode, cache)
            trajs.append(normalize(rec, [str(s) for s in tokens]))
        adv_scale = add_colours(trajs)
        iterations.append({"iteration": it, "file": f.name, "trajectories": trajs, "adv_scale": adv_scale})
    metrics = {}
    mpath = run_dir / "metrics.jsonl"
    if mpath.is_file():
        for line in mpath.read_text().splitlines():
            try:
                m = json.loads(line)
            except ValueError:
                continue
            if isinstance(m, dict) and "iteration" in m:
                metrics[int(m["iteration"])] = {
                    k: v for k, v in m.items() if k.startswith(("rollout/", "eval/", "adv/"))
                }
    for entry in iterations:
        entry["metrics"] = metrics.get(entry["iteration"], {})
    return {"run": str(run_dir), "iterations": iterations}


# -- the page ------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:8px 14px;z-index:2}
header h1{font-size:16px;margin:0 0 6px}
.bar{display:flex;flex-wrap:wrap;gap:10px;align-items:center}
.bar label{display:flex;gap:4px;align-items:center}
input[type=number]{width:6em}
#metrics{font-size:12px;color:#555;margin-top:4px}
main{padding:10px 14px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;margin:0 0 12px;padding:8px 10px}
.card.ok{border-left:5px solid #2e9d4c}.card.fail{border-left:5px solid #c9372c}
.head{display:flex;flex-wrap:wrap;gap:14px;font-weight:600}
.facts{font-size:12px;margin:4px 0}
.facts table{border-collapse:collapse}
.facts td,.facts th{border:1px solid #e2e2e2;padding:1px 6px;text-align:left}
.tokens{font:12px/1.6 ui-monospace,monospace;white-space:pre-wrap;word-break:break-all;border-top:1px dashed #ddd;padding-top:4px}
.tok{border-radius:2px}
.tok.prompt{color:#777;background:#f0f0f0}
.tok.agent{background:#cfe8ff;color:#003c78}
.tok.agent.odd{background:#b3d9ff}
.tok.env{background:#fff1c7;color:#6b4d00}
.prompt-hidden .tok.prompt{display:none}
.by-value .tok{background:none}
.by-value .tok.agent{box-shadow:inset 0 -1px #8a8a8a}
#scale{font-size:12px;color:#555}
.legend span{padding:0 6px;margin-right:4px}
.empty{color:#777;font-style:italic}
"""

_JS = r"""
const DATA = JSON.parse(document.getElementById('data').textContent);
const $ = id => document.getElementById(id);
let cur = 0;
function fmt(x){ return x === null || x === undefined ? '–' : (typeof x === 'number' ? (Number.isInteger(x) ? String(x) : x.toFixed(3)) : String(x)); }
function el(tag, cls, text){ const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; }
function kv(obj){ const ks = Object.keys(obj || {}); return ks.length ? ks.map(k => k + ': ' + fmt(obj[k])).join(', ') : '–'; }
function dark(rgb){  // white text on a dark background
  const [r, g, b] = rgb.match(/\d+/g).map(Number);
  return 0.299 * r + 0.587 * g + 0.114 * b < 140;
}
function scaleText(it){
  const m = $('colour').value;
  if (m === 'advantage') return 'advantage: blue pushed up, red pushed down; full at max |A| ' + fmt(it.adv_scale) + ' (this iteration); untrained tokens uncoloured';
  if (m === 'ratio') return 'importance ratio: purple r > 1, orange r < 1; full at |r - 1| >= 0.2; untrained tokens uncoloured';
  return '';
}
function passes(t){
  const s = $('success').value;
  if (s === 'success' && t.success !== true) return false;
  if (s === 'fail' && t.success !== false) return false;
  const lo = parseFloat($('rmin').value), hi = parseFloat($('rmax').value);
  if (!isNaN(lo) && !(t.reward !== null && t.reward >= lo)) return false;
  if (!isNaN(hi) && !(t.reward !== null && t.reward <= hi)) return false;
  return true;
}
function stepOf(t){  // token index -> step number, for agent tokens
  const m = new Int32Array(t.ids.length).fill(-1);
  t.steps.forEach((s, k) => { if (s.span) for (let i = s.span[0]; i < s.span[1] && i < m.length; i++) m[i] = k; });
  return m;
}
function card(t, idx){
  const c = el('div', 'card ' + (t.success === true ? 'ok' : t.success === false ? 'fail' : ''));
  c.dataset.index = idx; c.dataset.success = String(t.success); c.dataset.reward = String(t.reward);
  const h = el('div', 'head');
  [['#', idx], ['task', t.task_index], ['group', t.group], ['reward', t.reward], ['success', t.success],
   ['turns', t.turns], ['end', t.truncation_reason || (t.answer !== null ? 'answered' : null)],
   ['agent tokens', t.mask_sum], ['advantage', t.advantage]].forEach(([k, v]) => {
    if (v !== null && v !== undefined) h.appendChild(el('span', null, k + ' ' + fmt(v)));
  });
  c.appendChild(h);
  const f = el('div', 'facts');
  f.appendChild(el('div', null, 'answer: ' + fmt(t.answer) + ' · scores: ' + kv(t.answer_scores)));
  f.appendChild(el('div', 'components', 'reward components: ' + kv(t.reward_components)));
  f.appendChild(el('div', 'statuses', 'tool calls: ' + kv(t.call_statuses)));
  if (t.steps.length){
    const tb = el('table', 'steps'), hr = el('tr');
    const extra = t.steps.some(s => s.components), st = t.steps.some(s => s.statuses);
    ['step', 'agent tokens', 'reward'].concat(extra ? ['components'] : [], st ? ['tool calls'] : []).forEach(x => hr.appendChild(el('th', null, x)));
    tb.appendChild(hr);
    t.steps.forEach((s, k) => {
      const r = el('tr', 'step');
      [k, s.span ? s.span[0] + '–' + s.span[1] : '–', fmt(s.reward)].forEach(x => r.appendChild(el('td', null, String(x))));
      if (extra) r.appendChild(el('td', null, kv(s.components)));
      if (st) r.appendChild(el('td', null, Array.isArray(s.statuses) ? s.statuses.map(x => (x && x.status) || x).join(', ') : kv(s.statuses)));
      tb.appendChild(r);
    });
    f.appendChild(tb);
  }
  c.appendChild(f);
  const mode = $('colour').value, colours = mode === 'advantage' ? t.adv_colours : mode === 'ratio' ? t.ratio_colours : null;
  const box = el('div', 'tokens' + ($('showprompt').checked ? '' : ' prompt-hidden') + (colours ? ' by-value' : ''));
  const steps = stepOf(t), names = {P: 'prompt', A: 'agent', E: 'env'};
  const frag = document.createDocumentFragment();
  for (let i = 0; i < t.ids.length; i++){
    const role = names[t.roles[i]];
    const s = el('span', 'tok ' + role + (role === 'agent' && steps[i] % 2 === 1 ? ' odd' : ''), t.tokens[i]);
    let title = 'pos ' + i + ' · id ' + t.ids[i] + ' · ' + role;
    if (steps[i] >= 0) title += ' · step ' + steps[i];
    if (t.advantages) title += ' · adv ' + fmt(t.advantages[i]);
    if (t.ratios) title += ' · ratio ' + fmt(t.ratios[i]);
    s.title = title;
    if (colours && colours[i]){
      s.style.background = colours[i];
      if (dark(colours[i])) s.style.color = '#fff';
    }
    frag.appendChild(s);
  }
  box.appendChild(frag);
  c.appendChild(box);
  return c;
}
function render(){
  const it = DATA.iterations[cur];
  $('itlabel').textContent = 'iteration ' + it.iteration + ' (' + (cur + 1) + ' / ' + DATA.iterations.length + ')';
  $('slider').value = cur;
  $('prev').disabled = cur === 0; $('next').disabled = cur === DATA.iterations.length - 1;
  $('metrics').textContent = kv(it.metrics);
  $('scale').textContent = scaleText(it);
  const list = $('list'); list.textContent = '';
  let shown = 0;
  it.trajectories.forEach((t, i) => { if (passes(t)) { list.appendChild(card(t, i)); shown++; } });
  $('count').textContent = shown + ' of ' + it.trajectories.length + ' trajectories';
  if (!shown) list.appendChild(el('div', 'empty', 'no trajectory of this iteration passes the filters'));
}
function go(k){ cur = Math.max(0, Math.min(DATA.iterations.length - 1, k)); render(); }
$('prev').onclick = () => go(cur - 1);
$('next').onclick = () => go(cur + 1);
$('slider').max = DATA.iterations.length - 1;
$('slider').oninput = e => go(parseInt(e.target.value, 10));
['success', 'rmin', 'rmax', 'showprompt', 'colour'].forEach(id => $(id).addEventListener('input', render));
{  // open coloured by advantage where the page has advantages (else ratios, else roles)
  const has = k => DATA.iterations.some(it => it.trajectories.some(t => t[k]));
  ['advantage', 'ratio'].forEach((m, k) => { if (!has(['adv_colours', 'ratio_colours'][k])) $('colour').querySelector('option[value=' + m + ']').disabled = true; });
  $('colour').value = has('adv_colours') ? 'advantage' : has('ratio_colours') ? 'ratio' : 'role';
}
document.addEventListener('keydown', e => {
  if (e.target.tagName === 'INPUT' || e.target.tagName === 'SELECT') return;
  if (e.key === 'ArrowLeft') go(cur - 1); else if (e.key === 'ArrowRight') go(cur + 1);
});
render();
"""


def render_html(data: dict[str, Any]) -> str:
    # "</" inside the JSON would close the script element early; "<\/" is the same JSON string.
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
    title = html.escape(f"trajectories: {data['run']}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<style>{_CSS}</style></head>
<body>
<header><h1>{title}</h1>
<div class="bar">
<button id="prev" type="button">&larr; prev</button>
<input id="slider" type="range" min="0" value="0" step="1" aria-label="iteration">
<button id="next" type="button">next &rarr;</button>
<span id="itlabel"></span>
<label>success <select id="success"><option value="all">all</option><option value="success">successes</option><option value="fail">failures</option></select></label>
<label>reward &ge; <input id="rmin" type="number" step="any"></label>
<label>reward &le; <input id="rmax" type="number" step="any"></label>
<label><input id="showprompt" type="checkbox" checked> show prompt</label>
<label>colour by <select id="colour"><option value="role">role</option><option value="advantage">advantage</option><option value="ratio">importance ratio</option></select></label>
<span id="count"></span>
<span class="legend"><span class="tok prompt">prompt</span><span class="tok agent">agent (loss mask)</span><span class="tok env">env / tool</span></span>
</div>
<div id="metrics"></div>
<div id="scale"></div>
</header>
<main id="list"></main>
<script type="application/json" id="data">{payload}</script>
<script>{_JS}</script>
</body></html>
"""


def write_viewer(path: str | Path, out: str | Path | None = None, tokenizer: Any = None) -> tuple[Path, int]:
    """Build the page for the trajectories under ``path`` and write it; returns its path and
    the number of trajectories on it."""
    data = build_page_data(path, tokenizer)
    out_path = Path(out) if out is not None else Path(data["run"]) / "trajectories.html"
    out_path.write_text(render_html(data), encoding="utf-8")
    return out_path, sum(len(it["trajectories"]) for it in data["iterations"])


@command  # without argv (the command line): one line and exit 2 on a bad input (agent_gym/cli_errors.py)
def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(
        prog=prog_name("python -m agent_gym.view", argv, module="agent_gym.view"), description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("path", help="a run's trajectories/ directory (or the run directory, or one iter_XXXXX.jsonl)")
    ap.add_argument("-o", "--out", help="where to write the page (default: <run>/trajectories.html)")
    ap.add_argument("--tokenizer", help="tokenizer directory or hub name (default: the run's, from config.yaml)")
    args = ap.parse_args(argv)
    try:
        tok = run_tokenizer(Path(args.path), args.tokenizer) if args.tokenizer else None
        out, n = write_viewer(args.path, args.out, tok)
    except ViewerError as e:
        return report(str(e), 2)
    print(f"wrote {out} ({n} trajectories); open file://{out.resolve()} in a browser")
    return 0


if __name__ == "__main__":
    sys.exit(main())

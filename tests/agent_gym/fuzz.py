"""A fuzzed action source shared by the conformance tests and the env benchmark."""

from __future__ import annotations

import json

import numpy as np

WORDS = 'the of Karimel mentor rival who is Paris capital 1902 born search lookup {} [] " : , \\n'.split()


def random_args(schema: dict, rng: np.random.Generator, hints: list[str] | None = None) -> dict:
    """Random arguments; strings often reuse words of the task (``hints``) so calls can succeed."""
    out = {}
    for k, p in schema.get("properties", {}).items():
        if "enum" in p:
            out[k] = p["enum"][int(rng.integers(len(p["enum"])))]
        elif p.get("type") == "integer":
            out[k] = int(rng.integers(-3, 50))
        elif hints and rng.random() < 0.6:
            out[k] = str(rng.choice(hints))
        else:
            out[k] = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 4))))
    return out


def fuzz_action(env, rng: np.random.Generator, task: dict | None = None) -> np.ndarray:
    """One action: random ids, or text that is a valid call, a malformed call, or an answer."""
    u = env.unwrapped
    tok = u.tokenizer
    kind = int(rng.integers(6))
    if kind == 0:
        ids = rng.integers(0, u.vocab_size, size=int(rng.integers(0, 48))).tolist()
        if rng.random() < 0.5:
            ids.append(int(rng.choice(u.stop_token_ids)))
        return np.asarray(ids, dtype=np.int64)
    schemas = [t.schema()["function"] for t in u.tools.values()]
    if kind in (1, 2) and not schemas:  # an env without tools: write a malformed call instead
        kind = 3
    hints = [w.strip("?.,\"'") for w in (task or {}).get("question", "").split()] + [(task or {}).get("question", "x")]
    if kind in (1, 2):
        fn = schemas[int(rng.integers(len(schemas)))]
        if u.format.name == "search_r1":
            text = f"<search>{random_args(fn['parameters'], rng, hints).get('query', 'x')}</search>"
        else:
            text = (
                "<tool_call>"
                + json.dumps({"name": fn["name"], "arguments": random_args(fn["parameters"], rng, hints)})
                + "</tool_call>"
            )
    elif kind == 3:
        text = '<tool_call>{"name": "' + str(rng.choice(WORDS)) + '", "arguments": {' + "</tool_call>"
    elif kind == 4:
        gold = (task or {}).get("answer", "x")
        text = f"<answer>{gold if rng.random() < 0.5 else rng.choice(WORDS)}</answer>"
    else:
        text = " ".join(rng.choice(WORDS + ["<answer>", "<tool_call>", "</tool_call>"], size=int(rng.integers(1, 8))))
    ids = tok.encode(text, add_special_tokens=False)
    if rng.random() < 0.9:
        ids.append(u.eot_id)
    return np.asarray(ids, dtype=np.int64)

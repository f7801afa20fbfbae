"""The transformers generation backend: a hand-written batched sampling loop for the CPU.

Why not ``model.generate``: the trainer needs, per row, the exact sampled ids (stop id included),
the log-prob of each id under the distribution it was drawn from, a stop on any of several ids,
and a per-request seed. Writing the loop keeps each of these explicit and testable.

The loop:
- prompts are left-padded into one (B, L) batch with an attention mask, and position ids count
  real tokens only (``cumsum(mask) - 1``), so a padded row sees the same positions, and hence
  the same rotary phases, as the same prompt run alone;
- the prompt is run once and its keys/values kept in a ``DynamicCache``; each step then feeds
  one token per row;
- a row that emits a stop id is done (the stop id is kept), and finished rows are dropped from
  the batch and from the cache, so a long straggler does not drag the whole batch along;
- ``stop_strings`` (per row, for scaffolded envs: agent_gym/scaffold.py): a row is also done when
  the text of its generated ids holds one of its strings; the token that completed the string is
  kept whole, as vLLM keeps it (its ``token_ids`` are never cut; only its text is), so the ids
  are exactly what was sampled. Checking decodes the row's ids, so the backend needs the
  tokenizer for it.

Per-request seeds: each row owns a ``torch.Generator`` seeded with ``seeds[i]`` and draws one
uniform number from it per generated token, then takes the inverse CDF of its own processed
distribution. Row i's draws therefore depend only on its seed and on its own logits, never on
which other rows share the batch or on the global RNG. What can still differ across batch
compositions is the logits themselves, by float rounding (a different padded length changes the
reduction order inside the matmuls); at float32 that is ~1e-6 and flips a sample only when the
uniform draw lands within that distance of a CDF boundary. Rows without a seed take one from the
global torch RNG, so ``torch.manual_seed`` makes a whole call reproducible.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from trainers.backends.base import Generation, SamplingConfig, check_stop_strings


class HFBackend:
    """``GenerationBackend`` over a transformers causal LM, in-process.

    model: a ``*ForCausalLM`` (e.g. from ``trainers.tiny_model.build_tiny_qwen2``). The backend
        holds a reference, not a copy: if the trainer updates the same module in place, the
        backend sees it without ``load_weights``.
    pad_token_id: the id written into left padding; it is masked out, so any valid id works.
    num_threads: torch intra-op threads while generating (restored afterwards); None leaves the
        process setting alone. A tiny model's per-token ops are too small to split: on 2 busy
        cores, 1 thread ran batch 64 x 64 tokens in 0.5 s where 2 threads took 6-9 s.
    tokenizer: decodes generated ids to check ``stop_strings``; needed only for them.
    """

    def __init__(
        self,
        model: Any,
        pad_token_id: int,
        device: str | torch.device = "cpu",
        num_threads: int | None = None,
        tokenizer: Any = None,
    ):
        self.num_threads = num_threads
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.model.eval()
        self.pad_token_id = int(pad_token_id)
        self._closed = False

    # -- protocol -------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        seeds: Sequence[int] | None = None,
        stop_strings: Sequence[Sequence[str]] | None = None,
    ) -> list[Generation]:
        """One continuation per prompt; see the module docstring for padding, seeding and
        ``stop_strings`` (``stop_strings[i]``: the strings that end row ``i``; ``[]`` for none)."""
        if self.num_threads is None:
            return self._generate(prompts, sampling, seeds, stop_strings)
        previous = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)
        try:
            return self._generate(prompts, sampling, seeds, stop_strings)
        finally:
            torch.set_num_threads(previous)

    @torch.inference_mode()
    def _generate(self, prompts, sampling, seeds, stop_strings=None) -> list[Generation]:
        if self._closed:
            raise RuntimeError("HFBackend.generate called after close()")
        _check_sampling(sampling)
        n = len(prompts)
        if seeds is not None and len(seeds) != n:
            raise ValueError(f"got {len(seeds)} seeds for {n} prompts")
        if n == 0:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        texts = check_stop_strings(stop_strings, n)
        if texts and self.tokenizer is None:
            raise ValueError(
                "stop_strings need the tokenizer to read the generated text: build HFBackend(..., tokenizer=tok)"
            )
        greedy = sampling.temperature == 0
        # Each row's uniform draws for the whole call, from its own generator, in one call per
        # row: the same stream as one draw per token (torch's CPU generator fills a tensor in
        # order), so row i's tokens still depend only on seeds[i] and its own logits.
        uniforms = (
            None
            if greedy
            else torch.stack(
                [
                    torch.rand(sampling.max_new_tokens, generator=g, device=self.device)
                    for g in self._generators(n, seeds)
                ]
            )
        )  # (B, max_new_tokens)
        stop_ids = torch.tensor(sorted(set(sampling.stop_token_ids)), dtype=torch.long, device=self.device)

        input_ids, mask = self._left_pad(prompts)  # (B, L), (B, L)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, L): pads sit at 0, masked anyway
        next_pos = mask.sum(-1)  # (B,): position of the first generated token
        cache = _new_cache(self.model)
        logits = self._forward(input_ids, mask, position_ids, cache)  # (B, V)

        out_ids: list[list[int]] = [[] for _ in range(n)]
        out_lps: list[list[float]] = [[] for _ in range(n)]
        reasons: list[str] = ["length"] * n
        rows = torch.arange(n, device=self.device)  # (b,) original index of each live batch row
        for step in range(sampling.max_new_tokens):
            tok, lp = _sample(logits, sampling, None if uniforms is None else uniforms[rows, step])
            stopped = torch.isin(tok, stop_ids)  # (b,)
            for k, (r, t, l) in enumerate(zip(rows.tolist(), tok.tolist(), lp.tolist())):
                out_ids[r].append(t)
                out_lps[r].append(l)
                if texts and texts[r] and not stopped[k]:
                    text = self.tokenizer.decode(out_ids[r], skip_special_tokens=False)
                    if any(s in text for s in texts[r]):
                        stopped[k] = True
            for r in rows[stopped].tolist():
                reasons[r] = "stop"
            if step == sampling.max_new_tokens - 1:
                break
            keep = (~stopped).nonzero().squeeze(-1)  # (b',)
            if keep.numel() == 0:
                break
            if keep.numel() < rows.numel():
                cache.batch_select_indices(keep)
                rows, tok, mask, next_pos = rows[keep], tok[keep], mask[keep], next_pos[keep]
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)  # (b, L + step + 1)
            logits = self._forward(tok[:, None], mask, next_pos[:, None], cache)
            next_pos = next_pos + 1
        return [Generation(out_ids[i], out_lps[i], reasons[i]) for i in range(n)]  # type: ignore[arg-type]

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Copy ``state_dict`` into the model in place. Unknown keys raise; so do missing keys,
        except the output head when the embeddings are tied (it is the input embedding)."""
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        tied = set(getattr(self.model, "_tied_weights_keys", None) or [])
        if getattr(self.model.config, "tie_word_embeddings", False):
            tied.add("lm_head.weight")
        missing = [k for k in missing if k not in tied]
        if missing or unexpected:
            raise KeyError(f"load_weights: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")

    def close(self) -> None:
        """Nothing to release beyond dropping the reference; idempotent."""
        self._closed = True

    # -- helpers --------------------------------------------------------------------------

    def _left_pad(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        length = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), length), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, length - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, length - len(p) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _forward(self, ids, mask, position_ids, cache) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()  # (b, V)

    def _generators(self, n: int, seeds: Sequence[int] | None) -> list[torch.Generator]:
        if seeds is None:
            seeds = torch.randint(0, 2**62, (n,)).tolist()
        gens = []
        for s in seeds:
            g = torch.Generator(device=self.device)
            g.manual_seed(int(s))
            gens.append(g)
        return gens


def _new_cache(model: Any):
    from transformers import DynamicCache  # deferred: transformers (seconds) stays out of `import trainers.backends`

    return DynamicCache(config=model.config)


def _check_sampling(s: SamplingConfig) -> None:
    if s.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {s.max_new_tokens}")
    if s.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {s.temperature}")
    if not 0 < s.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {s.top_p}")
    if s.top_k == 0 or s.top_k < -1:
        raise ValueError(f"top_k must be -1 (off) or >= 1, got {s.top_k}")


def processed_logprobs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """Log-probs of the distribution actually sampled from (filtered ids at -inf).

    logits: (b, V) float32. Order: temperature, then top-k, then top-p, as vLLM applies them.
    ``temperature == 0`` (greedy) reports the plain softmax at temperature 1, which is what the
    trainer recomputes; the argmax is the same either way.
    """
    if temperature == 0:
        return torch.log_softmax(logits, dim=-1)
    logits = logits / temperature
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (b, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (b, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p; the top token
        # always stays.
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def _sample(logits: torch.Tensor, s: SamplingConfig, u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one id per row: greedy when ``u`` is None, else by inverse CDF at the row's uniform
    draw ``u`` (b,). Returns ids (b,) and their processed log-probs (b,)."""
    logp = processed_logprobs(logits, s.temperature, s.top_p, s.top_k)  # (b, V)
    if u is None:
        tok = logits.argmax(-1)  # (b,)
    else:
        cdf = logp.exp().cumsum(-1)  # (b, V)
        target = (u * cdf[:, -1]).unsqueeze(-1).contiguous()  # (b, 1)
        # right=True gives the first id whose cdf exceeds the target: it has positive mass.
        tok = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=logits.shape[-1] - 1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)

"""What a forward will take before any forward of the model ran here: its FLOPs, from the model's config alone
(parameters and geometry, read before any weights load), divided by this device's rate, measured once per process by
a short timed matmul at the job's dtype on the job's device. A sweep's budget (:mod:`evals.core.run.budget`) says it for a
first run; the seconds measured by earlier finished runs replace it where they exist.

FLOPs of one causal forward over L tokens (Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
arXiv:2001.08361, Table 1: C_forward ≈ 2N + 2·n_layer·n_ctx·d_attn per token):

- every weight matrix multiply-adds each token once: 2·N·L, N the parameters of the matrix products (the LM head
  included, as perplexity scores every token; the input embedding, a lookup, not);
- attention: QKᵀ and softmax·V each take L²·d_attn multiply-adds per layer over the full square (d_attn =
  heads·head_dim), a causal mask halves both: 2 matmuls × ½ × 2 FLOPs = 2·L²·d_attn per layer, 2·layers·L²·d_attn
  in all (sliding-window layers are counted as full: an upper bound).

Each part runs at its own share of a square matmul's rate (:data:`SHARES`): the weight matrices' products, with the
norms, activations and the LM head's chunks between them, below it; causal attention (a fused kernel that skips the
masked half) on the CPU above it. Measured on this project's CPU box by ``bench/throughput_share.py`` and read off
the H200 run of ``bench/gpu_bench.py`` (``bench/results/gpu_h200_2026-11-26.jsonl``); the numbers and the check
against a measured 16k forward: docs/benchmarks.md, "A first run's budget".
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# {device type: (share of the weight-matrix FLOPs, share of the attention FLOPs)}, each the part's FLOP rate over the
# timed square matmul's of device_rate (docs/benchmarks.md, "A first run's budget"). CPU: SmolLM2-135M fp32, a forward
# at 2048 tokens and one layer's SDPA at 16384 (bench/throughput_share.py). CUDA: the H200 run of bench/gpu_bench.py,
# Llama-3-8B-shaped bf16 forwards at 66% of its 8192² matmul to 256k tokens (62% at 16k), both parts alike as that
# run cannot tell them apart. Another device type takes the CPU's.
SHARES = {"cpu": (0.75, 1.25), "cuda": (0.65, 0.65)}
MATMUL_SIZE = {"cpu": 1024}  # the square matmul timed; 8192 elsewhere (the H200 run's)


def forward_flops(
    matmul_params: int, layers: int, attention_width: int, length: int, new: int | None = None
) -> tuple[float, float]:
    """(weight-matrix FLOPs, attention FLOPs) of one causal forward whose last ``new`` tokens (default all) of
    ``length`` are computed, the earlier ones cached (the module docstring derives both)."""
    new = length if new is None else new
    # 2 FLOPs per multiply-add; attention: the new tokens' causal rows of QKᵀ and softmax·V over the prefix
    return 2.0 * matmul_params * new, 2.0 * layers * attention_width * (length**2 - (length - new) ** 2)


def forward_seconds(flops: tuple[float, float], rate: float, device_type: str) -> float:
    """Seconds of a forward of ``flops`` (:func:`forward_flops`) on a device whose square matmul runs at ``rate``."""
    dense, attention = SHARES.get(device_type, SHARES["cpu"])
    return flops[0] / (dense * rate) + flops[1] / (attention * rate)


def geometry(config) -> tuple[int, int, int]:
    """(matmul parameters, layers, heads·head_dim) of the model ``config`` describes, counted on the model built on
    the ``meta`` device (shapes only, no weights): every weight matrix but the input embedding (norm weights and
    biases are no products), the LM head counted when it is tied to it."""
    from ..inputs.models import meta_model

    model = meta_model(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding
    matrices = sum(p.numel() for p in model.parameters() if p.dim() >= 2 and p is not embedding)
    params = matrices + (embedding.numel() if tied else 0)
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return params, text.num_hidden_layers, heads * head_dim


_RATES: dict[tuple[str, str], float] = {}


def device_rate(device: torch.device, dtype: torch.dtype, seconds: float = 0.2) -> float:
    """FLOP/s of a square matmul (:data:`MATMUL_SIZE`) at ``dtype`` on ``device``, timed for about ``seconds`` after
    one warm-up; once per process and (device, dtype): a sweep measures it once. Not kept across runs: a shared
    machine's rate is the rate of the moment the sweep starts."""
    import torch

    key = (str(device), str(dtype))
    if key in _RATES:
        return _RATES[key]
    n = MATMUL_SIZE.get(device.type, 8192)
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.inference_mode():
        a @ b
        sync()
        reps, start = 0, time.perf_counter()
        while reps < 3 or time.perf_counter() - start < seconds:
            a @ b
            reps += 1
        sync()
        elapsed = time.perf_counter() - start
    _RATES[key] = 2.0 * n**3 * reps / elapsed  # 2 FLOPs per multiply-add, n³ of them
    return _RATES[key]


_SCORING: dict[tuple[str, int], float] = {}


def scoring_seconds(model_cfg, config, tokens: int = 256, seconds: float = 0.1) -> float:
    """Seconds per token that perplexity's scoring spends beyond the LM head's FLOPs: the float32 logits over the
    vocabulary of ``config`` written, then their cross-entropy (:func:`evals.scoring.nll.token_nll`) -- memory-bound,
    several passes over ``vocab`` floats a token, which no FLOP count sees (on the tiny test model, whose vocabulary
    is most of its work, most of a forward). Timed on ``tokens`` random rows, once per process and (device, vocab)."""
    import torch
    import torch.nn.functional as F

    from ..inputs.device import resolve_device

    device = resolve_device(model_cfg.device)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    key = (str(device), int(text.vocab_size))
    if key not in _SCORING:
        logits = torch.randn(tokens, key[1], device=device)
        targets = torch.randint(0, key[1], (tokens,), device=device)
        with torch.inference_mode():
            F.cross_entropy(logits.clone(), targets, reduction="none")
            reps, start = 0, time.perf_counter()
            while reps < 2 or time.perf_counter() - start < seconds:
                F.cross_entropy(logits.clone(), targets, reduction="none").cpu()
                reps += 1
            elapsed = time.perf_counter() - start
        _SCORING[key] = elapsed / reps / tokens
    return _SCORING[key]


def estimate(model_cfg, config, lengths) -> tuple[dict[int, float], str]:
    """({length: estimated seconds per forward}, how it was estimated) for the model of ``model_cfg`` (its
    ``device`` and ``dtype``) with transformers config ``config``."""
    from ..inputs.device import resolve_device, resolve_dtype

    device = resolve_device(model_cfg.device)
    dtype = resolve_dtype(model_cfg.dtype, device)
    params, layers, width = geometry(config)
    rate = device_rate(device, dtype)
    seconds = {L: forward_seconds(forward_flops(params, layers, width, L), rate, device.type) for L in lengths}
    how = (
        f"estimated from FLOPs at the measured {rate / 1e9:.0f} GFLOP/s (a matmul timed now on {device.type}, "
        f"{str(dtype).removeprefix('torch.')})"
    )
    return seconds, how


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: s, min or h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

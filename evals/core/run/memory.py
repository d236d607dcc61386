"""What a job will hold in memory at its peak, said before its model is built, from the same source as its time
budget (:mod:`evals.core.run.throughput`): the model built on the ``meta`` device (shapes only) and the job's longest
forward.

peak = the process as it is now + the weights at the job's dtype + the larger of two phases of the longest forward:

- the decoder: one layer's working set over the forward's new tokens (layers run one after another and free what
  they made), per token ``2·hidden + max(7·q + 2·kv, 4·intermediate + hidden)`` values at the dtype: the residual
  stream and, whichever is larger, attention (q, k, v, the rotary's temporaries, k/v repeated to every head, its
  output) or the MLP (gate, up, activation, product); eager attention adds the scores and their softmax
  (2·heads·new·L float32); an attention-level method (Self-Extend, DCA, ...) x1.3, its blended pieces (peak memory
  x0.98-1.32 of a plain forward at 16k, docs/benchmarks.md, "What each method costs at 16k");
- the LM head: the final hidden states and, per chunk of positions, the logits at the dtype, in float32 and
  cross-entropy's log-softmax (float32): perplexity chunks ``eval.chunk_tokens`` positions at a time
  (:func:`evals.core.scoring.nll.token_nll`), retrieval keeps the last logits only, other evals (lm-eval) are counted with
  every position's logits;

plus the KV cache (2·layers·L·kv values) where the eval keeps one (passkey, needle). The coefficients were fitted on
two-layer Llama-shaped models at 8-16k tokens on CPU (the decoder within 5% at 16k) and the whole checked against the
peaks the runner records (:mod:`evals.core.run.peak`): tests/test_memory.py; the numbers in docs/benchmarks.md,
"Memory before it is spent".
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
CLOSE = 0.8  # a peak above this share of what the device has: a warning
ATTENTION_LEVEL = 1.3  # an attention-level method's decoder working set over a plain forward's (module docstring)
RETRIEVAL = ("passkey", "needle")


@dataclass
class MemoryEstimate:
    """Bytes: ``resident`` the process now, ``weights``, ``forward`` the longest forward's own (at ``length``)."""

    resident: int
    weights: int
    forward: int
    length: int
    dtype: str

    @property
    def peak(self) -> int:
        return self.resident + self.weights + self.forward

    def text(self) -> str:
        return (
            f"about {self.peak / GIB:.2f} GiB at its peak (weights {self.weights / GIB:.2f} GiB in {self.dtype}, the "
            f"forward at {self.length} tokens {self.forward / GIB:.2f} GiB, the process now {self.resident / GIB:.2f})"
        )


def weight_bytes(config, dtype) -> int:
    """Bytes of the weights of the model ``config`` describes at ``dtype``, counted on the meta model (a tied
    embedding once)."""
    from ..inputs.models import meta_model

    model = meta_model(config)
    size = dtype.itemsize
    return sum(p.numel() for p in model.parameters()) * size + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )


def forward_bytes(
    config,
    length: int,
    width: int,
    new: int | None = None,
    head_tokens: int | None = None,
    cache: bool = False,
    eager: bool = False,
    attention_level: bool = False,
) -> int:
    """Peak bytes of one forward over ``length`` tokens (``new`` of them computed, default all) at ``width`` bytes
    a value (the module docstring): ``head_tokens`` positions' logits at a time (None: all new ones), ``cache`` a
    KV cache of ``length`` tokens kept, ``eager`` attention scores materialised."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    new = length if new is None else new
    hidden, heads = text.hidden_size, text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    kv = (getattr(text, "num_key_value_heads", None) or heads) * head_dim
    q = heads * head_dim
    intermediate = getattr(text, "intermediate_size", None) or 4 * hidden
    # one layer's working set per token: the residual stream, then attention or the MLP, whichever is larger
    layer = new * (2 * hidden + max(7 * q + 2 * kv, 4 * intermediate + hidden)) * width
    layer *= ATTENTION_LEVEL if attention_level else 1
    scores = 2 * heads * new * length * 4 if eager else 0  # the scores and their softmax, float32
    chunk = min(new, head_tokens or new)
    # the final hidden states, then a chunk's logits at the dtype (when not float32), in float32 and log-softmaxed
    head = new * hidden * width + chunk * text.vocab_size * (8 + (width if width != 4 else 0))
    kv_cache = 2 * text.num_hidden_layers * length * kv * width if cache else 0
    return int(max(layer + scores, head) + kv_cache)


def part_forward(config, name: str, part, length: int, width: int, eager: bool, attention_level: bool) -> int:
    """Bytes of the forward eval ``name`` (its config ``part``) runs at ``length`` tokens."""
    if name in RETRIEVAL:  # the first prompt of a length: one prefill of it, its cache kept; the last logits
        return forward_bytes(config, length, width, head_tokens=64, cache=True, eager=eager,
                             attention_level=attention_level)  # fmt: skip
    chunk = part.get("chunk_tokens") if name == "perplexity" else None  # any other eval (lm-eval): every logit
    return forward_bytes(config, length, width, head_tokens=chunk, eager=eager, attention_level=attention_level)


def job_forwards(config, eval_parts, width: int, eager: bool, attention_level: bool) -> list[tuple[int, int, str]]:
    """(bytes, length, eval name) of every forward length of the job, most demanding first: ``eval_parts`` [(eval
    name, its config)]."""
    found = [
        (part_forward(config, name, part, int(L), width, eager, attention_level), int(L), name)
        for name, part in eval_parts
        for L in part.get("lengths") or []
    ]
    return sorted(found, reverse=True)


def job_forward(config, eval_parts, lengths, width: int, eager: bool, attention_level: bool) -> tuple[int, int]:
    """(bytes, length) of the job's most demanding forward: ``eval_parts`` [(eval name, its config)]."""
    forwards = job_forwards(config, eval_parts, width, eager, attention_level)
    return forwards[0][:2] if forwards else (0, max(lengths, default=0))


def held_by_cache(device) -> int:
    """Bytes of the model this process already holds on ``device`` (the sweep's model cache): freed or reused by the
    next job, so counted as available."""
    from ..inputs.model_cache import MODEL_CACHE

    loaded = getattr(MODEL_CACHE, "_loaded", None)
    model = getattr(loaded, "model", None)
    if model is None:
        return 0
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.device.type == device.type)


def estimate(model, eval_parts, lengths, attention_level: bool = False) -> MemoryEstimate:
    """The peak of a job of the resolved ``model`` (:class:`evals.core.inputs.models.ResolvedModel`) running
    ``eval_parts`` at ``lengths``."""
    from .peak import _resident

    eager = (model.cfg.get("attn_implementation") or "") == "eager"
    width = model.dtype.itemsize
    forward, length = job_forward(model.config, eval_parts, lengths, width, eager, attention_level)
    resident = (_resident() or 0) if model.device.type == "cpu" else 0
    return MemoryEstimate(
        resident, weight_bytes(model.config, model.dtype), forward, length, str(model.dtype).removeprefix("torch.")
    )


def levers(found: MemoryEstimate, device_type: str) -> str:
    half = found.weights / 2 / GIB
    ways = [f"model.dtype=bfloat16 (weights {half:.1f} GiB)"] if found.dtype == "float32" else []
    ways += ["shorter eval.lengths", "a smaller eval.chunk_tokens (perplexity's LM head)"]
    if device_type == "cpu":
        ways.append("a GPU with more memory (model.device=cuda)")
    else:
        ways.append("model.device_map=auto (shard across GPUs, offload)")
    return ", ".join(ways)


def check(model, eval_parts, lengths, attention_level: bool = False, have: int | None = None) -> list[str]:
    """Before the model is built: a ConfigError (one line, exit 2) when not even the job's smallest forward fits
    what the device has (nothing could be measured); a warning line naming the lengths that will not fit when only
    some do (they are tried and recorded as out of memory, the others measured), or when the peak is close (above
    :data:`CLOSE` of it); otherwise the estimate, said."""
    from ..errors import ConfigError
    from .peak import available_bytes

    if model.cfg.get("device_map"):
        return []  # sharded or offloaded by accelerate: not one device's memory
    found = estimate(model, eval_parts, lengths, attention_level)
    if have is None:
        free = available_bytes(model.device)
        if free is None:
            return [f"memory: {found.text()}; what {model.device.type} has cannot be told here"]
        have = free + held_by_cache(model.device)
        if model.device.type == "cuda":  # blocks torch's caching allocator keeps from an earlier job are ours to reuse
            import torch

            have += torch.cuda.memory_reserved(model.device) - torch.cuda.memory_allocated(model.device)
    need = found.weights + found.forward  # the process's own resident memory is already not available
    where = f"{have / GIB:.1f} GiB available on {model.device.type}"
    if need <= have:
        if need > CLOSE * have:
            return [f"warning: memory: this job needs {found.text()}, close to the {where}; it may run out"]
        return [f"memory: {found.text()}; {where}"]
    eager = (model.cfg.get("attn_implementation") or "") == "eager"
    forwards = job_forwards(model.config, eval_parts, model.dtype.itemsize, eager, attention_level)
    over = [(L, name) for size, L, name in forwards if found.weights + size > have]
    if len(over) == len(forwards):  # not even the smallest forward fits: nothing would be measured
        raise ConfigError(
            f"memory: this job needs {found.text()}, {where}: it would run out of memory; levers: "
            f"{levers(found, model.device.type)}"
        )
    named = ", ".join(f"{name} at {L}" for L, name in sorted(over, key=lambda x: (x[1], x[0])))
    # on CPU without an address-space limit the kernel may kill the process rather than fail the allocation
    killed = (
        ", or the kernel may stop the job: the lengths finished before are kept" if model.device.type == "cpu" else ""
    )
    return [
        f"warning: memory: this job needs {found.text()}, {where}: {named} tokens will likely run out of memory "
        f"(tried, and recorded as out of memory if the allocation fails{killed}), the shorter lengths are measured; "
        f"levers: {levers(found, model.device.type)}"
    ]


def budget_line(model_cfg, config, eval_cfg, work) -> str:
    """The sweep budget's memory line: a job's peak (:func:`estimate`) at the longest forward of ``work`` [(eval,
    length, forwards)], against what the device has now."""
    from types import SimpleNamespace

    from ..inputs.device import resolve_device, resolve_dtype
    from .peak import available_bytes

    device = resolve_device(model_cfg.device)
    model = SimpleNamespace(cfg=model_cfg, config=config, device=device, dtype=resolve_dtype(model_cfg.dtype, device))
    chunk = eval_cfg.get("chunk_tokens") or (eval_cfg.get("perplexity") or {}).get("chunk_tokens")
    parts = [(name, {"lengths": [L], "chunk_tokens": chunk}) for name, L, _ in work]
    found = estimate(model, parts, [L for _, L, _ in work])
    have = available_bytes(device)
    where = f"{have / GIB:.1f} GiB available on {device.type} now" if have is not None else f"on {device.type}"
    return (
        f"budget: memory {found.text()} per job, {where}; attention-level methods up to x{ATTENTION_LEVEL} the forward"
    )

"""The FlexAttention path of the attention-level methods (rope_ext/attention/flex.py): the six methods on tiny random models of
real architectures give the logits of the paper's dense attention (tests/test_positions.py's, written from each
paper's formula) and of the blocks path (rope_ext/attention/assembled.py, the reference) at the fp32 floor -- block sizes of 16
and 32 over 72 tokens (pieces skipped, held whole and masked), grouped-query attention, sliding-window layers
(Gemma-3's, Mistral's), partial rotary, a value head of another size (MLA), logit soft-capping, a cached prefix
extended in chunks and one token at a time, left padding; eagerly (every score materialised, as tiny shapes
allow: torch 2.13 cannot compile flex_attention with its log-sum-exp on the CPU, so the compiled kernels run on
CUDA only, in bench/gpu_bench.py)."""

import pytest
import torch

import rope_ext
from rope_ext.attention import flex
from tests.test_positions import SETTINGS, build, dense_reference, logits, relative_error, tokens

CASES = [(method, k) for method, settings in SETTINGS.items() for k in range(len(settings))]


RAN = []  # the attention calls that went through rope_ext.attention.flex


@pytest.fixture
def use_flex(monkeypatch):
    """FlexAttention forced (eager), with block size ``block``: a function that sets it, clears the kept masks and
    the count of calls that went through it (``RAN``)."""
    monkeypatch.setenv("ROPE_EXT_FLEX_EAGER", "1")
    flex_assemble = flex.flex_assemble

    def counted(*args, **kwargs):
        RAN.append(1)
        return flex_assemble(*args, **kwargs)

    monkeypatch.setattr(flex, "flex_assemble", counted)

    def use(backend="flex", block=flex.BLOCK):
        monkeypatch.setattr(flex, "BACKEND", backend)
        monkeypatch.setattr(flex, "BLOCK", block)
        flex._MASKS.clear()
        RAN.clear()

    return use


def through(model, params, ids, **kwargs):
    with rope_ext.patch(model, params):
        return logits(model, ids, **kwargs)


@pytest.mark.parametrize("method,setting", CASES)
@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
@pytest.mark.parametrize("block", [16, 32])
def test_flex_equals_the_papers_dense_attention_and_the_blocks(model_type, method, setting, block, use_flex):
    model = build(model_type)
    params = {"name": method, **SETTINGS[method][setting]}
    ids = tokens(72)
    with dense_reference(model, method, SETTINGS[method][setting]):
        want = logits(model, ids)
    use_flex("blocks")
    blocks = through(model, params, ids)
    use_flex("flex", block)
    got = through(model, params, ids)
    assert RAN, "the flex path did not run"
    assert relative_error(got, want) <= 1e-5 and relative_error(got, blocks) <= 1e-5, (model_type, method, params)


LAYOUTS = [  # (first query position, queries, first key position, keys, sliding window, block)
    (0, 72, 0, 72, None, 16),
    (0, 100, 0, 100, 20, 16),
    (40, 17, 0, 57, None, 16),  # a chunk of a prefill extending a cache
    (56, 1, 0, 57, None, 32),  # one decoded token
    (0, 130, 0, 130, None, 32),
]


@pytest.mark.parametrize("method,setting", CASES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("padded", [False, True])
def test_block_masks_skip_only_empty_blocks_and_run_unmasked_only_whole_ones(method, setting, layout, padded):
    """Eager flex_attention reads the mask per pair and ignores the blocks, so the blocks are checked here, against
    the pairs each piece holds (Piece.region, causal, the window, a padding mask): a block left out holds no
    pair, a block run unmasked ("full") holds all of its pairs."""
    q0, q_len, k0, k_len, window, block = layout
    rule = rope_ext.resolve({"name": method, **SETTINGS[method][setting]}, trained_context=64).position_rule()
    qp, kp = (q0 + torch.arange(q_len))[None], (k0 + torch.arange(k_len))[None]
    allowed = None
    if padded:  # the first 5 keys closed to every query, as a left-padded row's mask
        allowed = torch.ones(1, q_len, k_len, dtype=torch.bool)
        allowed[..., :5] = False
    kinds = set()
    for piece in rule.pieces:
        found = flex.block_mask(piece, qp, kp, window, allowed, block)
        m, n = qp[0][:, None], kp[0][None]
        held = piece.region(m, n) & (n <= m) & ((m - n < window) if window else True)
        if allowed is not None:
            held &= allowed[0]
        partial, full = (
            {(qb, int(kb)) for qb in range(count.shape[-1]) for kb in index[0, 0, qb, : int(count[0, 0, qb])]}
            for count, index in (
                (found.kv_num_blocks, found.kv_indices),
                (found.full_kv_num_blocks, found.full_kv_indices),
            )
        )
        assert not partial & full
        for qb in range(-(-q_len // block)):
            for kb in range(-(-k_len // block)):
                tile = held[qb * block : (qb + 1) * block, kb * block : (kb + 1) * block]
                kind = "full" if (qb, kb) in full else "partial" if (qb, kb) in partial else "skipped"
                kinds.add(kind)
                assert kind != "skipped" or not tile.any(), (piece.name, qb, kb)
                assert kind != "full" or tile.all(), (piece.name, qb, kb)
    if q_len >= 72 and window is None:  # all three seen (LM-Infinite's pieces: bands of 10 and 3 keys, none whole)
        assert kinds == {"partial", "skipped"} | (set() if method == "lm_infinite" else {"full"})


@pytest.mark.parametrize("model_type", ["gpt_neox", "qwen2", "mistral_window"])
@pytest.mark.parametrize("method", ["self_extend", "dca", "string"])
def test_flex_with_partial_rotary_biases_and_a_sliding_window(model_type, method, use_flex):
    model = build("mistral", sliding_window=20) if model_type == "mistral_window" else build(model_type)
    params = SETTINGS[method][0]
    ids = tokens(72)
    with dense_reference(model, method, params):
        want = logits(model, ids)
    use_flex("flex", 16)
    assert relative_error(through(model, {"name": method, **params}, ids), want) <= 1e-5 and RAN


@pytest.mark.parametrize("method", list(SETTINGS))
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_flex_decodes_from_a_cache_extended_in_chunks_as_it_recomputes(method, use_flex):
    """A 24-token prefix, then chunks of 16 and 8 tokens (the passkey path's chunked prefill), then one token at a
    time: each step's logits equal the whole sequence's, recomputed."""
    model = build("llama")
    ids = tokens(64)
    params = {"name": method, **SETTINGS[method][0]}
    use_flex("flex", 16)
    with rope_ext.patch(model, params), torch.no_grad():
        full = model(input_ids=ids).logits
        out = model(input_ids=ids[:, :24], use_cache=True)
        cache, pieces = out.past_key_values, [out.logits]
        for start, stop in [(24, 40), (40, 48), *((t, t + 1) for t in range(48, 64))]:
            out = model(input_ids=ids[:, start:stop], cache=cache, use_cache=True)
            cache = out.past_key_values
            pieces.append(out.logits)
    assert relative_error(torch.cat(pieces, 1), full) <= 1e-5 and RAN


def test_flex_with_left_padding_matches_each_prompt_alone(use_flex):
    """Left-padded rows (positions that are not one run: the block mask evaluated per pair) attend as alone."""
    model = build("llama")
    short, long_ = tokens(30, seed=2), tokens(40, seed=3)
    batch = torch.cat([torch.cat([torch.zeros(1, 10, dtype=torch.long), short], 1), long_])
    mask = torch.cat([torch.cat([torch.zeros(1, 10), torch.ones(1, 30)], 1), torch.ones(1, 40)]).long()
    use_flex("flex", 16)
    with rope_ext.patch(model, {"name": "self_extend", "group_size": 4, "window": 8}), torch.no_grad():
        both = model.generate(batch, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
        alone = [model.generate(x, max_new_tokens=5, do_sample=False, pad_token_id=0) for x in (short, long_)]
    assert torch.equal(both[0, -5:], alone[0][0, -5:]) and torch.equal(both[1, -5:], alone[1][0, -5:]) and RAN


def build_other(model_type):
    """DeepSeek-V3's multi-head latent attention (a rope sub-dimension, a value head of 12 for query/key heads of 16:
    tests/test_attention_families.py's tiny one) or Gemma-2 with logit soft-capping (eager: sdpa has none)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests import test_attention_families, test_positions

    if model_type == "deepseek_v3":
        return test_attention_families.build("deepseek_v3")
    extra = dict(head_dim=16, sliding_window=24, attn_logit_softcapping=5.0)
    config = AutoConfig.for_model("gemma2", **{**test_positions.COMMON, **extra})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


@pytest.mark.parametrize("model_type", ["deepseek_v3", "gemma2"])
@pytest.mark.parametrize("method", ["self_extend", "dca", "lm_infinite"])
def test_flex_equals_the_blocks_on_mla_and_soft_capping(model_type, method, use_flex):
    model = build_other(model_type)
    params = {"name": method, **SETTINGS[method][0]}
    ids = tokens(72)
    use_flex("blocks")
    blocks = through(model, params, ids)
    use_flex("flex", 16)
    got = through(model, params, ids)
    assert RAN, "the flex path did not run"
    assert relative_error(got, blocks) <= 1e-5 and relative_error(got, logits(model, ids)) > 1e-3


def test_auto_uses_flex_on_cuda_only_and_a_bad_backend_is_one_line(monkeypatch):
    x = torch.zeros(1, 1, 4, 8)
    monkeypatch.setattr(flex, "BACKEND", "auto")
    assert not flex.available(x)  # the CPU keeps the blocks (measured faster here: docs/benchmarks.md)
    assert not flex.available(x.double())
    monkeypatch.setattr(flex, "BACKEND", "flex")
    assert flex.available(x) and not flex.available(x.double())  # float64: the blocks' matmul path
    monkeypatch.setattr(flex, "BACKEND", "fast")
    with pytest.raises(ValueError, match=r"^ROPE_EXT_ATTENTION='fast': valid are auto, flex, blocks$"):
        flex.available(x)

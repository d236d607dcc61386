"""Attention-level strategies (Self-Extend, DCA, ReRoPE, Leaky ReRoPE, STRING, LM-Infinite) on tiny random models
of real architectures, fp32: the patched model's logits equal those of a dense O(N^2) attention written here
from each paper's relative-position formula (not from rope_ext's pieces), below and above the windows, for
several settings; decoding with a KV cache gives the logits of recomputing the whole sequence; where a
method is the identity the output is exactly the unpatched one; bad parameters are one-line errors."""

import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from evals.families import switched_on
from rope_ext.attention import capture

TRAINED = 64
COMMON = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
    max_position_embeddings=TRAINED,
)
ARCHITECTURES = {
    "llama": {},
    "qwen3": {"head_dim": 16},  # q/k norm before RoPE
    "gemma3_text": {
        "head_dim": 16,
        "num_hidden_layers": 4,
        "sliding_window": 8,  # sliding + global layers
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
    "gpt_neox": {"partial_rotary_factor": 0.5, "num_key_value_heads": 4},  # rotary on half the head dims
    "mistral": {"sliding_window": None},
    "qwen2": {},  # biases on the q, k and v projections
    "doge": {"head_dim": 16},  # a mask with a bias per head (its dynamic mask): drawn, not left at zero (switched_on)
}


def build(model_type, implementation="sdpa", **extra):
    config = AutoConfig.for_model(model_type, **{**COMMON, **ARCHITECTURES[model_type], **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation).eval()
    return switched_on(model) if model_type == "doge" else model


def tokens(length, seed=1):
    return torch.randint(3, 100, (1, length), generator=torch.Generator().manual_seed(seed))


# -- each paper's formula, written out: the relative position P(m, n) a pair sees, None where not attended ----


def paper_position(method, p, m, n):
    d = m - n
    if method == "self_extend":  # Jin et al. 2024, eq. 3/4: neighbour window W, group size G
        G, W = p["group_size"], p["window"]
        return d if d < W else (m // G + W - W // G) - n // G
    if method == "rerope":  # Su 2023: min(m - n, w)
        return min(d, p["window"])
    if method == "leaky_rerope":  # Su 2023: w + (m - n - w) / k beyond w
        W, k = p["window"], p["leak"]
        return d if d < W else W + (d - W) / k
    if method == "dca":  # An et al. 2024 (ChunkLlama): intra / successive / inter chunk
        s, w = p["chunk_size"], p["local_window"]
        c = s - w
        if m // c == n // c:
            return m % c - n % c
        if n // c == m // c - 1:
            return min(m % c + c, s) - n % c
        return min(2 * c - 1, s) - n % c
    if method == "string":  # An et al. 2024 (STRING): P - S + W where P >= S
        S, W = p["offset"], p["local_window"]
        return d if d < S else d - S + W
    if method == "lm_infinite":  # Han et al. 2023: Lambda mask, distances capped at the local span
        local, first = p["local_span"], p["global_tokens"]
        if d < local:
            return d
        return local if n < first else None
    raise ValueError(method)


def paper_query_factor(method, p, m):
    if method in ("rerope", "leaky_rerope") and p.get("logn", True):
        return max(1.0, math.log(m + 1) / math.log(TRAINED))
    return 1.0


def paper_rotary_factor(method, p):
    return p.get("attention_factor", 0.1 * math.log(2) + 1) if method == "string" else 1.0


def dense_reference(model, method, params, selected=None):
    """A replacement attention for the *unpatched* model: per pair, q . R(P(m, n)) k computed from the unrotated
    q and k in float64, softmax over the attended pairs, GQA, the module's scaling. ``selected``: the layer
    indices it applies to (default every layer with full attention)."""

    def run(call):
        window = call.kwargs.get("sliding_window")
        if window is not None and len(rope_ext.find_rotary_slots(model)) > 1:
            return None  # Gemma-3's sliding layers keep their own attention (layer_types=auto)
        if selected is not None and call.layer not in selected:
            return None
        cos, sin = call.rotation
        pairs = capture.pair_layout(cos)
        inv_freq, factor = call.slot().frequencies(model)
        # unrotate gives x / factor: the vectors RoPE rotated were x * factor
        q = capture.unrotate(call.query, cos, sin, pairs).double() * factor
        k = capture.unrotate(call.key, cos, sin, pairs).double() * factor
        a, b = pairs
        rotary = torch.zeros(q.shape[-1], dtype=torch.bool)
        rotary[a] = rotary[b] = True
        rf = paper_rotary_factor(method, params)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = call.value.double().repeat_interleave(q.shape[1] // call.value.shape[1], 1)
        n_q, n_k = q.shape[-2], k.shape[-2]
        positions = call.positions[0].tolist()
        key_positions = list(range(positions[-1] - n_k + 1, positions[-1] + 1))
        relative = torch.zeros(n_q, n_k, dtype=torch.float64)
        seen = torch.zeros(n_q, n_k, dtype=torch.bool)
        for i, m in enumerate(positions):
            for j, n in enumerate(key_positions):
                P = paper_position(method, params, m, n) if n <= m and (window is None or m - n < window) else None
                if P is not None:
                    relative[i, j], seen[i, j] = P, True
        query_factor = torch.tensor([paper_query_factor(method, params, m) for m in positions], dtype=torch.float64)
        angle = relative[..., None] * inv_freq.double()  # (q, k, pairs)
        qa, qb, ka, kb = q[0][..., a], q[0][..., b], k[0][..., a], k[0][..., b]
        # q . R(P) k per pair: cos(P theta)(qa ka + qb kb) + sin(P theta)(qa kb - qb ka)
        rot = (
            torch.einsum("hip,hjp,ijp->hij", qa, ka, angle.cos())
            + torch.einsum("hip,hjp,ijp->hij", qb, kb, angle.cos())
            + torch.einsum("hip,hjp,ijp->hij", qa, kb, angle.sin())
            - torch.einsum("hip,hjp,ijp->hij", qb, ka, angle.sin())
        )
        rest = q[0][..., ~rotary] @ k[0][..., ~rotary].transpose(-1, -2)
        scores = (rot * rf * rf + rest) * query_factor[:, None] * call.scaling
        mask = call.attention_mask
        if mask is not None and mask.is_floating_point():  # an additive mask: its bias (per head: Doge's) is kept
            scores = scores + mask[0, :, -n_q:, :n_k].double().clamp(min=-1e30)
        scores = scores.masked_fill(~seen, float("-inf"))
        out = scores.softmax(-1) @ v[0]
        return out.transpose(0, 1).unsqueeze(0).to(call.query.dtype).contiguous(), None

    return rope_ext.hook_attention(model, run, replace=True)


SETTINGS = {
    "self_extend": [{"group_size": 4, "window": 8}, {"group_size": 3, "window": 5}],
    "rerope": [{"window": 8}, {"window": 5, "logn": False}],
    "leaky_rerope": [{"window": 8, "leak": 4.0}, {"window": 6, "leak": 2.5, "logn": False}],
    "dca": [{"chunk_size": 12, "local_window": 4}, {"chunk_size": 9, "local_window": 0}],
    "string": [{"offset": 12, "local_window": 3}, {"offset": 7, "local_window": 0, "attention_factor": 1.2}],
    "lm_infinite": [{"global_tokens": 3, "local_span": 10}, {"global_tokens": 0, "local_span": 7}],
}
CASES = [(method, k) for method, settings in SETTINGS.items() for k in range(len(settings))]


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(input_ids=ids, **kwargs).logits


def patched_and_dense(model, method, params, ids):
    """(logits of the patched model, logits of the unpatched model with the paper's dense attention)."""
    with dense_reference(model, method, params):
        want = logits(model, ids)
    with rope_ext.patch(model, {"name": method, **params}):
        return logits(model, ids), want


def relative_error(got, want):
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("method,setting", CASES)
@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text"])
def test_patched_logits_equal_the_papers_dense_attention(model_type, method, setting):
    model = build(model_type)
    params = SETTINGS[method][setting]
    for length in (6, 40):  # below and above the windows / chunks
        got, want = patched_and_dense(model, method, params, tokens(length))
        assert relative_error(got, want) <= 1e-5, (model_type, method, params, length)


@pytest.mark.parametrize("method", list(SETTINGS))
def test_a_mask_with_a_bias_per_head_is_kept_by_every_method(method):
    """Doge adds a learned bias per head and key to its attention mask: every method keeps it, head by head."""
    model = build("doge", implementation="eager")
    ids = tokens(40)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("self_attn.A"):  # its bias is exp(A * softplus(dt)): a learned A of order 1
                param.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(2))
        masks = []
        with rope_ext.hook_attention(model, lambda call: masks.append(call.attention_mask)):
            model(ids)
    heads = masks[0][0, :, -1, :8]
    assert float((heads[0] - heads[2]).abs().max()) > 0.1  # the heads' biases differ (heads 0, 1 share a key head)
    got, want = patched_and_dense(model, method, SETTINGS[method][0], ids)
    assert relative_error(got, want) <= 1e-5


@pytest.mark.parametrize("model_type", ["gpt_neox", "mistral", "qwen2", "mistral_window"])
@pytest.mark.parametrize("method", ["self_extend", "dca", "string"])
def test_partial_rotary_mistral_and_qwen2(model_type, method):
    """(mistral_window: Mistral with a sliding window of 20 tokens, kept on top of the method's pairs.)"""
    model = build("mistral", sliding_window=20) if model_type == "mistral_window" else build(model_type)
    params = SETTINGS[method][0]
    ids = tokens(40)
    got, want = patched_and_dense(model, method, params, ids)
    assert relative_error(got, want) <= 1e-5


def test_composed_with_yarn_the_rotation_keeps_yarns_frequencies_and_factor():
    """compose[yarn, dca] (Qwen2.5-1M's recipe): DCA's positions rotated with YaRN's frequencies and temperature."""
    model = build("llama")
    params = SETTINGS["dca"][0]
    ids = tokens(40)
    composed = {"name": "compose", "stages": [{"name": "yarn", "factor": 4}, {"name": "dca", **params}]}
    with rope_ext.patch(model, {"name": "yarn", "factor": 4}):
        with dense_reference(model, "dca", params):
            want = logits(model, ids)
    with rope_ext.patch(model, composed):
        got = logits(model, ids)
    assert relative_error(got, want) <= 1e-5
    with rope_ext.patch(model, {"name": "yarn", "factor": 4}):
        plain_yarn = logits(model, ids)
    assert relative_error(got, plain_yarn) > 1e-3  # DCA did change something


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("method", list(SETTINGS))
def test_decoding_with_the_kv_cache_equals_recomputing(method, implementation):
    model = build("llama", implementation)
    ids = tokens(36)
    with rope_ext.patch(model, {"name": method, **SETTINGS[method][0]}):
        full = logits(model, ids)
        with torch.no_grad():
            out = model(input_ids=ids[:, :20], use_cache=True)
            cache = out.past_key_values
            steps = [out.logits[:, -1]]
            for t in range(20, 36):
                out = model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)
                cache = out.past_key_values
                steps.append(out.logits[:, -1])
    decoded = torch.stack(steps[:-1], 1)
    assert relative_error(decoded, full[:, 19:35]) <= 1e-5


def test_generate_with_left_padding_matches_each_prompt_alone():
    """Batched generation (lm-eval's and RULER's path): left-padded rows attend as their unpadded selves."""
    model = build("llama")
    short, long_ = tokens(20, seed=2), tokens(30, seed=3)
    batch = torch.cat([torch.cat([torch.zeros(1, 10, dtype=torch.long), short], 1), long_])
    mask = torch.cat([torch.cat([torch.zeros(1, 10), torch.ones(1, 20)], 1), torch.ones(1, 30)]).long()
    with rope_ext.patch(model, {"name": "self_extend", "group_size": 4, "window": 8}), torch.no_grad():
        both = model.generate(batch, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
        alone = [model.generate(x, max_new_tokens=5, do_sample=False, pad_token_id=0) for x in (short, long_)]
    assert torch.equal(both[0, -5:], alone[0][0, -5:])
    assert torch.equal(both[1, -5:], alone[1][0, -5:])


IDENTITY = {
    "self_extend": {"window": 64},
    "rerope": {"window": 64},
    "leaky_rerope": {"window": 64},
    "dca": {"chunk_size": 64, "local_window": 0},
    "string": {"offset": 64, "local_window": 0, "attention_factor": 1.0},
    "lm_infinite": {"local_span": 64},
}


@pytest.mark.parametrize("model_type", ["llama", pytest.param("gemma3_text", marks=pytest.mark.slow)])
@pytest.mark.parametrize("method", list(IDENTITY))
def test_a_method_that_is_the_identity_leaves_the_model_exactly_as_it_was(model_type, method):
    model = build(model_type)
    ids = tokens(40)
    plain = logits(model, ids)
    with rope_ext.patch(model, {"name": method, **IDENTITY[method]}):
        assert torch.equal(logits(model, ids), plain)
    assert torch.equal(logits(model, ids), plain)  # and removed exactly


def test_the_rule_map_is_the_papers_and_the_pieces_are_disjoint():
    m, n = torch.arange(50)[:, None], torch.arange(50)[None, :]
    for method, settings in SETTINGS.items():
        for params in settings:
            scaling = rope_ext.resolve({"name": method, **params}, TRAINED)
            rule = scaling.position_rule()
            position, seen = rule.relative(m, n)
            claimed = sum((piece.region(m, n) & (n <= m)).long() for piece in rule.pieces)
            assert int(claimed.max()) <= 1, method  # no pair in two pieces
            for i in range(50):
                for j in range(i + 1):
                    want = paper_position(method, params, i, j)
                    assert bool(seen[i, j]) == (want is not None)
                    if want is not None:
                        assert float(position[i, j]) == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize(
    "config,message",
    [
        ({"name": "self_extend", "group_size": 0}, "group_size=0 must be >= 1"),
        ({"name": "self_extend", "window": 0}, "window=0 must be >= 1"),
        ({"name": "rerope", "window": -3}, "window=-3 must be >= 1"),
        ({"name": "leaky_rerope", "leak": 1.0}, "leak=1.0 must be > 1"),
        ({"name": "dca", "chunk_size": 16, "local_window": 16}, "chunk_size=16 must be > local_window=16"),
        ({"name": "string", "offset": 100, "local_window": 200}, "local_window=200 must be < offset=100"),
        ({"name": "compose", "stages": [{"name": "self_extend"}, {"name": "dca"}]}, "at most one attention-level"),
    ],
)
def test_impossible_parameters_are_one_line_errors(config, message):
    with pytest.raises(rope_ext.ScalingError, match=message) as err:
        rope_ext.resolve(config, 4096)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("method", list(SETTINGS))
def test_small_blocks_skip_and_merge_exactly(method, monkeypatch):
    """Query blocks of 7 and key blocks of 5: pieces skipped, masked and merged across many blocks."""
    from rope_ext.attention import assembled

    model = build("llama")
    ids = tokens(40)
    params = SETTINGS[method][0]
    with rope_ext.patch(model, {"name": method, **params}):
        whole = logits(model, ids)
        monkeypatch.setattr(assembled, "QUERY_BLOCK", 7)
        monkeypatch.setattr(assembled, "KEY_BLOCK", 5)
        blocked = logits(model, ids)
    assert relative_error(blocked, whole) <= 1e-5


# --- as jobs: composed by Hydra, checked before the model loads, run end to end --------------------------------


def test_on_a_model_whose_attention_cannot_be_hooked_it_is_one_line_before_loading(tmp_path, compose, models):
    from evals.core.errors import UserError
    from evals.core.job.parse import parse_job

    for scaling in (
        ["scaling=self_extend"],
        ["scaling=compose", "scaling.stages=[{name: yarn, factor: 2}, {name: dca}]"],
    ):
        with pytest.raises(
            UserError,
            match="sets the relative positions inside attention, but model 'tinyneoxjapanese' "
            r"cannot be hooked: GPTNeoXJapaneseForCausalLM: its attention \(GPTNeoXJapaneseAttention\)",
        ):
            parse_job(compose("model=tinyneoxjapanese", "logger=none", *scaling, models), tmp_path / "bad")


def test_an_attention_implementation_the_model_lacks_is_one_line_saying_what_builds(tmp_path, compose, models):
    from evals.core.errors import UserError
    from evals.core.job.parse import parse_job

    cfg = compose("model=tinyneoxjapanese", "logger=none", "model.attn_implementation=sdpa", models)
    with pytest.raises(UserError) as err:
        parse_job(cfg, tmp_path / "sdpa")
    assert "\n" not in str(err.value)
    assert "cannot build the model with attn_implementation='sdpa': GPTNeoXJapaneseForCausalLM does not support" in (
        str(err.value)
    )
    assert str(err.value).endswith("; try model.attn_implementation=eager")


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_bad_parameters_on_the_command_line_exit_2_in_one_line(run_cli):
    """(The other impossible parameters: test_impossible_parameters_are_one_line_errors, through the same resolve.)"""
    from tests.tiny import TINY

    done = run_cli(*TINY, "scaling=dca", "scaling.chunk_size=64", "scaling.local_window=64", "eval.lengths=[64]")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-1500:]
    assert done.stderr.strip() == (
        "error: scaling 'dca': chunk_size=64 must be > local_window=64 (a chunk holds chunk_size - local_window tokens)"
    )


@pytest.fixture
def text(tmp_path):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("It is a truth universally acknowledged, that a single man. " * 60)
    return ["data=text_files", f"data.glob={tmp_path / 'texts' / '*.txt'}"]


@pytest.mark.slow  # two jobs; the default suite stays under 10 minutes
def test_a_perplexity_job_runs_with_each_method_on_gemma3(tmp_path, run_job, models, text):
    """The global layers of Gemma-3 (layer_types=auto) get the rule; the job records what was applied."""
    for method, params in (
        ("self_extend", ["scaling.group_size=2", "scaling.window=16"]),
        ("dca", ["scaling.chunk_size=24", "scaling.local_window=8"]),
    ):
        summary, results = run_job(
            tmp_path / method, "model=tinygemma", models, f"scaling={method}", *params, *text, "eval.lengths=[32,96]"
        )
        assert math.isfinite(summary["ppl@96"])
        assert {"attention": results["rope"]["label"], "layer_types": ["full_attention"]} in results["rope"]["patched"]


DECAY = ["eval=rope_decay", "eval.max_distance=8192", "eval.bound_contexts=[1024]", "eval.points=64"]


@pytest.mark.slow  # two jobs with eight figures; the default suite stays under 10 minutes
def test_rope_decay_draws_the_map_and_the_decay_the_last_query_sees(tmp_path, run_job):
    """eval=rope_decay: the map figure, the positions seen per distance (gaps where LM-Infinite attends nothing),
    the largest relative position and the per-pair angles against training."""
    import csv

    summary, _ = run_job(tmp_path / "dca", *DECAY, "scaling=dca")
    assert summary["max_relative_position"] == 1536  # the TINY model is trained at 2048: chunk_size 3L/4
    assert summary["pairs_unseen_angles"] == 0
    assert (tmp_path / "dca" / "position_map.png").is_file()
    rows = list(csv.DictReader(open(tmp_path / "dca" / "rope_decay.csv")))
    dca = [r for r in rows if r["strategy"] != "none"]
    assert max(float(r["position_seen"]) for r in dca) <= 1536 < max(int(r["distance"]) for r in dca)
    summary, _ = run_job(
        tmp_path / "lmi", *DECAY, "scaling=lm_infinite", "scaling.local_span=1024", "scaling.global_tokens=4"
    )
    rows = list(csv.DictReader(open(tmp_path / "lmi" / "rope_decay.csv")))
    gaps = [r for r in rows if r["strategy"] != "none" and r["mean"] == ""]
    assert gaps and all(1024 <= int(r["distance"]) < 8191 - 3 for r in gaps)
    dimensions = list(csv.DictReader(open(tmp_path / "lmi" / "dimensions.csv")))
    assert {float(r["max_relative_position"]) for r in dimensions} == {1024.0}
    assert all(float(r["angle_over_trained"]) <= 1 for r in dimensions)


@pytest.mark.parametrize("method", ["self_extend", "dca", "lm_infinite"])
def test_the_matmul_path_off_the_fused_kernel_is_exact_too(method):
    """float64 (as any device without PyTorch's fused CPU kernel) goes through the matmul-softmax blocks. (The
    model's own cos/sin are computed in float32 even here, which bounds the agreement near 1e-7.)"""
    model = build("llama").double()
    params = SETTINGS[method][0]
    ids = tokens(40)
    got, want = patched_and_dense(model, method, params, ids)
    assert relative_error(got, want) <= 1e-6

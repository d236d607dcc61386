"""Item A of issue #44: a job whose verdict needs a value at the trained context T measures it. Beyond T the verdict
compares with the unscaled model at T, and a scaled job needs a short-context check; when the user's lengths omit T
it is added to the forward that runs anyway (prefix protocol: free), said in one line with what it costs."""

from evals.core.job.parse import parse_job

T = 256  # the tiny model's trained context here
SMALL = [f"model.original_max_position={T}", "data.books=[persuasion]", "eval.bootstrap_block=32"]


def test_an_unscaled_job_without_t_in_its_lengths_measures_it_and_decides_beyond_t(tmp_path, capsys, run_job):
    summary, results = run_job(tmp_path / "none", *SMALL, "scaling=none", "eval.lengths=[128,1024]")
    out = capsys.readouterr().out
    assert (
        f"lengths: {T} (1x, the trained context) added to eval.lengths: the verdict beyond it compares with the "
        f"unscaled model there; no extra forward (prefix protocol: the first {T} tokens of the forward at 1024)"
    ) in out
    assert results["config"]["eval"]["lengths"] == [128, T, 1024]
    # decided beyond T: its own value at T is there (the old code said '?': no unscaled ppl at 256)
    assert summary["verdict_state@1024"] in ("yes", "NO", "inconclusive"), summary["verdict_reason@1024"]
    assert f"unscaled @{T}" in summary["verdict_reason@1024"]


def test_a_scaled_job_with_every_length_beyond_t_measures_t_for_its_short_context_check(tmp_path, capsys, run_job):
    summary, results = run_job(
        tmp_path / "yarn", *SMALL, "scaling=yarn", "scaling.factor=4", "eval.lengths=[1024]", "verdict.baseline=true"
    )
    out = capsys.readouterr().out
    assert "the verdict beyond it needs the short context kept, and no length is up to it" in out
    assert results["config"]["eval"]["lengths"] == [T, 1024]
    # the short-context check ran (the old code: '?', short context not measured)
    assert summary["verdict_state@1024"] in ("yes", "NO", "inconclusive"), summary["verdict_reason@1024"]
    assert summary["verdict_state@256"] in ("yes", "NO", "inconclusive")


def test_what_adding_t_costs_is_said_per_protocol_and_eval(tmp_path, capsys, compose):
    from tests.tiny import TINY

    def parsed(*overrides):
        job = parse_job(compose(*TINY, f"model.original_max_position={T}", *overrides), tmp_path)
        return job, capsys.readouterr()

    job, said = parsed("scaling=none", "eval.lengths=[128,1024]", "eval.protocol=sliding", "eval.stride=128")
    assert list(job.eval_cfg.lengths) == [128, T, 1024]
    assert "one more sliding pass per document (7 windows of 256 tokens advanced by 128 over its 1024 tokens)" in (
        said.out
    )
    job, said = parsed("scaling=none", "eval.lengths=[1024]", "eval.protocol=sliding", "eval.stride=512")
    assert list(job.eval_cfg.lengths) == [1024]  # a window shorter than the stride: not added, and said why
    assert f"warning: lengths: {T} (1x, the trained context) not added to eval.lengths" in said.err
    assert "shorter than eval.stride=512" in said.err
    job, said = parsed("scaling=none", "eval=passkey", "eval.lengths=[1024]", "eval.depths=[0.1,0.9]", "eval.trials=3")
    assert list(job.eval_cfg.lengths) == [T, 1024] and "it costs 6 more prompts of 256 tokens" in said.out
    # a suite: each eval the verdict judges beyond T; the reference job then needs nothing more than the sweep's
    job, said = parsed(
        "scaling=none",
        "eval=suite",
        "eval.run=[perplexity,passkey]",
        "eval.perplexity.lengths=[1024]",
        "eval.passkey.lengths=[1024]",
    )
    assert list(job.eval_cfg.perplexity.lengths) == [T, 1024] and list(job.eval_cfg.passkey.lengths) == [T, 1024]
    assert "added to eval.perplexity.lengths" in said.out and "added to eval.passkey.lengths" in said.out
    # nothing added where the verdict does not need it: a scaled job with a length up to T, lengths up to T
    for overrides in (("scaling=yarn", "eval.lengths=[128,1024]"), ("scaling=none", "eval.lengths=[128]")):
        job, said = parsed(*overrides)
        assert T not in job.eval_cfg.lengths and "added" not in said.out

"""``eval=qk_study``: the model's own queries and keys, and the seeds' decay conjecture tested on them.

The notes this project grew from end on a conjecture (tinymind blog, 2024-10-13,
github.com/Paul33333/tinymind-blog): RoPE's long-distance decay depends on the distribution of q and k --
same-sign means decay more as |mean| grows, opposite-sign means give a rise, a larger variance weakens
it -- so a trained model, with its own q/k means per layer and head, has heads that decay and look
locally and heads that barely decay and look globally. Barbero et al. 2024 ("Round and round we go!",
arXiv 2410.06205) found Gemma using the highest frequencies for positional heads and the lowest as
semantic channels. Here, on real text:

- every attention layer's q and k are captured exactly as RoPE rotates them (after any q/k norm, per
  head, GQA as it is) through rope_ext's attention hook (``rope_ext.capture``), in one forward of
  ``eval.tokens`` tokens of document ``eval.document``;
- per layer x head x rotary pair: mean, variance and energy of q and k (the pair z = x_a + i x_b);
- per head, its relative-position score profile in logits (the softmax scale applied): the empirical one,
  E over token pairs at distance r of <R_m q_m, R_n k_n>, from the FFT cross-correlation of every
  pair (``rope_ext.strategies.analysis``; r < tokens), and the mean-field one mu_q R_r mu_k from the measured
  means (any r), with the model's frequencies (``none``) and with the job's scaling (beyond the trained
  context L too; a query-scaling strategy multiplies the score at r by its factor for a query at r);
- locality = mean score over r in [1, near] minus mean over [W/2, W) (W: the trained context, the
  sliding window of sliding layers, and for the empirical profile the tokens captured); a head is local
  when its locality is at least ``eval.local_threshold`` logits (e^1 = 2.7x the attention weight);
- the conjecture's claims as rank correlations across heads with p-values (scipy), and per layer the
  energy share of the pairs whose wavelength exceeds L (past Liu et al. 2023's critical dimension,
  arXiv 2310.05209) and of the pairs each strategy in ``eval.compare`` (and the job's) changes;
- on a model with q/k projection biases (Qwen2.5, arXiv 2412.15115): per head how much of mu_q and mu_k the
  bias is (its norm, the norm of the mean of W.x, and the share of the mean along the bias), the mean-field
  locality of the biases alone, and the claim that they set the decay; ``eval.ablate_bias=[q,k]`` measures
  everything again with the biases zeroed, or (``eval.ablate_mode=center``) with q and k centred to mean 0
  (the variance-only control; :mod:`evals.core.projection_bias`), restored after the eval.

Capture runs on the model as the job patches it (``scaling=none``: the model's own RoPE); the
profiles compare the frequencies it was trained with against the strategy's on the same q and k.

The package: :mod:`.measure` (capture and statistics), :mod:`.present` (tables and figures), :mod:`.eval` (the
config, the early check and the registered eval).
"""

from __future__ import annotations

from .measure import Layer, claims, study_layer
from .eval import QKStudyConfig, QKStudyError, check_config, evaluate

__all__ = ["Layer", "QKStudyConfig", "QKStudyError", "check_config", "claims", "evaluate", "study_layer"]

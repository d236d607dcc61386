"""The strategies: what a context-extension method is, as pure functions of RoPE's frequencies and positions.

The registry and how a strategy declares itself (:mod:`.registry`); one module per kind: frequency strategies
(:mod:`.frequency`: PI, NTK, YaRN, Llama-3, LongRoPE, ...), query scaling (:mod:`.query_scaling`: ``logn``),
attention-level strategies (:mod:`.attention_level`: Self-Extend, DCA, ReRoPE, STRING, LM-Infinite) and the position
rules they declare (:mod:`.position_rule`); a config resolved into a :class:`~.scaling.Scaling`, and ``compose``
(:mod:`.scaling`); the factor that reaches a target length (:mod:`.targets`); a model's shipped scaling carried into a
strategy (:mod:`.shipped`); RoPE's own frequencies (:mod:`.rope`) and analytic studies of any frequency set
(:mod:`.analysis`). Nothing here knows a model: applying a strategy is :mod:`rope_ext.patch`.
"""

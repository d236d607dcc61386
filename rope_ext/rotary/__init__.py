"""A model's rotary embedding, from the model object alone: where it keeps its frequencies and how they are patched.

A *rotary slot* (:mod:`.slot`) is one place that holds RoPE's frequencies -- an ``inv_freq`` buffer or a sin/cos table
(:mod:`.tables`: read, rebuilt and grown); :mod:`.find` finds and selects a model's slots (on a ``meta``-device instance
too) and reads what each holds once, into plain data the patcher's later stages take. What a rotary module outputs
is checked against the frequencies it was patched with (:mod:`.output`), and that the logits depend on it at all
(:mod:`.in_use`). :mod:`.native` is a strategy as transformers' config takes it (``rope_parameters``), which
the attention modules' build-time constants follow (:mod:`.softmax_scale`: MLA's softmax scale).
"""

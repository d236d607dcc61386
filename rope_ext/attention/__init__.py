"""Where RoPE meets attention: one hook on every attention call of a transformers model, and what runs through it.

The hook (:mod:`.hook`) hands each call -- its query and key as RoPE left them -- to observers, query transforms and
one replacement; captures and the hookability probe build on it (:mod:`.capture`). An attention-level strategy's call
(:mod:`.call`) is assembled exactly from its position rule, block by block (:mod:`.assembled`) or with FlexAttention
(:mod:`.flex`), from what both share (:mod:`.pieces`).
"""

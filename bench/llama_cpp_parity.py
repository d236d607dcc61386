"""llama.cpp parity: each strategy's rope_ext llama.cpp export run by the real engine (llama-cpp-python) on SmolLM2's
GGUF, against the harness (the same GGUF loaded by transformers, dequantized to fp32, patched with rope_ext) on the
same tokens: perplexity of each and their ratio, as a markdown table. SmolLM2 stands in for a model trained on
``--trained`` tokens (``original_max_position``), so a factor-2 run is short; the first ``--tokens`` of Emma.

    python bench/llama_cpp_parity.py                          # trained 512, factor 2, 1024 tokens
    python bench/llama_cpp_parity.py --trained 2048 --tokens 4096
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time

STRATEGIES = [  # every strategy rope_ext.export's llama_cpp accepts
    {"name": "none"},
    {"name": "linear"},
    {"name": "ntk"},
    {"name": "base", "base": 400000.0},
    {"name": "yarn"},
    {"name": "ntk_by_parts"},
    {"name": "yarn", "attention_factor": 1.2},
    {"name": "yarn", "mscale": 1.0, "mscale_all_dim": 0.5},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trained", type=int, default=512, help="the trained context SmolLM2 stands in for")
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()

    import llama_cpp
    import numpy as np
    import torch
    from hydra import compose, initialize_config_dir

    import rope_ext
    from evals import load_evals
    from evals.core.config.store import config_dir, register_configs
    from evals.core.inputs.data import load_documents
    from evals.core.inputs.loading import load_model
    from evals.core.inputs.models import resolve_model
    from evals.core.scoring.nll import token_nll
    from rope_ext.export import export, geometry

    load_evals()
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["data.books=[emma]", "model.device=cpu", "model.dtype=float32"])
    resolved = resolve_model(cfg.model, geometry=False, weights=True)
    loaded = load_model(resolved)
    path = f"{resolved.source.location}/{resolved.source.file}"
    ids = load_documents(cfg.data, loaded.tokenizer)[0].ids[: args.tokens]
    rows = []
    for setting in STRATEGIES:
        setting = {"factor": args.factor, **setting} if setting["name"] not in ("none", "base") else setting
        scaling = rope_ext.resolve(setting, args.trained)
        start = time.time()
        with rope_ext.patch(loaded.model, scaling):
            ours = math.exp(float(token_nll(loaded.model, ids).mean()))
        found = export(scaling, geometry(loaded.model, scaling, trained=args.trained), "llama.cpp")
        served = {**found["llama_cpp_python"], "n_ctx": len(ids)}  # the unscaled export covers the trained context
        llm = llama_cpp.Llama(path, logits_all=True, verbose=False, **served)
        llm.eval(ids.tolist())
        logits = torch.from_numpy(np.asarray(llm.scores[: len(ids) - 1]))
        theirs = math.exp(float(torch.nn.functional.cross_entropy(logits, ids[1:]).mean()))
        llm.close()
        row = {
            "strategy": scaling.label,
            "harness_ppl": ours,
            "llama_cpp_ppl": theirs,
            "ratio": theirs / ours,
            "flags": " ".join(found["flags"]),
            "seconds": round(time.time() - start, 1),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(
        f"\nllama-cpp-python {llama_cpp.__version__}, {platform.processor() or platform.machine()}, "
        f"trained {args.trained}, factor {args.factor:g}, {len(ids)} tokens of Emma\n"
    )
    print("| strategy | harness ppl | llama.cpp ppl | ratio | llama.cpp flags |\n|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['strategy']} | {r['harness_ppl']:.4f} | {r['llama_cpp_ppl']:.4f} | {r['ratio']:.4f} | `{r['flags']}` |"
        )


if __name__ == "__main__":
    main()

"""Time Hugging Face transformers' assisted generation on the same pair, for comparison
(benchmark.py --compare-hf). transformers is imported here only, and only when asked for: the
project itself never needs it.

Assisted generation is transformers' speculative decoding: GPT2LMHeadModel.generate(...,
assistant_model=draft, do_sample=False). The assistant drafts num_assistant_tokens = gamma tokens
per round with the "constant" schedule (no growing/shrinking of gamma) and its confidence
threshold off (0), so every round drafts gamma tokens, as ours do. The baseline is transformers'
own greedy generate() on the same target. Both run greedy, exactly max_gen new tokens.
"""

import time

import numpy as np
import torch

from gpt2.speed.device import synchronize


def transformers_missing_message() -> str | None:
    """None when transformers can be imported, else what to do about it."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return ("--compare-hf needs Hugging Face transformers, which is not installed. Install it "
                "(pip install transformers) or run without --compare-hf.")
    return None


def load_hf_model(name_or_path: str, device, dtype):
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()  # its notes on generation arguments are not for our readers
    logging.disable_progress_bar()

    try:
        model = GPT2LMHeadModel.from_pretrained(name_or_path, dtype=dtype)
    except Exception as e:  # offline, missing files, ...
        raise SystemExit(f"error: --compare-hf: transformers could not load {name_or_path!r} "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Offline? "
                         f"Pass local folders with --draft/--target.") from None
    return model.to(device).eval()


@torch.inference_mode()
def _generate_seconds(target, ids, max_gen, device, assistant=None):
    synchronize(device)
    start = time.perf_counter()
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_gen,
                          min_new_tokens=max_gen, do_sample=False, assistant_model=assistant,
                          pad_token_id=target.config.eos_token_id)
    synchronize(device)
    return out[0, ids.shape[1]:].tolist(), time.perf_counter() - start


def _set_gamma(assistant, gamma):
    config = assistant.generation_config
    config.num_assistant_tokens = gamma
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0


def compare_assisted_generation(target_path, draft_path, prompts, gammas, max_gens, device, dtype,
                                repeats=1, warmup=1) -> dict:
    """Greedy only. prompts: lists of token ids. Returns {"cells": [...], "note": ...}, one cell per
    (gamma, max_gen) with the median speed-up over prompts x repeats of assisted over plain greedy."""
    from tqdm import tqdm

    target = load_hf_model(target_path, device, dtype)
    assistant = load_hf_model(draft_path, device, dtype)
    inputs = [torch.tensor([p], device=device) for p in prompts]
    for _ in range(warmup):
        _generate_seconds(target, inputs[0], 8, device)
        for gamma in gammas:
            _set_gamma(assistant, gamma)
            _generate_seconds(target, inputs[0], 8, device, assistant)

    runs = []
    bar = tqdm(total=len(max_gens) * repeats * len(inputs) * (1 + len(gammas)), desc="transformers",
               unit="run", dynamic_ncols=True)
    for max_gen in max_gens:
        for _ in range(repeats):
            for p, ids in enumerate(inputs):
                bar.set_description(f"transformers max_gen={max_gen} prompt {p + 1}: greedy")
                plain_tokens, plain_s = _generate_seconds(target, ids, max_gen, device)
                bar.update()
                for gamma in gammas:
                    bar.set_description(f"transformers max_gen={max_gen} prompt {p + 1}: assisted gamma={gamma}")
                    _set_gamma(assistant, gamma)
                    tokens, seconds = _generate_seconds(target, ids, max_gen, device, assistant)
                    bar.update()
                    runs.append({"gamma": gamma, "max_gen": max_gen, "prompt_index": p,
                                 "baseline_seconds": plain_s, "assisted_seconds": seconds,
                                 "speedup": plain_s / seconds, "tokens": len(tokens),
                                 "tokens_match_greedy": tokens == plain_tokens})
    bar.close()
    cells = []
    for gamma in gammas:
        for max_gen in max_gens:
            rs = [r for r in runs if (r["gamma"], r["max_gen"]) == (gamma, max_gen)]
            cells.append({
                "gamma": gamma, "max_gen": max_gen, "temperature": 0.0,
                "speedup_median": float(np.median([r["speedup"] for r in rs])),
                "baseline_tokens_per_s": sum(r["tokens"] for r in rs) / sum(r["baseline_seconds"] for r in rs),
                "assisted_tokens_per_s": sum(r["tokens"] for r in rs) / sum(r["assisted_seconds"] for r in rs),
                "tokens_match_greedy": all(r["tokens_match_greedy"] for r in rs),
                "runs": rs})
    import transformers
    return {"transformers": transformers.__version__, "cells": cells,
            "note": "GPT2LMHeadModel.generate(assistant_model=draft, do_sample=False), "
                    "num_assistant_tokens=gamma, schedule constant, confidence threshold 0; "
                    "speed-up over the same model's plain greedy generate()"}

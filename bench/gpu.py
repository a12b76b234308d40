"""One-GPU check of the training stack on a real model's shape: sampling throughput, a GRPO
update's model FLOPs utilisation, FSDP2 at world size 1, peak memory. One JSON line.

The model is Qwen2-0.5B's shape (24 layers, hidden 896, 14 query / 2 KV heads, MLP 4864,
vocabulary 151936, tied embeddings) built from its config with random weights: no download,
no network. Random weights decide nothing measured here (every row generates exactly
``--new-tokens``, EOS ignored). The rows:

- ``engine``: per batch size (1, 8, 64), generated tokens per second of ``TorchEngine``
  (eager, and with its decode step through ``torch.compile`` with ``--compile-mode``,
  default ``reduce-overhead``: CUDA graphs) and of Hugging Face ``generate`` (sampling at
  temperature 1, same prompts, same lengths), after one warm-up call each (the compiled
  engine's warm-up compiles and records: ``compile_warmup_s``); weights in bfloat16 on the
  GPU. A compile that fails is recorded (``compiled_error``), not fatal.
- ``matmul_peak_bf16``: the best FLOP/s of a few ``torch.mm`` of two ``--peak-n`` square
  bf16 matrices, measured here (on the device the table's peak is a datasheet's).
- ``update``: one :func:`mgrpo.training.update.policy_update` step (float32 master weights,
  bfloat16 autocast, Adam) on ``--update-batch`` sequences of ``--prompt-len`` +
  ``--new-tokens`` tokens; ``mfu`` = model FLOPs / time / the device's peak bf16 dense FLOPs
  (``PEAK_BF16``; None when the device is not listed), model FLOPs per trained token
  ``6 N + 12 L H S`` (PaLM, appendix B; N the matmul parameters, LM head included, L layers,
  H hidden size, S sequence length; gradient-checkpointing recompute not counted).
- ``update_bf16_master``: the same update with the model's parameters in bfloat16 (no
  autocast: no casts of the weights per matmul) and Adam on float32 master copies
  (:class:`mgrpo.training.precision.MasterWeightsAdam`); the vocabulary log-softmax is the
  trainer's chunked one in both rows. ``fraction_of_measured_peak``: model FLOPs / time /
  ``matmul_peak_bf16``.
- ``fsdp2``: the same step with the model sharded by FSDP2 (``fully_shard`` per decoder layer
  and the root, the rank trainer's layout) in a process group of one (NCCL on a GPU, gloo on
  CPU).
- peak memory of each phase (``torch.cuda.max_memory_allocated``; CPU: the process's peak
  RSS, which only grows).

``--tiny`` uses a 2-layer, 64-wide shape on CPU (float32 weights, bf16 autocast in the
update; the compiled engine on torch.compile's ``eager`` backend, Dynamo's trace without code
generation) so ``make test`` runs this file in seconds (``tests/unit/bench/test_bench_gpu.py``)
and it never rots; its figures say nothing about a GPU.

Usage::

    python bench/gpu.py                 # the GPU check (cuda:0)
    python bench/gpu.py --tiny          # the CPU smoke shape
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shared"))

from mgrpo.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from mgrpo.engines.torch_engine import TorchEngine  # noqa: E402

QWEN2_05B = {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
             "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "max_position_embeddings": 32768, "rope_theta": 1_000_000.0,
             "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 1024, "tie_word_embeddings": True}
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


class IdTokenizer:
    """What TorchEngine needs of a tokenizer when the weights are random: pad/eos ids and a
    decode (ids as text; no stop strings are used)."""

    pad_token_id = 0
    eos_token_id = 1

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(str(int(i)) for i in ids)


def build_model(shape: dict, dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**shape, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype)
    return model.eval()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def _peak_gb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def _prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch)
    return torch.randint(2, vocab, (batch, length), generator=gen).tolist()


def _timed(fn, device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def matmul_peak(device: str, n: int, repeats: int = 5) -> dict:
    """The best bf16 FLOP/s of ``repeats`` ``torch.mm`` of two n x n matrices."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device=device, dtype=torch.bfloat16)
            for _ in range(2))
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b), device) for _ in range(repeats))
    return {"n": n, "repeats": repeats, "flops_per_s": 2.0 * n ** 3 / best}


def _compiled_row(model, device: str, batch: int, requests, compile_options: dict,
                  tokens: int) -> dict:
    """Tokens/s of a TorchEngine whose decode step is compiled; the warm-up compiles."""
    engine = TorchEngine(model, IdTokenizer(), device=device, max_batch_size=batch,
                         stop_at_eos=False, compile_options=compile_options)
    try:
        warmup = _timed(lambda: engine.generate(requests), device)
        seconds = _timed(lambda: engine.generate(requests), device)
    except Exception as error:  # noqa: BLE001 - a backend that cannot compile is a figure
        return {"compiled_error": f"{type(error).__name__}: {str(error)[:300]}"}
    return {"torch_engine_compiled_tok_s": tokens / seconds, "compile_warmup_s": warmup}


def engine_rows(model, device: str, batches: list[int], prompt_len: int, new_tokens: int,
                vocab: int, compile_options: dict) -> list[dict]:
    engine = TorchEngine(model, IdTokenizer(), device=device, max_batch_size=max(batches),
                         stop_at_eos=False)
    rows = []
    for batch in batches:
        prompts = _prompts(batch, prompt_len, vocab)
        requests = [GenerationRequest(p, SamplingParams(temperature=1.0, seed=i,
                                                        max_new_tokens=new_tokens))
                    for i, p in enumerate(prompts)]
        ids = torch.tensor(prompts, device=device)
        attention = torch.ones_like(ids)

        def hf(ids=ids, attention=attention):
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=attention, do_sample=True,
                               temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, pad_token_id=0)

        def ours(requests=requests):
            engine.generate(requests)

        for fn in (ours, hf):  # warm-up: kernels, allocator, static cache
            fn()
        _reset_peak(device)
        ours_s, hf_s = _timed(ours, device), _timed(hf, device)
        tokens = batch * new_tokens
        row = {"batch": batch, "torch_engine_tok_s": tokens / ours_s,
               "hf_generate_tok_s": tokens / hf_s, "engine_over_hf": hf_s / ours_s,
               "peak_mem_gb": _peak_gb(device)}
        row.update(_compiled_row(model, device, batch, requests, compile_options, tokens))
        if "torch_engine_compiled_tok_s" in row:
            row["compiled_over_hf"] = row["torch_engine_compiled_tok_s"] * hf_s / tokens
        rows.append(row)
    return rows


def matmul_params(model) -> int:
    """Parameters that take part in a matmul per token: all but the embedding lookup, plus
    the LM head (tied to the embedding here, so counted once as the head)."""
    embed = model.get_input_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    return total - embed + model.get_output_embeddings().weight.numel()


def model_flops(model, tokens: int, seq_len: int) -> float:
    cfg = model.config
    per_token = 6 * matmul_params(model) + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len
    return float(per_token * tokens)


def _samples(batch: int, prompt_len: int, new_tokens: int, vocab: int) -> list:
    from mgrpo.training.scoring import Sample
    from mgrpo.types import Trajectory

    gen = torch.Generator().manual_seed(7)
    out = []
    for i, prompt in enumerate(_prompts(batch, prompt_len, vocab)):
        completion = torch.randint(2, vocab, (new_tokens,), generator=gen).tolist()
        traj = Trajectory(traj_id=f"b/{i}", round_id="b", query_id=str(i // 8), rollout=i % 8,
                          agent="policy", model="policy", input_ids=prompt + completion,
                          response_mask=[0] * prompt_len + [1] * new_tokens,
                          old_logprobs=[0.0] * prompt_len + [-8.0] * new_tokens)
        out.append(Sample(traj, advantage=1.0 if i % 2 else -1.0, reward=float(i % 2)))
    return out


def update_row(model, device: str, samples: list, micro_batch: int, checkpointing: bool,
               shard: bool, bf16_master: bool = False, peak: dict | None = None) -> dict:
    """One timed update (after a warm-up). ``bf16_master``: ``model`` is in bfloat16, no
    autocast, Adam on float32 master copies; else float32 weights under bf16 autocast."""
    from mgrpo.training.config import LossConfig, ModelConfig
    from mgrpo.training.precision import MasterWeightsAdam, make_optimizer, prepare_for_training
    from mgrpo.training.update import UpdateSpec, policy_update

    mcfg = ModelConfig(path="random", lr=1e-6, micro_batch_size=micro_batch,
                       dtype="float32" if bf16_master else "bfloat16",
                       gradient_checkpointing=checkpointing)
    prepare_for_training(model, mcfg)
    if shard:
        from mgrpo.parallel.sharding import shard as fsdp2

        fsdp2(model, "fsdp", device)
    optimizer = MasterWeightsAdam(model.parameters(), lr=mcfg.lr) if bf16_master \
        else make_optimizer(model, mcfg)
    _reset_peak(device)

    def step():
        # rollout_is: the sampler's logprobs here are made up, so no correction
        spec = UpdateSpec(mcfg, LossConfig(rollout_is="none"), pad_id=0)
        policy_update(model, optimizer, samples, spec, generator=torch.Generator().manual_seed(0))

    step()  # warm-up (allocator, Adam state)
    seconds = _timed(step, device)
    tokens = sum(len(s.trajectory.input_ids) for s in samples)
    flops = model_flops(model, tokens, len(samples[0].trajectory.input_ids))
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    table_peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    measured = peak
    return {"tokens": tokens, "seconds": seconds, "tflops": flops / seconds / 1e12,
            "mfu": None if table_peak is None else flops / seconds / table_peak,
            "fraction_of_measured_peak": None if measured is None
            else flops / seconds / measured["flops_per_s"],
            "bf16_master": bf16_master,
            "peak_mem_gb": _peak_gb(device), "gradient_checkpointing": checkpointing}


def fsdp2_row(args, shape: dict, device: str, samples: list) -> dict:
    import torch.distributed as dist

    with socket.socket() as s:  # a free port: parallel test runs never collide
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend)
    try:
        model = build_model(shape, torch.float32, device)
        row = update_row(model, device, samples, args.micro_batch, args.checkpointing,
                         shard=True)
    finally:
        dist.destroy_process_group()
    return {"backend": backend, "world_size": 1, **row}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke shape (make test)")
    parser.add_argument("--device", default=None, help="default: cuda, or cpu with --tiny")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--prompt-len", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--update-batch", type=int, default=None)
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument("--checkpointing", action="store_true",
                        help="gradient checkpointing in the update rows")
    parser.add_argument("--compile-mode", default="reduce-overhead",
                        help="torch.compile mode of the compiled engine's decode step")
    parser.add_argument("--peak-n", type=int, default=None, help="bf16 matmul peak size")
    args = parser.parse_args(argv)
    tiny = args.tiny
    device = args.device or ("cpu" if tiny else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py: no CUDA device here; run it on a GPU machine, or "
                         "pass --tiny for the CPU smoke shape")
    shape = TINY if tiny else QWEN2_05B
    defaults = ((2, 4), 8, 8, 8, 4) if tiny else ((1, 8, 64), 128, 128, 32, 8)
    batches = args.batches or list(defaults[0])
    prompt_len, new_tokens = args.prompt_len or defaults[1], args.new_tokens or defaults[2]
    update_batch, args.micro_batch = (args.update_batch or defaults[3],
                                      args.micro_batch or defaults[4])
    started = time.perf_counter()
    gen_dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = build_model(shape, gen_dtype, device)
    compile_options = {"backend": "eager"} if device == "cpu" else {"mode": args.compile_mode}
    out = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
           "shape": "tiny" if tiny else "qwen2-0.5b",
           "params": sum(p.numel() for p in model.parameters()),
           "torch": torch.__version__, "prompt_len": prompt_len, "new_tokens": new_tokens,
           "compile_options": compile_options, "load_avg_start": list(os.getloadavg()),
           "engine": engine_rows(model, device, batches, prompt_len, new_tokens,
                                 shape["vocab_size"], compile_options)}
    del model
    peak = matmul_peak(device, args.peak_n or (256 if device == "cpu" else 8192))
    out["matmul_peak_bf16"] = peak
    samples = _samples(update_batch, prompt_len, new_tokens, shape["vocab_size"])
    out["update"] = update_row(build_model(shape, torch.float32, device), device, samples,
                               args.micro_batch, args.checkpointing, shard=False, peak=peak)
    out["update_bf16_master"] = update_row(
        build_model(shape, torch.bfloat16, device), device, samples, args.micro_batch,
        args.checkpointing, shard=False, bf16_master=True, peak=peak)
    out["fsdp2"] = fsdp2_row(args, shape, device, samples)
    out["wall_s"] = time.perf_counter() - started
    out["load_avg_end"] = list(os.getloadavg())
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

"""How close one GRPO update comes to this machine's matmul limit, at a real model's shape.

A model of Qwen2-0.5B's shape (``--shape qwen2-0.5b``: 24 layers, hidden 896, MLP 4864, 14
query / 2 key-value heads, vocabulary 151,936, tied embeddings: ~494M parameters) or of
SmolLM2-135M-Instruct's (``--shape smollm2-135m``: a Llama, 30 layers, hidden 576, MLP 1536,
9 / 3 heads, vocabulary 49,152, tied: 134.5M) is built from its config with random weights
(nothing downloaded). One GRPO update
(:func:`mgrpo.training.update.policy_update`, the trainer's own code: one mini-batch, Adam,
pi_old from the update's own forward, entropy diagnostic) runs over a fixed batch of
``--batch`` sequences of ``--seq`` tokens (``--prompt`` of them prompt, the rest response,
advantages +-1). Per dtype (``--dtypes``):

- ``fp32``: float32 weights and arithmetic;
- ``bf16``: the trainer's ``dtype: bfloat16`` (``ModelConfig.dtype``): float32 master
  weights and Adam, the forward passes under ``torch.autocast(dtype=torch.bfloat16)``.

and per variant (``--variants``, each dtype runs every one, side by side in one run):

- ``plain``: logits at every position, the plain autograd log-softmax over the vocabulary,
  torch's default Adam step;
- ``response``: + logits only from the earliest response position on (``logits_to_keep``);
- ``chunked``: + the vocabulary log-softmax in chunks of positions
  (:mod:`mgrpo.algo.vocab_logprobs`);
- ``fast``: + fused Adam: the trainer's own path (:class:`mgrpo.training.update.LogitsPlan`
  defaults, :func:`mgrpo.training.precision.make_optimizer`).

``speedup_over_plain`` is the plain variant's CPU seconds over the variant's. Peak memory of
each variant's timed update: the process's peak resident set from just before it to its end
(Linux: the peak is reset through ``/proc/self/clear_refs`` and read from ``VmHWM``),
beside the resident set just before it (weights, Adam's state, what the allocator keeps).

Model FLOPs of an update: 3 x the forward's matmul FLOPs (forward, and a backward of twice
the forward), counting every linear layer of every token (lm_head included, the embedding
lookup not) and causal attention (QK^T and AV over the positions each token sees);
``fraction_of_peak_*_needed`` counts the lm_head only on the positions whose logits the loss
reads (those that predict a response token), the work the update cannot skip. The
machine's limit: the best of ``--peak-repeats`` ``torch.mm`` of two ``--peak-n`` square
matrices in the same dtype on the same threads, measured in the same run, before and after
the updates. Both are reported per wall second and per CPU second of this process: on a
shared machine other jobs take the cores, so the wall figures sag with the load while the
CPU-second ones (which count only the time this process ran) do not; the 1-, 5- and
15-minute load averages are recorded around every measurement.

Per variant update 1 warms up (allocations, Adam's state); update 2 is the timed one; with
``--profile`` one more of the last variant runs under ``torch.profiler`` and the JSON gives
its self CPU time per operator (top 15) and per kind: matmul (``mm``/``addmm``/``bmm``,
attention), Adam (``_foreach_*``, ``_fused_adam``), the
log-softmax and entropy over the vocabulary, and the rest.

``--device cuda`` measures a GPU the same way (the clocks synchronised around each timing).

What it does NOT do: generation, the KL reference's forward (``loss.kl_coef`` 0), gradient
checkpointing, more than one process; a figure taken while other jobs run says what this
machine gave then, not what it can do.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/update_mfu.py [--shape qwen2-0.5b] [--batch 4]
        [--seq 256] [--prompt 64] [--micro-batch 2] [--dtypes fp32 bf16] [--profile]
        [--variants plain response chunked fast]
    .venv/bin/python bench/update_mfu.py --smoke    # the tiny shape, seconds (the test's)

``--adam`` also times one Adam step over the model's parameters per implementation (torch's
default, ``foreach``, ``fused``): the optimizer's share without the update's noise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch

RESULT_FILE = Path(__file__).resolve().parent / "results" / "update_mfu.json"

# Qwen/Qwen2-0.5B's and Qwen/Qwen2-1.5B's config.json (the fields that set the arithmetic)
SHAPES = {
    "qwen2-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                       tie_word_embeddings=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6),
    "qwen2-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                       num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                       tie_word_embeddings=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6),
    # HuggingFaceTB/SmolLM2-135M-Instruct's config.json (a LlamaForCausalLM)
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         tie_word_embeddings=True, rope_theta=100_000.0, rms_norm_eps=1e-5),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                 rope_theta=10_000.0, rms_norm_eps=1e-6),
}
LLAMA_SHAPES = {"smollm2-135m"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
VARIANTS = ("plain", "response", "chunked", "fast")
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
              "aten::_scaled_dot_product", "aten::_flash_attention", "aten::linear_backward")
VOCAB_OPS = ("aten::logsumexp", "aten::_softmax", "aten::_log_softmax", "aten::gather",
             "aten::softmax")
VOCAB_BACKWARD = ("LogsumexpBackward", "GatherBackward", "SoftmaxBackward",
                  "_ChunkedLogprobs")


def build_model(shape: str, device: str) -> torch.nn.Module:
    """A Qwen2ForCausalLM (LlamaForCausalLM for :data:`LLAMA_SHAPES`) of ``shape`` with
    random weights (seed 0), float32."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if shape in LLAMA_SHAPES \
        else (Qwen2Config, Qwen2ForCausalLM)
    torch.manual_seed(0)
    config = config_cls(**SHAPES[shape], max_position_embeddings=4096,
                        attn_implementation="sdpa")
    return model_cls(config).to(device)


def update_flops(shape: str, batch: int, seq: int, prompt: int | None = None
                 ) -> dict[str, float]:
    """Model FLOPs of one forward + backward over ``batch`` x ``seq`` tokens (see the module
    docstring): per token 2 x the linear layers' weights; per sequence and layer causal
    attention's QK^T and AV, 2 x 2 x (query heads x head dim) x seq (seq + 1) / 2; x 3.
    ``update_needed``: the lm_head only on the ``seq - prompt`` positions that predict a
    response token (with ``prompt``)."""
    s = SHAPES[shape]
    d, heads, kv = s["hidden_size"], s["num_attention_heads"], s["num_key_value_heads"]
    head_dim = d // heads
    per_layer = (d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d
                 + 3 * d * s["intermediate_size"])
    linear = s["num_hidden_layers"] * per_layer + d * s["vocab_size"]  # + lm_head
    forward_linear = 2.0 * linear * batch * seq
    forward_attention = (4.0 * heads * head_dim * seq * (seq + 1) / 2
                         * s["num_hidden_layers"] * batch)
    skipped_head = 2.0 * d * s["vocab_size"] * batch * (prompt if prompt is not None else 0)
    return {"matmul_parameters": linear, "forward": forward_linear + forward_attention,
            "attention_share": forward_attention / (forward_linear + forward_attention),
            "update": 3.0 * (forward_linear + forward_attention),
            "update_needed": 3.0 * (forward_linear + forward_attention - skipped_head)}


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str) -> dict[str, float]:
    """Run ``fn`` once: wall and CPU seconds of this process, load averages around it."""
    load_before = os.getloadavg()
    synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    synchronize(device)
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()]}


def matmul_peak(dtype: torch.dtype, n: int, repeats: int, device: str) -> dict:
    """The best FLOP/s of ``repeats`` ``torch.mm`` of two n x n matrices (one untimed first)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    torch.mm(a, b)
    runs = [timed(lambda: torch.mm(a, b), device) for _ in range(repeats)]
    flops = 2.0 * n ** 3
    return {"n": n, "repeats": repeats,
            "flops_per_wall_s": max(flops / r["wall_s"] for r in runs),
            "flops_per_cpu_s": max(flops / max(r["cpu_s"], 1e-9) for r in runs),
            "load_before": runs[0]["load_before"], "load_after": runs[-1]["load_after"]}


def make_samples(batch: int, seq: int, prompt: int, vocab: int) -> list:
    """``batch`` fixed trajectories of ``seq`` random tokens (seed 1), ``prompt`` of them
    prompt; advantages alternate +1 / -1."""
    from mgrpo.training.scoring import Sample
    from mgrpo.types import Trajectory

    gen = torch.Generator().manual_seed(1)
    return [Sample(Trajectory(
        traj_id=f"r/q/{i}/planner/0", round_id="r", query_id="q", rollout=i, agent="planner",
        model="planner", input_ids=torch.randint(10, vocab - 1, (seq,), generator=gen).tolist(),
        response_mask=[0] * prompt + [1] * (seq - prompt), old_logprobs=[0.0] * seq),
        advantage=1.0 if i % 2 else -1.0, reward=0.0) for i in range(batch)]


def _kind(event) -> str:
    """An operator's kind: its own name, else the nearest enclosing one that has a kind
    (an ``aten::mul`` inside ``Optimizer.step`` is Adam's; one inside a logsumexp's backward
    is the vocabulary softmax's)."""
    while event is not None:
        name = event.name
        if name.startswith(MATMUL_OPS) or "MmBackward" in name or "BmmBackward" in name:
            return "matmul"
        if name.startswith("Optimizer."):
            return "adam"
        if name.startswith(VOCAB_OPS) or any(k in name for k in VOCAB_BACKWARD):
            return "vocab_softmax"
        if name.startswith("aten::_foreach_norm") or "clip_grad" in name:
            return "grad_clip"
        event = event.cpu_parent
    return "other"


def profile_kinds(prof, top: int = 15) -> dict:
    """Self CPU time per operator (the ``top`` largest) and per kind (:func:`_kind`)."""
    kinds: dict[str, float] = {}
    for event in prof.events():
        kinds[_kind(event)] = kinds.get(_kind(event), 0.0) + event.self_cpu_time_total / 1e6
    rows = sorted(((e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()),
                  key=lambda r: -r[1])
    total = sum(kinds.values()) or 1e-9
    return {"self_cpu_s_total": round(total, 3),
            "share_by_kind": {k: round(v / total, 4) for k, v in sorted(kinds.items())},
            "top_ops": [{"op": n, "self_cpu_s": round(s, 3), "share": round(s / total, 4),
                         "calls": c} for n, s, c in rows[:top]]}


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set to its current one (Linux ``clear_refs``);
    False where that is not possible (then only the whole run's peak is known)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def memory_of(fn, device: str) -> tuple[dict, dict]:
    """Run ``fn`` (timed): its timing and its memory: resident set before, peak during
    (GiB; on a GPU the allocator's peak)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**30
        run = timed(fn, device)
        return run, {"kind": "cuda_max_memory_allocated", "before_gb": round(before, 3),
                     "peak_gb": round(torch.cuda.max_memory_allocated() / 2**30, 3)}
    reset = reset_peak_rss()
    before = _status_kb("VmRSS")
    run = timed(fn, device)
    peak = _status_kb("VmHWM") if reset else None
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return run, {"kind": "VmHWM after clear_refs" if reset else "ru_maxrss (whole run)",
                 "before_gb": None if before is None else round(before / 2**20, 3),
                 "peak_gb": round(peak / 2**20, 3),
                 "peak_over_before_gb": None if before is None
                 else round((peak - before) / 2**20, 3)}


def _variant(name: str, model, lr: float = 1e-6):
    """The variant's logits plan and optimizer (see the module docstring)."""
    from mgrpo.training.config import ModelConfig
    from mgrpo.training.precision import make_optimizer
    from mgrpo.training.update import LogitsPlan

    plans = {"plain": LogitsPlan(response_only=False, chunked=False),
             "response": LogitsPlan(response_only=True, chunked=False),
             "chunked": LogitsPlan(), "fast": LogitsPlan()}
    if name == "fast":
        optimizer = make_optimizer(model, ModelConfig(path="-", lr=lr))
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    return plans[name], optimizer


def measure_dtype(args, dtype_name: str, samples: list, flops: dict) -> list[dict]:
    """One dtype: the matmul peak, then per variant a warm-up update and a timed one (its
    memory), the peak again, a profile of the last variant."""
    from mgrpo.training.config import LossConfig, ModelConfig
    from mgrpo.training.update import UpdateSpec, policy_update

    dtype = DTYPES[dtype_name]
    peak_before = matmul_peak(dtype, args.peak_n, args.peak_repeats, args.device)
    model = build_model(args.shape, args.device)
    mcfg = ModelConfig(path="-", micro_batch_size=args.micro_batch,
                       dtype="bfloat16" if dtype == torch.bfloat16 else "float32")
    runs, profile = {}, None
    for variant in args.variants:
        plan, optimizer = _variant(variant, model)

        def update(plan=plan, optimizer=optimizer) -> None:
            policy_update(model, optimizer, samples,
                          UpdateSpec(mcfg, LossConfig(rollout_is="none"), pad_id=0,
                                     logits=plan),
                          generator=torch.Generator().manual_seed(0))

        warmup = timed(update, args.device)
        runs[variant] = (warmup, *memory_of(update, args.device))
        if args.profile and variant == args.variants[-1]:
            profile = profile_update(update)
        del update, optimizer  # its Adam state: the next variant's memory does not hold it
    peak_after = matmul_peak(dtype, args.peak_n, args.peak_repeats, args.device)
    peak_wall = max(peak_before["flops_per_wall_s"], peak_after["flops_per_wall_s"])
    peak_cpu = max(peak_before["flops_per_cpu_s"], peak_after["flops_per_cpu_s"])
    base_cpu = runs[args.variants[0]][1]["cpu_s"]
    return [_row(dtype_name, variant, warmup, run, memory, flops, peak_wall, peak_cpu,
                 peak_before, peak_after, base_cpu,
                 profile if variant == args.variants[-1] else None)
            for variant, (warmup, run, memory) in runs.items()]


def adam_steps(shape: str, device: str) -> dict:
    """CPU and wall seconds of one Adam step over the model's parameters (gradients set,
    after one untimed step), per implementation: torch's default, ``foreach``, ``fused``."""
    model = build_model(shape, device)
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(2)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(device)
    out = {"parameters": sum(p.numel() for p in params)}
    for name, kwargs in (("default", {}), ("foreach", {"foreach": True}),
                         ("fused", {"fused": True})):
        optimizer = torch.optim.Adam(params, lr=1e-6, **kwargs)
        optimizer.step()
        out[name] = timed(optimizer.step, device)
        del optimizer
    return out


def profile_update(update) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        update()
    return profile_kinds(prof)


def _row(dtype_name, variant, warmup, run, memory, flops, peak_wall, peak_cpu, peak_before,
         peak_after, base_cpu, profile) -> dict:
    wall_rate = flops["update"] / run["wall_s"]
    cpu_rate = flops["update"] / max(run["cpu_s"], 1e-9)
    needed_cpu_rate = flops["update_needed"] / max(run["cpu_s"], 1e-9)
    return {"dtype": dtype_name, "variant": variant, "warmup_update": warmup, "update": run,
            "memory": memory, "model_flops_per_wall_s": wall_rate,
            "model_flops_per_cpu_s": cpu_rate,
            "matmul_peak_before": peak_before, "matmul_peak_after": peak_after,
            "fraction_of_peak_wall": wall_rate / peak_wall,
            "fraction_of_peak_cpu": cpu_rate / peak_cpu,
            "fraction_of_peak_wall_needed": flops["update_needed"] / run["wall_s"] / peak_wall,
            "fraction_of_peak_cpu_needed": needed_cpu_rate / peak_cpu,
            "speedup_over_plain": base_cpu / max(run["cpu_s"], 1e-9),
            # the process had the core this share of the update's wall time (1 thread)
            "cpu_over_wall": run["cpu_s"] / run["wall_s"], "profile": profile}


def memory_needed_gb(shape: str, batch: int, seq: int, micro: int) -> float:
    """Rough peak: weights, gradients and Adam's two moments in float32, plus a micro-batch's
    activations (~40 floats per hidden unit per token and layer) and logits (~4 copies)."""
    s = SHAPES[shape]
    params = update_flops(shape, 1, 1)["matmul_parameters"]
    tokens = min(batch, micro) * seq
    activations = 40 * s["hidden_size"] * s["num_hidden_layers"] * tokens
    logits = 4 * s["vocab_size"] * tokens
    return 4 * (4 * params + activations + logits) / 2**30


def available_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2-0.5b")
    parser.add_argument("--batch", type=int, default=4, help="sequences in the update")
    parser.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per sequence")
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--peak-n", type=int, default=2048)
    parser.add_argument("--peak-repeats", type=int, default=5)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="the first is the baseline of speedup_over_plain")
    parser.add_argument("--profile", action="store_true",
                        help="profile one more update of the last variant")
    parser.add_argument("--adam", action="store_true",
                        help="also time one Adam step per implementation (adam_step)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny shape at a few tokens, profiled (seconds)")
    parser.add_argument("--out", type=Path, default=RESULT_FILE)
    args = parser.parse_args(argv)
    if args.smoke:
        args.shape, args.batch, args.seq, args.prompt, args.micro_batch = "tiny", 2, 16, 4, 1
        args.peak_n, args.peak_repeats, args.profile, args.adam = 128, 2, True, True
    if not 0 < args.prompt < args.seq:
        parser.error(f"--prompt {args.prompt} must be in 1..{args.seq - 1} (--seq)")
    need, have = memory_needed_gb(args.shape, args.batch, args.seq, args.micro_batch), \
        available_gb()
    if args.device == "cpu" and have is not None and need > have:
        parser.error(f"{args.shape} at {args.batch}x{args.seq} needs ~{need:.1f} GB, "
                     f"{have:.1f} GB available: lower --batch/--micro-batch or wait")
    flops = update_flops(args.shape, args.batch, args.seq, args.prompt)
    samples = make_samples(args.batch, args.seq, args.prompt, SHAPES[args.shape]["vocab_size"])
    rows = []
    for name in args.dtypes:
        for row in measure_dtype(args, name, samples, flops):
            rows.append(row)
            print(json.dumps({k: row[k] for k in (
                "dtype", "variant", "fraction_of_peak_cpu", "fraction_of_peak_cpu_needed",
                "speedup_over_plain", "cpu_over_wall")} | {"memory": row["memory"]}),
                flush=True)
    result = {
        "bench": "update_mfu", "shape": args.shape, "config": SHAPES[args.shape],
        "batch": args.batch, "seq": args.seq, "prompt": args.prompt,
        "micro_batch": args.micro_batch, "tokens": args.batch * args.seq,
        "response_tokens": args.batch * (args.seq - args.prompt), "variants": args.variants,
        "flops": flops, "device": args.device, "memory_estimate_gb": round(need, 2),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "machine": platform.processor() or platform.machine(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": argv if argv is not None else sys.argv[1:], "rows": rows,
        "adam_step": adam_steps(args.shape, args.device) if args.adam else None}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()

"""``bench/gpu.py`` in its CPU smoke shape (so it never rots without a GPU), and the Qwen2-0.5B
shape it builds for the GPU check (on the meta device: no memory, no download)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
PATH = ROOT / "bench" / "gpu.py"


def load():
    if "bench_gpu" not in sys.modules:  # bench/ is not a package
        spec = importlib.util.spec_from_file_location("bench_gpu", PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_gpu"] = module
        spec.loader.exec_module(module)
    return sys.modules["bench_gpu"]


def test_tiny_run_prints_one_json_line_with_every_row():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(PATH), "--tiny"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["shape"] == "tiny" and out["device"] == "cpu"
    assert [row["batch"] for row in out["engine"]] == [2, 4]
    for row in out["engine"]:
        assert row["torch_engine_tok_s"] > 0 and row["hf_generate_tok_s"] > 0
        assert row["torch_engine_compiled_tok_s"] > 0 and row["compiled_over_hf"] > 0
    assert out["compile_options"] == {"backend": "eager"} and out["matmul_peak_bf16"]["n"] == 256
    for key in ("update", "update_bf16_master", "fsdp2"):
        assert out[key]["tokens"] == 8 * 16 and out[key]["seconds"] > 0
        assert out[key]["tflops"] > 0 and out[key]["mfu"] is None  # no CPU peak is claimed
    assert out["update_bf16_master"]["bf16_master"] is True
    assert out["update_bf16_master"]["fraction_of_measured_peak"] > 0
    assert out["fsdp2"]["backend"] == "gloo" and out["fsdp2"]["world_size"] == 1


def test_the_gpu_shape_is_qwen2_0_5b():
    bench = load()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**bench.QWEN2_05B))
    params = sum(p.numel() for p in model.parameters())
    assert params == 494_032_768  # Qwen2-0.5B's published count
    # FLOPs per token of a 1024-token sequence, fwd + bwd: 6 N + 12 L H S
    n = bench.matmul_params(model)
    assert n == params  # the tied LM head is the embedding matrix: counted once, as the head
    assert bench.model_flops(model, 1, 1024) == 6 * n + 12 * 24 * 896 * 1024

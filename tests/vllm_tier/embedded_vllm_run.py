"""One embedded M-GRPO round whose planner samples with vLLM (``engines: {planner: vllm}``),
run by ``test_vllm_embedded.py`` with the vLLM venv's python.

argv: the run config (YAML). The main venv's site-packages (``MGRPO_MAIN_SITE``) come after
the vLLM venv's on the path: the store, tools and trainer need packages the vLLM venv lacks,
while vLLM keeps its own pins. Everything runs under ``if __name__ == "__main__"`` (vLLM spawns
its engine process, which re-imports this module).

The round goes through the embedded loop's own pieces (``build_system``, ``start_weights``,
``run_round``: play, score, update, checkpoint, ``sync_sampler``). Then, on the same vLLM
engine: the planner prompts of the round are sampled again (T = 1, seeded) and their tokens
teacher-forced through the trainer's updated planner and through its starting weights. The
round's own planner tokens (sampled by vLLM before the step) are teacher-forced through the
starting weights. One JSON line on fd 1 (everything else goes to stderr).
"""

from __future__ import annotations

import json
import os
import site
import sys


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM prints to fd 1
    site.addsitedir(os.environ["MGRPO_MAIN_SITE"])  # after this venv's own packages

    import torch

    from mgrpo.engines.base import GenerationRequest, SamplingParams
    from mgrpo.engines.vllm_engine import VLLMEngine
    from mgrpo.models import load_model
    from mgrpo.models.logprobs import token_logprobs
    from mgrpo.store import Store
    from mgrpo.training.config_files import load_run_config
    from mgrpo.training.loop import run_round, stage_pool
    from mgrpo.training.round_store import round_id_of
    from mgrpo.training.run_state import start_weights
    from mgrpo.training.system import build_system

    cfg = load_run_config(sys.argv[1])
    system = build_system(cfg)
    lm = system.models["planner"]
    assert isinstance(lm.engine, VLLMEngine), type(lm.engine)
    store = Store(f"sqlite:///{os.path.join(cfg.out_dir, 'store.db')}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    assert start_weights(system, resume=False) == 0
    metrics = run_round(system, store, cfg.name, 0, stage_pool(system, 0, cfg.name))
    start, _ = load_model(cfg.models["planner"].path)
    start.eval()

    def forced(model, ids: list[int], first: int) -> list[float]:
        with torch.no_grad():
            logp = token_logprobs(model, torch.tensor([ids]), temperature=1.0)[0]
        return logp[first:].tolist()

    def gap(a: list[float], b: list[float]) -> float:
        return max(abs(x - y) for x, y in zip(a, b, strict=True))

    round_trajs = store.round_trajectories(round_id_of(cfg.name, 0), "planner")
    before = 0.0  # the round's vLLM samples against the starting weights
    prompts = []
    for t in round_trajs:
        first = t.response_mask.index(1)
        ids, mask = t.input_ids, t.response_mask
        ours = [lp for lp, m in zip(t.old_logprobs, mask, strict=True) if m]
        theirs = [lp for lp, m in zip(forced(start, ids, 0), mask, strict=True) if m]
        before = max(before, gap(ours, theirs))
        prompts.append(ids[:first])
    requests = [GenerationRequest(p, SamplingParams(temperature=1.0, max_new_tokens=16,
                                                    seed=i))
                for i, p in enumerate(prompts)]
    after = lm.engine.generate(requests)
    new = stale = 0.0
    tokens = 0
    for c in after:
        ids, n = c.prompt_ids + c.completion_ids, len(c.prompt_ids)
        new = max(new, gap(c.logprobs, forced(lm.model, ids, n)))
        stale = max(stale, gap(c.logprobs, forced(start, ids, n)))
        tokens += len(c.completion_ids)
    protocol.write(json.dumps({
        "grad_norm": metrics.get("planner/grad_norm"), "version": lm.version,
        "engine_version": lm.engine.version, "round_trajectories": len(round_trajs),
        "round_max_diff_start": before, "after_tokens": tokens, "after_max_diff_new": new,
        "after_max_diff_start": stale}) + "\n")
    protocol.flush()


if __name__ == "__main__":
    main()

"""Two embedded M-GRPO rounds whose planner and searcher are LoRA adapters on one base and both
sample with vLLM (``engines: {planner: vllm, searcher: vllm}``), run by
``test_vllm_embedded.py`` with the vLLM venv's python (the main venv's packages after its own,
``make vllm-venv``). One vLLM instance must serve both agents, each with its own adapter, and
after each round each agent's pushed adapter must agree with its trainer (the round's own
``rollout_logp_diff_max`` check). One JSON line on fd 1; everything else on stderr.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM prints to fd 1

    from mgrpo.engines.vllm_engine import VLLMEngine
    from mgrpo.store import Store
    from mgrpo.training.config_files import load_run_config
    from mgrpo.training.loop import run_round, stage_pool
    from mgrpo.training.run_state import start_weights
    from mgrpo.training.system import build_system

    cfg = load_run_config(sys.argv[1])
    system = build_system(cfg)
    planner, searcher = system.models["planner"], system.models["searcher"]
    assert isinstance(planner.engine, VLLMEngine) and isinstance(searcher.engine, VLLMEngine)
    store = Store(f"sqlite:///{os.path.join(cfg.out_dir, 'store.db')}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    assert start_weights(system, resume=False) == 0
    pool = stage_pool(system, 0, cfg.name)
    rounds = [run_round(system, store, cfg.name, i, pool)
              for i in range(2)]
    ids = [getattr(m.engine.lora_request, "lora_int_id", None) for m in (planner, searcher)]
    protocol.write(json.dumps({
        "one_instance": planner.engine.llm is searcher.engine.llm,
        "versions": [planner.engine.version, searcher.engine.version],
        "lora_ids": ids,
        "diff": {f"{role}/{i}": m.get(f"{role}/rollout_logp_diff_max")
                 for i, m in enumerate(rounds) for role in ("planner", "searcher")},
        "grad_norm": {f"{role}/{i}": m.get(f"{role}/grad_norm")
                      for i, m in enumerate(rounds) for role in ("planner", "searcher")},
    }) + "\n")
    protocol.flush()
    searcher.engine.close()  # the adapter engine: leaves the instance running
    planner.engine.close()


if __name__ == "__main__":
    main()

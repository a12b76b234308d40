"""r_expert by an LLM judge in the distributed round (issue 10.4): the sub-agent trainers
build the judges of the round's config. The searcher is judged by its own model (the
trainer's engine, current weights), the coder by a separate frozen ``judge`` model loaded in
its trainer. In-memory bus, SQLite store, scripted agents, real tiny models as judges: their
replies are unparsable noise, which is exactly what the parse-failure metric must count."""

from __future__ import annotations

import time

import yaml
from services_testkit import make_bench, make_tiny, write_run_config

from mgrpo.bus import InMemoryBus
from mgrpo.config import Settings
from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.envs.judges import LLMExpertJudge
from mgrpo.services.context import Queues, load_service_config, open_store
from mgrpo.services.planner_worker import PlannerRuntime, PlannerWorker
from mgrpo.services.rounds import start_round
from mgrpo.services.subagent_worker import SubagentWorker
from mgrpo.services.trainer import TrainerService


def test_distributed_round_uses_the_configured_llm_judges(tmp_path):
    tiny = make_tiny(tmp_path / "tiny")
    cfg_path = write_run_config(tmp_path / "run.yaml", tiny, make_bench(tmp_path / "bench"),
                                name="judged", k=2, queries=2)
    data = yaml.safe_load(cfg_path.read_text())
    data["models"]["judge"] = {"path": str(tiny), "trainable": False}
    data["judges"] = {"searcher": {"kind": "llm", "model": "searcher"},
                      "coder": {"kind": "llm", "model": "judge"}}
    cfg_path.write_text(yaml.safe_dump(data))
    settings = Settings(mode="embedded", database_url=f"sqlite:///{tmp_path}/store.db",
                        checkpoint_uri=str(tmp_path / "ckpt"), run_config=str(cfg_path),
                        engine="services_testkit:scripted_engine")
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = InMemoryBus(store)
    for name, tool in (("searcher", "search"), ("coder", "python")):
        SubagentWorker(settings, cfg, store, bus, name, tool).start()
    PlannerWorker(PlannerRuntime.build(settings, cfg, store, bus)).start()
    trainers = {m: TrainerService(settings, cfg, store, bus, m, poll_s=0.1)
                for m in ("planner", "searcher", "coder")}
    for trainer in trainers.values():
        trainer.start()
    try:
        record = start_round(store, bus, cfg, Queues())
        deadline = time.monotonic() + 120
        while store.get_round(record.round_id).status not in ("done", "failed") \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert store.get_round(record.round_id).status == "done"
        metrics = store.metrics("judged", record.round_id)[record.round_id]
        for role in ("searcher", "coder"):
            trajs = store.round_trajectories(record.round_id, role)
            valid = sum(t.format_ok for t in trajs)
            assert valid > 0 and metrics[f"{role}/expert_judged"] == valid
            assert 0 <= metrics[f"{role}/judge_parse_failures"] <= valid
            assert metrics[f"{role}/expert_no_truth"] == 0
        searcher_judge = trainers["searcher"].judge(cfg).for_role("searcher")
        assert isinstance(searcher_judge, LLMExpertJudge)
        assert searcher_judge.engine is trainers["searcher"].lm.engine
        coder_judge = trainers["coder"].judge(cfg).for_role("coder")
        assert isinstance(coder_judge.engine, TorchEngine)
        assert coder_judge.engine is not trainers["coder"].lm.engine
        # A trainer builds only its own roles' judges (never loads another role's model).
        assert not isinstance(trainers["searcher"].judge(cfg).for_role("coder"), LLMExpertJudge)
    finally:
        for trainer in trainers.values():
            trainer.stop()
        bus.close()
        store.close()

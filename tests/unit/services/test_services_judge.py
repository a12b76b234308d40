"""r_expert by an LLM judge in the distributed round (issue 10.4): the sub-agent trainers
build the judges of the round's config. The searcher is judged by its own model (the
trainer's engine, current weights), the coder by a separate frozen ``judge`` model loaded in
its trainer. In-memory bus, SQLite store, scripted agents, real tiny models as judges: their
replies are unparsable noise, which is exactly what the parse-failure metric must count."""

from __future__ import annotations

import yaml
from services_testkit import (
    embedded_settings,
    in_process_services,
    make_bench,
    make_tiny,
    wait_done,
    write_run_config,
)

from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.envs.judges import LLMExpertJudge
from mgrpo.services.context import Queues
from mgrpo.services.rounds import start_round


def test_distributed_round_uses_the_configured_llm_judges(tmp_path):
    tiny = make_tiny(tmp_path / "tiny")
    cfg_path = write_run_config(tmp_path / "run.yaml", tiny, make_bench(tmp_path / "bench"),
                                name="judged", k=2, queries=2)
    data = yaml.safe_load(cfg_path.read_text())
    data["models"]["judge"] = {"path": str(tiny), "trainable": False}
    data["judges"] = {"searcher": {"kind": "llm", "model": "searcher"},
                      "coder": {"kind": "llm", "model": "judge"}}
    cfg_path.write_text(yaml.safe_dump(data))
    with in_process_services(embedded_settings(tmp_path, cfg_path)) as svc:
        cfg, store, bus, trainers = svc.cfg, svc.store, svc.bus, svc.trainers
        record = start_round(store, bus, cfg, Queues())
        assert wait_done(store, record.round_id) == "done"
        metrics = store.metrics("judged", record.round_id)[record.round_id]
        for role in ("searcher", "coder"):
            trajs = store.round_trajectories(record.round_id, role)
            valid = sum(t.format_ok for t in trajs)
            assert valid > 0 and metrics[f"{role}/expert_judged"] == valid
            assert 0 <= metrics[f"{role}/judge_parse_failures"] <= valid
            assert metrics[f"{role}/expert_no_truth"] == 0
        searcher_judge = trainers["searcher"].rounds.judge(cfg).for_role("searcher")
        assert isinstance(searcher_judge, LLMExpertJudge)
        assert searcher_judge.engine is trainers["searcher"].lm.engine
        coder_judge = trainers["coder"].rounds.judge(cfg).for_role("coder")
        assert isinstance(coder_judge.engine, TorchEngine)
        assert coder_judge.engine is not trainers["coder"].lm.engine
        # A trainer builds only its own roles' judges (never loads another role's model).
        searchers_coder = trainers["searcher"].rounds.judge(cfg).for_role("coder")
        assert not isinstance(searchers_coder, LLMExpertJudge)

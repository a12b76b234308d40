"""A user's verifier that raises never crashes an embedded round: each answer it could not
score gets r_correct 0 and is counted in the round's ``planner/verifier_errors``. The planner
is scripted to answer at once, so every episode reaches the verifier."""

from __future__ import annotations

import sys

from training_testkit import ScriptedEngine, run_config_dict, text_responder

from mgrpo.training.config import RunConfig

VERIFIER = '''
def flaky(question, answer, gold):
    if "capital" not in question:
        raise ConnectionError("grading API down")
    return 1.0
'''


def test_a_raising_verifier_scores_zero_and_is_counted(tmp_path, monkeypatch, tiny_dir,
                                                        bench_dir):
    from mgrpo.store import Store
    from mgrpo.training.loop import run_round, stage_pool
    from mgrpo.training.system import build_system

    (tmp_path / "acme_flaky.py").write_text(VERIFIER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "acme_flaky", raising=False)
    cfg = RunConfig.model_validate(run_config_dict(tmp_path, tiny_dir, bench_dir,
                                                   verifier="acme_flaky:flaky"))
    system = build_system(cfg)
    planner = system.runtimes["planner"]
    planner.engine = ScriptedEngine(planner.tokenizer, text_responder(
        planner.tokenizer, lambda text, params: "<answer>42</answer>"))
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    metrics = run_round(system, store, cfg.name, 0, stage_pool(system, 0))
    episodes = cfg.queries_per_round * cfg.k
    assert metrics["planner/format_valid"] == 1.0
    assert metrics["planner/verifier_errors"] == episodes
    assert metrics["planner/accuracy"] == 0.0
    assert system.verifier.reasons == {"raised ConnectionError: grading API down": episodes}
    [record] = store.list_rounds(cfg.name)
    assert record.status == "done"

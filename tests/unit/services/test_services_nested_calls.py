"""What the services need of a nested hierarchy (planner -> researcher -> searcher), short of
a round (that one is tests/integration/services/test_services_nested.py): the services load
the nested run config, the planner's header lists its own callees only, and d_k counts the
answered calls at every depth of an episode's trace."""

from __future__ import annotations

import yaml

from mgrpo.config import Settings
from mgrpo.services.context import load_service_config
from mgrpo.services.dispatch import agent_cards
from mgrpo.services.planner.worker import answered_calls
from mgrpo.store import Store
from mgrpo.training.config import RunConfig

NESTED = {"planner": "p", "researcher": {"model": "p", "calls": ["searcher"]},
          "searcher": "p", "coder": "p"}


def _cfg(agents) -> RunConfig:
    return RunConfig.model_validate({"agents": agents, "models": {"p": {"path": "unused"}}})


def test_the_services_load_a_nested_run_config(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"agents": NESTED, "models": {"p": {"path": "unused"}}}))
    cfg = load_service_config(Settings(run_config=str(path)))
    assert cfg.delegation == {"researcher": ["searcher"]}


def test_the_planner_lists_its_own_callees_only(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    for name in ("searcher", "researcher", "coder", "extra"):
        store.register_agent(name, "p", f"subagent.{name}", description=f"{name} card")
    nested = [card.name for card in agent_cards(store, _cfg(NESTED))]
    assert nested == ["researcher", "coder", "extra"]  # the searcher is the researcher's
    flat = [card.name for card in agent_cards(store, _cfg(
        {"planner": "p", "searcher": "p", "coder": "p"}))]
    assert flat == ["searcher", "coder", "extra", "researcher"]  # registered extras by name
    store.close()


def test_d_counts_answered_calls_at_every_depth():
    def searcher(ok: bool = True) -> dict:
        return {"agent": "searcher", "task": "t", "result": "r", "format_ok": ok, "steps": []}

    failed = {"agent": "searcher", "task": "t", "error": "unknown agent"}
    researcher = {"agent": "researcher", "task": "q", "result": "r", "format_ok": True,
                  "steps": [
                      {"agent": "researcher", "delegate": "searcher", "task": "t",
                       "calls": [searcher()]},
                      {"agent": "researcher", "delegate": "searcher", "task": "t",
                       "calls": [searcher(ok=False)]},
                      {"agent": "researcher", "delegate": "searcher", "task": "t",
                       "calls": [failed]}]}
    trace = [{"agent": "planner", "delegate": "researcher", "task": "q"}, researcher,
             searcher(), {"agent": "planner", "answer": "a"}]
    assert answered_calls(trace, "researcher") == 1
    assert answered_calls(trace, "searcher") == 3  # two under the researcher, one direct
    assert answered_calls(trace, "coder") == 0

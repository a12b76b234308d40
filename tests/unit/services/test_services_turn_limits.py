"""Distributed mode, turn limits (issue 10.2): the sub-agent service plays a round's calls with
the ROUND's ``sampling`` (what its planner worker and trainers read), not the config it was
started with, so a sub-agent that makes four tool calls and returns within the round's
``subagent_max_turns: 5`` is format-valid. (main: the service's own limit, 2 here, cut the
call short: no return, R_S = 0.)"""

from __future__ import annotations

import threading

import yaml
from services_testkit import make_bench, make_tiny, write_run_config

from mgrpo.bus import InMemoryBus
from mgrpo.bus.messages import SubAgentCall
from mgrpo.config import Settings
from mgrpo.engines.base import Completion
from mgrpo.services.context import Queues, load_service_config, open_store
from mgrpo.services.rounds import start_round
from mgrpo.services.subagent.worker import SubagentWorker


class FourToolsThenReturn:
    """A searcher that searches four times, then returns (a scripted engine)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.version = tokenizer, 0

    def load_weights(self, source, version: int) -> None:
        self.version = version

    def generate(self, requests):
        out = []
        for req in requests:
            text = self.tokenizer.decode(req.prompt_ids, skip_special_tokens=False)
            turn = ("<tool>Velmora</tool>" if text.count("<obs>") < 4
                    else "<return>v1</return>")
            ids = self.tokenizer.encode(turn, add_special_tokens=False)
            out.append(Completion(prompt_ids=list(req.prompt_ids), completion_ids=ids,
                                  logprobs=[-0.5] * len(ids), text=turn, finish_reason="stop"))
        return out


def four_tools_engine(path: str, device: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return None, tokenizer, FourToolsThenReturn(tokenizer)


def test_subagent_service_uses_the_rounds_turn_limit(tmp_path):
    cfg_path = write_run_config(tmp_path / "run.yaml", make_tiny(tmp_path / "tiny"),
                                make_bench(tmp_path / "bench"), name="turns")
    settings = Settings(mode="embedded", database_url=f"sqlite:///{tmp_path}/store.db",
                        checkpoint_uri=str(tmp_path / "ckpt"), run_config=str(cfg_path),
                        engine=f"{__name__}:four_tools_engine")
    service_cfg = load_service_config(settings)
    assert service_cfg.sampling.subagent_max_turns == 2  # the service's own (stale) limit
    data = yaml.safe_load(cfg_path.read_text())
    data["sampling"]["subagent_max_turns"] = 5
    round_cfg = type(service_cfg).model_validate(data)
    store = open_store(settings)
    bus = InMemoryBus(store)
    try:
        worker = SubagentWorker(settings, service_cfg, store, bus, "searcher", "search")
        record = start_round(store, bus, round_cfg, Queues())
        replies, got = [], threading.Event()
        bus.consume("test.replies", lambda m: (replies.append(m), len(replies) == 2
                                               and got.set()))
        call = SubAgentCall(call_id=f"{record.round_id}/q/0/searcher/0",
                            round_id=record.round_id, query_id="q", rollout=0,
                            agent="searcher", subtask="population of Velmora",
                            reply_to="test.replies")
        rest = call.model_copy(update={"call_id": "rest-1", "round_id": None,
                                       "query_id": None})
        worker.handle_batch([call, rest])
        assert got.wait(10)
        by_id = {r.call_id: r for r in replies}
        assert by_id[call.call_id].result == "v1" and by_id[call.call_id].format_ok
        # Outside a round (a REST query) the service's own limit applies: cut at 2 turns.
        assert by_id["rest-1"].result == "none" and not by_id["rest-1"].format_ok
    finally:
        bus.close()
        store.close()

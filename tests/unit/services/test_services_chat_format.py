"""protocol.format: chat_template in the distributed round (in-process services, in-memory
bus, SQLite store, real tiny trainers): the planner worker's and the sub-agent workers'
trajectories are chat-template conversations with the loss on the assistant turns only."""

from __future__ import annotations

import re

import yaml
from chat_tokenizer import chat_tokenizer, save_chat_model
from services_testkit import (
    embedded_settings,
    in_process_services,
    make_bench,
    wait_done,
    write_run_config,
)

from mgrpo.services.context import Queues
from mgrpo.services.rounds import start_round


def _assistant_mask(tok, ids: list[int]) -> list[int]:
    text = tok.decode(ids, skip_special_tokens=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids
    spans = [m.span(1) for m in re.finditer(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)",
                                            text, flags=re.S)]
    return [int(any(s <= start < e for s, e in spans)) for start, _ in enc["offset_mapping"]]


def test_a_distributed_round_plays_the_chat_template(tmp_path):
    model = save_chat_model(tmp_path / "chat-model")
    cfg_path = write_run_config(tmp_path / "run.yaml", model, make_bench(tmp_path / "bench"),
                                k=2, queries=1)
    data = yaml.safe_load(cfg_path.read_text())
    cfg_path.write_text(yaml.safe_dump({**data, "protocol": {"format": "chat_template"}}))
    settings = embedded_settings(tmp_path, cfg_path,
                                 engine="chat_tokenizer:chat_scripted_engine")
    tok = chat_tokenizer()
    with in_process_services(settings, poll_s=0.2) as svc:
        record = start_round(svc.store, svc.bus, svc.cfg, Queues())
        assert wait_done(svc.store, record.round_id) == "done"
        planner = svc.store.round_trajectories(record.round_id, "planner")
        searcher = svc.store.round_trajectories(record.round_id, "searcher")
    assert len(planner) == 2 and len(searcher) == 2
    assert all(t.format_ok for t in planner + searcher)
    for traj in planner + searcher:
        text = tok.decode(traj.input_ids, skip_special_tokens=False)
        assert text.startswith("<|im_start|>system\nYou are the ")
        assert text.count("<|im_start|>assistant\n<tool_call>") == 1 and "<tool_response>" in text
        assert traj.response_mask == _assistant_mask(tok, traj.input_ids)

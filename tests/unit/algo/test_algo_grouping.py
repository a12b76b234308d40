"""AT-GRPO's group keys against a naive multi-agent GRPO's: one task, two roles, two turns,
K = 2 candidates each; group ids and advantages computed by hand for every grouping."""

from __future__ import annotations

import pytest
import torch

from mgrpo.algo import at_grpo_advantages, at_grpo_group_ids

# (agent, turn, reward) of the 8 candidates of query 0
ROWS = [(0, 0, 1.0), (0, 0, 0.0), (0, 1, 1.0), (0, 1, 1.0),
        (1, 0, 2.0), (1, 0, 0.0), (1, 1, 0.5), (1, 1, 0.5)]
Q = torch.zeros(8, dtype=torch.long)
A = torch.tensor([r[0] for r in ROWS])
T = torch.tensor([r[1] for r in ROWS])
R = torch.tensor([r[2] for r in ROWS])
S375, S6875 = 0.375 ** 0.5, 0.6875 ** 0.5  # population stds of the pooled groups

EXPECTED = {
    # each (agent, turn): [1, 0] -> +-1; [1, 1] -> 0; [2, 0] -> +-1; [.5, .5] -> 0
    "agent_turn": ([0, 0, 1, 1, 2, 2, 3, 3], [1, -1, 0, 0, 1, -1, 0, 0]),
    # agent 0 [1, 0, 1, 1]: mean .75, std sqrt(.1875); agent 1 [2, 0, .5, .5]: mean .75, std .75
    "agent": ([0, 0, 0, 0, 1, 1, 1, 1],
              [.25 / .1875 ** .5, -.75 / .1875 ** .5, .25 / .1875 ** .5, .25 / .1875 ** .5,
               1.25 / .75, -1, -1 / 3, -1 / 3]),
    # turn 0 [1, 0, 2, 0]: mean .75, std sqrt(.6875); turn 1 [1, 1, .5, .5]: mean .75, std .25
    "turn": ([0, 0, 1, 1, 0, 0, 1, 1],
             [.25 / S6875, -.75 / S6875, 1, 1, 1.25 / S6875, -.75 / S6875, -1, -1]),
    # all 8: mean .75, std sqrt(.375)
    "naive": ([0] * 8, [d / S375 for d in (.25, -.75, .25, .25, 1.25, -.75, -.25, -.25)]),
}


@pytest.mark.parametrize("grouping", sorted(EXPECTED))
def test_group_keys_and_advantages_by_hand(grouping):
    ids, adv = EXPECTED[grouping]
    assert at_grpo_group_ids(Q, A, T, grouping).tolist() == ids
    out = at_grpo_advantages(R, Q, A, T, grouping=grouping)
    assert out.group_ids.tolist() == ids
    assert torch.allclose(out.advantages.double(), torch.tensor(adv, dtype=torch.float64),
                          atol=1e-4)


def test_default_is_agent_turn_and_queries_never_pool():
    q = torch.tensor([0, 0, 1, 1])
    zeros = torch.zeros(4, dtype=torch.long)
    assert at_grpo_group_ids(q, zeros, zeros).tolist() == [0, 0, 1, 1]
    assert at_grpo_group_ids(q, zeros, zeros, "naive").tolist() == [0, 0, 1, 1]


def test_unknown_grouping_is_refused():
    with pytest.raises(ValueError, match="grouping 'roles'"):
        at_grpo_group_ids(Q, A, T, "roles")

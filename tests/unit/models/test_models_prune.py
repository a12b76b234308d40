"""prune_versions keeps the newest versions and never the partial ones."""

import pytest

from mgrpo.models import TinyModelConfig
from mgrpo.models.checkpoint import list_versions, prune_versions, save_checkpoint
from mgrpo.models.tiny import build_tiny_model


def test_prune_keeps_newest(tmp_path):
    model = build_tiny_model(TinyModelConfig(hidden_size=16, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1,
                                             intermediate_size=32), 300, 0, 1)
    for version in range(1, 6):
        save_checkpoint(model, str(tmp_path), "m", version)
    assert prune_versions(str(tmp_path), "m", keep=2) == [1, 2, 3]
    assert list_versions(str(tmp_path), "m") == [4, 5]


def test_prune_rejects_keep_zero(tmp_path):
    with pytest.raises(ValueError, match="keep >= 1"):
        prune_versions(str(tmp_path), "m", keep=0)

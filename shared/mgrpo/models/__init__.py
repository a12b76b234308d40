"""Models: load local Hugging Face models, build tiny ones, logprobs, checkpoints, SFT.

Imports are lazy (PEP 562 ``__getattr__``) so ``import mgrpo.models`` does not import torch or
transformers; the first use of a name imports its module.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "load_model": "mgrpo.models.loading",
    "load_tokenizer": "mgrpo.models.loading",
    "folder_weights": "mgrpo.models.loading",
    "ModelLoadError": "mgrpo.models.loading",
    "init_tiny": "mgrpo.models.tiny",
    "TinyModelConfig": "mgrpo.models.tiny",
    "token_logprobs": "mgrpo.models.logprobs",
    "save_checkpoint": "mgrpo.models.checkpoint",
    "load_checkpoint": "mgrpo.models.checkpoint",
    "latest_version": "mgrpo.models.checkpoint",
    "CheckpointError": "mgrpo.models.checkpoint",
    "train_sft": "mgrpo.models.sft",
    "SFTConfig": "mgrpo.models.sft",
    "encode_segments": "mgrpo.models.sft",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'mgrpo.models' has no attribute {name!r}")

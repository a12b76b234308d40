"""Agents as adapters on one base: LoRA models loaded from the same base folder hold one copy
of its frozen weights (:func:`share_frozen_base`).

Every frozen parameter (``requires_grad`` False: peft freezes the whole base) and every buffer
of the 2nd..nth model becomes the very same tensor object as the first model's, so their
storage is shared and the duplicates are freed; the LoRA parameters (trainable) stay each
model's own. Parameters are matched by their base name (``...q_proj.base_layer.weight`` is
``...q_proj.weight``), so adapters of different rank or on different ``target_modules`` may
share one base. Models are refused (ValueError) unless their frozen tensors agree in names,
shapes, dtypes, devices and (by default) values.

Safe because nothing writes into a LoRA model's base: the optimizer holds only the adapter,
checkpoints of a LoRA model hold only the adapter, the KL reference runs the same weights
inside ``disable_adapter()``. A full-weights load into a model whose base is shared
(:func:`mgrpo.models.lora.load_base_state`) would change every sharer's base, so it is
accepted only when the weights equal the base already there (then nothing is written).

What it does NOT do: share across processes (each service process loads its own model), or
share full-weight (trained) models.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgrpo.models.lora import (  # noqa: F401 - shares_base also read from here
    SHARED_FLAG,
    is_lora_model,
    shares_base,
)


@dataclass(frozen=True)
class SharedBase:
    """What :func:`share_frozen_base` did: tensors of the 2nd..nth models replaced by the
    first's, and the bytes of the distinct storages that were dropped."""

    tensors: int
    bytes_saved: int


def base_name(name: str) -> str:
    """A peft parameter's name as in the plain model's (``.base_layer.`` dropped)."""
    return name.replace(".base_layer.", ".")


def _frozen_slots(model) -> dict[str, list[tuple]]:
    """base name -> [(module, attribute, tensor, is_param)] of every frozen parameter and every
    buffer (one name may sit in several modules: tied embeddings)."""
    slots: dict[str, list[tuple]] = {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        prefix = f"{mod_name}." if mod_name else ""
        for attr, p in module._parameters.items():
            if p is not None and not p.requires_grad:
                slots.setdefault(base_name(prefix + attr), []).append((module, attr, p, True))
        for attr, b in module._buffers.items():
            if b is not None:
                slots.setdefault(base_name(prefix + attr), []).append((module, attr, b, False))
    return slots


def _first(slots: dict[str, list[tuple]]) -> dict[str, object]:
    return {name: entries[0][2] for name, entries in slots.items()}


def _mismatch(ref: dict, other: dict, check_values: bool) -> str | None:
    missing, extra = sorted(set(ref) - set(other)), sorted(set(other) - set(ref))
    if missing or extra:
        return f"frozen tensors only in the first: {missing[:5]}; only in this one: {extra[:5]}"
    import torch

    for name, t in ref.items():
        o = other[name]
        if (t.shape, t.dtype, t.device) != (o.shape, o.dtype, o.device):
            return (f"{name}: {tuple(t.shape)} {t.dtype} on {t.device} vs "
                    f"{tuple(o.shape)} {o.dtype} on {o.device}")
        if check_values and t is not o and not torch.equal(t, o):
            return f"{name}: the values differ (not loaded from the same base folder?)"
    return None


def share_frozen_base(models: list, check_values: bool = True) -> SharedBase:
    """Tie the frozen base tensors of peft ``models`` (loaded from one base folder with one
    dtype) to the first model's, in place; returns what was shared. Raises ValueError (before
    changing anything) when a model is not a peft model or its frozen tensors differ from the
    first's in names, shapes, dtypes, devices or, with ``check_values``, values."""
    if len(models) < 2:
        return SharedBase(0, 0)
    for i, model in enumerate(models):
        if not is_lora_model(model):
            raise ValueError(f"model {i} ({type(model).__name__}) is not a peft (LoRA) model; "
                             "only LoRA models share a frozen base: its full weights train")
    first = _first(_frozen_slots(models[0]))
    if not first:
        raise ValueError("the first model has no frozen tensors to share")
    plans = []
    for i, model in enumerate(models[1:], start=1):
        slots = _frozen_slots(model)
        problem = _mismatch(first, _first(slots), check_values)
        if problem is not None:
            raise ValueError(f"model {i} cannot share the base of model 0: {problem}; only "
                             "models loaded from the same base folder with the same dtype can")
        plans.append(slots)
    tensors, dropped = 0, {}
    for slots in plans:
        for name, entries in slots.items():
            target = first[name]
            for module, attr, old, is_param in entries:
                if old is target:
                    continue
                if old.data_ptr() != target.data_ptr():
                    dropped[old.data_ptr()] = old.untyped_storage().nbytes()
                (module._parameters if is_param else module._buffers)[attr] = target
                tensors += 1
    for model in models:
        model.__dict__[SHARED_FLAG] = True
    return SharedBase(tensors, sum(dropped.values()))


def unique_storage_bytes(models: list) -> tuple[int, int]:
    """(distinct storages, their bytes) of every parameter and buffer of ``models``: what
    they hold in memory together."""
    seen: dict[int, int] = {}
    for model in models:
        for t in list(model.parameters()) + list(model.buffers()):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return len(seen), sum(seen.values())

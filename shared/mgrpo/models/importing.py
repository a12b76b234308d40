"""Bring your own model: make a local Hugging Face folder speak the agent protocol.

``import_model(src, out)`` loads the folder (its own tokenizer and chat template), checks each
protocol marker (``mgrpo.protocol_tokens``: ``<call>``, ``<|planner|>`` ...) and adds
as special tokens the ones that do not already encode to exactly one token, resizes the
embeddings to the new vocabulary, and writes a folder the run config can name under
``models.<m>.path``. Each new marker's row (input embedding, and output embedding when not
tied) starts at the mean of the rows of the sub-tokens its text encoded to before it was
added (``<call>`` starts near ``<``, ``call``, ``>``), so markers start distinct and close to
what their text meant to the model; a mean row for all of them (transformers'
``mean_resizing``) starts them at one point (cosine 1.0), where sampling at T = 1 swaps them.

Why: the episode runner and the parser find markers by text, and the trainer and the stop
logic are cleaner and cheaper when each is one token; a byte-level BPE splits ``<call>`` into
several pieces that also merge with their neighbours (``x<call>`` may not contain the pieces
of ``<call>`` alone). The chat template, the tokenizer's own special tokens and their ids are
kept (new tokens get new ids at the end). The new embedding rows are untrained: warm-start
with ``mgrpo sft`` before RL.
"""

from __future__ import annotations

from pathlib import Path

from mgrpo import protocol_tokens as P
from mgrpo.models import load_model
from mgrpo.models.permissions import make_readable


def protocol_markers(roles: tuple[str, ...] = P.BUILTIN_ROLES) -> list[str]:
    """Every marker the protocol needs for these agent roles (builtin + role tokens)."""
    markers = list(P.SPECIAL_TOKENS)
    markers += [P.ROLE_TOKEN.format(role=r) for r in roles if P.ROLE_TOKEN.format(role=r)
                not in markers]
    return markers


def marker_problems(tokenizer, markers: list[str]) -> dict[str, str]:
    """marker -> why it is not usable as is (empty when every marker is one clean token)."""
    problems = {}
    for marker in markers:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) != 1:
            problems[marker] = f"{len(ids)} tokens"
            continue
        in_context = tokenizer.encode(f"x{marker}y", add_special_tokens=False)
        if ids[0] not in in_context:
            problems[marker] = "merges with its neighbours"
        elif tokenizer.decode(ids) != marker:
            problems[marker] = f"decodes to {tokenizer.decode(ids)!r}"
    return problems


def init_from_pieces(model, tokenizer, pieces: dict[str, list[int]]) -> None:
    """Set each new token's embedding row (and output row, if untied) to the mean of the
    rows of ``pieces[token]``, the ids its text encoded to before it was added."""
    import torch

    tables = [model.get_input_embeddings().weight]
    output = model.get_output_embeddings()
    if output is not None and output.weight.data_ptr() != tables[0].data_ptr():
        tables.append(output.weight)
    with torch.no_grad():
        for token, ids in pieces.items():
            if ids:
                row = tokenizer.convert_tokens_to_ids(token)
                for table in tables:
                    table[row] = table[ids].mean(dim=0)


def import_model(src: str | Path, out: str | Path,
                 roles: tuple[str, ...] = P.BUILTIN_ROLES) -> dict:
    """Write ``src`` with the protocol markers as single tokens to ``out``; returns a report
    (markers added, vocabulary sizes, whether a chat template was kept)."""
    src, out = Path(src), Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; choose a new folder")
    model, tokenizer = load_model(src)
    had_pad = tokenizer.pad_token is not None and tokenizer.pad_token != tokenizer.eos_token
    markers = protocol_markers(tuple(roles))
    problems = marker_problems(tokenizer, markers)
    vocab_before = len(tokenizer)
    added = list(problems)
    pieces = {m: tokenizer.encode(m, add_special_tokens=False) for m in added}
    if added:
        tokenizer.add_tokens(added, special_tokens=True)
    if not had_pad:  # batched generation pads: a pad token that is not eos
        tokenizer.pad_token = P.PAD
    embeddings = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embeddings:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        model.config.vocab_size = model.get_input_embeddings().weight.shape[0]
    init_from_pieces(model, tokenizer, pieces)
    model.config.pad_token_id = tokenizer.pad_token_id
    left = marker_problems(tokenizer, markers)
    if left:
        raise ValueError(f"{src}: markers still not single tokens after adding them: {left}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    make_readable(out)
    return {"out": str(out), "added": added, "problems": problems,
            "vocab_before": vocab_before, "vocab_after": len(tokenizer),
            "embeddings": model.get_input_embeddings().weight.shape[0],
            "pad": tokenizer.pad_token, "eos": tokenizer.eos_token,
            "chat_template": bool(getattr(tokenizer, "chat_template", None))}

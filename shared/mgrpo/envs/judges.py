"""r_expert judges (paper Eq. 5): how well a sub-agent did the task it was given, in [0, 1].

Every judge answers ``judge(agent, task, result) -> float`` and, batched,
``verdicts(agent, [(task, result), ...]) -> [Verdict]``. A :class:`Verdict` says whether the
score is a real judgement (``ok``) or a 0 that stands for "could not judge": ``no_truth`` (the
rule judge has no ground truth for the task, e.g. user data without subtasks) or
``parse_failure`` (the LLM judge's reply was neither yes nor no). Trainers count both as
metrics (``{role}/expert_no_truth``, ``{role}/judge_parse_failures``), so r_expert is never
silently 0.

- :class:`RuleVerdicts` wraps ``RuleExpertJudge`` (ground truth from the benchmark).
- :class:`LLMExpertJudge`: any engine (``mgrpo.engines``: in-process torch, vLLM, a remote
  OpenAI-compatible server) asked a yes/no question from a prompt file, greedy, through the
  judge tokenizer's chat template when it has one; the judged text (task, result, the
  sub-agent's tool observations as evidence) is escaped and capped, so a sub-agent cannot
  close the quoted block or write the judge's reply.
- :class:`FunctionExpertJudge`: a user's function ``(role, task, result) -> float`` named by
  import path (``judges: {role: {kind: "pkg.mod:function"}}``); a call that raises or returns
  anything but a number in [0, 1] is 0 with the status ``error`` (``{role}/judge_errors``).
- :class:`ExpertJudges`: the run's judges, one per sub-agent role (run config ``judges:``),
  the rule judge for roles not listed.

A judge's ``kind`` is a name of :data:`JUDGES` (a :class:`~mgrpo.registry.Registry`:
``register_judge``, ``get_judge``, ``judge_names``; built in: ``rule`` and ``llm``; a
function registered with :func:`register_judge`) or an import path; :func:`build_judge`
builds one.

What this module does not do: load models or engines (``mgrpo.training.judging`` builds the
judges from the run config), or weight r_expert into R_S (``mgrpo.algo.rewards``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mgrpo.engines.base import GenerationRequest, SamplingParams
from mgrpo.envs.rewards import RuleExpertJudge, exact_match
from mgrpo.plugins import check_call, is_import_path, load_object
from mgrpo.registry import Registry

DEFAULT_EXPERT_PROMPT = Path(__file__).parent / "prompts" / "llm_expert_judge.txt"


@dataclass(frozen=True)
class Verdict:
    score: float
    status: Literal["ok", "no_truth", "parse_failure", "error"] = "ok"


def parse_yes_no(text: str) -> float | None:
    """1.0 for a reply whose first word is yes, 0.0 for no, None for anything else."""
    words = text.strip().lower().split()
    first = words[0].strip(".,:;!\"'") if words else ""
    return {"yes": 1.0, "no": 0.0}.get(first)


class RuleVerdicts:
    """:class:`RuleExpertJudge` with verdicts: a task without ground truth is ``no_truth``."""

    def __init__(self, rule: RuleExpertJudge):
        self.rule = rule

    def truth(self, agent: str, task: str) -> str | None:
        return self.rule.truth(agent, task)

    def judge(self, agent: str, task: str, result: str | None) -> float:
        return self.rule.judge(agent, task, result)

    def verdicts(self, agent: str, items: list[tuple[str, str | None]]) -> list[Verdict]:
        out = []
        for task, result in items:
            truth = self.rule.truth(agent, task or "")
            out.append(Verdict(0.0, "no_truth") if truth is None
                       else Verdict(exact_match(result, truth)))
        return out


def quote(text: str | None, cap: int) -> str:
    """``text`` as data inside a prompt: at most ``cap`` characters (the cut said), and
    ``& < >`` escaped so it cannot close a ``<tag>`` block of the prompt."""
    text = text or ""
    if len(text) > cap:
        text = f"{text[:cap]} [... {len(text) - cap} more characters cut]"
    return html.escape(text, quote=False)


class LLMExpertJudge:
    """Ask ``engine`` whether ``result`` completes ``task``; yes -> 1.0, no -> 0.0, any other
    reply -> 0.0 counted as a parse failure (``parse_failures``, and the verdict's status).

    ``prompt_path``: a text file with the placeholders ``{task}`` and ``{result}`` (and
    optionally ``{role}`` and ``{evidence}``: the sub-agent's tool observations). ``tokenizer``
    (``encode(text, add_special_tokens=False)``) defaults to ``engine.tokenizer``; when it has
    a chat template the prompt is its user message (``apply_chat_template``, generation prompt
    added), as an instruction-tuned judge expects. Task, result and evidence are quoted
    (:func:`quote`): escaped, the result capped at ``max_result_chars``, each observation at
    ``max_result_chars // 2`` and all of them at ``max_result_chars``. Greedy, at most
    ``max_new_tokens`` tokens.
    """

    def __init__(self, engine: Any, prompt_path: str | Path = DEFAULT_EXPERT_PROMPT,
                 tokenizer: Any = None, max_new_tokens: int = 4, max_result_chars: int = 2000):
        self.engine = engine
        self.template = Path(prompt_path).read_text(encoding="utf-8")
        for field in ("{task}", "{result}"):
            if field not in self.template:
                raise ValueError(f"expert judge prompt {str(prompt_path)!r} lacks the "
                                 f"placeholder {field}; it needs {{task}} and {{result}} "
                                 "(and may use {role})")
        self.tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError("LLMExpertJudge needs a tokenizer: pass tokenizer=... or use an "
                             "engine with a .tokenizer attribute")
        self.max_new_tokens = max_new_tokens
        self.max_result_chars = max_result_chars
        self.parse_failures = 0

    def prompt(self, agent: str, task: str, result: str | None,
               evidence: list[str] | None = None) -> str:
        cap = self.max_result_chars
        shown = "\n".join(f"- {quote(obs, cap // 2)}" for obs in evidence or []) or "(none)"
        if len(shown) > cap:
            shown = f"{shown[:cap]} [... {len(shown) - cap} more characters cut]"
        return self.template.format(role=agent, task=quote(task, cap), result=quote(result, cap),
                                    evidence=shown)

    def prompt_ids(self, text: str) -> list[int]:
        """The judge model's input: ``text`` as the user turn of its chat template (with the
        generation prompt) when the tokenizer has one, else the plain text."""
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys")
                        else ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def judge(self, agent: str, task: str, result: str | None) -> float:
        return self.verdicts(agent, [(task, result)])[0].score

    def verdicts(self, agent: str, items: list[tuple[str, str | None]],
                 evidence: list[list[str]] | None = None) -> list[Verdict]:
        """``evidence``: per item, the sub-agent's tool observations (None: none shown)."""
        if not items:
            return []
        params = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens)
        evidence = evidence or [[] for _ in items]
        requests = [GenerationRequest(self.prompt_ids(self.prompt(agent, task, result, seen)),
                                      params)
                    for (task, result), seen in zip(items, evidence, strict=True)]
        out = []
        for completion in self.engine.generate(requests):
            score = parse_yes_no(completion.text)
            if score is None:
                self.parse_failures += 1
                out.append(Verdict(0.0, "parse_failure"))
            else:
                out.append(Verdict(score))
        return out




class FunctionExpertJudge:
    """A function ``(role, task, result) -> float`` in [0, 1] as an r_expert judge."""

    def __init__(self, fn: Any, name: str = ""):
        self.fn, self.name = fn, name or getattr(fn, "__name__", "judge")
        self.errors = 0

    def judge(self, agent: str, task: str, result: str | None) -> float:
        return self.verdicts(agent, [(task, result)])[0].score

    def verdicts(self, agent: str, items: list[tuple[str, str | None]]) -> list[Verdict]:
        out = []
        for task, result in items:
            try:
                value = float(self.fn(agent, task or "", result or ""))
            except Exception:  # noqa: BLE001 (a user's judge: a bug scores 0, counted)
                value = float("nan")
            if value != value or not 0.0 <= value <= 1.0:
                self.errors += 1
                out.append(Verdict(0.0, "error"))
            else:
                out.append(Verdict(value))
        return out


class ExpertJudges:
    """One judge per sub-agent role; roles without one use ``default`` (the rule judge).
    ``truth`` is always the rule judge's (AT-GRPO's r_team needs ground truth)."""

    def __init__(self, default: RuleVerdicts, by_role: dict[str, Any] | None = None):
        self.default, self.by_role = default, dict(by_role or {})
        # model name -> engine loaded for a judge in this process (not shared with sampling)
        self.own_engines: dict[str, Any] = {}

    def for_role(self, agent: str) -> Any:
        return self.by_role.get(agent, self.default)

    def truth(self, agent: str, task: str) -> str | None:
        return self.default.truth(agent, task)

    def judge(self, agent: str, task: str, result: str | None) -> float:
        return self.for_role(agent).judge(agent, task, result)

    def verdicts(self, agent: str, items: list[tuple[str, str | None]],
                 evidence: list[list[str]] | None = None) -> list[Verdict]:
        """``evidence`` (tool observations per item) reaches the judges that show it."""
        judge = self.for_role(agent)
        if evidence is not None and isinstance(judge, LLMExpertJudge):
            return judge.verdicts(agent, items, evidence=evidence)
        return judge.verdicts(agent, items)


# kind -> a judge class (built with the run's context: ``llm`` takes an engine, ``rule`` the
# benchmark's rule judge) or a function (role, task, result) -> float
JUDGES: Registry[Any] = Registry(
    "judge", hint="a judge of your own: register_judge in a module named under `plugins:`, "
                  "or the kind 'pkg.mod:function'")
JUDGES.register("rule", RuleVerdicts)
JUDGES.register("llm", LLMExpertJudge)
get_judge = JUDGES.get
judge_names = JUDGES.names


def register_judge(name: str, fn: Any = None):  # type: ignore[no-untyped-def]
    """``judges: {role: {kind: NAME}}`` uses the function ``fn`` ``(role, task, result) ->
    float`` (a plug-in module registers it on import); without ``fn``, a decorator that
    does."""

    def put(f: Any) -> Any:
        check_call(f, f"register_judge({name!r})", getattr(f, "__name__", name), args=3)
        return JUDGES.register(name, f)

    return put if fn is None else put(fn)


def check_judge_kind(kind: str, key: str) -> None:
    """Refuse a judge ``kind`` that is neither a registered name nor a usable import path."""
    if kind in JUDGES:
        return
    if not is_import_path(kind):
        raise ValueError(f"{key}: {kind!r}: use one of {', '.join(judge_names())} or "
                         "'pkg.mod:function'")
    check_call(load_object(kind, key), key, kind, args=3)


def build_judge(kind: str, **context: Any) -> Any:
    """The judge ``kind`` names: a registered class built with ``context`` (``llm``:
    ``engine``, ``prompt_path=``, ``tokenizer=``, ...; ``rule``: the rule judge), a registered
    function or an import path's as a :class:`FunctionExpertJudge`."""
    check_judge_kind(kind, "judge")
    if kind not in JUDGES:
        return FunctionExpertJudge(load_object(kind, "judge"), kind)
    entry = get_judge(kind)
    return entry(**context) if isinstance(entry, type) else FunctionExpertJudge(entry, kind)

"""The benchmark: a knowledge graph, its corpus, and train/dev/test questions.

``build_benchmark(BenchmarkConfig(seed=0))`` is deterministic: the same config gives
byte-identical files from :meth:`Benchmark.save`. Layout of a saved benchmark::

    DIR/benchmark.json          config and counts
    DIR/kg.json                 entities (absent for a user benchmark)
    DIR/corpus.jsonl            documents {id, title, text}
    DIR/questions/{split}.jsonl one Question per line

Users bring their own data with :func:`load_questions` (JSONL with at least ``question`` and
``answer``) and :meth:`Corpus.from_folder`, then ``Benchmark(questions, corpus)``.

What this module does not do: retrieval, rewards, or policies.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from pydantic import Field, model_validator

from mgrpo.atomic import write_text_atomic
from mgrpo.envs.corpus import Corpus, render_corpus
from mgrpo.envs.kg import SPLITS, KnowledgeGraph, build_kg
from mgrpo.envs.questions import Question, generate_split
from mgrpo.validation import StrictModel

FORMAT_VERSION = 1


def _default_entities() -> dict[str, dict[str, int]]:
    return {"train": {"city": 110, "person": 160, "company": 80},
            "dev": {"city": 20, "person": 30, "company": 15},
            "test": {"city": 25, "person": 35, "company": 18}}


class BenchmarkConfig(StrictModel):
    """How big the benchmark is. Defaults: about 3,500 questions and 700 documents, < 5 s."""


    seed: int = 0
    n_train: int = Field(3000, ge=1, description="train questions")
    n_dev: int = Field(200, ge=1, description="dev questions (model selection)")
    n_test: int = Field(300, ge=1, description="test questions (held out; disjoint entities)")
    stage1_fraction: float = Field(
        0.35, ge=0.0, le=1.0, description="share of one-hop look-ups per split; the rest are "
        "stage-2 chains, comparisons and arithmetic in equal parts")
    distractor_rate: float = Field(
        0.4, ge=0.0, le=1.0, description="probability that an entity gets a one-letter "
        "look-alike document; more makes search harder and the corpus larger")
    entities: dict[str, dict[str, int]] = Field(
        default_factory=_default_entities,
        description="real entities per split and type (city, person, company)")

    @model_validator(mode="after")
    def _splits_present(self) -> BenchmarkConfig:
        missing = [s for s in SPLITS if s not in self.entities]
        if missing:
            raise ValueError(f"entities has splits {sorted(self.entities)}; it needs all of "
                             f"{list(SPLITS)} (missing {missing})")
        return self

    def n_questions(self, split: str) -> int:
        return {"train": self.n_train, "dev": self.n_dev, "test": self.n_test}[split]


class Benchmark:
    """Questions by split, the corpus, and (for the built-in benchmark) the knowledge graph."""

    def __init__(self, questions: list[Question], corpus: Corpus,
                 kg: KnowledgeGraph | None = None, config: BenchmarkConfig | None = None):
        self.all_questions = questions
        self.corpus = corpus
        self.kg = kg
        self.config = config

    def questions(self, split: str, stage: int | None = None) -> list[Question]:
        """Questions of ``split`` (train/dev/test), optionally of one ``stage`` (1 or 2)."""
        splits = sorted({q.split for q in self.all_questions})
        if split not in splits:
            raise ValueError(f"unknown split {split!r}; this benchmark has {splits}")
        return [q for q in self.all_questions
                if q.split == split and (stage is None or q.stage == stage)]

    def counts(self) -> dict[str, int]:
        """``{"split/stage/kind": n}`` for every combination present (``mgrpo data show``)."""
        out: dict[str, int] = {}
        for q in self.all_questions:
            key = f"{q.split}/{q.stage}/{q.kind}"
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    def save(self, folder: str | Path) -> Path:
        root = Path(folder)
        (root / "questions").mkdir(parents=True, exist_ok=True)
        meta = {"format_version": FORMAT_VERSION, "counts": self.counts(),
                "config": self.config.model_dump() if self.config else None,
                "n_docs": len(self.corpus)}
        _write_json(root / "benchmark.json", meta)
        if self.kg is not None:
            _write_json(root / "kg.json", self.kg.to_json())
        self.corpus.save_jsonl(root / "corpus.jsonl")
        for split in sorted({q.split for q in self.all_questions}):
            lines = [json.dumps(q.model_dump(), sort_keys=True, ensure_ascii=False)
                     for q in self.questions(split)]
            write_text_atomic(root / "questions" / f"{split}.jsonl",
                              "".join(line + "\n" for line in lines))
        return root


def _write_json(path: Path, obj: object) -> None:
    write_text_atomic(path, json.dumps(obj, sort_keys=True, ensure_ascii=False, indent=1) + "\n")


def build_benchmark(config: BenchmarkConfig | None = None) -> Benchmark:
    """Generate the knowledge graph, corpus and questions from ``config.seed``."""
    config = config or BenchmarkConfig()
    rng = random.Random(config.seed)
    kg = build_kg(config.entities, config.distractor_rate, rng)
    questions: list[Question] = []
    for split in SPLITS:
        questions += generate_split(kg, split, config.n_questions(split),
                                    config.stage1_fraction, rng)
    return Benchmark(questions, render_corpus(kg), kg, config)


def load_questions(path: str | Path, split: str | None = None) -> list[Question]:
    """Read a JSONL of questions. Each line needs ``question`` and ``answer``; ``id`` defaults
    to ``{split}-{line}``, ``split`` to the argument (or ``train``), ``stage`` to 1, ``kind``
    to ``lookup``, ``subtasks`` to none (then r_expert needs an LLM judge)."""
    path = Path(path)
    split_name = split or "train"
    questions = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{i + 1} is not JSON ({exc.msg}); "
                             "write one object per line") from None
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise ValueError(f"{path}:{i + 1} needs an object with 'question' and 'answer'")
        row = {"id": f"{split_name}-{i:05d}", "split": split_name, **row}
        if split is not None:
            row["split"] = split
        row["answer"] = str(row["answer"])
        questions.append(Question(**row))
    return questions


def load_benchmark(folder: str | Path) -> Benchmark:
    """Read a folder written by :meth:`Benchmark.save` (``kg.json`` optional)."""
    root = Path(folder)
    if not (root / "corpus.jsonl").is_file() or not (root / "questions").is_dir():
        raise FileNotFoundError(f"{str(root)!r} is not a benchmark folder (needs corpus.jsonl and "
                                "questions/); build one with `mgrpo data build --out DIR`")
    questions: list[Question] = []
    order = {s: i for i, s in enumerate(SPLITS)}  # train, dev, test first, as built
    for path in sorted((root / "questions").glob("*.jsonl"),
                       key=lambda p: (order.get(p.stem, len(order)), p.stem)):
        questions += load_questions(path, split=path.stem)
    kg = None
    if (root / "kg.json").is_file():
        kg = KnowledgeGraph.from_json(json.loads((root / "kg.json").read_text(encoding="utf-8")))
    config = None
    if (root / "benchmark.json").is_file():
        meta = json.loads((root / "benchmark.json").read_text(encoding="utf-8"))
        config = BenchmarkConfig(**meta["config"]) if meta.get("config") else None
    return Benchmark(questions, Corpus.load_jsonl(root / "corpus.jsonl"), kg, config)

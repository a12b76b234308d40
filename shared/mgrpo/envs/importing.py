"""Your data as a benchmark folder: questions (JSONL or parquet) and documents.

:func:`read_question_rows` reads the rows; :func:`import_benchmark` checks every row, gives
rows without a ``split`` a seeded one, reads the documents, and returns a
:class:`~mgrpo.envs.benchmark.Benchmark` that :func:`write_benchmark_atomic` writes to a
folder every command takes (``bench_dir``, ``--bench``).

A question row: ``question`` (text) and ``answer`` (text or number), optionally ``id``
(default ``q{line}``), ``split`` (train, dev or test), ``stage`` (1 or 2, default 1),
``kind`` and ``subtasks`` (a list of ``{agent, task, answer}``: ground truth for the rule
r_expert judge). Other columns are ignored and listed. Documents: a folder of text files
(``Corpus.from_folder``) or a JSONL of ``{id, title, text}``; none is allowed (a task whose
tools bring their own data).

Every bad row is reported with its line (JSONL) or row (parquet) number, all at once, and
nothing is written: the folder appears complete or not at all.

What this module does not do: generate questions (``mgrpo.envs.benchmark``) or check that a
question can be answered from the documents (``mgrpo data demos`` measures that for the
built-in experts).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mgrpo.envs.benchmark import Benchmark
from mgrpo.envs.corpus import Corpus, Doc
from mgrpo.envs.questions import Question, Subtask

SPLITS = ("train", "dev", "test")
QUESTION_KEYS = ("id", "question", "answer", "split", "stage", "kind", "subtasks")
MAX_REPORTED = 20


class DataImportError(ValueError):
    """Rows that cannot be imported: ``problems`` holds one line per bad row."""

    def __init__(self, source: str, problems: list[str]):
        self.problems = problems
        self.summary = f"{source}: {len(problems)} bad row(s), nothing written"
        shown = problems[:MAX_REPORTED]
        more = len(problems) - len(shown)
        self.lines = [f"{source}: {p}" for p in shown] + ([f"... and {more} more"] if more
                                                          else [])
        super().__init__(self.summary + ": " + "; ".join(shown) + (f"; ... and {more} more"
                                                                   if more else ""))


def read_question_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) for each non-empty row: ``line N`` of a JSONL, ``row N`` of a parquet
    file (1-based). A JSONL line that is not JSON yields its decode error as the row."""
    if path.suffix == ".parquet":
        yield from _parquet_rows(path)
        return
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"line {number}", json.loads(line)
            except json.JSONDecodeError as exc:
                yield f"line {number}", exc


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    except ImportError:
        try:
            import pandas as pd
        except ImportError:
            raise ValueError(f"{path}: reading parquet needs pyarrow or pandas, and neither "
                             "is installed; `pip install pyarrow`, or convert the file to "
                             "JSONL (one object per line)") from None
        rows = pd.read_parquet(path).to_dict(orient="records")
    for number, row in enumerate(rows, start=1):
        yield f"row {number}", row


def _text(value: Any) -> str | None:
    """A cell as text: strings, numbers (not bools: True as an answer is the text 'true')."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float) and value == value:
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    return value if isinstance(value, str) else None


def _question(where: str, row: Any, ignored: set[str]) -> tuple[dict | None, list[str]]:
    """The row as Question fields (``split`` may be None), or its problems."""
    if isinstance(row, Exception):
        return None, [f"{where}: not JSON ({getattr(row, 'msg', row)})"]
    if not isinstance(row, dict):
        return None, [f"{where}: expected an object with question and answer, got "
                      f"{type(row).__name__}"]
    row = {k: None if isinstance(v, float) and v != v else v for k, v in row.items()}  # NaN
    problems = []
    question, answer = _text(row.get("question")), _text(row.get("answer"))
    if not question or not question.strip():
        problems.append(f"{where}: 'question' is missing or empty")
    if answer is None or not answer.strip():
        problems.append(f"{where}: 'answer' is missing or empty")
    split = row.get("split")
    if split is not None and split not in SPLITS:
        problems.append(f"{where}: split {split!r} is not one of {list(SPLITS)}")
    stage = row.get("stage", 1)
    if stage is None:
        stage = 1
    if stage not in (1, 2) or isinstance(stage, bool):
        problems.append(f"{where}: stage {stage!r} is not 1 or 2")
    ident = row.get("id")
    if ident is not None and _text(ident) in (None, ""):
        problems.append(f"{where}: id {ident!r} is not text or a number")
    subtasks = []
    for i, st in enumerate(row.get("subtasks") or []):
        fields = {k: _text(st.get(k)) for k in ("agent", "task", "answer")} \
            if isinstance(st, dict) else {}
        if not fields or not all(fields.values()):
            problems.append(f"{where}: subtasks[{i}] needs agent, task and answer (text)")
        else:
            subtasks.append(Subtask(**fields, doc_id=st.get("doc_id")))
    ignored.update(k for k in row if k not in QUESTION_KEYS)
    if problems:
        return None, problems
    return {"id": _text(ident) if ident is not None else None, "question": question.strip(),
            "answer": answer.strip(), "split": split, "stage": int(stage),
            "kind": _text(row.get("kind")) or "qa", "subtasks": subtasks}, []


def _assign_splits(rows: list[dict], seed: int, dev: float, test: float) -> None:
    """Rows without a split: a seeded shuffle, then the first ``test`` share to test, the
    next ``dev`` share to dev, the rest to train (at least one each when rows allow)."""
    free = [r for r in rows if r["split"] is None]
    random.Random(seed).shuffle(free)
    n = len(free)
    n_test = max(1, round(n * test)) if test > 0 and n >= 3 else 0
    n_dev = max(1, round(n * dev)) if dev > 0 and n >= 3 else 0
    for i, row in enumerate(free):
        row["split"] = "test" if i < n_test else "dev" if i < n_test + n_dev else "train"


def read_corpus(docs: Path | None = None, corpus: Path | None = None) -> Corpus:
    """Documents from a folder of text files or a JSONL of ``{id, title, text}`` (bad lines
    reported with their numbers); neither: an empty corpus."""
    if docs is not None and corpus is not None:
        raise ValueError("give either --docs (a folder of text files) or --corpus (a JSONL), "
                         "not both")
    if docs is not None:
        return Corpus.from_folder(docs)
    if corpus is None:
        return Corpus(docs=[])
    out, problems, seen = [], [], {}
    for where, row in read_question_rows(corpus):
        if isinstance(row, Exception):
            problems.append(f"{where}: not JSON ({getattr(row, 'msg', row)})")
            continue
        fields = {k: _text(row.get(k)) for k in ("id", "title", "text")} \
            if isinstance(row, dict) else {}
        if not fields or not fields["id"] or not fields["text"]:
            problems.append(f"{where}: a document needs id and text (title optional)")
            continue
        if fields["id"] in seen:
            problems.append(f"{where}: id {fields['id']!r} repeats {seen[fields['id']]}")
            continue
        seen[fields["id"]] = where
        out.append(Doc(id=fields["id"], title=fields["title"] or fields["text"][:80],
                       text=fields["text"]))
    if problems:
        raise DataImportError(str(corpus), problems)
    return Corpus(docs=out)


def import_benchmark(questions: Path, docs: Path | None = None, corpus: Path | None = None,
                     seed: int = 0, dev: float = 0.1, test: float = 0.1
                     ) -> tuple[Benchmark, list[str]]:
    """(benchmark, ignored column names) from the user's files; raises
    :class:`DataImportError` listing every bad row."""
    if not questions.is_file():
        raise FileNotFoundError(f"questions file {str(questions)!r} does not exist")
    if not (0 <= dev < 1 and 0 <= test < 1 and dev + test < 1):
        raise ValueError(f"dev={dev}, test={test}: shares of the questions without a split; "
                         "each in [0, 1) and together below 1")
    rows, problems, ignored, seen = [], [], set(), {}
    for where, raw in read_question_rows(questions):
        row, bad = _question(where, raw, ignored)
        problems += bad
        if row is None:
            continue
        row["id"] = row["id"] or f"q{where.split()[-1]}"
        if row["id"] in seen:
            problems.append(f"{where}: id {row['id']!r} repeats {seen[row['id']]}")
            continue
        seen[row["id"]] = where
        rows.append(row)
    if problems:
        raise DataImportError(str(questions), problems)
    if not rows:
        raise DataImportError(str(questions), ["no questions (the file is empty)"])
    _assign_splits(rows, seed, dev, test)
    bench = Benchmark([Question(**row) for row in rows], read_corpus(docs, corpus))
    return bench, sorted(ignored)


def write_benchmark_atomic(bench: Benchmark, out: Path) -> Path:
    """Write ``bench`` to ``out`` (which must not exist, or be empty) all at once: into a
    temporary folder beside it, then renamed."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{str(out)!r} already exists and is not empty; choose a new "
                              "folder (nothing was written)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        bench.save(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out

"""``mgrpo data import``: a user's JSONL of questions and documents become a benchmark folder
that load_benchmark (every command) reads; seeded splits for rows without one; every bad row
reported with its line number and nothing written; parquet needs pyarrow or pandas."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mgrpo.envs import load_benchmark
from mgrpo.envs.importing import DataImportError, import_benchmark, write_benchmark_atomic


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_questions_and_a_corpus_jsonl_become_a_benchmark_folder(tmp_path):
    questions = _jsonl(tmp_path / "q.jsonl", [
        {"id": "a", "question": "Capital of Kelvar?", "answer": "Ostra", "split": "train",
         "subtasks": [{"agent": "searcher", "task": "capital of Kelvar", "answer": "Ostra"}]},
        {"id": 7, "question": "Year Ostra was founded?", "answer": 1203, "split": "test",
         "stage": 2, "source": "wiki"},
    ])
    corpus = _jsonl(tmp_path / "docs.jsonl", [{"id": "d1", "title": "Kelvar",
                                               "text": "Kelvar's capital is Ostra."}])
    bench, ignored = import_benchmark(questions, corpus=corpus)
    out = write_benchmark_atomic(bench, tmp_path / "bench")
    loaded = load_benchmark(out)
    assert [q.id for q in loaded.questions("train")] == ["a"]
    test_q = loaded.questions("test")[0]
    assert (test_q.id, test_q.answer, test_q.stage) == ("7", "1203", 2)
    assert loaded.questions("train")[0].subtasks[0].answer == "Ostra"
    assert loaded.corpus.get("d1").text == "Kelvar's capital is Ostra."
    assert ignored == ["source"]


def test_rows_without_a_split_get_a_seeded_split(tmp_path):
    questions = _jsonl(tmp_path / "q.jsonl", [{"question": f"q{i}?", "answer": str(i)}
                                              for i in range(20)])
    splits = [{q.id: q.split for q in import_benchmark(questions, seed=s)[0].all_questions}
              for s in (3, 3, 4)]
    assert splits[0] == splits[1] != splits[2]
    counts = {s: list(splits[0].values()).count(s) for s in ("train", "dev", "test")}
    assert counts == {"train": 16, "dev": 2, "test": 2}


def test_every_bad_row_is_reported_with_its_line_and_nothing_is_written(tmp_path):
    questions = _jsonl(tmp_path / "q.jsonl", [
        {"question": "ok?", "answer": "yes"},
        "",
        {"question": "", "answer": "x"},
        "{not json",
        {"question": "q", "answer": "a", "split": "validation"},
        {"question": "q", "subtasks": [{"agent": "searcher"}]},
        {"id": "d", "question": "q", "answer": "a"},
        {"id": "d", "question": "q2", "answer": "a"},
    ])
    with pytest.raises(DataImportError) as info:
        import_benchmark(questions)
    assert info.value.problems == [
        "line 3: 'question' is missing or empty",
        "line 4: not JSON (Expecting property name enclosed in double quotes)",
        "line 5: split 'validation' is not one of ['train', 'dev', 'test']",
        "line 6: 'answer' is missing or empty",
        "line 6: subtasks[0] needs agent, task and answer (text)",
        "line 8: id 'd' repeats line 7",
    ]


def test_the_cli_writes_nothing_on_error_and_refuses_a_full_folder(tmp_path):
    env = {**os.environ, "MGRPO_DEBUG": ""}

    def mgrpo(*argv):
        return subprocess.run([sys.executable, "-m", "mgrpo.cli.main", "data", "import", *argv],
                              env=env, capture_output=True, text=True, timeout=120)

    bad = _jsonl(tmp_path / "bad.jsonl", [{"question": "q"}])
    done = mgrpo("--questions", str(bad), "--out", str(tmp_path / "b"))
    assert done.returncode == 1 and not (tmp_path / "b").exists()
    assert done.stderr.splitlines()[:2] == [
        f"{bad}: line 1: 'answer' is missing or empty",
        f"error: {bad}: 1 bad row(s), nothing written"]
    assert [p.name for p in tmp_path.iterdir()] == ["bad.jsonl"]  # no temporary folder left
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "kelvar.txt").write_text("Kelvar\nKelvar's capital is Ostra.\n")
    good = _jsonl(tmp_path / "good.jsonl", [{"question": f"q{i}", "answer": "a"}
                                            for i in range(10)])
    done = mgrpo("--questions", str(good), "--docs", str(docs), "--out", str(tmp_path / "b"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote 10 questions (dev 1, test 1, train 8) and 1 documents")
    assert load_benchmark(tmp_path / "b").corpus.docs[0].id == "kelvar.txt"
    done = mgrpo("--questions", str(good), "--out", str(tmp_path / "b"))
    assert done.returncode == 1 and "already exists and is not empty" in done.stderr


def test_parquet_without_pyarrow_or_pandas_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setitem(sys.modules, "pandas", None)
    path = tmp_path / "q.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="reading parquet needs pyarrow or pandas"):
        import_benchmark(path)

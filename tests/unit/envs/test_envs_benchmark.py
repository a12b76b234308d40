"""The generator: determinism, split disjointness, question shapes, save/load, user data."""

from __future__ import annotations

import filecmp
import json
import time

import pytest
from benchmark_sizes import small_bench_config

from mgrpo.envs import (
    BenchmarkConfig,
    Corpus,
    build_benchmark,
    load_benchmark,
    load_questions,
)
from mgrpo.envs.arith import evaluate_arithmetic
from mgrpo.envs.corpus import parse_document


def _files(root):
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def test_same_seed_gives_byte_identical_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    build_benchmark(BenchmarkConfig(seed=7)).save(a)
    build_benchmark(BenchmarkConfig(seed=7)).save(b)
    assert _files(a) == _files(b)
    assert len(_files(a)) == 6  # benchmark.json kg.json corpus.jsonl + 3 splits
    for rel in _files(a):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_different_seed_gives_different_questions(tmp_path):
    build_benchmark(small_bench_config(1)).save(tmp_path / "a")
    build_benchmark(small_bench_config(2)).save(tmp_path / "b")
    assert not filecmp.cmp(tmp_path / "a/questions/test.jsonl",
                           tmp_path / "b/questions/test.jsonl", shallow=False)


def test_default_sizes_and_build_time():
    start = time.perf_counter()
    bench = build_benchmark(BenchmarkConfig(seed=0))
    elapsed = time.perf_counter() - start
    assert len(bench.questions("train")) == 3000
    assert len(bench.questions("dev")) == 200
    assert len(bench.questions("test")) == 300
    assert len(bench.questions("train", stage=1)) == 1050
    assert 300 <= len(bench.corpus) <= 800
    assert elapsed < 30  # spec: < 5 s on this machine; loose bound, not a timing test


def _entities_of(bench, split):
    names = set()
    for q in bench.questions(split):
        for st in q.subtasks:
            if st.agent == "searcher":
                names.add(st.task.partition(" of ")[2])
                names.add(st.answer)
    return {n for n in names if bench.kg.get(n) is not None}


def test_test_entities_disjoint_from_train():
    bench = build_benchmark(BenchmarkConfig(seed=3))
    train, test, dev = (_entities_of(bench, s) for s in ("train", "test", "dev"))
    assert len(train) > 100 and len(test) > 30
    assert not train & test and not train & dev and not dev & test
    assert all(bench.kg.get(n).split == "test" for n in test)


def test_question_shapes(small_bench):
    kinds = {q.kind for q in small_bench.questions("train")}
    assert kinds == {"lookup", "chain", "compare", "arith"}
    for q in small_bench.all_questions:
        assert q.subtasks and q.subtasks[-1].answer
        if q.stage == 1:
            assert q.kind == "lookup" and len(q.subtasks) == 1
        if q.kind == "chain":
            assert 2 <= len(q.subtasks) <= 3 and q.answer == q.subtasks[-1].answer
        if q.kind == "compare":
            assert q.options and q.answer in q.options
            assert q.answer == q.options[0 if q.subtasks[-1].answer == "True" else 1]
        if q.kind == "arith":
            assert q.answer == evaluate_arithmetic(q.subtasks[-1].task)
            assert int(q.answer) > 0


def test_subtask_ground_truth_is_in_its_document(small_bench):
    for q in small_bench.all_questions:
        for st in q.subtasks:
            if st.agent != "searcher":
                continue
            attr, _, entity = st.task.partition(" of ")
            title, facts = parse_document(small_bench.corpus.get(st.doc_id).text)
            assert title == entity and facts[attr] == st.answer


def test_corpus_has_one_letter_look_alikes(small_bench):
    real = [e for e in small_bench.kg.entities if not e.distractor]
    twins = [e for e in small_bench.kg.entities if e.distractor]
    assert len(twins) >= 0.2 * len(real)
    names = {e.name for e in real}
    for twin in twins:
        close = [n for n in names if len(n) == len(twin.name)
                 and sum(a != b for a, b in zip(n, twin.name, strict=True)) == 1]
        assert close, twin.name


def test_save_load_round_trip(tmp_path, small_bench):
    small_bench.save(tmp_path)
    loaded = load_benchmark(tmp_path)
    assert [q.model_dump() for q in loaded.all_questions] == \
        [q.model_dump() for q in small_bench.all_questions]
    assert loaded.corpus.docs == small_bench.corpus.docs
    assert loaded.kg.fact("x", "population") is None
    assert loaded.config == small_bench.config
    with pytest.raises(ValueError, match="unknown split 'val'"):
        loaded.questions("val")


def test_bad_config_says_value_and_fix():
    with pytest.raises(ValueError, match="missing"):
        BenchmarkConfig(entities={"train": {"city": 5}})
    with pytest.raises(ValueError, match="at least 2"):
        build_benchmark(BenchmarkConfig(entities={s: {"city": 1, "person": 3, "company": 3}
                                                  for s in ("train", "dev", "test")}))


def test_user_questions_and_corpus(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "Who?", "answer": 42}) + "\n\n"
                    + json.dumps({"id": "x", "question": "What?", "answer": "b"}) + "\n")
    qs = load_questions(path, split="dev")
    assert [(q.id, q.answer, q.split, q.stage) for q in qs] == \
        [("dev-00000", "42", "dev", 1), ("x", "b", "dev", 1)]
    (tmp_path / "bad.jsonl").write_text('{"question": "no answer"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1 needs"):
        load_questions(tmp_path / "bad.jsonl")
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text("Alpha\n\nfirst   doc\n")
    (docs / "sub" / "b.md").write_text("Beta doc")
    (docs / "empty.txt").write_text("  \n")
    corpus = Corpus.from_folder(docs)
    assert [(d.id, d.title, d.text) for d in corpus.docs] == \
        [("a.txt", "Alpha", "Alpha first doc"), ("sub/b.md", "Beta doc", "Beta doc")]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Corpus.from_folder(tmp_path / "nope")


def test_saving_over_a_benchmark_never_exposes_a_half_written_file(tmp_path, monkeypatch):
    """`mgrpo ablate` saves the benchmark again while runs started earlier may be loading it:
    every file is replaced whole. A save that fails part-way leaves the old files intact and
    no temporary files behind (before: `write_text` truncated the old file first)."""
    import os
    import stat

    from mgrpo.atomic import write_text_atomic

    bench = build_benchmark(small_bench_config(seed=3))
    root = bench.save(tmp_path / "b")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert stat.S_IMODE(os.stat(root / "corpus.jsonl").st_mode) == 0o644
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(root / "corpus.jsonl", "half a line\n\ud800 cannot be encoded")
    bad = bench.corpus.docs[0].model_copy(update={"text": "\ud800"})
    monkeypatch.setattr(bench.corpus, "docs", [bad, *bench.corpus.docs[1:]])
    with pytest.raises(UnicodeEncodeError):
        bench.save(root)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    load_benchmark(root)  # still loads

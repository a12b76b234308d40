"""Tool registry, BM25 search, and the python tool over a real and a scripted executor."""

from __future__ import annotations

import pytest

from mgrpo.envs import BenchmarkConfig, Corpus, Doc, build_benchmark
from mgrpo.sandbox.types import ExecResult
from mgrpo.tools import ROLE_TOOLS, build_tool, register_tool, tool_names
from mgrpo.tools.python import PythonTool
from mgrpo.tools.search import NO_RESULTS, SearchTool

SMALL = {s: {"city": 6, "person": 8, "company": 4} for s in ("train", "dev", "test")}


@pytest.fixture(scope="module")
def bench():
    return build_benchmark(BenchmarkConfig(seed=0, n_train=40, n_dev=20, n_test=20,
                                           entities=SMALL, distractor_rate=1.0))


def test_registry_builds_by_name_and_lists_unknown():
    assert {"search", "python"} <= set(tool_names())
    assert ROLE_TOOLS == {"searcher": "search", "coder": "python"}
    with pytest.raises(ValueError, match=r"unknown tool 'web'; valid: .*python, search"):
        build_tool("web")

    @register_tool("echo_test")
    class Echo:
        def __init__(self, prefix: str = ""):
            self.prefix = prefix

        def run(self, payload: str) -> str:
            return self.prefix + payload

    tool = build_tool("echo_test", prefix="> ")
    assert tool.name == "echo_test" and tool.run("hi") == "> hi"
    with pytest.raises(ValueError, match="already registered"):
        register_tool("echo_test")(type("Other", (), {}))


def test_search_finds_the_gold_document_over_its_look_alike(bench):
    tool = build_tool("search", corpus=bench.corpus)
    hits = 0
    searched = [st for q in bench.all_questions for st in q.subtasks if st.agent == "searcher"]
    for st in searched:
        docs = tool.retrieve(st.task)
        assert len(docs) <= 2
        hits += docs[0].id == st.doc_id
        assert tool.run(st.task).startswith(bench.corpus.get(st.doc_id).text + "\n")
    assert hits == len(searched)


def test_search_observation_is_terse_and_deterministic(bench):
    tool = SearchTool(bench.corpus, k=2, max_chars=60)
    first = bench.corpus.docs[0]
    obs = tool.run(f"population of {first.title}")
    assert len(obs) <= 60 and obs.endswith("...") and obs.startswith(first.title + ":")
    assert tool.run(f"population of {first.title}") == obs
    assert tool.run("zzzz qqqq") == NO_RESULTS
    assert tool.run("   ") == NO_RESULTS
    assert tool.run("the of a") == NO_RESULTS  # stopwords only


def test_search_ties_break_by_corpus_order():
    corpus = Corpus(docs=[Doc(id=f"d{i}", title=f"t{i}", text="alpha beta") for i in range(4)])
    assert [d.id for d in SearchTool(corpus, k=3).retrieve("alpha")] == ["d0", "d1", "d2"]
    with pytest.raises(ValueError):
        SearchTool(corpus, k=0)


class _Scripted:
    def __init__(self, result: ExecResult):
        self.result, self.requests = result, []

    def execute(self, request):
        self.requests.append(request)
        return self.result


@pytest.mark.parametrize("result, observation", [
    (ExecResult(status="ok", stdout="17211\n"), "17211"),
    (ExecResult(status="ok", stdout=""), "(no output)"),
    (ExecResult(status="error", stderr="Traceback ...\n  File x\nNameError: name 'y' is "
                "not defined\n", exit_code=1), "NameError: name 'y' is not defined"),
    (ExecResult(status="error", exit_code=-9), "error: exit code -9"),
    (ExecResult(status="timeout"), "error: timeout after 2s"),
    (ExecResult(status="memory"), "error: memory limit"),
    (ExecResult(status="ok", stdout="x" * 500), "x" * 37 + "..."),
])
def test_python_observation(result, observation):
    executor = _Scripted(result)
    tool = PythonTool(executor, timeout_s=2, max_chars=40)
    assert tool.run("print(1)") == observation
    assert executor.requests[0].code == "print(1)" and executor.requests[0].timeout_s == 2


def test_python_through_local_sandbox():
    from mgrpo.sandbox.local import LocalSandbox

    tool = build_tool("python", executor=LocalSandbox(), timeout_s=5)
    assert tool.run("print(48213 - 31002)") == "17211"
    assert tool.run("print(1743 < 1802)") == "True"
    assert tool.run("print(population of X)").startswith("SyntaxError")
    assert tool.run("raise ValueError('bad')") == "ValueError: bad"


@pytest.mark.parametrize("code, observation", [
    ("print('\ud800')", "error: code is not valid unicode text"),
    ("#" * 10_000_001, "error: code too long (limit 10000000 characters)"),
])
def test_python_refused_code_is_an_observation_not_an_exception(code, observation):
    executor = _Scripted(ExecResult(status="ok", stdout="never"))
    tool = PythonTool(executor, timeout_s=2, max_chars=200)
    assert tool.run(code) == observation
    assert executor.requests == []  # refused before the sandbox is asked


def test_python_sandbox_unavailable_propagates():
    from mgrpo.sandbox.client import SandboxUnavailable

    class _Down:
        def execute(self, request):
            raise SandboxUnavailable("sandbox at http://sandbox:8080 refused the connection")

    with pytest.raises(SandboxUnavailable, match="refused the connection"):
        PythonTool(_Down()).run("print(1)")

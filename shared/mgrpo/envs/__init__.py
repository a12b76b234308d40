"""The offline deep-research benchmark: knowledge graph, corpus, questions, protocol,
rewards and scripted experts. See ``docs/benchmark.md`` and ``docs/protocol.md``."""

from mgrpo.envs.benchmark import (
    Benchmark,
    BenchmarkConfig,
    build_benchmark,
    load_benchmark,
    load_questions,
)
from mgrpo.envs.corpus import Corpus, Doc
from mgrpo.envs.questions import Question, Subtask

__all__ = ["Benchmark", "BenchmarkConfig", "Corpus", "Doc", "Question", "Subtask",
           "build_benchmark", "load_benchmark", "load_questions"]

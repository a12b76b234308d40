"""``search``: BM25 (the ``bm25s`` package) over a corpus, returning terse top-k documents.

The observation is the text of the top ``k`` documents, one per line, best first, cut to
``max_chars``. Ties in score are broken by corpus order, so results are deterministic.
:meth:`SearchTool.retrieve` gives the documents themselves (for AT-GRPO turn rewards).

What it does not do: stemming, phrase matching, or snippet extraction inside long documents
(built-in documents are one line; a user corpus is shown from each document's start).
"""

from __future__ import annotations

import bm25s
import numpy as np
from pydantic import Field

from mgrpo.envs.corpus import Corpus, Doc
from mgrpo.tools.registry import register_tool
from mgrpo.validation import StrictModel

NO_RESULTS = "no results"


class SearchConfig(StrictModel):
    k: int = Field(2, ge=1, le=50, description="documents per search; more finds more but "
                   "lengthens the observation the sub-agent must read")
    max_chars: int = Field(400, ge=16, description="observation length cap")


def _tokens(text: str) -> list[str]:
    return bm25s.tokenize([text], stopwords="en", return_ids=False, show_progress=False)[0]


@register_tool("search")
class SearchTool:
    name = "search"

    def __init__(self, corpus: Corpus, k: int = 2, max_chars: int = 400):
        self.config = SearchConfig(k=k, max_chars=max_chars)
        if len(corpus) == 0:
            raise ValueError("SearchTool needs a non-empty corpus")
        self.corpus = corpus
        self._bm25 = bm25s.BM25()
        texts = [f"{d.title} {d.text}" if d.title not in d.text else d.text for d in corpus.docs]
        self._bm25.index(bm25s.tokenize(texts, stopwords="en", show_progress=False),
                         show_progress=False)

    def retrieve(self, query: str) -> list[Doc]:
        """Top-k documents with a positive BM25 score, best first (ties: corpus order)."""
        tokens = _tokens(query)
        if not tokens:
            return []
        scores = np.asarray(self._bm25.get_scores(tokens), dtype=np.float64)
        order = np.lexsort((np.arange(len(scores)), -scores))[: self.config.k]
        return [self.corpus.docs[i] for i in order if scores[i] > 0]

    def run(self, payload: str) -> str:
        docs = self.retrieve(payload)
        if not docs:
            return NO_RESULTS
        text = "\n".join(d.text for d in docs)
        cap = self.config.max_chars
        return text if len(text) <= cap else text[: cap - 3] + "..."

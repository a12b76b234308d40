"""Documents: the corpus the ``search`` tool indexes.

Built-in documents are one terse line per entity, attributes in a fixed order, numbers as
plain digits, e.g. ``Varnholt: city. population 48213. founded 1743. country Oskaria.``
:func:`parse_document` reads such a line back (the scripted searcher uses it). Users bring
their own corpus as a folder of text files (:meth:`Corpus.from_folder`).

What this module does not do: retrieval (``mgrpo.tools.search``).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, PrivateAttr

from mgrpo.atomic import write_text_atomic
from mgrpo.envs.kg import ATTRIBUTES, Entity, KnowledgeGraph

_ALL_ATTRIBUTES = sorted({a for attrs in ATTRIBUTES.values() for a in attrs},
                         key=len, reverse=True)  # longest first: "birth year" before "founded"


class Doc(BaseModel):
    id: str
    title: str
    text: str


class Corpus(BaseModel):
    docs: list[Doc]
    _index: dict[str, Doc] | None = PrivateAttr(default=None)

    def get(self, doc_id: str) -> Doc | None:
        if self._index is None:
            self._index = {d.id: d for d in self.docs}
        return self._index.get(doc_id)

    def __len__(self) -> int:
        return len(self.docs)

    def save_jsonl(self, path: Path) -> None:
        lines = [json.dumps(d.model_dump(), sort_keys=True, ensure_ascii=False) for d in self.docs]
        write_text_atomic(path, "".join(line + "\n" for line in lines))

    @classmethod
    def load_jsonl(cls, path: Path) -> Corpus:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip()]
        return cls(docs=[Doc(**row) for row in rows])

    @classmethod
    def from_folder(cls, folder: str | Path, suffixes: tuple[str, ...] = (".txt", ".md")) -> Corpus:
        """One document per text file (recursive, sorted by path for determinism).

        id: the path relative to ``folder``; title: the first non-empty line; text: the whole
        file with runs of whitespace collapsed to one space.
        """
        root = Path(folder)
        if not root.is_dir():
            raise FileNotFoundError(f"corpus folder {str(root)!r} does not exist; pass a folder "
                                    f"of {'/'.join(suffixes)} files")
        docs = []
        for path in sorted(p for p in root.rglob("*") if p.suffix in suffixes and p.is_file()):
            raw = path.read_text(encoding="utf-8", errors="replace")
            lines = [ln.strip() for ln in raw.splitlines() if ln.strip()]
            if not lines:
                continue
            docs.append(Doc(id=str(path.relative_to(root)), title=lines[0][:200],
                            text=" ".join(raw.split())))
        if not docs:
            raise ValueError(f"corpus folder {str(root)!r} has no non-empty {suffixes} files")
        return cls(docs=docs)


def render_document(entity: Entity) -> Doc:
    """``{name}: {type}. {attr} {value}. ...`` in the type's attribute order."""
    facts = " ".join(f"{attr} {entity.attrs[attr]}." for attr in ATTRIBUTES[entity.type])
    return Doc(id=entity.doc_id, title=entity.name, text=f"{entity.name}: {entity.type}. {facts}")


def render_corpus(kg: KnowledgeGraph) -> Corpus:
    return Corpus(docs=[render_document(e) for e in kg.entities])


def parse_document(text: str) -> tuple[str, dict[str, str]] | None:
    """Inverse of :func:`render_document`: ``(title, {attr: value})``, None if not that shape."""
    head, sep, rest = text.partition(": ")
    if not sep:
        return None
    facts: dict[str, str] = {}
    for sentence in rest.split(". "):
        sentence = sentence.strip().rstrip(".")
        for attr in _ALL_ATTRIBUTES:
            if sentence.startswith(attr + " "):
                facts[attr] = sentence[len(attr) + 1:]
                break
    return head, facts

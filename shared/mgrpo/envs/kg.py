"""The seeded knowledge graph of fictional cities, people and companies.

Every entity has typed attributes (numbers as plain integers, relations as entity names) and
belongs to exactly one split, and relations only join entities of the same split, so test
questions never mention a train entity. Each real entity may get a *distractor*: a look-alike
entity whose name differs by one letter, with its own random attributes, present in the
corpus but never asked about (it exists so that search must be precise).

Attribute names double as the canonical subtask phrase (``"population of Varnholt"``) and as
the words in the documents (``"population 48213."``), so a query made of the task text finds
the document by BM25.

What this module does not do: render documents (``mgrpo.envs.corpus``) or write questions
(``mgrpo.envs.questions``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

EntityType = Literal["city", "person", "company"]
SPLITS = ("train", "dev", "test")

# Attribute order is the order in documents. Relations point to another entity's name.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "city": ("population", "founded", "country"),
    "person": ("birth year", "birthplace", "employer"),
    "company": ("employees", "founded", "headquarters", "founder"),
}
NUMERIC_ATTRIBUTES = frozenset({"population", "founded", "birth year", "employees"})

_CITY_HEADS = ("Var", "Quen", "Ost", "Bel", "Mar", "Tor", "Hal", "Lun", "Dra", "Kel", "Brum",
               "Fen", "Gor", "Hest", "Ild", "Jor", "Kav", "Lor", "Mev", "Nor", "Pel", "Rav",
               "Sol", "Tam", "Ulm", "Vel", "Wen", "Yst", "Zor", "Ark")
_CITY_TAILS = ("holt", "by", "mark", "stad", "wick", "ford", "heim", "dal", "mere", "gard",
               "ton", "burg")
_FIRST = ("Edda", "Tomas", "Ines", "Bram", "Calla", "Dorin", "Elva", "Fenno", "Greta", "Hugo",
          "Ilse", "Jarek", "Kaia", "Lenz", "Mira", "Nils", "Orla", "Piet", "Runa", "Sven",
          "Tilde", "Ulf", "Vera", "Wim", "Yara", "Zeno")
_LAST = ("Morlin", "Hask", "Vedder", "Brandt", "Cole", "Dunmore", "Esk", "Falk", "Grell",
         "Holm", "Ivers", "Jessen", "Kroll", "Lund", "Mast", "Nyberg", "Orr", "Pask", "Quist",
         "Rask", "Stahl", "Toft", "Unger", "Voss", "Wendt", "Yde")
_COMPANY_HEADS = ("Korv", "Brix", "Dal", "Fyn", "Gral", "Hov", "Jup", "Kest", "Lum", "Murn",
                  "Nex", "Orb", "Prax", "Qual", "Rund", "Strom", "Tav", "Umbr", "Vant", "Wex")
_COMPANY_MIDS = ("ex", "ia", "on", "ar", "is", "um")
_COMPANY_KINDS = ("Works", "Labs", "Group", "Mills", "Foods")
_COUNTRIES = ("Oskaria", "Veldmark", "Tarnland", "Brisca", "Quorra", "Helvin", "Morania",
              "Esterra")


@dataclass
class Entity:
    """One node: ``attrs`` maps attribute name -> value (int or another entity's name)."""

    name: str
    type: EntityType
    split: str
    attrs: dict[str, int | str]
    distractor: bool = False
    doc_id: str = ""


@dataclass
class KnowledgeGraph:
    """All entities, indexed by name. ``fact(name, attr)`` is the ground truth of a subtask."""

    entities: list[Entity] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_name = {e.name: e for e in self.entities}

    def get(self, name: str) -> Entity | None:
        return self._by_name.get(name)

    def fact(self, name: str, attr: str) -> str | None:
        """The value of ``attr`` of entity ``name`` as text, or None if either is unknown."""
        entity = self._by_name.get(name)
        if entity is None or attr not in entity.attrs:
            return None
        return str(entity.attrs[attr])

    def real(self, split: str, type_: EntityType) -> list[Entity]:
        """Non-distractor entities of one split and type, in generation order."""
        return [e for e in self.entities
                if e.split == split and e.type == type_ and not e.distractor]

    def to_json(self) -> list[dict]:
        return [{"name": e.name, "type": e.type, "split": e.split, "attrs": e.attrs,
                 "distractor": e.distractor, "doc_id": e.doc_id} for e in self.entities]

    @classmethod
    def from_json(cls, rows: list[dict]) -> KnowledgeGraph:
        return cls([Entity(**row) for row in rows])


def _name_pool(type_: EntityType) -> list[str]:
    if type_ == "city":
        return [h + t for h in _CITY_HEADS for t in _CITY_TAILS]
    if type_ == "person":
        return [f"{f} {la}" for f in _FIRST for la in _LAST]
    return [f"{h}{m} {k}" for h in _COMPANY_HEADS for m in _COMPANY_MIDS for k in _COMPANY_KINDS]


def look_alike(name: str, taken: set[str], rng: random.Random) -> str:
    """A one-letter variant of ``name`` (a lowercase letter replaced) not in ``taken``."""
    positions = [i for i, ch in enumerate(name) if ch.islower()]
    for _ in range(200):
        i = rng.choice(positions)
        letter = rng.choice("aeioulnrstkm")
        candidate = name[:i] + letter + name[i + 1:]
        if candidate != name and candidate not in taken:
            return candidate
    raise RuntimeError(f"no free one-letter variant of {name!r} after 200 tries")


def _draw_names(type_: EntityType, count: int, rng: random.Random) -> list[str]:
    pool = _name_pool(type_)
    # Half the pool at most, so look-alikes of drawn names rarely collide with real names.
    if count > len(pool) // 2:
        raise ValueError(f"{count} {type_} entities requested but the name pool allows at most "
                         f"{len(pool) // 2}; lower the count in BenchmarkConfig")
    return rng.sample(pool, count)


def _random_attrs(type_: EntityType, split_entities: dict[str, list[Entity]],
                  rng: random.Random) -> dict[str, int | str]:
    """Attributes of one entity; relations point to real entities of the same split."""
    if type_ == "city":
        return {"population": rng.randint(1000, 99999), "founded": rng.randint(1100, 1900),
                "country": rng.choice(_COUNTRIES)}
    if type_ == "person":
        return {"birth year": rng.randint(1940, 1999),
                "birthplace": rng.choice(split_entities["city"]).name,
                "employer": rng.choice(split_entities["company"]).name}
    founder = rng.choice(split_entities["person"])
    # A company is founded when its founder is 20-60 years old, and not after 2024, so "how
    # old was the founder" questions have positive, plausible answers.
    born = int(founder.attrs["birth year"])
    founded = born + rng.randint(20, min(60, 2024 - born))
    return {"employees": rng.randint(10, 9999), "founded": founded,
            "headquarters": rng.choice(split_entities["city"]).name, "founder": founder.name}


def build_kg(counts: dict[str, dict[str, int]], distractor_rate: float,
             rng: random.Random) -> KnowledgeGraph:
    """Generate the graph. ``counts[split][type]`` real entities per split and type.

    Names are drawn once for all splits (so splits are disjoint by construction); each real
    entity gets a distractor twin with probability ``distractor_rate``.
    """
    per_type = {t: sum(counts[s].get(t, 0) for s in SPLITS) for t in ATTRIBUTES}
    names = {t: _draw_names(t, n, rng) for t, n in per_type.items()}
    taken = {n for pool in names.values() for n in pool}
    entities: list[Entity] = []
    for split in SPLITS:
        split_entities: dict[str, list[Entity]] = {}
        for type_ in ATTRIBUTES:
            n = counts[split].get(type_, 0)
            if n < 2:
                raise ValueError(f"counts[{split!r}][{type_!r}] = {n}: each split needs at least "
                                 "2 entities of each type (comparisons need a pair)")
            drawn, names[type_] = names[type_][:n], names[type_][n:]
            split_entities[type_] = [Entity(name=x, type=type_, split=split, attrs={})
                                     for x in drawn]
        for type_ in ATTRIBUTES:  # city, person, company: founders exist before companies
            for entity in split_entities[type_]:
                entity.attrs = _random_attrs(type_, split_entities, rng)
        for type_ in ATTRIBUTES:
            for entity in split_entities[type_]:
                entities.append(entity)
                if rng.random() < distractor_rate:
                    twin = Entity(name=look_alike(entity.name, taken, rng), type=type_,
                                  split=split, attrs=_random_attrs(type_, split_entities, rng),
                                  distractor=True)
                    taken.add(twin.name)
                    entities.append(twin)
    for i, entity in enumerate(entities):
        entity.doc_id = f"d{i:04d}"
    return KnowledgeGraph(entities)

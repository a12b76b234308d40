"""How one training round's wall time grows with K, B and the number of sub-agent types.

The work is ``bench/round.py``'s (imported, not copied): its warm-started tiny models
(:func:`mgrpo.experiments.tiny_assets.prepare_cached`, ``--sft-steps`` 150 as in round.py: the
planner delegates), its run config (:func:`round.make_config`, M-GRPO
co-training) and its embedded round (:func:`round.embedded_round`: ``run_round`` in this
process on a fresh SQLite store; model loading is not timed). Three one-factor sweeps around
a base point (B = 4 queries, K = 4 rollouts, 2 sub-agent types):

- K in ``--ks`` (default 2, 4, 8) at the base B and types;
- B in ``--bs`` (default 2, 4, 8) at the base K and types;
- sub-agent types 1 (searcher only: the coder is removed from ``agents`` and ``models``, so
  the planner's header lists one agent) and 2 (searcher and coder).

Each configuration runs ``--repeats`` times (the same seeds, hence the same episodes), in
interleaved order after one warm-up round; the median wall time is used (and, as
``*_of_fastest``, the fastest repeat: on a loaded machine the least disturbed one). A slope is the
least-squares line through (factor, median seconds): seconds per extra rollout per query
(K), per extra query (B), per extra sub-agent type. The same fit is given for each part of
the round's own split (rollout / ingest / update / weight sync); each point also records the
trajectories stored and the sub-agent trajectories per model (``round.delegations``: what
the round did), since a slope means little if, say, the planner never delegates.
``os.getloadavg()`` is recorded around every round.

What it does NOT do: the distributed mode (``bench/round.py`` compares the two at one
size), more than one round, or any model larger than the tiny ones (Python overhead
dominates; slopes on other hardware and sizes will differ).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/scaling.py [--repeats 3] [--base-b 4 --base-k 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from round import delegations, embedded_round, machine, make_config  # noqa: E402

from mgrpo.experiments.tiny_assets import prepare_cached  # noqa: E402

RESULT_FILE = Path(__file__).resolve().parent / "results" / "scaling.json"


def config(paths: dict, out_dir: Path, *, b: int, k: int, types: int):
    """``round.make_config`` (co-training) with ``types`` sub-agent types (1: searcher only)."""
    cfg = make_config(paths, out_dir, b=b, k=k)
    if types == 2:
        return cfg
    if types != 1:
        raise ValueError(f"types={types}: the bench has 1 (searcher) or 2 (searcher, coder)")
    data = cfg.model_dump(mode="json")
    data["agents"].pop("coder")
    data["models"].pop("coder")
    return type(cfg).model_validate(data)


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y on x (None with fewer than two distinct x)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)


def one_round(paths: dict, root: Path, b: int, k: int, types: int, tag: str) -> dict:
    load = os.getloadavg()[0]
    cfg = config(paths, root / tag, b=b, k=k, types=types)
    data = embedded_round(cfg)
    return {"wall_s": data.wall_s, "trajectories": len(data.tokens),
            "delegations": delegations(data, cfg),
            "split": data.split,
            "load_1m_before": round(load, 2), "load_1m_after": round(os.getloadavg()[0], 2)}


def run(repeats: int, base_b: int, base_k: int, ks: list[int], bs: list[int],
        sft_steps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    paths = prepare_cached(sft_steps)
    points = sorted({(base_b, k, 2) for k in ks} | {(b, base_k, 2) for b in bs}
                    | {(base_b, base_k, t) for t in (1, 2)})
    runs: dict[tuple, list[dict]] = {p: [] for p in points}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        one_round(paths, root, base_b, base_k, 2, "warmup")  # imports, first-call costs
        for r in range(repeats):  # interleaved: each repeat visits every point
            order = points if r % 2 == 0 else points[::-1]
            for b, k, t in order:
                runs[(b, k, t)].append(one_round(paths, root, b, k, t, f"b{b}-k{k}-t{t}-{r}"))
    load_end = os.getloadavg()

    def median(p: tuple, key: str, pick=statistics.median) -> float:
        values = [x[key] if key == "wall_s" else x["split"].get(key, 0.0)
                  for x in runs[p]]
        return pick(values)

    parts = sorted({key for rs in runs.values() for x in rs for key in x["split"]})
    sweeps = {"K": [((base_b, k, 2), k) for k in ks], "B": [((b, base_k, 2), b) for b in bs],
              "sub_agent_types": [((base_b, base_k, t), t) for t in (1, 2)]}
    slopes = {}
    for name, sweep in sweeps.items():
        def fit(key: str, sweep=sweep, pick=statistics.median) -> float | None:
            value = slope([(x, median(p, key, pick)) for p, x in sweep])
            return None if value is None else round(value, 4)

        slopes[name] = {"wall_s_per_unit": fit("wall_s"),
                        "wall_s_per_unit_of_fastest": fit("wall_s", pick=min),
                        "split_s_per_unit": {part: fit(part) for part in parts}}
    table = [{"B": b, "K": k, "sub_agent_types": t, "episodes": b * k,
              "median_wall_s": round(median((b, k, t), "wall_s"), 3),
              "wall_s": [round(x["wall_s"], 3) for x in runs[(b, k, t)]],
              "median_split_s": {part: round(median((b, k, t), part), 3) for part in parts},
              "min_wall_s": round(min(x["wall_s"] for x in runs[(b, k, t)]), 3),
              "trajectories": runs[(b, k, t)][0]["trajectories"],
              "delegations": runs[(b, k, t)][0]["delegations"],
              "load_1m": [x["load_1m_before"] for x in runs[(b, k, t)]]}
             for b, k, t in points]
    return {"mode": "embedded (bench/round.py embedded_round: run_round, SQLite, one process)",
            "base": {"B": base_b, "K": base_k, "sub_agent_types": 2}, "repeats": repeats,
            "sft_steps": sft_steps,
            "slopes": slopes, "points": table, "machine": machine(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in load_end]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--base-b", type=int, default=4)
    parser.add_argument("--base-k", type=int, default=4)
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--bs", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--out", default=str(RESULT_FILE))
    args = parser.parse_args()
    result = run(args.repeats, args.base_b, args.base_k, args.ks, args.bs, args.sft_steps)
    text = json.dumps(result, indent=1)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

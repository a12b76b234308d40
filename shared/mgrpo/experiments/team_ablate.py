"""`mgrpo ablate --config` on a turn team (AT-GRPO's comparisons in miniature).

A team ablation config (``kind: turn_team``) holds one ``turn_team`` run config (``base``)
and named ``arms``, each a set of overrides merged into it (nested sections merge key by
key; ``workflow.roles`` and ``models`` are replaced whole, since they name the policies).
Every arm trains once per seed from its warm start and is evaluated greedily on the same
``test_tasks`` held-out tasks of its world's test split, before and after RL. Optional:

- ``warm_start``: each model starts from a copy of its ``path`` fine-tuned (``mgrpo sft``'s
  recipe) on the world's scripted expert turns (``mgrpo worlds demos``) of the roles it
  plays in that arm (a shared model: every role's; one warm start per (world, roles));
- ``swap: [role_a, role_b]``: each arm that plays both roles with different models is also
  evaluated after RL with the two trained models exchanged (arm ``<arm>+swapped``); arms
  without both roles (a single agent) are not swapped, and at least one arm must have them.

Writes ``{out_dir}/results.md``: accuracy (solved share) and mean team reward before and
after per arm (mean and 95% Student-t interval over seeds) and each arm minus the first
(``baseline``), paired on the same tasks: a seed's held-out tasks are the same for every
arm, so the 95% interval resamples the seeds, then each drawn seed's tasks
(``mgrpo.algo.paired.seed_task_bootstrap``), and a Student-t interval over the seeds'
paired differences stands beside it (with 3 seeds the bootstrap's seed stage allows only 10
distinct draws, and the t interval is the wider one); each row says how many seeds and
tasks it rests on. Both on solved, and on the team reward too where some task's is partial
(``coder_tester``: the fraction of hidden tests passed); and ``{out_dir}/ablation.json``.
"""

from __future__ import annotations

import copy
import json
import shutil
import time
import zlib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from mgrpo.envs.worlds import build_world
from mgrpo.envs.worlds.demos import expert_demos
from mgrpo.experiments.ablate import finished_run, mean_ci
from mgrpo.models import load_model
from mgrpo.models.checkpoint import version_uri
from mgrpo.validation import StrictModel

REPLACED = ("roles", "models")  # sections an arm replaces whole


class WarmStart(StrictModel):
    demos: int = Field(200, ge=1, description="expert episodes of the training split")
    steps: int = Field(200, ge=1, description="SFT optimizer steps per warm-started model")
    batch_size: int = Field(16, ge=1)
    lr: float = Field(1e-3, gt=0)


class TeamAblateConfig(StrictModel):
    kind: Literal["turn_team"] = "turn_team"
    out_dir: str = "runs/ablate_team"
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    test_tasks: int = Field(200, ge=1, description="held-out tasks of the test split")
    base: dict[str, Any] = Field(description="a turn_team run config (mgrpo train's fields)")
    arms: dict[str, dict[str, Any]] = Field(min_length=1, description="arm -> overrides "
                                            "(one arm needs `swap`: its swapped team is "
                                            "the comparison)")
    baseline: str | None = Field(None, description="the arm the others are compared to "
                                 "(default: the first)")
    warm_start: WarmStart | None = None
    swap: list[str] | None = Field(None, min_length=2, max_length=2)
    results_md: str | None = None

    @model_validator(mode="after")
    def _arms_validate(self) -> TeamAblateConfig:
        if len(self.arms) < 2 and not self.swap:
            raise ValueError("a team ablation compares two arms or more, or one arm with "
                             "`swap: [role, role]`")
        if self.baseline is not None and self.baseline not in self.arms:
            raise ValueError(f"baseline {self.baseline!r} is not an arm: {list(self.arms)}")
        roles = {}
        for arm in self.arms:
            cfg = arm_config(self, arm, self.seeds[0])
            if cfg.flow.name != "turn_team":
                raise ValueError(f"arm {arm}: a team ablation's runs are turn_team runs")
            roles[arm] = sorted(cfg.workflow.roles)
        if self.swap and not any(set(self.swap) <= set(r) for r in roles.values()):
            raise ValueError(f"swap {self.swap}: no arm plays both roles (the arms' roles: "
                             f"{roles})")
        return self

    def first(self) -> str:
        return self.baseline or next(iter(self.arms))

    def results_path(self) -> Path:
        return Path(self.results_md) if self.results_md else Path(self.out_dir) / "results.md"


def merge(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in REPLACED:
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def arm_config(cfg: TeamAblateConfig, arm: str, seed: int, paths: dict | None = None):
    """The RunConfig of ``arm`` at ``seed`` (model paths from ``paths`` when warm-started)."""
    # on use: keeps torch out of this module's import
    from mgrpo.training.config import RunConfig

    data = merge(cfg.base, cfg.arms[arm])
    for model, path in (paths or {}).get(arm, {}).items():
        data["models"][model]["path"] = path
    data.update(name=f"{arm}-s{seed}", seed=seed, eval_questions=cfg.test_tasks,
                out_dir=str(Path(cfg.out_dir) / arm / f"seed{seed}"))
    try:
        return RunConfig.model_validate(data)
    except ValueError as error:
        raise ValueError(f"arm {arm}: {error}") from None


def load_team_ablate(path: str | Path, data: dict | None = None) -> TeamAblateConfig:
    """Read a team ablation YAML; ``out_dir``, ``results_md`` and model paths that are
    relative start at the file's folder."""
    import yaml

    path = Path(path)
    data = dict(data if data is not None else yaml.safe_load(path.read_text()) or {})
    here = path.resolve().parent

    def absolute(value: str) -> str:
        return value if "://" in value or Path(value).is_absolute() else str(here / value)

    for key in ("out_dir", "results_md"):
        if isinstance(data.get(key), str):
            data[key] = absolute(data[key])
    for section in [data.get("base", {}), *dict(data.get("arms") or {}).values()]:
        for model in (section.get("models") or {}).values():
            if isinstance(model, dict) and isinstance(model.get("path"), str):
                model["path"] = absolute(model["path"])
    return TeamAblateConfig.model_validate(data)


def warm_paths(cfg: TeamAblateConfig) -> dict[str, dict[str, str]]:
    """{arm: {model: warm-started checkpoint}}: one SFT run per (world, its options, roles
    the model plays, start path), shared by the arms that need the same one."""
    # on use: keeps torch out of this module's import
    from mgrpo.models.checkpoint import latest_version, save_checkpoint
    from mgrpo.models.sft import SFTConfig, train_sft

    ws, root = cfg.warm_start, str(Path(cfg.out_dir) / "warm")
    built: dict[str, str] = {}
    out: dict[str, dict[str, str]] = {}
    for arm in cfg.arms:
        run = arm_config(cfg, arm, cfg.seeds[0])
        flow = run.workflow
        for model, spec in run.models.items():
            roles = sorted(r for r, m in flow.roles.items() if m == model)
            key = json.dumps([flow.world, flow.world_options, roles, spec.path, ws.model_dump()],
                             sort_keys=True)
            if key not in built:
                name = f"{flow.world}-{'+'.join(roles)}-{zlib.crc32(key.encode()):08x}"
                if latest_version(root, name) is None:
                    world = build_world(flow.world, **flow.world_options)
                    demos = [e for e in expert_demos(world, "train", ws.demos, 0)
                             if e["agent"] in roles]
                    net, tokenizer = load_model(spec.path, device="cpu")
                    train_sft(net, tokenizer, demos, SFTConfig(
                        steps=ws.steps, batch_size=ws.batch_size, lr=ws.lr, seed=0),
                        log_name=name)
                    save_checkpoint(net, root, name, 0, tokenizer=tokenizer,
                                    extra={"demos": len(demos), "roles": roles})
                built[key] = version_uri(root, name, 0)
            out.setdefault(arm, {})[model] = built[key]
    return out


def swapped_eval(run_cfg, roles: list[str], test_out: Path) -> dict | None:
    """The trained team of ``run_cfg`` with the models of ``roles`` exchanged, evaluated
    greedily on the held-out tasks; None when one model plays both roles."""
    # on use: keeps torch, sqlalchemy out of this module's import
    from mgrpo.training.config import RunConfig
    from mgrpo.training.run_state import checkpoint_root
    from mgrpo.training.team_round import build_team_system, evaluate_team_tasks, write_task_scores

    flow = run_cfg.workflow
    a, b = roles
    if flow.roles[a] == flow.roles[b]:
        return None
    rounds = sum(s.rounds for s in run_cfg.stages)
    root = checkpoint_root(run_cfg)
    data = run_cfg.model_dump(mode="json")
    models = {}  # renamed: a model named like one role may not play another
    for name, model in data["models"].items():
        if run_cfg.models[name].trainable:
            model["path"] = version_uri(root, name, rounds)
        models[f"{name}_trained"] = model
    exchanged = {**flow.roles, a: flow.roles[b], b: flow.roles[a]}
    data["models"] = models
    data["workflow"]["roles"] = data["agents"] = {r: f"{m}_trained"
                                                  for r, m in exchanged.items()}
    data["out_dir"] = str(test_out)
    swapped = RunConfig.model_validate(data)
    system = build_team_system(swapped)
    test = system.world.tasks("test", swapped.eval_questions, swapped.seed)
    metrics, scores = evaluate_team_tasks(system, test)
    test_out.mkdir(parents=True, exist_ok=True)
    write_task_scores(test_out, scores)
    return metrics


def run_team_ablation(cfg: TeamAblateConfig) -> dict[str, list[dict]]:
    # on use: keeps torch, sqlalchemy out of this module's import
    from mgrpo.training.loop import run_training

    t0 = time.perf_counter()
    paths = warm_paths(cfg) if cfg.warm_start else {}
    results: dict[str, list[dict]] = {}
    for seed in cfg.seeds:  # seed-major: a run cut short leaves every arm's first seeds
        for arm in cfg.arms:
            run_cfg = arm_config(cfg, arm, seed, paths)
            rounds = sum(s.rounds for s in run_cfg.stages)
            done = finished_run(Path(run_cfg.out_dir), rounds)
            if done is None:
                if Path(run_cfg.out_dir).exists():  # cut short: start it again
                    shutil.rmtree(run_cfg.out_dir)
                result = run_training(run_cfg, progress=False)
                done = {"before": result.before, "after": result.after}
            results.setdefault(arm, []).append({"seed": seed, **done,
                                                "out_dir": run_cfg.out_dir})
            _log(t0, arm, seed, done["after"])
            if cfg.swap and set(cfg.swap) <= set(run_cfg.workflow.roles):
                out = Path(run_cfg.out_dir) / "swapped"
                after = swapped_eval(run_cfg, cfg.swap, out)
                if after is not None:
                    results.setdefault(f"{arm}+swapped", []).append(
                        {"seed": seed, "before": {}, "after": after, "out_dir": str(out)})
                    _log(t0, f"{arm}+swapped", seed, after)
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    Path(cfg.out_dir, "ablation.json").write_text(json.dumps(results, indent=2))
    cfg.results_path().parent.mkdir(parents=True, exist_ok=True)
    cfg.results_path().write_text(team_markdown(cfg, results, time.perf_counter() - t0))
    return results


def _log(t0: float, arm: str, seed: int, after: dict) -> None:
    print(f"[ablate {time.perf_counter() - t0:7.1f}s] {arm} seed {seed}: held-out "
          f"{after.get('eval/greedy/accuracy', float('nan')):.3f}", flush=True)


def task_scores(runs: list[dict]) -> dict[int, dict[str, float]]:
    """{seed: {task id: score}} after RL over an arm's runs (a run's held-out tasks are its
    seed's, the same for every arm), from each run's ``eval_after_questions.json``."""
    return {run["seed"]: json.loads((Path(run["out_dir"]) / "eval_after_questions.json")
                                    .read_text())["greedy"] for run in runs}


def paired_row(label: str, sa: dict[int, dict[str, float]], sb: dict[int, dict[str, float]],
               value) -> str:
    """One comparison's table row: A - B on the seeds and tasks both have, ``value`` of each
    task's score; the seeds-then-tasks bootstrap and the t interval over the seeds."""
    # on use: keeps torch, numpy out of this module's import
    from mgrpo.algo.paired import seed_task_bootstrap

    seeds = sorted(set(sa) & set(sb))
    tasks = {s: sorted(set(sa[s]) & set(sb[s])) for s in seeds}
    a = [[value(sa[s][t]) for t in tasks[s]] for s in seeds]
    b = [[value(sb[s][t]) for t in tasks[s]] for s in seeds]
    res = seed_task_bootstrap(a, b)
    per_seed = [sum(x) / len(x) - sum(y) / len(y) for x, y in zip(a, b, strict=True)]
    mean, half = mean_ci(per_seed)
    t_cell = "n/a (one seed)" if len(seeds) < 2 else f"[{mean - half:+.3f}, {mean + half:+.3f}]"
    return (f"| {label} | {res.diff:+.3f} | [{res.low:+.3f}, {res.high:+.3f}] | "
            f"{'yes' if res.significant else 'no'} | {t_cell} | "
            f"{', '.join(f'{d:+.3f}' for d in per_seed)} | {len(seeds)} x "
            f"{res.questions // max(len(seeds), 1)} |")


def team_markdown(cfg: TeamAblateConfig, results: dict[str, list[dict]],
                  wall_s: float) -> str:
    base = arm_config(cfg, cfg.first(), cfg.seeds[0])
    lines = [f"Seeds {cfg.seeds}; {cfg.test_tasks} held-out tasks of {base.workflow.world}'s "
             f"test split; {wall_s / 60:.1f} min. Greedy team: accuracy (solved share: team "
             "reward 1.0) and team reward (`World.score` in [0, 1], the same where a world "
             "scores 0 or 1), mean ± 95% Student-t half-width over seeds (nan: one seed).", "",
             "| arm | before RL | after RL | team reward before | team reward after |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for arm, runs in results.items():
        cells = []
        for key in ("eval/greedy/accuracy", "eval/greedy/team_reward"):
            for when in ("before", "after"):
                vals = [r[when][key] for r in runs if key in r[when]]
                cells.append("-" if not vals else "{:.3f} ± {:.3f}".format(*mean_ci(vals)))
        lines.append(f"| {arm} | {' | '.join(cells)} |")
    lines += ["", "Paired after RL on the same tasks of each seed: solved (team reward 1.0), "
              "and the team reward where some task's is partial. 95% bootstrap resampling "
              "the seeds, then each drawn seed's tasks (excludes 0: of this interval); 95% "
              "Student-t over the seeds' paired differences; each seed's difference:", "",
              "| comparison | difference | 95% bootstrap (seeds, tasks) | excludes 0 | "
              "95% t over seeds | per seed | seeds x tasks |",
              "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    first = cfg.first()
    others = [(first, a) for a in cfg.arms if a != first and a in results]
    others += [(a, f"{a}+swapped") for a in cfg.arms if f"{a}+swapped" in results]
    for a, b in others:
        sa, sb = task_scores(results[a]), task_scores(results[b])
        partial = any(0.0 < v < 1.0 for scores in (sa, sb) for seed in scores.values()
                      for v in seed.values())
        measures = [("", lambda v: float(v == 1.0))]
        measures += [(" (team reward)", float)] if partial else []
        for label, value in measures:
            lines.append(paired_row(f"{a} - {b}{label}", sa, sb, value))
    return "\n".join(lines) + "\n"

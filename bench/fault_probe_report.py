"""The fault probe's verdict and table (``bench/fault_probe.py``): what makes a scenario's
row a failure, and the markdown table of docs/services.md's "Fault probe"."""

from __future__ import annotations

MODELS = ("planner", "searcher", "coder")


def problems(name: str, row: dict) -> list[str]:
    """What makes the probe fail: loss, duplication, an unfinished round, a hostile
    message without a dead letter, a dead process."""
    out = []
    if "error" in row:
        return [f"{name}: {row['error']}"]
    if row.get("status") != "done":
        out.append(f"{name}: round {row.get('status')}")
    for model, want in row.get("expected", {}).items():
        got = row["trained"][model]
        if (got or 0) != want:  # no metric at all: 0 trained
            out.append(f"{name}: {model} trained {got}, expected {want}")
        if row["duplicates"][model]:
            out.append(f"{name}: {model} {row['duplicates'][model]} stored duplicates")
    for what, count in row.get("hostile_dead_lettered", {}).items():
        if count != 1:
            out.append(f"{name}: {what}: {count} dead letters")
    if row.get("rounds_created", 1) != 1:
        out.append(f"{name}: {row['rounds_created']} rounds created")
    if row.get("died"):
        out.append(f"{name}: processes died: {row['died']}")
    if row.get("same_checkpoint_version") is False:
        out.append(f"{name}: checkpoint versions differ: {row['checkpoint_versions']}")
    return out


def table(rows: dict) -> str:
    """The markdown table of docs/services.md's "Fault probe"."""
    lines = ["| scenario | round | rollouts | s to done | trained (planner/searcher/coder)"
             " vs expected | dead letters | hostile dead-lettered | other |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, row in rows.items():
        if "error" in row:
            lines.append(f"| {name} | error | | | | | | {row['error'][:120]} |")
            continue
        trained = "/".join(str(row.get("trained", {}).get(m)) for m in MODELS)
        expected = "/".join(str(row.get("expected", {}).get(m)) for m in MODELS)
        hostile = row.get("hostile_dead_lettered", {})
        other = []
        if name == "concurrent_starts":
            other.append(f"201: {row['status_201']}, 409: {row['status_409']}, other: "
                         f"{row['other_statuses'] or 'none'}, rounds created: "
                         f"{row['rounds_created']}")
        if name == "unpublished_round":
            other.append(f"published by the sweep after {row['seconds_to_published']} s")
        if name == "broker_restart":
            other.append(f"broker down {row.get('broker_down_s')} s, "
                         f"{row.get('workers_503')}/{len(row.get('healthz_before_start_app', {}))}"
                         f" workers 503, {row.get('completed_when_broker_down')} rollouts done"
                         " when it went down")
        if "checkpoint_versions" in row:
            versions = sorted(set(row["checkpoint_versions"].values()), key=str)
            other.append(f"checkpoint versions {versions}")
        other.append(f"died: {row.get('died') or 'none'}")
        lines.append(
            f"| {name} | {row.get('status')} | {row.get('completed')}/{row.get('total')} | "
            f"{row.get('seconds_to_done')} | {trained} vs {expected} | "
            f"{len(row.get('dead_letters', []))} | "
            f"{sum(v == 1 for v in hostile.values())}/{len(hostile)} | {'; '.join(other)} |")
    return "\n".join(lines)

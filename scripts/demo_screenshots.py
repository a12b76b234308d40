"""Screenshots of the dashboard DURING a demo run (``make screenshots``; docs/dashboard.md).

Runs ``mgrpo demo`` as a user does (its own process) with a shortened config (fewer
demonstrations, warm-start steps and rounds: minutes, not the demo's hour), serves its run
with ``mgrpo ui OUT/run`` (another process) once the run's store exists, and drives headless
Chromium (``tests/unit/services/cdp_pipe.py``, Debian's ``chromium``) while the demo's rounds
go on: the whole page once ``--rounds-done`` rounds are done and another one is under way,
the curves, and the trace of an episode in which the planner delegated. Then the demo is
stopped (its remaining rounds are not needed for the pictures). Writes
``demo_dashboard.png``, ``demo_curves.png``, ``demo_trace.png`` and ``demo_screenshots.json``
(what the page showed when they were taken) into ``--out-img``. A second run with the same
``--out`` reuses the warm-started models and plays the rounds again.

Usage: python scripts/demo_screenshots.py [--out runs/screenshots] [--out-img docs/img]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "services"))

# A short demo: the demo's recipe (imperfect warm start, then M-GRPO) at a smaller size.
SHORT_DEMO = {"n_train": 2000, "n_test": 200, "demos_per_agent": 400,
              "sft_steps": {"planner": 400, "searcher": 400, "coder": 60},
              "rounds": 12, "queries_per_round": 8, "k": 4, "eval_questions": 40}
ROUNDS = ("[...document.querySelectorAll('#rounds tbody tr')]"
          ".map(r => r.children[2].textContent)")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(condition, timeout: float, what: str, alive: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            raise RuntimeError(f"the demo exited ({alive.returncode}) before {what}")
        time.sleep(1)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def rounds_done(url: str) -> list[str]:
    try:
        rounds = httpx.get(f"{url}/v1/runs/demo/rounds", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return []
    return [r["status"] for r in rounds] if isinstance(rounds, list) else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "screenshots")
    parser.add_argument("--out-img", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--rounds-done", type=int, default=4,
                        help="Rounds done (and one more under way) when the page is shot.")
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args()
    from cdp_pipe import Browser, chromium_path

    if chromium_path() is None:
        sys.exit("chromium is not installed: make browser-deps")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if (out / "run").exists():  # an earlier run of this script: start the rounds afresh
        shutil.rmtree(out / "run")  # (the warm-started models in out/models are reused)
    args.out_img.mkdir(parents=True, exist_ok=True)
    (out / "short_demo.yaml").write_text(yaml.safe_dump(SHORT_DEMO))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'shared'}:{ROOT}"}
    cli = [sys.executable, "-m", "mgrpo.cli.main"]
    log = (out / "demo.log").open("w")
    t0 = time.monotonic()
    demo = subprocess.Popen([*cli, "demo", "--out", str(out), "--config",
                             str(out / "short_demo.yaml")], stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    ui = browser = None
    notes: dict = {"demo_config": SHORT_DEMO}
    try:
        run = out / "run"
        wait(lambda: (run / "store.db").exists() and (run / "metrics.csv").exists(),
             args.timeout, "the demo's run to start", demo)
        print(f"[screenshots {time.monotonic() - t0:6.0f}s] run started; serving it", flush=True)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        ui = subprocess.Popen([*cli, "ui", str(run), "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        n = args.rounds_done
        wait(lambda: (lambda s: s.count("done") >= n and s[-1] != "done")(rounds_done(url)),
             args.timeout, f"{n} rounds done and one more under way", demo)
        browser = Browser(out / "chromium-profile", width=1400, height=1500)
        browser.open(f"{url}/ui?run=demo&poll=1000")
        browser.wait_for(f"(s => s.filter(x => x === 'done').length >= {n} && "
                         f"s.some(x => x !== 'done'))({ROUNDS})", timeout=120,
                         what=f"the rounds table ({n} done, one under way)")
        browser.wait_for("document.querySelectorAll('#episodes tbody tr').length > 0",
                         what="the episodes of the last done round")
        time.sleep(1.5)  # one more poll: every chart drawn
        assert demo.poll() is None, "the demo ended before the screenshots"
        notes["dashboard"] = {"rounds": browser.evaluate(ROUNDS),
                              "seconds_into_demo": round(time.monotonic() - t0)}
        browser.screenshot(args.out_img / "demo_dashboard.png")
        browser.screenshot(args.out_img / "demo_curves.png", selector="#charts")
        notes["trace"] = open_delegating_trace(browser)
        browser.screenshot(args.out_img / "demo_trace.png", selector="#trace")
        notes["demo_running_at_last_screenshot"] = demo.poll() is None
        (args.out_img / "demo_screenshots.json").write_text(json.dumps(notes, indent=2) + "\n")
        print(json.dumps(notes), flush=True)
    finally:
        if browser is not None:
            browser.close()
        for proc in (ui, demo):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
        log.close()


def open_delegating_trace(browser) -> dict:
    """Click the episodes of the shown round, correct ones first, until one's trace has a
    sub-agent turn (the planner delegated); the first one otherwise."""
    correct = browser.evaluate("[...document.querySelectorAll('#episodes tbody tr')]"
                               ".map(r => r.children[3].textContent === '1')")
    order = sorted(range(len(correct)), key=lambda i: not correct[i])
    for i in [*order, 0]:
        browser.evaluate("document.querySelector('#trace').dataset.loaded = ''")
        browser.evaluate(f"document.querySelectorAll('#episodes tbody tr')[{i}].click()")
        loaded = browser.wait_for("document.querySelector('#trace').dataset.loaded",
                                  what="a trace")
        subs = browser.evaluate("document.querySelectorAll('#trace .turn.sub').length")
        if subs:
            break
    return {"episode": loaded, "subagent_turns": subs,
            "round": browser.evaluate("document.querySelector('#ep-round').textContent")}


if __name__ == "__main__":
    main()

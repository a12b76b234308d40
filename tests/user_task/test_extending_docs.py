"""docs/extending.md ("Your own task in 15 minutes") runs as written, in an empty folder: its
files are written (a block after ``<!-- file: PATH -->``), its bash and Python blocks run in
order, and the deploy block's ``mgrpo serve`` commands are checked against their --help (they
run until stopped). The only change: the YAML's search URL points at a local stand-in of the
search API."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from search_api import SearchAPI

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
BLOCK = re.compile(r"(?:<!-- (?P<marker>[^>]*) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```",
                   re.S)
DOC_URL = "http://127.0.0.1:8321"
FRAGMENT_CHECK = """import sys, yaml
from mgrpo.training.config import RunConfig
fragment = yaml.safe_load(sys.argv[1])
models = {m: {"path": "unused"} for m in ("planner", "web")}
RunConfig.model_validate({"plugins": ["acme_task"], "models": models, **fragment})
"""


def blocks() -> list[tuple[str, str, str]]:
    """(marker, language, body) of each fenced block of the doc, in order."""
    return [(m["marker"] or "", m["lang"], m["body"]) for m in BLOCK.finditer(DOC.read_text())]


def _run(command: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{command}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def _check_serve_options(line: str, cwd: Path, env: dict) -> None:
    words = [w for w in shlex.split(line) if "=" not in w or w.startswith("-")]
    assert words[:2] == ["mgrpo", "serve"], line
    help_text = _run([*words[:3], "--help"], cwd, env).stdout
    for option in (w for w in words[3:] if w.startswith("--")):
        assert option in help_text, f"{line}: `mgrpo serve {words[2]}` has no {option}"


def test_the_guide_runs_as_written(tmp_path):
    found = blocks()
    assert sum(1 for marker, _, _ in found if marker.startswith("file:")) == 7
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path),
                                                        os.environ.get("PYTHONPATH", "")]),
           "PATH": os.pathsep.join([bin_dir, os.environ["PATH"]]), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "MGRPO_DEBUG": ""}
    docs = tmp_path / "documents.jsonl"  # the search API's data (not part of the guide)
    docs.write_text("".join(
        f'{{"id": "{c.lower()}", "title": "{c}", "text": "The capital of {c} is {city}."}}\n'
        for c, city in (("Kelvar", "Ostra"), ("Brennia", "Holm"), ("Tazra", "Quell"),
                        ("Morvane", "Istra"), ("Dulcet", "Farrow"), ("Pellin", "Vigo"))))
    api = SearchAPI(docs)
    try:
        ran = []
        for marker, lang, body in found:
            if marker.startswith("file:"):
                path = tmp_path / marker.split(":", 1)[1].strip()
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(body.replace(DOC_URL, api.url))
            elif marker == "check: options":
                for line in body.strip().splitlines():
                    _check_serve_options(line, tmp_path, env)
            elif lang == "bash":
                ran.append(_run(["bash", "-euc", body], tmp_path, env))
            elif lang == "yaml" and not marker:  # a fragment of a run config: it validates
                _run([sys.executable, "-c", FRAGMENT_CHECK, body], tmp_path, env)
            elif lang == "python":
                ran.append(_run([sys.executable, "-c", body], tmp_path, env))
            else:
                raise AssertionError(f"a {lang} block without a marker: {body[:80]}")
        assert "wrote 6 questions" in ran[0].stdout
        assert (tmp_path / "runs/acme/run/metrics.csv").is_file()
        assert any(": ok, a run config" in done.stdout for done in ran)  # config check
        assert "accuracy" in ran[-1].stdout
    finally:
        api.close()

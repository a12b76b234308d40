"""The run folder is owned: a lock file names the live process training in it, --resume and
--overwrite refuse such a folder, and a start that fails before its first round leaves the
folder as it found it. Before, a failed start (missing model path) left metrics.csv and
tensorboard/ behind, so the corrected rerun was refused as "not empty"; --resume on a live
run's folder appended a second copy of its rounds to metrics.csv."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml
from training_testkit import run_config_dict
from typer.testing import CliRunner

from mgrpo.cli.main import app
from mgrpo.cli.run import prepare_out_dir
from mgrpo.training.config import RunConfig
from mgrpo.training.loop import run_training
from mgrpo.training.run_lock import LOCK_FILE, RunFolderInUse, live_owner, own_run_folder


def _broken(tmp_path, bench_dir, out):
    """A run config whose models do not exist: it fails after the run folder is made."""
    data = run_config_dict(tmp_path, tmp_path / "no-such-model", bench_dir)
    data["out_dir"] = str(out)
    return RunConfig.model_validate(data)


def test_a_failed_fresh_start_leaves_no_folder(tmp_path, bench_dir):
    out = tmp_path / "run"
    with pytest.raises(Exception, match="does not exist"):
        run_training(_broken(tmp_path, bench_dir, out), progress=False)
    assert not out.exists()
    config = tmp_path / "run.yaml"  # the corrected rerun is not refused as "not empty"
    config.write_text(yaml.safe_dump(_broken(tmp_path, bench_dir, out).model_dump()))
    result = CliRunner().invoke(app, ["train", "--config", str(config)])
    assert "not empty" not in result.output and "does not exist" in result.output
    assert not out.exists()


def test_a_failed_resume_puts_the_folder_back(tmp_path, bench_dir):
    out = tmp_path / "run"
    (out / "tensorboard").mkdir(parents=True)
    (out / "metrics.csv").write_text("round,key,value\n0,planner/accuracy,0.5\n")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="does not exist"):
        run_training(_broken(tmp_path, bench_dir, out), resume=True, progress=False)
    assert sorted(p.name for p in out.rglob("*")) == ["metrics.csv", "notes.txt",
                                                      "tensorboard"]
    assert (out / "metrics.csv").read_text() == "round,key,value\n0,planner/accuracy,0.5\n"


def test_the_lock_names_the_owner_while_it_trains(tmp_path):
    out = tmp_path / "run"
    with own_run_folder(out):
        owner = json.loads((out / LOCK_FILE).read_text())
        assert (owner["pid"], owner["host"]) == (os.getpid(), socket.gethostname())
    assert not (out / LOCK_FILE).exists()


def test_a_live_owner_is_refused_and_a_dead_one_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.csv").write_text("round,key,value\n")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / LOCK_FILE).write_text(json.dumps({"pid": child.pid,
                                                 "host": socket.gethostname(),
                                                 "started": 0}))
        for resume, overwrite in ((True, False), (False, True), (False, False)):
            with pytest.raises(RunFolderInUse, match=f"in use by a live run \\(pid "
                                                     f"{child.pid} on"):
                prepare_out_dir(out, resume=resume, overwrite=overwrite)
        with pytest.raises(RunFolderInUse), own_run_folder(out):
            pass
        result = CliRunner().invoke(app, ["train", "--config", str(_write(tmp_path, out)),
                                          "--overwrite"])
        assert result.exit_code == 1 and "is in use by a live run" in result.output
        assert (out / "metrics.csv").exists()  # not deleted
    finally:
        child.kill()
        child.wait()
    assert live_owner(out) is None  # its process is gone: stale
    prepare_out_dir(out, resume=True, overwrite=False)
    with own_run_folder(out):
        assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_another_hosts_lock_counts_as_live(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": 0}))
    with pytest.raises(RunFolderInUse) as caught:
        prepare_out_dir(out, resume=True, overwrite=False)
    assert str(out / LOCK_FILE) in caught.value.hint


def _write(tmp_path, out):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"models": {m: {"path": "/nowhere"} for m in
                                                 ("planner", "searcher", "coder")},
                                      "out_dir": str(out)}))
    return config

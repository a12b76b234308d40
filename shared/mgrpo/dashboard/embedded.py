"""``mgrpo ui RUN_DIR``: the planner API's dashboard over an embedded run's files.

An embedded run (``mgrpo train``/``mgrpo demo``) leaves ``store.db`` (the SQLite stats store:
rounds, metrics, group statistics, trajectories, checkpoints) and ``metrics.csv`` (also the
eval curves) in its ``out_dir``. We open that store and serve the same app as the planner
service, with no bus: every page and read endpoint works, starting a round does not (the
page hides the button). Mutating endpoints need a random token generated per process and
never shown, so the server is read-only.

What this module does NOT do: train, or write to the run's store beyond ``upgrade()``.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from mgrpo.config import Settings
from mgrpo.services.api.app import create_app
from mgrpo.services.api.deps import ApiState
from mgrpo.store import Store
from mgrpo.training.config import RunConfig
from mgrpo.training.round_spec import RoundSpec
from mgrpo.web.server import server_options


class NotARunDir(ValueError):
    pass


def ui_app(run_dir: Path):
    """The FastAPI app serving ``/ui`` for the run in ``run_dir``."""
    run_dir = Path(run_dir)
    db = run_dir / "store.db"
    if not db.is_file():
        raise NotARunDir(f"{run_dir} has no store.db: pass the out_dir of an embedded run "
                         "(e.g. runs/demo/run), where `mgrpo train` writes store.db and "
                         "metrics.csv")
    url = f"sqlite:///{db.resolve()}"
    store = Store(url)
    store.upgrade()
    runs = store.list_runs()
    stored = RoundSpec.from_stored(runs[-1].config) if runs else None
    cfg = stored.run if stored is not None else RunConfig(models={})
    settings = Settings(mode="embedded", database_url=url, api_token=secrets.token_hex(16))
    return create_app(ApiState(settings, cfg, store, bus=None, run_dir=run_dir))


def serve_ui(run_dir: Path, host: str = "127.0.0.1", port: int = 8765) -> None:
    import uvicorn

    app = ui_app(run_dir)
    print(f"dashboard: http://{host}:{port}/ui  (run {run_dir}; Ctrl-C to stop)", flush=True)
    uvicorn.run(app, **server_options(host=host, port=port, log_level="warning"))

from typer.testing import CliRunner

from mgrpo.cli.main import app
from mgrpo.store.migrate import head_revision


def test_db_upgrade_then_current(tmp_path):
    url = f"sqlite:///{tmp_path}/cli.db"
    runner = CliRunner()
    before = runner.invoke(app, ["db", "current", "--url", url])
    assert before.exit_code == 0, before.output
    assert "current: (none" in before.output
    result = runner.invoke(app, ["db", "upgrade", "--url", url])
    assert result.exit_code == 0, result.output
    head = head_revision()
    assert f"database at revision {head}" in result.output
    after = runner.invoke(app, ["db", "current", "--url", url])
    assert f"current: {head}" in after.output and f"head:    {head}" in after.output

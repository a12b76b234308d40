from typer.testing import CliRunner

from mgrpo.cli.main import app


def test_db_upgrade_then_current(tmp_path):
    url = f"sqlite:///{tmp_path}/cli.db"
    runner = CliRunner()
    before = runner.invoke(app, ["db", "current", "--url", url])
    assert before.exit_code == 0, before.output
    assert "current: (none" in before.output
    result = runner.invoke(app, ["db", "upgrade", "--url", url])
    assert result.exit_code == 0, result.output
    assert "database at revision 0001" in result.output
    after = runner.invoke(app, ["db", "current", "--url", url])
    assert "current: 0001" in after.output and "head:    0001" in after.output

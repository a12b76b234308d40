"""Settings read secrets from files in MGRPO_SECRETS_DIR (a mounted k8s Secret), env wins."""

from __future__ import annotations

from mgrpo.config import Settings


def test_secrets_come_from_files_named_like_the_env_vars(tmp_path, monkeypatch):
    (tmp_path / "MGRPO_DATABASE_URL").write_text("postgresql+psycopg://u:p@db:5432/x")
    (tmp_path / "MGRPO_API_TOKEN").write_text("file-token")
    monkeypatch.setenv("MGRPO_SECRETS_DIR", str(tmp_path))
    monkeypatch.setenv("MGRPO_API_TOKEN", "env-token")
    monkeypatch.delenv("MGRPO_DATABASE_URL", raising=False)
    settings = Settings()
    assert settings.database_url == "postgresql+psycopg://u:p@db:5432/x"
    assert settings.api_token == "env-token"  # an env var wins over a file


def test_without_a_secrets_dir_files_are_not_read(tmp_path, monkeypatch):
    (tmp_path / "MGRPO_API_TOKEN").write_text("file-token")
    monkeypatch.chdir(tmp_path)
    for name in ("MGRPO_SECRETS_DIR", "MGRPO_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    assert Settings().api_token is None

"""SERVETUNE_* settings: parsed, validated, and refused with the variable's name."""

from __future__ import annotations

import pytest

from api.settings import Settings, SettingsError


def test_values_from_the_environment() -> None:
    s = Settings.from_env({
        "SERVETUNE_DATABASE_URL": "postgresql://postgres@127.0.0.1/test",
        "SERVETUNE_MAX_UPLOAD_BYTES": "1_000_000",
        "SERVETUNE_LEASE_S": "12.5",
        "SERVETUNE_NATIVE_THREADS": "2",
        "SERVETUNE_EMBEDDED_WORKER": "false",
        "SERVETUNE_UPLOAD_DIR": "/tmp/x",
        "OTHER": "ignored",
    })  # fmt: skip
    assert s.database_url == "postgresql+psycopg://postgres@127.0.0.1/test"
    assert (s.max_upload_bytes, s.lease_s, s.native_threads) == (1_000_000, 12.5, 2)
    assert s.embedded_worker is False and s.upload_dir == "/tmp/x"
    assert Settings.from_env({}).database_url.startswith("sqlite:///")
    assert Settings.from_env({"SERVETUNE_EMBEDDED_WORKER": ""}).embedded_worker is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SERVETUNE_LEASE_S": "1"}, "SERVETUNE_LEASE_S: expected a value >= 2, got 1.0"),
        ({"SERVETUNE_NATIVE_THREADS": "0"}, "SERVETUNE_NATIVE_THREADS: expected a value >= 1"),
        ({"SERVETUNE_NATIVE_THREADS": "two"}, "SERVETUNE_NATIVE_THREADS: expected a number"),
        ({"SERVETUNE_WORKER_POLL_S": "nan"}, "SERVETUNE_WORKER_POLL_S: expected a number"),
        ({"SERVETUNE_KEY_CACHE_S": "11"}, "expected a value >= 0 and <= 10, got 11.0"),
        ({"SERVETUNE_EMBEDDED_WORKER": "maybe"}, "expected true or false, got 'maybe'"),
        ({"SERVETUNE_DATABASE_URL": "mysql://x/y"}, "back-end 'mysql' is not supported"),
        ({"SERVETUNE_DATABASE_URL": "not a url"}, "is not a database URL"),
    ],
)
def test_bad_values_name_the_variable(env: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        Settings.from_env(env)


def test_cli_reports_a_bad_setting_in_one_line(cli_db, runner, monkeypatch) -> None:
    from api.cli import app
    from api.settings import get_settings

    monkeypatch.setenv("SERVETUNE_LEASE_S", "0.5")
    get_settings.cache_clear()
    from api.cli.common import engine

    engine.cache_clear()
    out = runner.invoke(app, ["traces", "list"])
    assert out.exit_code == 2 and "error: SERVETUNE_LEASE_S: expected a value >= 2" in out.output


def test_a_retired_variable_is_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="api.settings"):
        settings = Settings.from_env({"SERVETUNE_RESPONSE_CACHE_S": "5"})
    assert settings == Settings.from_env({})
    assert "SERVETUNE_RESPONSE_CACHE_S is no longer used" in caplog.text

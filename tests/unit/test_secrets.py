"""Empty and short secrets: refused at start-up by the settings, and refused again by the comparison."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_engine import FakeEngine
from fastapi.testclient import TestClient
from helpers import make_wav, open_gate, wait_ready
from pydantic import SecretStr, ValidationError

from service.access import bearer_token, key_matches
from service.app import create_app
from service.settings import MIN_SECRET_LENGTH, GatewaySettings

LONG_ENOUGH = "x" * MIN_SECRET_LENGTH


@pytest.mark.parametrize("token", ["", "short", "x" * (MIN_SECRET_LENGTH - 1), f" {LONG_ENOUGH}"])
def test_settings_refuse_an_empty_or_short_admin_token(token: str) -> None:
    with pytest.raises(ValidationError) as raised:
        GatewaySettings(server={"admin_token": token})
    message = str(raised.value)
    assert "server.admin_token" in message
    assert ("at least 16 characters" in message) or ("whitespace" in message)
    if token.strip():
        assert token.strip() not in message  # the secret is never echoed


def test_empty_admin_token_from_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported case: `MOSS_GATEWAY_SERVER__ADMIN_TOKEN=""` used to give SecretStr('')."""
    monkeypatch.setenv("MOSS_GATEWAY_SERVER__ADMIN_TOKEN", "")
    with pytest.raises(ValidationError, match="empty"):
        GatewaySettings()
    monkeypatch.setenv("MOSS_GATEWAY_SERVER__ADMIN_TOKEN", LONG_ENOUGH)
    token = GatewaySettings().server.admin_token
    assert token is not None and token.get_secret_value() == LONG_ENOUGH


def test_settings_refuse_short_api_keys(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"access.api_keys\[1\]"):
        GatewaySettings(access={"api_keys": [LONG_ENOUGH, "k1"]})
    with pytest.raises(ValidationError, match="api_keys"):
        GatewaySettings(access={"api_keys": [""]})
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# operators\n{LONG_ENOUGH}\n\nshort-key\n")
    with pytest.raises(ValidationError, match="api_keys_file line 4") as raised:
        GatewaySettings(access={"api_keys_file": str(keys)})
    assert "short-key" not in str(raised.value)
    with pytest.raises(ValidationError, match="cannot be read"):
        GatewaySettings(access={"api_keys_file": str(tmp_path / "absent.txt")})
    keys.write_text(f"# operators\n{LONG_ENOUGH}\n")
    settings = GatewaySettings(access={"api_keys": ["y" * 40], "api_keys_file": str(keys)})
    assert settings.access.load_keys() == (b"y" * 40, LONG_ENOUGH.encode())


def test_comparison_refuses_an_empty_presented_token() -> None:
    assert bearer_token([(b"authorization", b"Bearer")]) is None
    assert bearer_token([(b"authorization", b"Bearer    ")]) is None
    assert not key_matches(b"", (b"",))
    assert not key_matches(b"", (LONG_ENOUGH.encode(),))
    assert not key_matches(None, (b"",))
    assert key_matches(LONG_ENOUGH.encode(), (b"", LONG_ENOUGH.encode()))


def _app_with_empty_admin_token(tmp_path: Path, **settings: object) -> tuple[TestClient, FakeEngine]:
    """Settings built without validation, as if an empty token had slipped past them."""
    config = GatewaySettings(state_dir=tmp_path / "state", **settings)
    config = config.model_copy(
        update={"server": config.server.model_copy(update={"admin_token": SecretStr("")})}
    )
    engine = FakeEngine()
    return TestClient(create_app(config, engine_factory=lambda _: engine, on_ready=open_gate)), engine


@pytest.mark.parametrize("authorization", ["Bearer", "Bearer ", "bearer  "])
def test_a_bare_bearer_opens_no_admin_route_even_with_an_empty_configured_token(
    tmp_path: Path, authorization: str
) -> None:
    client, _ = _app_with_empty_admin_token(tmp_path, access={"api_keys": [LONG_ENOUGH]})
    with client:
        wait_ready(client)
        headers = {"Authorization": authorization}
        for path in ("/admin/qualify", "/admin/qualification/records", "/v1/models"):
            response = client.get(path, headers=headers)
            assert response.status_code == 401, path
            assert response.json()["error"]["code"] == "unauthorized"
        assert client.get("/v1/models", headers={"Authorization": f"Bearer {LONG_ENOUGH}"}).status_code == 200


def test_a_bare_bearer_does_not_unlock_admin_only_fields(tmp_path: Path) -> None:
    client, engine = _app_with_empty_admin_token(tmp_path)
    with client:
        wait_ready(client)
        response = client.post(
            "/v1/audio/transcriptions",
            files={"file": ("a.wav", make_wav(2.0), "audio/wav")},
            data={"ignore_eos": "true", "max_completion_tokens": "20"},
            headers={"Authorization": "Bearer"},
        )
        assert response.status_code == 401
        assert engine.requests == []

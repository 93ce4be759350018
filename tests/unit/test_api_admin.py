"""Admin-only fields, evidence bundles and admin authentication on the fake engine."""

from __future__ import annotations

from fake_engine import EOS, FakeEngine
from helpers import AppFactory, make_wav

TOKEN = {"Authorization": "Bearer s3cret-admin-token"}


def transcribe(client, headers=None, **fields):
    return client.post(
        "/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(4.0), "audio/wav")}, data=fields,
        headers=headers or {},
    )


def test_ignore_eos_needs_the_admin_token(fake_client: AppFactory) -> None:
    client, engine = fake_client(server={"admin_token": "s3cret-admin-token"})
    refused = transcribe(client, ignore_eos="true")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
    assert engine.requests == []
    allowed = transcribe(client, headers=TOKEN, ignore_eos="true", max_completion_tokens="20")
    assert allowed.status_code == 200
    assert engine.requests[0].ignore_eos is True


def test_admin_routes_refuse_without_or_with_wrong_token(fake_client: AppFactory) -> None:
    client, _ = fake_client(server={"admin_token": "s3cret-admin-token"})
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic s3cret-admin-token"}):
        for method, path in (("post", "/admin/qualify"), ("get", "/admin/qualify"),
                             ("get", "/admin/qualification/records"), ("get", "/admin/evidence/trsc-" + "0" * 32)):
            response = getattr(client, method)(path, headers=headers)
            assert response.status_code == 401, (path, headers)
            assert response.headers["www-authenticate"] == "Bearer"


def test_admin_routes_are_off_without_a_configured_token(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    response = client.get("/admin/qualify", headers={"Authorization": "Bearer anything"})
    assert response.status_code == 401
    assert "ADMIN_TOKEN" in response.json()["error"]["message"]


def test_evidence_bundle_is_kept_and_served(fake_client: AppFactory) -> None:
    client, _ = fake_client(FakeEngine(), server={"admin_token": "s3cret-admin-token"}, evidence={"checkpoint_every_tokens": 16})
    response = transcribe(client, headers=TOKEN, capture_evidence="true", response_format="verbose_json")
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    bundle = client.get(f"/admin/evidence/{request_id}", headers=TOKEN).json()
    assert bundle["token_ids"][-1] == EOS
    assert bundle["stop"]["stop"] == "eos"
    assert bundle["last_64"]["token_ids"] == bundle["token_ids"][-64:]
    assert bundle["budget"]["max_tokens"] == response.json()["moss"]["budget"]["max_tokens"]
    counts = [c["generated_tokens"] for c in bundle["checkpoints"]]
    assert counts == sorted(counts) and counts[0] >= 16 and counts[-1] == len(bundle["token_ids"])
    assert client.get(f"/admin/evidence/{request_id}").status_code == 401


def test_evidence_of_unknown_or_malformed_request_is_404(fake_client: AppFactory) -> None:
    client, _ = fake_client(server={"admin_token": "s3cret-admin-token"})
    assert client.get("/admin/evidence/trsc-" + "a" * 32, headers=TOKEN).status_code == 404
    assert client.get("/admin/evidence/..%2F..%2Fsecret", headers=TOKEN).status_code == 404


def test_backend_route_is_public_and_says_the_state(fake_client: AppFactory) -> None:
    client, _ = fake_client(qualified=False)
    body = client.get("/v1/backend").json()
    assert body["qualification"]["qualified"] is False
    assert body["qualification"]["policy"] == "explainable"
    assert "not been qualified" in body["qualification"]["reason"]

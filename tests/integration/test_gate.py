"""The qualification gate on the real engine and the real Transformers reference."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from gateway_process import ADMIN_TOKEN, GatewayProcess
from prometheus_client.parser import text_string_to_metric_families

from qualification.clip import FROZEN_CLIP_PATH, FROZEN_CLIP_SHA256


def test_fresh_gateway_refuses_with_503_and_says_how_to_qualify(qualified_gateway: GatewayProcess) -> None:
    before = qualified_gateway.before_qualification
    assert before, "the session gateway was already qualified before the test could see it fresh"
    assert before["transcription_status"] == 503
    error = before["transcription_body"]["error"]
    assert error["code"] == "backend_not_qualified"
    assert "moss-gateway qualify" in error["message"]
    assert before["ready_status"] == 503
    assert any("not qualified" in reason for reason in before["ready_body"]["reasons"])
    assert before["backend"]["qualification"]["qualified"] is False
    assert len(before["backend"]["fingerprint"]) == 64


def test_qualify_opens_the_gate_and_records_both_runs(qualified_gateway: GatewayProcess) -> None:
    summary = qualified_gateway.before_qualification["summary"]
    assert summary["result"] == "identical", summary
    assert summary["batched_result"] == "identical"
    assert summary["first_divergence"] is None
    assert (summary["near_ties"], summary["batched_near_ties"]) == (0, 0)
    assert summary["largest_margin_used"] == 0.0
    assert "reference:" in qualified_gateway.before_qualification["qualify_stderr"]  # progress was visible
    with qualified_gateway.client() as client:
        backend = client.get("/v1/backend").json()
        assert backend["qualification"]["qualified"] is True
        assert backend["qualification"]["qualification_id"] == summary["qualification_id"]
        assert client.get("/ready").status_code == 200
    record = json.loads(Path(summary["path"]).read_text())
    assert record["fingerprint"] == backend["fingerprint"]
    assert record["clip"]["sha256"] == FROZEN_CLIP_SHA256
    assert record["reference"]["token_ids"] == record["candidate"]["token_ids"]
    assert record["prompt"]["engine_token_ids_match"] is True  # the engine read the reference's prompt IDs
    assert record["verdict"]["near_tie_logprob_margin"] > 0
    assert record["reference"]["stop"] == record["candidate"]["stop"] == "eos"
    assert record["batched"]["batch_size"] == 8
    assert record["batched"]["clip_run"]["token_ids"] == record["reference"]["token_ids"]
    assert len(record["batched"]["companion_generated_tokens"]) == 7
    assert record["reference"]["identity"]["transformers"]
    assert record["comparison"]["label"] == "diagnostic (CPU)"
    comparison = record["comparison"]
    assert comparison["reference"]["peak_rss_bytes"] > 0 and comparison["candidate"]["peak_rss_bytes"] > 0
    assert comparison["reference"]["prompt_tokens"] == comparison["candidate"]["prompt_tokens"]  # same prompt
    assert comparison["candidate"]["load_s"] > 0


def test_backend_identity_names_the_running_engine(qualified_gateway: GatewayProcess) -> None:
    with qualified_gateway.client() as client:
        backend = client.get("/v1/backend").json()
        metrics = client.get("/metrics").text
    identity = backend["identity"]
    assert identity["runtime"]["vllm"]["version"] == "0.32.0"
    assert len(identity["runtime"]["vllm"]["record_sha256"]) == 64
    assert identity["runtime"]["torch"]["version"].startswith("2.13.0")
    assert identity["runtime"]["accelerator"]["kind"] == "cpu"
    assert identity["engine"]["attention_backends"] and identity["engine"]["attention_backends"] != ["unknown"]
    assert identity["engine"]["max_model_len"] == 2048
    assert identity["checkpoint"]["weights"] and all(len(h) == 64 for h in identity["checkpoint"]["weights"].values())
    assert "processing_moss_transcribe_diarize.py" in identity["checkpoint"]["remote_code"]
    assert identity["prompt"]["template_sha256"]
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    info = families["moss_gateway_backend_info"].samples[0]
    assert info.labels["fingerprint"] == backend["fingerprint"]
    assert families["moss_gateway_backend_qualified"].samples[0].value == 1


def test_every_response_carries_the_fingerprint(qualified_gateway: GatewayProcess) -> None:
    with qualified_gateway.client() as client:
        fingerprint = client.get("/v1/backend").json()["fingerprint"]
        response = client.post(
            "/v1/audio/transcriptions", files={"file": ("clip.wav", FROZEN_CLIP_PATH.read_bytes(), "audio/wav")},
        )
    assert response.status_code == 200, response.text
    assert response.headers["x-moss-backend-fingerprint"] == fingerprint
    assert response.json()["backend"]["fingerprint"] == fingerprint


def test_admin_endpoints_refuse_without_the_token(gateway: GatewayProcess) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = httpx.post(f"{gateway.url}/admin/qualify", headers=headers, timeout=30)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthorized"
    ok = httpx.get(f"{gateway.url}/admin/qualify", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
    assert ok.status_code == 200

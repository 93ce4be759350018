"""What closes the gate again: a changed identity, an altered record, a diverging engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gateway_process import GatewayProcess, gateway_env, run_cli

from qualification.records import RecordStore


def test_a_changed_identity_setting_closes_the_gate(qualified_gateway: GatewayProcess, tmp_path: Path) -> None:
    with qualified_gateway.client() as client:
        qualified_fingerprint = client.get("/v1/backend").json()["fingerprint"]
    env = dict(qualified_gateway.env, MOSS_GATEWAY_ENGINE__MAX_NUM_SEQS="8")  # same state dir, one setting changed
    second = GatewayProcess(env=env, log_path=tmp_path / "second.log").start()
    try:
        second.wait_engine()
        with second.client() as client:
            backend = client.get("/v1/backend").json()
            ready = client.get("/ready")
            refused = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"RIFF", "audio/wav")})
    finally:
        second.stop()
    assert backend["fingerprint"] != qualified_fingerprint
    assert backend["identity"]["engine"]["max_num_seqs"] == 8
    assert backend["qualification"]["qualified"] is False
    assert "no passing qualification record" in backend["qualification"]["reason"]
    assert ready.status_code == 503
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "backend_not_qualified"


def test_an_altered_real_record_no_longer_opens_the_gate(qualified_gateway: GatewayProcess, tmp_path: Path) -> None:
    summary = qualified_gateway.before_qualification["summary"]
    state = Path(qualified_gateway.env["MOSS_GATEWAY_STATE_DIR"]) / "qualification"
    copy = tmp_path / "qualification"
    shutil.copytree(state, copy)
    store = RecordStore(copy)
    assert store.passing_for(summary["fingerprint"], policy="explainable")[0] is not None
    record_path = copy / "records" / f"{summary['qualification_id']}.json"
    record = json.loads(record_path.read_text())
    record["candidate"]["token_ids"][0] += 1  # forge the engine's output
    record_path.write_text(json.dumps(record))
    found, notes = store.passing_for(summary["fingerprint"], policy="explainable")
    assert found is None
    assert any("seal mismatch" in note for note in notes)


def test_a_diverging_engine_fails_with_the_divergence_reported(qualified_gateway: GatewayProcess, tmp_path: Path) -> None:
    """Standalone qualify: the engine serves a perturbed copy, the reference loads the pristine checkpoint."""
    from safetensors.torch import load_file, save_file

    from service.checkpoint import ensure_tiny_checkpoint

    pristine = ensure_tiny_checkpoint()
    perturbed = tmp_path / "perturbed"
    shutil.copytree(pristine, perturbed)
    for weights in perturbed.glob("*.safetensors"):
        tensors = load_file(weights)
        name = next(n for n in tensors if n.endswith("language_model.norm.weight"))
        tensors[name] = -tensors[name]  # reverses every logit's order: greedy picks change at once
        save_file({k: v.contiguous() for k, v in tensors.items()}, weights, metadata={"format": "pt"})
    env = gateway_env(
        tmp_path / "standalone",
        MOSS_GATEWAY_ENGINE__MODEL=str(perturbed),
        MOSS_GATEWAY_QUALIFICATION__REFERENCE_MODEL=str(pristine),
        MOSS_GATEWAY_QUALIFICATION__BATCH_SIZE="2",
        MOSS_GATEWAY_AUDIO__MAX_DURATION_S="120",
        MOSS_GATEWAY_ENGINE__DTYPE="float32",
        MOSS_GATEWAY_ENGINE__ENFORCE_EAGER="true",
    )
    result = run_cli("qualify", "--standalone", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.lstrip().startswith("{"), result.stderr[-9000:]
    summary = json.loads(result.stdout)
    assert summary["result"] == "failed"
    divergence = summary["first_divergence"]
    assert divergence["position"] == 0
    assert divergence["reference_token_id"] != divergence["candidate_token_id"]
    assert divergence["reference_margin"] > summary["near_tie_logprob_margin"]  # nats, teacher-forced
    assert divergence["reference_top_id"] == divergence["reference_token_id"]
    assert summary["fingerprint"] != qualified_gateway.before_qualification["summary"]["fingerprint"]

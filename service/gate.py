"""The qualification gate: identity at start-up, records, qualification jobs.

At start-up (once the engine is ready) the running backend's identity is
resolved and fingerprinted; the gate opens only on a sealed, passing record for
that fingerprint. Qualification runs in the gateway (admin endpoint, or at
start-up when configured), one at a time, and opens the gate when it passes.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from qualification.clip import FROZEN_CLIP_PATH
from qualification.records import RecordStore, fingerprint_of
from qualification.runner import qualify
from service.identity import rank_identity, resolve_identity
from service.settings import GatewaySettings
from service.state import GatewayState

logger = logging.getLogger(__name__)


def record_store_for(settings: GatewaySettings) -> RecordStore:
    """The qualification records and their sealing key (checked here: `RecordKeyError` if untrusted)."""
    return RecordStore(settings.state_dir / "qualification", key_path=settings.qualification.record_key_path)


def record_store(state: GatewayState) -> RecordStore:
    return record_store_for(state.settings)


async def resolve_backend_identity(state: GatewayState) -> None:
    """Fill `state.identity` and the gate's fingerprint from the running engine."""
    engine = state.engine
    assert engine is not None
    description = dict(engine.describe())
    description["attention_backends"] = await engine.attention_backends()
    # Which devices serve, per data-parallel rank (a GPU's UUID stays out: see `identity.rank_identity`).
    description["ranks"] = rank_identity(await engine.rank_devices())
    model_dir = Path(engine.model_dir)
    identity = await asyncio.to_thread(
        resolve_identity, engine_description=description, model_dir=model_dir, revision=state.settings.engine.revision
    )
    state.identity = identity
    state.gate.fingerprint = fingerprint_of(identity)
    flat = {
        "fingerprint": state.gate.fingerprint,
        "gateway_version": identity["gateway"]["version"],
        "git_revision": identity["gateway"]["git_revision"],
        "vllm": str(identity["runtime"]["vllm"].get("version")),
        "torch": identity["runtime"]["torch"]["version"],
        "accelerator": str(identity["runtime"]["accelerator"].get("name")),
        "arch": str(identity["runtime"]["accelerator"].get("arch")),
        "dtype": str(description.get("dtype")),
        "kv_cache_dtype": str(description.get("kv_cache_dtype")),
        "attention_backend": ",".join(description.get("attention_backends", [])),
    }
    state.metrics.backend.info(flat)
    logger.info("backend fingerprint %s", state.gate.fingerprint)


def apply_records(state: GatewayState) -> bool:
    """Open the gate if a sealed passing record matches the running fingerprint."""
    fingerprint = state.gate.fingerprint
    if fingerprint is None:
        state.gate.open = False
        state.gate.reason = "the backend identity is not resolved yet"
        return False
    record, notes = record_store(state).passing_for(fingerprint, policy=state.settings.qualification.policy)
    if record is None:
        state.gate.open = False
        refused = f" ({'; '.join(notes)})" if notes else ""
        state.gate.reason = f"no passing qualification record for fingerprint {fingerprint[:16]}…{refused}"
        state.metrics.qualified.set(0)
        return False
    state.gate.open = True
    state.gate.qualification_id = record["qualification_id"]
    state.gate.verdict = record["verdict"]["result"]
    state.gate.reason = f"qualified by {record['qualification_id']} ({record['verdict']['result']})"
    state.metrics.qualified.set(1)
    return True


async def run_qualification(state: GatewayState, *, clip: Path | None = None) -> dict[str, Any]:
    """Qualify the serving engine now; one at a time per gateway."""

    async with state.qualification_lock:
        engine = state.engine
        if engine is None or state.gate.fingerprint is None:
            raise RuntimeError("the engine is not ready")

        def progress(message: str) -> None:
            state.gate.progress = message
            logger.info("qualify: %s", message)

        record = await qualify(
            engine=engine,
            identity=state.identity,
            fingerprint=state.gate.fingerprint,
            model_dir=Path(engine.model_dir),
            state_dir=state.settings.state_dir,
            settings=state.settings.qualification,
            clip_path=clip or FROZEN_CLIP_PATH,
            engine_load_s=engine.load_time_s,
            progress=progress,
        )
        apply_records(state)
        verdict = record["verdict"]
        progress(
            f"done: {record['qualification_id']} {verdict['result']} (batched {verdict['batched_result']}), "
            f"gate {'open' if state.gate.open else 'closed'}"
        )
        return record


async def open_gate_from_records(state: GatewayState) -> None:
    """The app's on-ready hook: identity, records, and qualification on start if configured."""
    await resolve_backend_identity(state)
    if apply_records(state):
        logger.info("gate open: %s", state.gate.reason)
        return
    logger.warning("gate closed: %s", state.gate.reason)
    if state.settings.should_qualify_on_start:
        logger.info("qualifying the backend at start-up")
        record = await run_qualification(state)
        logger.info(
            "start-up qualification %s: %s; gate %s",
            record["qualification_id"], record["verdict"]["result"], "open" if state.gate.open else "closed",
        )

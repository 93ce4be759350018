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
from service.engine.protocol import TranscriptionEngine
from service.identity import rank_identity, resolve_identity
from service.qualification_board import QualificationBoard
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
    state.metrics.set_backend(flat)
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


class QualificationBusy(RuntimeError):
    """Another process of this service is qualifying now."""


def qualification_board(state: GatewayState) -> QualificationBoard:
    return QualificationBoard(state.settings.state_dir / "qualification")


def records_signature(store: RecordStore) -> tuple[int, int]:
    """Changes whenever a record is added, replaced or removed (the records folder's mtime and entry count)."""
    try:
        info = store.records_dir.stat()
        return info.st_mtime_ns, sum(1 for _ in store.records_dir.iterdir())
    except OSError:
        return 0, 0


def refresh_gate(state: GatewayState) -> bool:
    """Re-read the records when another process changed them (several front ends share one state directory).

    Cheap when nothing changed (one stat and one listing); a new passing
    record opens the gate here, a removed one closes it. Returns whether the
    gate is open. A gateway of one process owns its records and its gate, and
    reads them only at start-up and after its own qualifications.
    """
    if state.frontend is None:
        return state.gate.open
    signature = records_signature(record_store(state))
    if signature != state.gate.records_signature and state.gate.fingerprint is not None:
        apply_records(state)
        state.gate.records_signature = signature
    return state.gate.open


async def run_qualification(state: GatewayState, *, clip: Path | None = None) -> dict[str, Any]:
    """Qualify the serving engine now; one at a time per state directory (`QualificationBusy` otherwise)."""

    board = qualification_board(state)
    async with state.qualification_lock:
        engine = state.engine
        if engine is None or state.gate.fingerprint is None:
            raise RuntimeError("the engine is not ready")
        with board.claim() as claimed:
            if not claimed:
                raise QualificationBusy("another process of this gateway is qualifying the backend now")
            return await _qualify_claimed(state, engine, state.gate.fingerprint, board, clip)


async def _qualify_claimed(
    state: GatewayState, engine: TranscriptionEngine, fingerprint: str, board: QualificationBoard, clip: Path | None
) -> dict[str, Any]:
    """The qualification itself, its progress published on the board for every process to read."""

    def progress(message: str) -> None:
        state.gate.progress = message
        board.publish(running=True, progress=message, last=None)
        logger.info("qualify: %s", message)

    try:
        record = await qualify(
            engine=engine,
            identity=state.identity,
            fingerprint=fingerprint,
            model_dir=Path(engine.model_dir),
            state_dir=state.settings.state_dir,
            settings=state.settings.qualification,
            clip_path=clip or FROZEN_CLIP_PATH,
            engine_load_s=engine.load_time_s,
            progress=progress,
        )
    except Exception as exc:
        state.gate.progress = f"failed: {type(exc).__name__}: {exc}"
        board.publish(running=False, progress=state.gate.progress, last={"error": f"{type(exc).__name__}: {exc}"})
        raise
    apply_records(state)
    state.gate.records_signature = records_signature(record_store(state))
    verdict = record["verdict"]
    state.gate.progress = (
        f"done: {record['qualification_id']} {verdict['result']} (batched {verdict['batched_result']}), "
        f"gate {'open' if state.gate.open else 'closed'}"
    )
    logger.info("qualify: %s", state.gate.progress)
    board.publish(running=False, progress=state.gate.progress, last=record_summary(record))
    return record


def record_summary(record: dict[str, Any]) -> dict[str, Any]:
    """What `GET /admin/qualify` and the qualify command show of a finished record."""
    verdict = record["verdict"]
    return {
        "qualification_id": record["qualification_id"],
        "fingerprint": record["fingerprint"],
        "result": verdict["result"],
        "passed": verdict["passed"],
        "batched_result": verdict["batched_result"],
        "batched_passed": verdict["batched_passed"],
        "explanation": verdict["evidence"]["explanation"],
        "first_divergence": verdict["evidence"]["first_divergence"],
        "near_tie_logprob_margin": verdict.get("near_tie_logprob_margin"),
        "near_ties": verdict.get("near_ties"),
        "largest_margin_used": verdict.get("largest_margin_used"),
        "batched_near_ties": verdict.get("batched_near_ties"),
        "batched_largest_margin_used": verdict.get("batched_largest_margin_used"),
        "comparison": record["comparison"],
        "path": record.get("path"),
    }


async def open_gate_from_records(state: GatewayState) -> None:
    """The app's on-ready hook: identity, records, and qualification on start if configured.

    With several front-end processes only the first qualifies at start-up; the
    others open their gate when its record appears (`refresh_gate`).
    """
    await resolve_backend_identity(state)
    state.gate.records_signature = records_signature(record_store(state))
    if apply_records(state):
        logger.info("gate open: %s", state.gate.reason)
        return
    logger.warning("gate closed: %s", state.gate.reason)
    if state.settings.should_qualify_on_start and (state.frontend is None or state.frontend.index == 0):
        logger.info("qualifying the backend at start-up")
        record = await run_qualification(state)
        logger.info(
            "start-up qualification %s: %s; gate %s",
            record["qualification_id"], record["verdict"]["result"], "open" if state.gate.open else "closed",
        )

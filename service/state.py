"""What one running app holds: settings, engine, gate, metrics, ledgers.

Created by the app factory and owned by the lifespan; there is no module-level
mutable state, so two apps (e.g. in tests) never share anything.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from service.admission import AdmissionController
from service.engine.protocol import TranscriptionEngine
from service.errors import ErrorCode, GatewayError
from service.ledger import JsonLinesLedger
from service.metrics import GatewayMetrics
from service.settings import GatewaySettings


class EngineStatus(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    DEAD = "dead"
    STOPPING = "stopping"


@dataclass(frozen=True)
class BackendTag:
    """Which backend produced an answer: on every response, event and ledger line."""

    fingerprint: str | None
    qualification_id: str | None

    def as_dict(self) -> dict[str, str | None]:
        return {"fingerprint": self.fingerprint, "qualification_id": self.qualification_id}


@dataclass
class GateStatus:
    """Whether transcription is allowed, and why (filled by the qualification gate)."""

    open: bool = False
    reason: str = "the backend has not been qualified yet"
    fingerprint: str | None = None
    qualification_id: str | None = None
    verdict: str | None = None
    progress: str | None = None

    def tag(self) -> BackendTag:
        return BackendTag(self.fingerprint, self.qualification_id)


@dataclass
class GatewayState:
    settings: GatewaySettings
    model_name: str
    metrics: GatewayMetrics
    request_ledger: JsonLinesLedger
    admission: AdmissionController
    engine: TranscriptionEngine | None = None
    engine_status: EngineStatus = EngineStatus.STARTING
    engine_error: str | None = None
    gate: GateStatus = field(default_factory=GateStatus)
    identity: dict[str, Any] = field(default_factory=dict)
    background: set[Any] = field(default_factory=set)
    qualification_task: asyncio.Task[None] | None = None
    last_qualification: dict[str, Any] | None = None
    qualification_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    engine_starts: int = 0

    def mark_engine_dead(self, reason: str) -> None:
        """The engine cannot serve: /ready turns false and new requests get 503 at once."""
        if self.engine_status is EngineStatus.READY:
            self.engine_status = EngineStatus.DEAD
            self.engine_error = reason
            self.metrics.engine_ready.set(0)

    def require_engine(self) -> TranscriptionEngine:
        """The engine, or a 503 that says why it cannot serve."""
        if self.engine_status is not EngineStatus.READY or self.engine is None:
            detail = f": {self.engine_error}" if self.engine_error else ""
            raise GatewayError(
                ErrorCode.ENGINE_NOT_READY,
                f"The engine is {self.engine_status.value}{detail}. Retry when GET /ready answers 200.",
                headers={"Retry-After": str(self.settings.limits.retry_after_s)},
            )
        return self.engine

    def require_qualified(self) -> None:
        """Refuse transcription until the running backend holds a passing qualification."""
        if not self.gate.open:
            raise GatewayError(
                ErrorCode.BACKEND_NOT_QUALIFIED,
                f"The backend is not qualified: {self.gate.reason}. Qualify it with `moss-gateway qualify` "
                f"(or start the gateway with MOSS_GATEWAY_QUALIFICATION__QUALIFY_ON_START=true); "
                f"GET /v1/backend shows the identity and state.",
                headers={"Retry-After": "30"},
            )

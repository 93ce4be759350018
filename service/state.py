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
    #: The records folder as last read (`gate.refresh_gate` re-reads it when another process changed it).
    records_signature: tuple[int, int] | None = None

    def tag(self) -> BackendTag:
        return BackendTag(self.fingerprint, self.qualification_id)


@dataclass(frozen=True)
class FrontendPosition:
    """This process as one of `count` front-end processes of one service (service/frontends.py)."""

    index: int
    count: int
    #: torch's intra-op threads here (`server.frontend_torch_threads`, read back from torch once it is set).
    torch_threads: int


@dataclass
class GatewayState:
    settings: GatewaySettings
    model_name: str
    metrics: GatewayMetrics
    request_ledger: JsonLinesLedger
    admission: AdmissionController
    engine: TranscriptionEngine | None = None
    #: None when this process is the whole front end.
    frontend: FrontendPosition | None = None
    engine_status: EngineStatus = EngineStatus.STARTING
    engine_error: str | None = None
    gate: GateStatus = field(default_factory=GateStatus)
    identity: dict[str, Any] = field(default_factory=dict)
    background: set[Any] = field(default_factory=set)
    qualification_task: asyncio.Task[None] | None = None
    last_qualification: dict[str, Any] | None = None
    qualification_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    engine_starts: int = 0
    #: Consecutive engine failures: failed starts, and engines that died before passing a health probe.
    engine_failures: int = 0
    #: The engine has passed a health probe since its last start (a later death then starts a new count).
    engine_proven: bool = False
    #: Set as soon as the process is told to stop (the signal, before uvicorn's drain): from then on the
    #: engine stopping is expected, never a death to log or to restart from.
    shutting_down: bool = False

    def begin_shutdown(self) -> None:
        """The gateway is stopping (safe to call from a signal handler: it only sets a flag)."""
        self.shutting_down = True

    def note_engine_failure(self, reason: str) -> None:
        """Count a failed start or a death; a death after a passed probe starts the count anew."""
        self.engine_failures = 1 if self.engine_proven else self.engine_failures + 1
        self.engine_proven = False
        self.engine_error = reason

    def note_engine_healthy(self) -> None:
        """The engine passed a health probe: it is proven, and the failure count starts over."""
        self.engine_proven = True
        self.engine_failures = 0

    def liveness_problem(self) -> str | None:
        """Why this replica cannot recover by itself (then /health answers 503), or None.

        Either the engine failed `lifecycle.restart_max_attempts` times in a row,
        or it is down and restarting is switched off. An orchestrator should then
        replace the replica; restarting the engine in place did not help.
        """
        lifecycle = self.settings.lifecycle
        down = self.engine_status in (EngineStatus.FAILED, EngineStatus.DEAD)
        if not lifecycle.restart_engine and down:
            return f"the engine is {self.engine_status.value} and lifecycle.restart_engine is off: {self.engine_error}"
        if self.engine_failures >= lifecycle.restart_max_attempts:
            return (
                f"the engine failed {self.engine_failures} consecutive times "
                f"(lifecycle.restart_max_attempts={lifecycle.restart_max_attempts}); last: {self.engine_error}"
            )
        return None

    def mark_engine_dead(self, reason: str) -> None:
        """The engine cannot serve: /ready turns false and new requests get 503 at once.

        Not while the gateway is stopping: the engine then stops on purpose.
        """
        if self.engine_status is EngineStatus.READY and not self.shutting_down:
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

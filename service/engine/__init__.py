"""Engines behind the small `TranscriptionEngine` protocol."""

from service.engine.protocol import (
    EngineDeadError,
    EngineTimings,
    GenerationRequest,
    GenerationUpdate,
    TranscriptionEngine,
)

__all__ = ["EngineDeadError", "EngineTimings", "GenerationRequest", "GenerationUpdate", "TranscriptionEngine"]

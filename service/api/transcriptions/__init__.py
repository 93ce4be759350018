"""POST /v1/audio/transcriptions."""

"""OpenAI-compatible transcription gateway for MOSS-Transcribe-Diarize.

Nothing heavy is imported here: the engine, torch and vLLM load only when the
app's lifespan starts, so `import service` stays cheap for the CLI and tests.
"""

__version__ = "0.1.0"

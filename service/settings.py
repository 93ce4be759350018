"""One settings model for the whole gateway.

Every field can be set from the environment with the `MOSS_GATEWAY_` prefix and
`__` between nested names (`MOSS_GATEWAY_ENGINE__MAX_MODEL_LEN=131072`); the CLI
builds on the same model. Cross-field rules are checked at start-up so a
misconfigured gateway refuses to start instead of failing on the first request.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Audio tokens per second of input (16 kHz, hop 160, encoder stride 2, merge 4).
AUDIO_TOKENS_PER_SECOND = 12.5
#: The model's own single-pass limit (upstream): 90 minutes.
NATIVE_MAX_DURATION_S = 90 * 60.0
#: Default input limit for the embedded tiny checkpoint, sized for a CPU engine.
EMBEDDED_MAX_DURATION_S = 120.0
#: Shortest admin token or API key accepted. An empty token (`ADMIN_TOKEN=""`) would otherwise be a token
#: that a bare `Authorization: Bearer` matches, and a short one can be guessed; 16 characters of
#: `openssl rand -hex 32` output or similar are the floor, not the recommendation (use 32 or more).
MIN_SECRET_LENGTH = 16


def check_secret(value: str, what: str) -> str:
    """Refuse a secret that is too short or padded with whitespace (a header never carries the padding).

    The message names the setting, never the value.
    """
    if value != value.strip():
        raise ValueError(f"{what} has leading or trailing whitespace; remove it")
    if len(value) < MIN_SECRET_LENGTH:
        raise ValueError(
            f"{what} is {'empty' if not value else f'{len(value)} characters'}: it must be at least "
            f"{MIN_SECRET_LENGTH} characters (e.g. `openssl rand -hex 32`), or unset"
        )
    return value

#: Parity's near-tie margin (nats), derived from measured BF16-against-float32 noise of the
#: reference (qualification/calibration/, README "The qualification gate").
DEFAULT_NEAR_TIE_LOGPROB_MARGIN = 1.15


class ServerSettings(BaseModel):
    """HTTP front: what one client may hold of the server (see service/server.py and docs/operations.md)."""

    model_config = ConfigDict(hide_input_in_errors=True)  # never echo a refused admin token

    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to bind.")
    admin_token: SecretStr | None = Field(
        None,
        description=(
            f"Bearer token for /admin/* routes, at least {MIN_SECRET_LENGTH} characters. "
            "Unset: admin routes refuse everything."
        ),
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    max_body_bytes: int = Field(
        1024 * 1024,
        gt=0,
        description=(
            "Body cap of every route that takes no audio (audio routes: audio.max_upload_bytes); "
            "enforced while the body streams in."
        ),
    )
    max_header_bytes: int = Field(
        64 * 1024, ge=1024, description="Request line plus headers; beyond it the connection gets 400 and is closed."
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="Time for a request's line and headers to arrive, from connect or the last response."
    )
    keep_alive_timeout_s: int = Field(5, ge=1, description="An idle keep-alive connection is closed after this long.")
    body_timeout_s: float = Field(600.0, gt=0, description="Time for a whole request body to arrive; beyond it, 408.")
    body_idle_timeout_s: float = Field(
        30.0, gt=0, description="Longest silence while a request body arrives (also the grace before the rate check)."
    )
    body_min_rate_bytes_s: int = Field(
        16 * 1024, ge=0, description="Slowest average body rate accepted once body_idle_timeout_s has passed (0: off)."
    )
    max_connections: int = Field(
        512, gt=0, description="Open connections (and running requests) served at once; a request beyond them gets 503."
    )
    backlog: int = Field(2048, gt=0, description="Connections the kernel queues before they are accepted.")
    api_processes: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "HTTP front-end processes on one engine core (vLLM's own `--api-server-count` mechanism): each parses, "
            "decodes and renders on its own CPU core; admission, /metrics, the gate and the ledger stay one "
            "(service/frontends.py). 1: the engine runs in the gateway's process."
        ),
    )
    frontend_torch_threads: int = Field(
        1,
        ge=1,
        le=256,
        description=(
            "torch's intra-op threads in each front-end process (with api_processes > 1). A front end's torch work "
            "is feature extraction, which the renderer already runs in engine.renderer_num_workers threads, one "
            "request each; every one of those threads would otherwise get its own team of one thread per CPU, "
            "in every front end."
        ),
    )

    @field_validator("admin_token")
    @classmethod
    def _admin_token_is_long(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None:
            check_secret(token.get_secret_value(), "server.admin_token (MOSS_GATEWAY_SERVER__ADMIN_TOKEN)")
        return token


class AccessSettings(BaseModel):
    """Who may call what. Secrets never appear in logs, /v1/backend or error bodies."""

    model_config = ConfigDict(hide_input_in_errors=True)  # never echo a refused key

    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description=(
            f"Bearer keys accepted on /v1/*, each at least {MIN_SECRET_LENGTH} characters. "
            "Empty (and no file): /v1/* is open."
        ),
    )
    api_keys_file: Path | None = Field(
        None, description="A file of API keys, one per line ('#' comments), same length rule; read at start-up."
    )
    protect_health: bool = Field(False, description="Require an API key on /health and /ready.")
    protect_metrics: bool = Field(False, description="Require an API key on /metrics.")

    @model_validator(mode="after")
    def _keys_are_long(self) -> AccessSettings:
        """Read the keys once here so that a short key (or an unreadable file) stops the start-up."""
        self.load_keys()
        return self

    def load_keys(self) -> tuple[bytes, ...]:
        """Every configured key; raises ValueError on one shorter than MIN_SECRET_LENGTH."""
        keys = [
            check_secret(key.get_secret_value(), f"access.api_keys[{index}]")
            for index, key in enumerate(self.api_keys)
        ]
        if self.api_keys_file is not None:
            try:
                lines = self.api_keys_file.read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ValueError(f"access.api_keys_file cannot be read: {exc.strerror}") from exc
            for number, line in enumerate(lines, 1):
                line = line.strip()
                if line and not line.startswith("#"):
                    keys.append(check_secret(line, f"access.api_keys_file line {number}"))
        return tuple(key.encode() for key in keys)


class LimitsSettings(BaseModel):
    """Backpressure: what the gateway takes on at once, and how long a request may run."""

    max_concurrent_requests: int | None = Field(
        None, gt=0, description="Transcriptions decoding or generating at once. Unset: engine.max_num_seqs."
    )
    max_queued_requests: int = Field(64, ge=0, description="Transcriptions waiting for a slot; beyond it, 429.")
    queue_timeout_s: float = Field(300.0, gt=0, description="Longest wait for a slot before 429.")
    request_timeout_s: float = Field(7200.0, gt=0, description="Longest a transcription may run before it is aborted.")
    retry_after_s: int = Field(5, gt=0, description="Retry-After sent with 429 and 503.")
    sse_keepalive_s: float = Field(15.0, gt=0, description="A quiet stream sends an SSE comment this often (proxies keep it open).")
    sse_send_timeout_s: float = Field(
        30.0, gt=0, description="A stream whose reader takes no event for this long is dropped (ledger status 499)."
    )


class LifecycleSettings(BaseModel):
    """Engine supervision and shutdown.

    A dead engine (or one that failed to start) is restarted after a delay that
    doubles with each consecutive failure, from `restart_initial_delay_s` up to
    `restart_max_delay_s`. After `restart_max_attempts` consecutive failures
    /health answers 503 so that an orchestrator replaces the replica (the
    supervisor keeps trying meanwhile). Probes are bounded: a hung engine must
    not hang /ready or the supervisor.
    """

    health_check_interval_s: float = Field(2.0, gt=0, description="How often the engine's health is probed.")
    health_check_timeout_s: float = Field(
        30.0, gt=0, description="The supervisor's probe: an engine that does not answer within it is dead."
    )
    ready_probe_timeout_s: float = Field(
        2.0,
        gt=0,
        description="GET /ready's own probe of the engine: no answer within it is 503 (keep the balancer's check timeout above it).",
    )
    restart_engine: bool = Field(True, description="Restart a dead engine; the gate re-checks the identity.")
    restart_initial_delay_s: float = Field(1.0, ge=0, description="Delay before the first restart; doubles per failure.")
    restart_max_delay_s: float = Field(60.0, ge=0, description="The longest delay between two restarts.")
    restart_max_attempts: int = Field(
        5, ge=1, description="Consecutive engine failures after which /health answers 503 (replace the replica)."
    )
    drain_timeout_s: float = Field(30.0, ge=0, description="On shutdown, how long in-flight requests may finish.")
    engine_shutdown_timeout_s: float = Field(
        30.0,
        gt=0,
        description=(
            "On shutdown, how long the engine core may take to stop its workers before it is killed (vLLM's own "
            "default is 5 s, shorter than its worker's grace period, so the core was always killed)."
        ),
    )
    ledger_flush_timeout_s: float = Field(
        30.0, gt=0, description="On shutdown, how long the request ledger may take to write its queued lines."
    )


class EngineSettings(BaseModel):
    """The in-process vLLM engine. Every field here is part of the backend identity."""

    model: str | None = Field(
        None,
        description="Checkpoint directory or Hugging Face repo id. Unset: the embedded tiny checkpoint.",
    )
    revision: str | None = Field(None, description="Checkpoint revision (commit) to pin.")
    served_model_name: str | None = Field(
        None, description="Name reported by /v1/models and accepted in `model`. Default: derived from `model`."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_model_len: int | None = Field(
        None, gt=0, description="Context length (prompt + output). Unset: the checkpoint's."
    )
    max_num_batched_tokens: int | None = Field(
        None,
        gt=0,
        description=(
            "Scheduler token budget; it also sizes vLLM's encoder cache, which must hold a whole audio item. "
            "Unset: the audio tokens of the longest accepted input (12.5 per second), at least 2048."
        ),
    )
    max_num_seqs: int = Field(16, gt=0, description="Most requests decoded in one batch.")
    kv_cache_dtype: str = Field("auto", description="'auto', 'fp8', 'fp8_e4m3', ...")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="Device memory fraction for the engine.")
    kv_cache_memory_bytes: int | None = Field(
        None, gt=0, description="Fixed KV-cache size in bytes (overrides the memory fraction; CPU: sizes the cache)."
    )
    enforce_eager: bool | None = Field(
        None,
        description=(
            "Disable graph capture and compilation. Unset: vLLM's default (graphs on), except the embedded tiny "
            "checkpoint, which runs eager (compiling it on CPU costs about a minute and gains nothing)."
        ),
    )
    enable_chunked_prefill: bool | None = Field(None, description="Unset: vLLM's default.")
    quantization: str | None = None
    attention_backend: str | None = Field(
        None, description="Force a vLLM attention backend (e.g. FLASH_ATTN, TRITON_ATTN). Unset: vLLM chooses."
    )
    flash_attn_max_num_splits: int | None = Field(
        None,
        gt=0,
        description=(
            "FLASH_ATTN under full CUDA graphs: the most KV splits of one decode step (vLLM's "
            "attention_config.flash_attn_max_num_splits_for_cuda_graph, default 32). Unset: vLLM's default."
        ),
    )
    async_scheduling: bool | None = Field(
        None, description="vLLM's asynchronous scheduling (the next step is scheduled while this one runs). Unset: vLLM's default."
    )
    cudagraph_mode: Literal["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"] | None = Field(
        None, description="vLLM's CUDA graph mode (compilation_config.cudagraph_mode). Unset: vLLM's default."
    )
    cudagraph_capture_sizes: list[int] | None = Field(
        None, description="Batch sizes captured as CUDA graphs. Unset: vLLM's list (up to 2 x max_num_seqs, at most 512)."
    )
    data_parallel_size: int = Field(1, ge=1, description="vLLM data-parallel replicas on one host.")
    distributed_executor_backend: Literal["mp", "uni"] | None = Field(
        None,
        description=(
            "How each engine core runs its model: 'uni' in the engine core's own process, 'mp' in a worker "
            "process the core drives over shared memory. Unset: vLLM's choice, which is 'uni' for one rank "
            "and 'mp' as soon as data_parallel_size > 1, although each rank of this dense single-GPU model is "
            "still one worker (vLLM counts the ranks into the world size when it picks). On the 32-core H200 "
            "host one GPU with 'mp' made 1.12-1.15 x the short-clip throughput of 'uni' (the in-process core "
            "kept torch's 32 threads and took 5.5-8.7 cores from the front ends; docs/benchmarks.md runs h-k); "
            "'uni' for dp > 1 made 0.86 x of one GPU (run e)."
        ),
    )
    renderer_num_workers: int = Field(
        8,
        ge=1,
        le=64,
        description=(
            "Threads of vLLM's renderer (model_config.renderer_num_workers), which computes each pass's audio "
            "features before the pass reaches the engine. vLLM's default is 1: a chunked program's chunks then "
            "get their features one after another, about 0.13 s per 200 s chunk, and on two H200s the 47:41 "
            "program's 15 chunks finished up to 2.6 s apart (run c, docs/benchmarks.md). With 8 every chunk had "
            "its features within 0.5 s and the program took 7.4-7.8 s instead of 8.9 s (runs d-g). On a 2-core "
            "machine 8 threads neither help nor hurt (tools/render_spread.py). Output is unchanged, so it is not "
            "part of the backend identity."
        ),
    )
    seed: int = 0


class AudioSettings(BaseModel):
    """What the gateway accepts."""

    max_upload_bytes: int = Field(512 * 1024 * 1024, gt=0, description="Upload size cap, enforced while streaming.")
    max_duration_s: float | None = Field(
        None,
        gt=0,
        description=(
            "Longest decoded audio accepted in one pass. Unset: the model's 90 minutes, or "
            f"{EMBEDDED_MAX_DURATION_S:g} s for the embedded tiny checkpoint (CPU-sized)."
        ),
    )
    min_duration_s: float = Field(
        0.1, gt=0, description="Shortest decoded audio accepted; below it the model has too little to transcribe."
    )


class BudgetSettings(BaseModel):
    """Output-token budget rules (see service/budget.py)."""

    observed_tokens_per_second: float = Field(12.75, gt=0, description="Measured output density (dense podcast).")
    conservative_tokens_per_second: float = Field(20.0, gt=0, description="Default budget density.")
    minimum_budget: int = Field(64, gt=0, description="Floor of the default budget for very short clips.")
    coverage_margin_s: float = Field(
        2.0,
        ge=0,
        description=(
            "Seconds of speech left uncovered (after the last segment and in long gaps) beyond which a response "
            "is flagged truncated; uncovered silence never is."
        ),
    )


class QualificationSettings(BaseModel):
    """The gate: no transcription before the serving backend matched the reference."""

    policy: Literal["strict", "explainable"] = "explainable"
    near_tie_logprob_margin: float = Field(
        DEFAULT_NEAR_TIE_LOGPROB_MARGIN,
        ge=0,
        description=(
            "Near-tie margin of the parity rule, in nats: an engine token that is not the teacher-forced "
            "reference's top choice passes when log p_top - log p_token is at most this. The default is "
            "calibrated on measured BF16-against-float32 noise (python -m qualification.calibrate; README)."
        ),
    )
    max_new_tokens: int = Field(256, gt=0, description="Budget of both qualification runs.")
    batch_size: int = Field(8, ge=1, description="Concurrent requests in the batch-invariance run.")
    qualify_on_start: bool | None = Field(
        None,
        description="Run the qualification at start-up. Unset: on for the embedded tiny checkpoint, off otherwise.",
    )
    reference_model: Path | None = Field(
        None,
        description=(
            "Checkpoint the Transformers reference loads. Unset: the engine's own checkpoint. Set it to a pristine "
            "copy when the engine serves a converted one."
        ),
    )
    reference_device: str = Field("cpu", description="Device of the Transformers reference.")
    reference_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    record_key_path: Path | None = Field(
        None,
        description=(
            "The HMAC key file sealing qualification records and cached reference runs (hex, at least 32 bytes, "
            "mode 0600 or stricter). Unset: record.key in the state directory's qualification folder, created on "
            "first use. Point it outside the state directory (a mounted secret) so that write access to the "
            "records is not enough to forge one."
        ),
    )


class LongformSettings(BaseModel):
    """The chunked track (`chunking_strategy`): defaults of its cut policy and its own input limit.

    When the policy's chunk length exceeds the native single-pass limit (the
    embedded tiny checkpoint's 120 s, say), all its lengths are scaled down by
    the same factor so that every chunk still fits one native pass.
    """

    max_duration_s: float | None = Field(
        None, gt=0, description="Longest audio accepted on the chunked track. Unset: 4 h (30 min for the tiny checkpoint)."
    )
    target_s: float = Field(600.0, gt=0, description="Chunk length aimed at (a cut lands near each multiple).")
    overlap_s: float = Field(10.0, ge=0, description="Audio shared by consecutive chunks, for stitching and speakers.")
    search_s: float = Field(30.0, gt=0, description="How far around each target the cut looks for silence.")
    min_silence_s: float = Field(0.3, gt=0, description="Shortest pause a cut may be placed in.")
    max_chunk_s: float = Field(900.0, gt=0, description="Longest chunk, overlap included.")
    max_concurrent_chunks: int = Field(8, gt=0, description="Chunks of one request sent to the engine at once.")


class CoverageSettings(BaseModel):
    """How a transcript is checked against its audio: timestamps, speech left out, and tail recovery."""

    timestamp_tolerance_s: float = Field(
        0.5, ge=0, description="How far past the end of the audio (or back in time) a timestamp may stray unflagged."
    )
    min_gap_s: float = Field(3.0, gt=0, description="Inner gaps between segments from this long are checked for speech.")
    speech_above_floor_db: float = Field(12.0, gt=0, description="A frame is speech this far above the noise floor.")
    speech_floor_db: float = Field(-60.0, description="Lowest speech threshold (dBFS): quieter frames are never speech.")
    speech_ceiling_db: float = Field(-40.0, description="Highest speech threshold (dBFS): louder frames are always speech.")
    recovery_back_off_s: float = Field(
        1.0, ge=0, description="tail_recovery: each further pass starts this long before the last settled segment ends."
    )
    recovery_min_progress_s: float = Field(
        2.0, gt=0, description="tail_recovery: a pass that moves the covered end by less than this makes no progress."
    )
    recovery_max_passes: int = Field(8, ge=1, description="tail_recovery: most further passes after the native one.")

    @model_validator(mode="after")
    def _check(self) -> CoverageSettings:
        if self.speech_floor_db > self.speech_ceiling_db:
            raise ValueError("coverage.speech_floor_db must not exceed coverage.speech_ceiling_db")
        if self.recovery_min_progress_s <= self.recovery_back_off_s:
            # Otherwise a later pass could start inside audio two passes back, where stitching does not look.
            raise ValueError("coverage.recovery_min_progress_s must exceed coverage.recovery_back_off_s")
        return self


class EvidenceSettings(BaseModel):
    """Per-request evidence bundles (token IDs, progress checkpoints, stop and budget records)."""

    capture_all: bool = Field(False, description="Keep the full bundle of every request (else only on request).")
    checkpoint_every_tokens: int = Field(256, gt=0, description="Progress checkpoint interval in tokens.")
    checkpoint_every_s: float = Field(30.0, gt=0, description="Progress checkpoint interval in seconds.")


class GatewaySettings(BaseSettings):
    """Everything the gateway needs to start."""

    model_config = SettingsConfigDict(
        env_prefix="MOSS_GATEWAY_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
        # A refused secret (too short) must not be echoed into the start-up error and the logs.
        hide_input_in_errors=True,
    )

    state_dir: Path = Field(
        Path("state"),
        description="Where qualification records, the request ledger and evidence bundles live.",
    )
    cache_dir: Path | None = Field(None, description="Build cache (tiny checkpoint). Unset: ~/.cache/moss-gateway.")
    server: ServerSettings = ServerSettings()
    access: AccessSettings = AccessSettings()
    limits: LimitsSettings = LimitsSettings()
    lifecycle: LifecycleSettings = LifecycleSettings()
    engine: EngineSettings = EngineSettings()
    audio: AudioSettings = AudioSettings()
    budget: BudgetSettings = BudgetSettings()
    qualification: QualificationSettings = QualificationSettings()
    evidence: EvidenceSettings = EvidenceSettings()
    coverage: CoverageSettings = CoverageSettings()
    longform: LongformSettings = LongformSettings()

    @model_validator(mode="after")
    def _check_limits(self) -> GatewaySettings:
        if self.audio.min_duration_s >= self.max_duration_s:
            raise ValueError("audio.min_duration_s must be below audio.max_duration_s")
        if self.max_duration_s > NATIVE_MAX_DURATION_S:
            raise ValueError(
                f"audio.max_duration_s={self.max_duration_s:g} exceeds the model's native single-pass "
                f"limit of {NATIVE_MAX_DURATION_S:g} s"
            )
        needed = self.encoder_tokens_needed
        batched = self.engine.max_num_batched_tokens
        if batched is not None and batched < needed:
            raise ValueError(
                f"engine.max_num_batched_tokens={batched} cannot hold the {needed} audio tokens of the longest "
                f"accepted input ({self.max_duration_s:g} s at {AUDIO_TOKENS_PER_SECOND} tokens/s); "
                f"raise it or lower audio.max_duration_s"
            )
        return self

    @property
    def uses_embedded_checkpoint(self) -> bool:
        return self.engine.model is None

    @property
    def max_duration_s(self) -> float:
        """The effective input limit (see AudioSettings.max_duration_s)."""
        if self.audio.max_duration_s is not None:
            return self.audio.max_duration_s
        return EMBEDDED_MAX_DURATION_S if self.uses_embedded_checkpoint else NATIVE_MAX_DURATION_S

    @property
    def chunked_max_duration_s(self) -> float:
        if self.longform.max_duration_s is not None:
            return self.longform.max_duration_s
        return 1800.0 if self.uses_embedded_checkpoint else 4 * 3600.0

    def chunking_defaults(self) -> dict[str, float]:
        """The cut policy's lengths, scaled so that the longest chunk fits one native pass."""
        form = self.longform
        scale = min(1.0, self.max_duration_s / form.max_chunk_s)
        return {
            "target_s": form.target_s * scale,
            "overlap_s": form.overlap_s * scale,
            "search_s": form.search_s * scale,
            "max_chunk_s": form.max_chunk_s * scale,
            "min_silence_s": form.min_silence_s,
        }

    @property
    def encoder_tokens_needed(self) -> int:
        """Audio embedding tokens of the longest accepted input (what the encoder cache must hold)."""
        return math.ceil(self.max_duration_s * AUDIO_TOKENS_PER_SECOND)

    @property
    def effective_max_num_batched_tokens(self) -> int:
        return self.engine.max_num_batched_tokens or max(2048, self.encoder_tokens_needed)

    @property
    def should_qualify_on_start(self) -> bool:
        flag = self.qualification.qualify_on_start
        return self.uses_embedded_checkpoint if flag is None else flag

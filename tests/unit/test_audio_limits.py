"""Decoding against the duration budget, and from an upload's spool file.

The hostile case (issue 12): a 16 MB Matroska file holding one PCM block at
1 kHz, i.e. hours of audio in a single FFmpeg frame. Decoding it whole before
the duration check grew the process by about 1 GB; the budget must be checked
before a frame is converted or resampled, so memory stays proportional to the
allowed duration.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
from helpers import AppFactory

import service.audio
from service.audio import decode_audio
from service.errors import ErrorCode, GatewayError

REPO = Path(__file__).resolve().parents[2]
#: The embedded checkpoint's input limit: what the issue's probe ran against.
BUDGET_S = 120.0
#: The issue's file: 16 MB of 16-bit PCM at 1 kHz, about 2.3 hours in one block.
HOSTILE_BYTES = 16 << 20
MAX_GROWTH_MB = 100


def pcm_matroska(samples: np.ndarray, rate: int, block: int | None = None) -> bytes:
    """A Matroska file of int16 mono PCM in blocks of `block` samples (default: one block holding all)."""
    buf = io.BytesIO()
    step = block or samples.size
    with av.open(buf, mode="w", format="matroska") as out:
        stream = out.add_stream("pcm_s16le", rate=rate, layout="mono")
        for start in range(0, samples.size, step):
            part = np.ascontiguousarray(samples[start : start + step]).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(part, format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, start
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


def hostile_matroska() -> bytes:
    rng = np.random.default_rng(7)
    return pcm_matroska(rng.integers(-8000, 8000, HOSTILE_BYTES // 2, dtype=np.int16), rate=1_000)


@pytest.fixture(scope="module")
def hostile_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / "bomb.mkv"
    path.write_bytes(hostile_matroska())
    return path


def test_the_hostile_file_is_one_block_of_hours() -> None:
    """The fixture is what the issue describes: one packet, hours of audio, about 16 MB."""
    data = hostile_matroska()
    assert HOSTILE_BYTES <= len(data) < HOSTILE_BYTES + 4096
    with av.open(io.BytesIO(data)) as container:
        packets = [p for p in container.demux(container.streams.audio[0]) if p.size]
    assert len(packets) == 1 and packets[0].size == HOSTILE_BYTES


def test_one_huge_frame_is_refused_as_too_long(hostile_file: Path) -> None:
    with pytest.raises(GatewayError) as caught:
        decode_audio(hostile_file.read_bytes(), max_duration_s=BUDGET_S)
    assert caught.value.code is ErrorCode.AUDIO_TOO_LONG


# Runs in a fresh interpreter: ru_maxrss is the process's peak, so the
# baseline must be taken after imports, a warm-up decode and reading the input.
_MEASURE = """
import io, json, resource, sys
import numpy as np, soundfile as sf
from service.audio import decode_audio
from service.errors import GatewayError

path, mode, budget = sys.argv[1], sys.argv[2], float(sys.argv[3])
warm = io.BytesIO()
sf.write(warm, np.zeros(16000, np.float32), 16000, format="WAV")
decode_audio(warm.getvalue())
source = open(path, "rb") if mode == "file" else open(path, "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    decode_audio(source, filename="bomb.mkv", max_duration_s=budget)
    outcome = "decoded"
except GatewayError as error:
    outcome = error.code.value
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"outcome": outcome, "growth_mb": (after - before) / 1024, "before_mb": before / 1024}))
"""


@pytest.mark.parametrize("mode", ["bytes", "file"])
def test_peak_memory_of_the_hostile_file_stays_small(hostile_file: Path, mode: str) -> None:
    """Peak RSS growth while refusing the 16 MB file stays under 100 MB (it was about 1 GB)."""
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(hostile_file), mode, str(BUDGET_S)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["outcome"] == "audio_too_long", measured
    assert measured["growth_mb"] < MAX_GROWTH_MB, measured


def test_slicing_a_large_frame_changes_no_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame cut into many slices decodes to exactly what one pass gives."""
    t = np.arange(30_000) / 1_000
    data = pcm_matroska((np.sin(2 * np.pi * 110 * t) * 12_000).astype(np.int16), rate=1_000)
    whole = decode_audio(data, max_duration_s=BUDGET_S)
    monkeypatch.setattr(service.audio, "_SLICE_VALUES", 1_600)  # 100 source frames per slice
    sliced = decode_audio(data, max_duration_s=BUDGET_S)
    assert whole.samples.size == 30 * 16_000
    assert sliced.sha256 == whole.sha256
    np.testing.assert_array_equal(sliced.samples, whole.samples)


def test_budget_boundary_is_the_same_for_one_frame_or_many() -> None:
    """Exactly the budget is accepted, a few samples more are not, whatever the frame size."""
    exact = pcm_matroska(np.zeros(5_000, np.int16) + 100, rate=1_000)  # 5.000 s
    assert decode_audio(exact, max_duration_s=5.0).duration_s == pytest.approx(5.0, abs=1e-3)
    with pytest.raises(GatewayError) as caught:
        decode_audio(exact, max_duration_s=4.99)
    assert caught.value.code is ErrorCode.AUDIO_TOO_LONG


class RecordingReads(io.BytesIO):
    """A seekable binary file that records every read size asked of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.sizes: list[int] = []

    def read(self, size: int | None = -1, /) -> bytes:
        self.sizes.append(-1 if size is None else size)
        return super().read(size)

    def readinto(self, buffer: bytearray | memoryview, /) -> int:  # type: ignore[override]
        self.sizes.append(len(buffer))
        return super().readinto(buffer)


def _wav(seconds: float, rate: int = 16_000) -> bytes:
    buf = io.BytesIO()
    t = np.arange(int(seconds * rate)) / rate
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["wav", "matroska"])
def test_a_spooled_upload_decodes_like_bytes_without_a_whole_copy(kind: str) -> None:
    data = _wav(20.0) if kind == "wav" else pcm_matroska(np.full(20 * 8_000, 900, np.int16), rate=8_000, block=4_000)
    expected = decode_audio(data)
    with tempfile.SpooledTemporaryFile(max_size=1 << 20) as spool:  # what Starlette hands out
        spool.write(data)  # left at its end: the decoder reads from the start anyway
        from_spool = decode_audio(spool, filename="a.bin")  # type: ignore[arg-type]
    assert from_spool.sha256 == expected.sha256
    assert (from_spool.container, from_spool.codec) == (expected.container, expected.codec)
    recording = RecordingReads(data)
    assert decode_audio(recording).sha256 == expected.sha256
    # Never asked for the whole file at once: read in buffers far smaller than the input.
    assert recording.sizes and -1 not in recording.sizes and max(recording.sizes) < len(data) // 4


def test_an_empty_spool_is_an_empty_file() -> None:
    with tempfile.SpooledTemporaryFile() as spool, pytest.raises(GatewayError) as caught:
        decode_audio(spool)  # type: ignore[arg-type]
    assert caught.value.code is ErrorCode.EMPTY_FILE


def test_a_non_seekable_stream_is_a_programming_error() -> None:
    class OneWay(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def seekable(self) -> bool:
            return False

    with pytest.raises(ValueError, match="seekable"):
        decode_audio(OneWay())  # type: ignore[arg-type]


def test_the_hostile_file_through_the_api_is_400_too_long(fake_client: AppFactory, hostile_file: Path) -> None:
    client, engine = fake_client()
    with hostile_file.open("rb") as upload:
        response = client.post("/v1/audio/transcriptions", files={"file": ("bomb.mkv", upload, "video/x-matroska")})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "audio_too_long"
    assert engine.requests == []


def test_a_packet_over_the_packet_cap_is_refused_before_decoding() -> None:
    """FFmpeg decodes a packet whole before the budget can be checked, so one over 16 MiB is refused."""
    samples = np.zeros(service.audio.MAX_PACKET_BYTES // 2 + 1, np.int16)  # one block of MAX + 2 bytes
    with pytest.raises(GatewayError) as caught:
        decode_audio(pcm_matroska(samples, rate=48_000))  # no duration budget at all
    assert caught.value.code is ErrorCode.INVALID_AUDIO
    assert "audio packet of" in caught.value.message

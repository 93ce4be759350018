"""Decode an uploaded file into what the model takes: 16 kHz mono float32.

Why it is built this way:
- libsndfile goes first because it reads the plain audio formats (WAV, FLAC,
  OGG, MP3, AIFF...) exactly and cheaply; PyAV (FFmpeg) is only the fallback
  for the containers libsndfile cannot read (m4a/mp4/webm/mkv...), so the
  large FFmpeg surface sees as little client data as possible.
- Decoding is streamed against the duration budget: each block is down-mixed
  and resampled as it arrives, and a block whose output would pass
  `max_duration_s` is refused before it is converted or resampled. FFmpeg
  hands out a whole packet as one frame (a single PCM block in a Matroska file
  can hold hours of 1 kHz audio, i.e. gigabytes once at 16 kHz float32), so
  frames are cut into slices of bounded size first. Memory therefore stays
  proportional to the allowed duration, never to what a small file claims to
  hold: the 16 kHz chunks plus their concatenation (two copies of the allowed
  result), one slice, and one demuxed packet and its frame (packets over
  `MAX_PACKET_BYTES` are refused before they are decoded).
- The input is `bytes` or a seekable binary file object (the upload's spool
  file): both libraries read file objects, so an upload is decoded without a
  whole in-memory copy. The sha256 of the samples is computed as they are kept.
- Everything a client can send ends as `GatewayError` (400 or 415): a library
  exception escaping from here would become a 500 for a bad upload.
- The result is deterministic (same bytes, same samples, same `sha256`) so
  requests can be cached, replayed and compared across engines.
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass
from typing import BinaryIO

import av
import numpy as np
import soundfile as sf
import soxr
from numpy.typing import NDArray

from service.errors import ErrorCode, GatewayError

TARGET_RATE = 16_000
#: Header sanity bounds. Below 1 kHz nothing speech-like is left and a tiny file
#: would expand 16x or more when brought to 16 kHz, so such a header is corrupt.
MIN_SOURCE_RATE = 1_000
MAX_SOURCE_RATE = 384_000
MAX_CHANNELS = 64

#: FFmpeg demuxer names we accept; a demuxer is allowed if any of its
#: comma-separated names is here ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm").
ALLOWED_DEMUXERS = frozenset({"mov", "mp4", "m4a", "matroska", "webm", "ogg", "mp3", "aac", "wav", "flac"})
SUPPORTED_CONTAINERS = (
    "WAV, FLAC, OGG, MP3, AAC (ADTS), M4A/MP4/MOV, WebM/MKV (plus AIFF and other formats libsndfile reads)"
)

_SF_UNRECOGNISED = 1  # libsndfile's SF_ERR_UNRECOGNISED_FORMAT
_BLOCK_FRAMES = 16_384  # libsndfile read size: 4 MiB at the 64-channel worst case.
#: Most values (source samples x channels, or 16 kHz output samples) one slice of an
#: FFmpeg frame may turn into: 4 MiB of float32 per step, whatever the frame holds.
_SLICE_VALUES = 1 << 20
#: Largest demuxed packet decoded. One compressed audio packet is at most a few hundred KB and a
#: PCM block of a real recording far less than this; FFmpeg decodes a packet into one frame (up to
#: 4x its size for ADPCM) before the duration budget can be checked, so a bigger one is refused.
MAX_PACKET_BYTES = 16 << 20
#: Bytes read from the start of the input to name containers and describe failures.
_HEAD_BYTES = 64
#: Output samples a block may be predicted to overshoot the budget by before it is
#: refused unresampled (rounding of the rate ratio; the exact check follows).
_BUDGET_SLACK = 2
_SF_CONTAINERS = {"WAVEX": "wav", "RF64": "wav", "W64": "wav"}
_SF_CODECS = {
    "MPEG_LAYER_I": "mp1",
    "MPEG_LAYER_II": "mp2",
    "MPEG_LAYER_III": "mp3",
    "VORBIS": "vorbis",
    "OPUS": "opus",
}
_INT_SCALE = {"u8": 128.0, "s16": 32768.0, "s32": 2147483648.0, "s64": 9223372036854775808.0}
#: FFmpeg's packed sample formats as numpy types (FFmpeg stores native-endian samples).
_SAMPLE_DTYPES = {"u8": np.uint8, "s16": np.int16, "s32": np.int32, "s64": np.int64, "flt": np.float32, "dbl": np.float64}


@dataclass(frozen=True, eq=False)
class DecodedAudio:
    """Decoded upload plus what it was decoded from (for logs and responses).

    `eq=False`: comparing ndarrays field-wise is ambiguous; compare `sha256`.
    `samples` is read-only so it can never drift from its `sha256`.
    """

    samples: NDArray[np.float32]
    sample_rate: int
    duration_s: float
    sha256: str
    container: str
    codec: str
    source_sample_rate: int
    source_channels: int


@dataclass(frozen=True)
class _Source:
    container: str
    codec: str
    rate: int
    channels: int


def decode_audio(
    data: bytes | BinaryIO,
    *,
    filename: str | None = None,
    target_rate: int = TARGET_RATE,
    max_duration_s: float | None = None,
) -> DecodedAudio:
    """Decode `data` (bytes, or a seekable binary file read from its start) to mono float32 at `target_rate`.

    A file object (an upload's `SpooledTemporaryFile`) is read in place, never
    copied whole into memory; it is left open, at an unspecified position.
    Blocking: call it from a worker thread. `filename` is only used to name the
    file in error messages: the content, never the name, decides how it is
    decoded. `max_duration_s` (optional) stops decoding with AUDIO_TOO_LONG
    before the output passes it, as a guard against small files that expand to
    huge audio; the duration policy itself stays with the caller.
    """
    if target_rate <= 0:
        raise ValueError(f"target_rate must be positive, got {target_rate}")
    label = _label(filename)
    stream = _as_stream(data)
    head = stream.read(_HEAD_BYTES)
    if not head:
        raise GatewayError(ErrorCode.EMPTY_FILE, f"{label} is empty (0 bytes).", param="file")
    max_samples = None if max_duration_s is None else math.ceil(max_duration_s * target_rate)
    sink = _Sink(target_rate, max_samples, label)
    try:
        stream.seek(0)
        source = _decode_with_soundfile(stream, sink, label)
        if isinstance(source, str):
            stream.seek(0)
            source = _decode_with_pyav(stream, head, sink, label, source)
        samples = sink.finish()
    except GatewayError:
        raise
    except Exception as exc:  # any library failure is the upload's fault, never a 500
        raise _invalid(f"{label} could not be decoded ({_reason(exc)}).") from exc
    if samples.size == 0:
        raise _invalid(f"{label} ({source.container}, {source.codec}) contains no samples.")
    samples.flags.writeable = False
    return DecodedAudio(
        samples=samples,
        sample_rate=target_rate,
        duration_s=samples.size / target_rate,
        sha256=sink.sha256,
        container=source.container,
        codec=source.codec,
        source_sample_rate=source.rate,
        source_channels=source.channels,
    )


class _Sink:
    """Takes down-mixed chunks at any rate and keeps only their `target_rate` version."""

    def __init__(self, target_rate: int, max_samples: int | None, label: str) -> None:
        self._target = target_rate
        self._max = max_samples
        self._label = label
        self._chunks: list[NDArray[np.float32]] = []
        self._hash = hashlib.sha256()
        self._rate: int | None = None
        self._resampler: soxr.ResampleStream | None = None
        self._produced = 0
        self._received_at_rate = 0  # input samples since the last rate change
        self._produced_before_rate = 0  # output samples kept before it
        self.received = 0

    @property
    def sha256(self) -> str:
        """Hash of the little-endian float32 samples kept so far (all of them after `finish`)."""
        return self._hash.hexdigest()

    def slice_frames(self, rate: int, channels: int) -> int:
        """Source frames per step so that neither the input slice nor its resampled output passes `_SLICE_VALUES`."""
        by_input = _SLICE_VALUES // max(channels, 1)
        by_output = _SLICE_VALUES * rate // self._target
        return max(1, min(by_input, by_output))

    def check_budget(self, frames: int, rate: int) -> None:
        """Refuse, before any conversion or resampling, a block that would pass the duration budget.

        The output of a rate run is its input times target/rate (the resampler
        only delays it), so the total after this block is known in advance.
        """
        if self._max is None:
            return
        before = self._produced_before_rate if rate == self._rate else self._produced
        received = self._received_at_rate if rate == self._rate else 0
        expected = before + (received + frames) * self._target // rate
        if expected > self._max + _BUDGET_SLACK:
            raise self._too_long()

    def add(self, mono: NDArray[np.float32], rate: int) -> None:
        """Check, resample and keep one chunk; a rate change restarts the resampler."""
        if mono.size == 0:
            return
        self.check_budget(mono.size, rate)
        if not np.isfinite(mono).all():
            raise _invalid(f"{self._label} contains invalid sample values (NaN or infinity).")
        if rate != self._rate:
            self._flush()
            self._rate = rate
            self._resampler = None
            self._received_at_rate = 0
            self._produced_before_rate = self._produced
            if rate != self._target:
                self._resampler = soxr.ResampleStream(rate, self._target, 1, dtype="float32", quality="HQ")
        self.received += mono.size
        self._received_at_rate += mono.size
        chunk = np.ascontiguousarray(mono, dtype=np.float32)
        self._keep(chunk if self._resampler is None else self._resampler.resample_chunk(chunk))

    def finish(self) -> NDArray[np.float32]:
        """Flush the resampler and return one contiguous array (the second copy)."""
        self._flush()
        samples = np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=np.float32)
        self._chunks.clear()
        if not np.isfinite(samples).all():  # finite input can still overflow float32
            raise _invalid(f"{self._label} contains sample values too large to represent.")
        return samples

    def _flush(self) -> None:
        if self._resampler is not None:
            self._keep(self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
            self._resampler = None

    def _keep(self, chunk: NDArray[np.float32]) -> None:
        if chunk.size == 0:
            return
        self._chunks.append(chunk)
        self._hash.update(chunk.astype("<f4", copy=False).data)
        self._produced += chunk.size
        if self._max is not None and self._produced > self._max:
            raise self._too_long()

    def _too_long(self) -> GatewayError:
        assert self._max is not None
        return GatewayError(
            ErrorCode.AUDIO_TOO_LONG,
            f"{self._label} is longer than the limit of {self._max / self._target:g} seconds.",
            param="file",
        )


def _as_stream(data: bytes | BinaryIO) -> BinaryIO:
    """A seekable binary stream over `data`, at its start; bytes are wrapped, never copied."""
    if isinstance(data, bytes | bytearray | memoryview):
        return io.BytesIO(data)
    if not data.seekable():
        raise ValueError("decode_audio needs bytes or a seekable binary file object")
    data.seek(0)
    return data


def _decode_with_soundfile(file: BinaryIO, sink: _Sink, label: str) -> _Source | str:
    """Decode with libsndfile; when it cannot open the data, say why (PyAV goes next)."""
    try:
        handle = sf.SoundFile(file)
    except Exception as exc:  # not recognised, or a header it rejects
        return "" if getattr(exc, "code", None) == _SF_UNRECOGNISED else _reason(exc)
    with handle:
        container = _SF_CONTAINERS.get(handle.format, handle.format.lower())
        codec = "flac" if handle.format == "FLAC" else _SF_CODECS.get(handle.subtype, handle.subtype.lower())
        source = _Source(container, codec, handle.samplerate, handle.channels)
        _check_header(source.rate, source.channels, label, container)
        try:
            while True:
                block = handle.read(_BLOCK_FRAMES, dtype="float32", always_2d=True)
                if block.shape[0] == 0:
                    break
                sink.add(_average_channels(block.T), source.rate)
        except GatewayError:
            raise
        except Exception as exc:
            if sink.received == 0:
                raise _invalid(
                    f"{label} looks like {container} ({codec}) but could not be decoded: {_reason(exc)}."
                ) from exc
            # A truncated or damaged end: keep the audio decoded before it.
    return source


def _decode_with_pyav(file: BinaryIO, head: bytes, sink: _Sink, label: str, sf_reason: str) -> _Source:
    """Decode the first audio stream of an allow-listed container with FFmpeg."""
    try:
        container = av.open(file, mode="r", metadata_errors="replace")
    except Exception as exc:
        if head[4:8] == b"ftyp":
            found = "an MP4/M4A/MOV file FFmpeg cannot read (often an upload cut short before its index)"
        else:
            found = f"a damaged header ({sf_reason})" if sf_reason else "no known audio format"
        raise _invalid(
            f"{label} is not audio or could not be decoded: found {found}; "
            f"it starts with bytes {head[:8].hex(' ')}."
        ) from exc
    with container:
        demuxer = container.format.name
        name = _container_name(demuxer, container.metadata, head)
        if not container.streams.audio:
            found = ", ".join(f"{s.type} ({_codec_name(s)})" for s in container.streams) or "no streams"
            raise _invalid(f"{label} contains no audio stream (container '{name}' holds: {found}).")
        if not ALLOWED_DEMUXERS.intersection(demuxer.split(",")):
            raise GatewayError(
                ErrorCode.UNSUPPORTED_MEDIA,
                f"{label} uses the '{demuxer}' container, which is not supported. Supported: {SUPPORTED_CONTAINERS}.",
                param="file",
            )
        stream = container.streams.audio[0]
        ctx = stream.codec_context
        if ctx is None:
            raise GatewayError(
                ErrorCode.UNSUPPORTED_MEDIA,
                f"{label} ({name}) has an audio stream in an unknown codec that cannot be decoded. "
                "Supported: any common audio codec (AAC, MP3, Opus, Vorbis, FLAC, ALAC, PCM...).",
                param="file",
            )
        source = _Source(name, ctx.codec.canonical_name, ctx.sample_rate, ctx.channels)
        _check_header(source.rate, source.channels, label, name)
        try:
            for packet in container.demux(stream):
                if packet.size > MAX_PACKET_BYTES:
                    raise _invalid(
                        f"{label} ({name}) holds an audio packet of {packet.size} bytes; "
                        f"at most {MAX_PACKET_BYTES} are accepted in one packet."
                    )
                for frame in packet.decode():
                    rate, channels = frame.sample_rate, frame.layout.nb_channels
                    _check_header(rate, channels, label, name)
                    # One frame may hold a whole packet: refuse or cut it before converting any of it.
                    sink.check_budget(frame.samples, rate)
                    planes, step = _frame_planes(frame), sink.slice_frames(rate, channels)
                    for start in range(0, frame.samples, step):
                        sink.add(_planes_to_mono(_slice_planes(planes, start, start + step), frame.format), rate)
        except GatewayError:
            raise
        except Exception as exc:
            if sink.received == 0:
                raise _invalid(f"{label} ({name}, {source.codec}) could not be decoded: {_reason(exc)}.") from exc
            # Stop at the first damaged packet rather than skip it: skipping would
            # silently shift every later timestamp.
    return source


def _frame_planes(frame: av.AudioFrame) -> list[NDArray[np.generic]]:
    """Views of the frame's own buffers, no copy (PyAV's `to_ndarray` copies the whole frame).

    Packed audio is one (samples, channels) array, planar audio one (samples, 1)
    array per channel; `_slice_planes` turns either into (channels, n).
    """
    dtype = np.dtype(_SAMPLE_DTYPES[frame.format.packed.name])
    channels = max(frame.layout.nb_channels, 1)
    if frame.format.is_planar:
        return [np.frombuffer(plane, dtype, count=frame.samples).reshape(-1, 1) for plane in frame.planes[:channels]]
    return [np.frombuffer(frame.planes[0], dtype, count=frame.samples * channels).reshape(-1, channels)]


def _slice_planes(planes: list[NDArray[np.generic]], start: int, stop: int) -> NDArray[np.generic]:
    """Samples `start:stop` as (channels, n): a view for packed or mono audio, a copy of the slice otherwise."""
    parts = [plane[start:stop] for plane in planes]
    return (parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)).T


def _planes_to_mono(planes: NDArray[np.generic], fmt: av.AudioFormat) -> NDArray[np.float32]:
    """(channels, samples) in any FFmpeg sample format to float32 in [-1, 1), channels averaged."""
    base = fmt.packed.name
    if base in _INT_SCALE:
        floats = planes.astype(np.float32)
        if base == "u8":
            floats -= 128.0
        floats /= _INT_SCALE[base]
    else:
        # Mono must own its data rather than view the frame's buffer; a mix is new anyway.
        floats = planes.astype(np.float32, copy=planes.shape[0] == 1)
    return _average_channels(floats)


def _average_channels(planes: NDArray[np.float32]) -> NDArray[np.float32]:
    """Down-mix (channels, samples) by averaging; float64 sums so loud input cannot overflow."""
    if planes.shape[0] == 1:
        mono: NDArray[np.float32] = planes[0]
        return mono
    mixed: NDArray[np.float32] = planes.mean(axis=0, dtype=np.float64).astype(np.float32)
    return mixed


def _check_header(rate: int, channels: int, label: str, container: str) -> None:
    """Refuse headers no real recording has before they size any allocation."""
    if not MIN_SOURCE_RATE <= rate <= MAX_SOURCE_RATE:
        raise _invalid(
            f"{label} ({container}) declares a sample rate of {rate} Hz; "
            f"expected {MIN_SOURCE_RATE} to {MAX_SOURCE_RATE} Hz."
        )
    if not 1 <= channels <= MAX_CHANNELS:
        raise _invalid(f"{label} ({container}) declares {channels} channels; expected 1 to {MAX_CHANNELS}.")


def _container_name(demuxer: str, metadata: dict[str, str], head: bytes) -> str:
    """A short name for the container, from the content (brand, EBML doctype)."""
    names = demuxer.split(",")
    if "mov" in names:
        brand = metadata.get("major_brand", "").strip().lower()
        if brand in ("m4a", "m4b"):
            return "m4a"
        return "mov" if brand == "qt" else "3gp" if brand.startswith("3g") else "mp4"
    if "matroska" in names:
        return "webm" if b"webm" in head[:_HEAD_BYTES] else "mkv"
    return names[0]


def _codec_name(stream: av.stream.Stream) -> str:
    ctx = stream.codec_context
    return ctx.name if ctx is not None else "unknown codec"


def _reason(exc: BaseException) -> str:
    """The library's own words for a failure, without object reprs."""
    text = getattr(exc, "error_string", None) or getattr(exc, "strerror", None) or str(exc)
    return str(text).strip().rstrip(".") or type(exc).__name__


def _label(filename: str | None) -> str:
    if not filename:
        return "The uploaded file"
    clean = "".join(ch if ch.isprintable() else "?" for ch in filename)[:120]
    return f"The uploaded file '{clean}'"


def _invalid(message: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_AUDIO, message, param="file")

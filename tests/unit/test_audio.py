"""Decoding uploads to 16 kHz mono: every supported container, every refusal.

All media is generated here (soundfile for WAV/FLAC/OGG/MP3, PyAV for the
rest) so the tests need no fixtures and show exactly what each case contains.
"""

from __future__ import annotations

import hashlib
import io
import random
import struct
import zlib

import av
import numpy as np
import pytest
import soundfile as sf

from service.audio import DecodedAudio, _frame_planes, _planes_to_mono, _slice_planes, decode_audio
from service.errors import ErrorCode, GatewayError

TONE_HZ = 440.0


def tone(rate: int, seconds: float, channels: int = 1) -> np.ndarray:
    """A 440 Hz sine as (samples, channels) float32; each channel at a different level."""
    t = np.arange(int(rate * seconds)) / rate
    wave = np.sin(2 * np.pi * TONE_HZ * t)
    return np.stack([wave * 0.3 / (c + 1) for c in range(channels)], axis=1).astype(np.float32)


def with_soundfile(fmt: str, subtype: str | None, rate: int, channels: int = 1, seconds: float = 1.0) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, tone(rate, seconds, channels), rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def with_pyav(
    fmt: str,
    codec: str | None,
    rate: int = 44_100,
    channels: int = 2,
    seconds: float = 1.0,
    video: bool = False,
    samples: np.ndarray | None = None,
) -> bytes:
    """Mux `samples` (or a tone) with PyAV; skips the test when the encoder is missing."""
    for name in filter(None, (codec, "mpeg4" if video else None)):
        if name not in av.codecs_available:
            pytest.skip(f"this PyAV build has no {name} encoder")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        # Every stream must exist before the first packet is muxed (the header goes first).
        audio = None
        if codec is not None:
            audio = samples if samples is not None else tone(rate, seconds, channels)
            layout = "mono" if audio.shape[1] == 1 else "stereo"
            audio_stream = out.add_stream(codec, rate=rate, layout=layout)
        if video:
            video_stream = out.add_stream("mpeg4", rate=25)
            video_stream.width, video_stream.height, video_stream.pix_fmt = 64, 64, "yuv420p"
        if audio is not None:
            _encode_audio(out, audio_stream, audio, rate, layout)
        if video:
            _encode_video(out, video_stream, seconds)
    return buf.getvalue()


def _encode_audio(out: av.container.OutputContainer, stream: av.audio.stream.AudioStream,
                  samples: np.ndarray, rate: int, layout: str) -> None:
    step = stream.codec_context.frame_size or 1024
    planar = np.ascontiguousarray(samples.T)
    fmt = stream.codec_context.format.name
    for start in range(0, planar.shape[1], step):
        chunk = np.ascontiguousarray(planar[:, start : start + step])
        if fmt.startswith("s16"):
            chunk = (chunk * 32767).astype(np.int16)
            chunk = chunk if fmt == "s16p" else chunk.T.reshape(1, -1).copy()
        frame = av.AudioFrame.from_ndarray(chunk, format=fmt if fmt.startswith("s16") else "fltp", layout=layout)
        frame.sample_rate, frame.pts = rate, start
        out.mux(stream.encode(frame))
    out.mux(stream.encode(None))


def _encode_video(out: av.container.OutputContainer, stream: av.video.stream.VideoStream, seconds: float) -> None:
    for index in range(int(25 * seconds)):
        frame = av.VideoFrame.from_ndarray(np.zeros((64, 64, 3), np.uint8), format="rgb24")
        frame.pts = index
        out.mux(stream.encode(frame))
    out.mux(stream.encode(None))


def wav_bytes(*, rate: int = 16_000, channels: int = 1, bits: int = 16, tag: int = 1, data: bytes = b"") -> bytes:
    """A WAV file written by hand, so its header can say anything."""
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def png_bytes() -> bytes:
    """A real 8x8 PNG image."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    pixels = zlib.compress(b"".join(b"\x00" + bytes(24) for _ in range(8)))
    header = struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def peak_hz(audio: DecodedAudio) -> float:
    spectrum = np.abs(np.fft.rfft(audio.samples))
    return float(np.argmax(spectrum) * audio.sample_rate / audio.samples.size)


def refused(data: bytes, code: ErrorCode, **kwargs: object) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        decode_audio(data, **kwargs)  # type: ignore[arg-type]
    assert caught.value.code is code, caught.value.message
    return caught.value


# (name, bytes factory, container, codec, source rate, extra source samples allowed).
# The allowance is the codec's padding: AAC in MP4 keeps one 1024-sample frame
# of end padding; raw ADTS also keeps the 1024-sample priming; the rest are exact.
SUPPORTED = [
    ("wav", lambda: with_soundfile("WAV", "PCM_16", 44_100, 2), "wav", "pcm_16", 44_100, 0),
    ("flac", lambda: with_soundfile("FLAC", "PCM_24", 48_000, 1), "flac", "flac", 48_000, 0),
    ("ogg-vorbis", lambda: with_soundfile("OGG", "VORBIS", 44_100, 2), "ogg", "vorbis", 44_100, 0),
    ("ogg-opus", lambda: with_soundfile("OGG", "OPUS", 48_000, 1), "ogg", "opus", 48_000, 0),
    ("mp3", lambda: with_soundfile("MP3", "MPEG_LAYER_III", 44_100, 2), "mp3", "mp3", 44_100, 1152),
    ("m4a-aac", lambda: with_pyav("ipod", "aac"), "m4a", "aac", 44_100, 1024),
    ("mp4-aac", lambda: with_pyav("mp4", "aac", rate=48_000), "mp4", "aac", 48_000, 1024),
    ("mp4-aac+video", lambda: with_pyav("mp4", "aac", video=True), "mp4", "aac", 44_100, 1024),
    ("mov-alac", lambda: with_pyav("mov", "alac"), "mov", "alac", 44_100, 0),
    ("webm-opus", lambda: with_pyav("webm", "libopus", rate=48_000), "webm", "opus", 48_000, 0),
    ("mkv-flac", lambda: with_pyav("matroska", "flac"), "mkv", "flac", 44_100, 0),
    ("aac-adts", lambda: with_pyav("adts", "aac"), "aac", "aac", 44_100, 2048),
]


@pytest.mark.parametrize(("data", "container", "codec", "rate", "padding"),
                         [pytest.param(*case[1:], id=case[0]) for case in SUPPORTED])
def test_supported_container_decodes_to_16k_mono(data, container: str, codec: str, rate: int, padding: int) -> None:
    audio = decode_audio(data())
    assert audio.sample_rate == 16_000
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    assert (audio.container, audio.codec, audio.source_sample_rate) == (container, codec, rate)
    extra = audio.samples.size - 16_000
    assert -2 <= extra <= 2 + padding * 16_000 / rate, f"{audio.samples.size} samples"
    assert audio.duration_s == audio.samples.size / 16_000
    assert abs(peak_hz(audio) - TONE_HZ) <= 2.0  # the pitch survived decoding and resampling


def test_stereo_is_averaged_to_mono() -> None:
    left, right = np.full(1600, 0.5, np.float32), np.full(1600, -0.1, np.float32)
    buf = io.BytesIO()
    sf.write(buf, np.stack([left, right], axis=1), 16_000, format="WAV", subtype="FLOAT")
    audio = decode_audio(buf.getvalue())
    assert audio.source_channels == 2
    np.testing.assert_allclose(audio.samples, 0.2, atol=1e-7)


def test_stereo_through_pyav_integer_samples_is_averaged() -> None:
    pair = np.stack([np.full(8000, 0.5), np.full(8000, -0.25)], axis=1).astype(np.float32)
    audio = decode_audio(with_pyav("matroska", "flac", rate=16_000, samples=pair))
    assert (audio.container, audio.source_channels) == ("mkv", 2)
    np.testing.assert_allclose(audio.samples, 0.125, atol=2 / 32768)


@pytest.mark.parametrize("rate", [44_100, 8_000, 22_050])
def test_resampling_keeps_duration_and_pitch(rate: int) -> None:
    audio = decode_audio(with_soundfile("WAV", "FLOAT", rate, 1, seconds=2.0))
    assert audio.source_sample_rate == rate
    assert abs(audio.samples.size - 32_000) <= 1
    assert abs(peak_hz(audio) - TONE_HZ) <= 1.0


def test_same_bytes_same_samples_and_sha256() -> None:
    for data in (with_soundfile("WAV", "PCM_16", 44_100, 2), with_pyav("ipod", "aac")):
        first, second = decode_audio(data), decode_audio(data)
        assert first.sha256 == second.sha256
        assert np.array_equal(first.samples, second.samples)
        assert first.sha256 == hashlib.sha256(first.samples.astype("<f4").tobytes()).hexdigest()
    other = decode_audio(with_soundfile("WAV", "PCM_16", 44_100, 1))
    assert other.sha256 != first.sha256


def test_samples_are_read_only() -> None:
    audio = decode_audio(with_soundfile("WAV", "PCM_16", 16_000))
    with pytest.raises(ValueError):
        audio.samples[0] = 1.0


def test_filename_does_not_change_decoding_but_names_the_file() -> None:
    data = with_soundfile("FLAC", "PCM_16", 16_000)
    assert decode_audio(data, filename="x.mp3").sha256 == decode_audio(data).sha256
    assert "'clip.wav'" in refused(b"\x00" * 64, ErrorCode.INVALID_AUDIO, filename="clip.wav").message


def test_empty_file() -> None:
    assert "empty" in refused(b"", ErrorCode.EMPTY_FILE).message


def test_random_bytes_are_not_audio() -> None:
    noise = random.Random(7).randbytes(4096)
    message = refused(noise, ErrorCode.INVALID_AUDIO).message
    assert "not audio" in message


def test_truncated_wav_header() -> None:
    whole = wav_bytes(data=bytes(3200))
    assert "damaged header" in refused(whole[:30], ErrorCode.INVALID_AUDIO).message


def test_truncated_wav_data_keeps_what_is_there() -> None:
    whole = wav_bytes(data=(tone(16_000, 1.0)[:, 0] * 32767).astype("<i2").tobytes())
    audio = decode_audio(whole[: 44 + 8000])
    assert audio.samples.size == 4000


@pytest.mark.parametrize("fmt,codec", [("webm", "libopus"), ("matroska", "flac"), ("mp3", "libmp3lame")])
def test_truncated_stream_decodes_its_start(fmt: str, codec: str) -> None:
    data = with_pyav(fmt, codec, rate=48_000, seconds=2.0)
    audio = decode_audio(data[: len(data) // 2])
    assert 0.5 < audio.duration_s < 1.5


def test_mp4_cut_before_its_index_is_invalid() -> None:
    data = with_pyav("ipod", "aac", seconds=2.0)
    assert "cut short" in refused(data[: len(data) // 2], ErrorCode.INVALID_AUDIO).message


def test_png_image_has_no_audio_stream() -> None:
    message = refused(png_bytes(), ErrorCode.INVALID_AUDIO).message
    assert "no audio stream" in message and "png" in message


def test_video_only_file_has_no_audio_stream() -> None:
    message = refused(with_pyav("mp4", None, video=True), ErrorCode.INVALID_AUDIO).message
    assert "no audio stream" in message and "video" in message


@pytest.mark.parametrize(("fmt", "codec"), [("avi", "libmp3lame"), ("flv", "aac"), ("mpegts", "aac")])
def test_container_outside_allow_list_is_unsupported(fmt: str, codec: str) -> None:
    error = refused(with_pyav(fmt, codec), ErrorCode.UNSUPPORTED_MEDIA)
    assert error.status == 415
    assert fmt in error.message and "Supported" in error.message


def test_unknown_codec_is_unsupported() -> None:
    error = refused(wav_bytes(tag=0x1234, data=bytes(3200)), ErrorCode.UNSUPPORTED_MEDIA)
    assert "codec" in error.message


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_float_samples(bad: float) -> None:
    samples = np.zeros(1600, np.float32)
    samples[800] = bad
    data = wav_bytes(bits=32, tag=3, data=samples.tobytes())
    assert "NaN" in refused(data, ErrorCode.INVALID_AUDIO).message


def test_absurd_sample_rate() -> None:
    message = refused(wav_bytes(rate=1_000_000_000, data=bytes(3200)), ErrorCode.INVALID_AUDIO).message
    assert "1000000000 Hz" in message


@pytest.mark.parametrize("rate", [0, 500])
def test_too_low_sample_rate(rate: int) -> None:
    refused(wav_bytes(rate=rate, data=bytes(3200)), ErrorCode.INVALID_AUDIO)


@pytest.mark.parametrize("channels", [0, 65])
def test_absurd_channel_count(channels: int) -> None:
    data = wav_bytes(channels=channels, data=bytes(2 * 65 * 10))
    assert "channels" in refused(data, ErrorCode.INVALID_AUDIO).message


def test_zero_length_data_chunk() -> None:
    assert "no samples" in refused(wav_bytes(data=b""), ErrorCode.INVALID_AUDIO).message


def test_max_duration_stops_early() -> None:
    data = with_soundfile("WAV", "PCM_16", 16_000, seconds=3.0)
    refused(data, ErrorCode.AUDIO_TOO_LONG, max_duration_s=2.0)
    assert decode_audio(data, max_duration_s=3.0).duration_s == 3.0


def test_library_exceptions_become_invalid_audio(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*_: object, **__: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(sf.SoundFile, "read", explode)
    refused(with_soundfile("WAV", "PCM_16", 16_000), ErrorCode.INVALID_AUDIO)
    monkeypatch.setattr("service.audio._planes_to_mono", explode)
    refused(with_pyav("ipod", "aac"), ErrorCode.INVALID_AUDIO)
    monkeypatch.setattr("service.audio._container_name", explode)
    refused(with_pyav("webm", "libopus", rate=48_000), ErrorCode.INVALID_AUDIO)


def _fail_after(monkeypatch: pytest.MonkeyPatch, target: object, name: str, calls: int) -> None:
    """Make `target.name` raise from its `calls`+1-th call on, as a damaged stream would."""
    original = getattr(target, name)
    count = {"n": 0}

    def flaky(*args: object, **kwargs: object) -> object:
        count["n"] += 1
        if count["n"] > calls:
            raise RuntimeError("damaged packet")
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, flaky)


def test_decode_error_midway_keeps_the_audio_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import service.audio

    _fail_after(monkeypatch, sf.SoundFile, "read", 1)  # one 16384-frame block, then an error
    assert decode_audio(with_soundfile("WAV", "PCM_16", 16_000, seconds=3.0)).samples.size == 16_384
    _fail_after(monkeypatch, service.audio, "_planes_to_mono", 10)  # ten 20 ms Opus frames, less pre-skip
    assert 2_800 <= decode_audio(with_pyav("webm", "libopus", rate=48_000)).samples.size <= 3_200


@pytest.mark.parametrize(
    ("fmt", "values", "expected"),
    [
        ("u8", [[0, 128, 255]], [-1.0, 0.0, 127 / 128]),
        ("s16", [[-32768, 0, 16384]], [-1.0, 0.0, 0.5]),
        ("s32", [[-(2**31), 0, 2**30]], [-1.0, 0.0, 0.5]),
        ("flt", [[-0.5, 0.0, 0.25]], [-0.5, 0.0, 0.25]),
        ("s16p", [[32767, 0, -16384], [-32767, 16384, -16384]], [0.0, 0.25, -0.5]),
        ("fltp", [[1.0, 0.5, 0.0], [0.0, 0.5, -1.0]], [0.5, 0.5, -0.5]),
        ("s16", [[16384, 0, 0, 16384, -32768, 0]], [0.25, 0.25, -0.5]),  # packed stereo
    ],
)
def test_every_ffmpeg_sample_format_becomes_float_mono(
    fmt: str, values: list[list[float]], expected: list[float]
) -> None:

    dtype = {"u8": np.uint8, "s16": np.int16, "s32": np.int32, "flt": np.float32}[fmt.rstrip("p")]
    planar = fmt.endswith("p")
    layout = "stereo" if planar and len(values) == 2 or len(values[0]) == 6 else "mono"
    frame = av.AudioFrame.from_ndarray(np.array(values, dtype=dtype), format=fmt, layout=layout)
    mono = _planes_to_mono(_slice_planes(_frame_planes(frame), 0, frame.samples), frame.format)
    np.testing.assert_allclose(mono, expected, atol=1e-6)


def test_corrupted_files_only_ever_raise_gateway_errors() -> None:
    """Flipped and cut bytes must give audio or a 4xx error, never another exception."""
    rng = random.Random(1234)
    originals = [
        with_soundfile("WAV", "PCM_16", 16_000, seconds=0.3),
        with_soundfile("FLAC", "PCM_16", 16_000, seconds=0.3),
        with_soundfile("OGG", "VORBIS", 16_000, seconds=0.3),
        with_soundfile("MP3", "MPEG_LAYER_III", 16_000, seconds=0.3),
        with_pyav("ipod", "aac", seconds=0.3),
        with_pyav("webm", "libopus", rate=48_000, seconds=0.3),
    ]
    outcomes: set[str] = set()
    for original in originals:
        for _ in range(25):
            data = bytearray(original)
            for _ in range(rng.randint(1, 12)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = data[: rng.randint(1, len(data))] if rng.random() < 0.3 else data
            try:
                decode_audio(bytes(data))
                outcomes.add("ok")
            except GatewayError as error:
                assert error.code in {ErrorCode.INVALID_AUDIO, ErrorCode.UNSUPPORTED_MEDIA}, error.message
                outcomes.add(error.code.value)
    assert "ok" in outcomes and "invalid_audio" in outcomes

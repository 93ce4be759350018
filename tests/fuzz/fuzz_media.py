"""A corpus of malformed media, generated in memory with a fixed seed.

Every entry says what the gateway must do with it: `refuse` (a 4xx from the
error table, the engine never sees it), `accept` (a 200: the content, not the
name, decides) or `either` (damaged but partly decodable media: the decoder may
keep the audio before the damage, or refuse; both are fine, a 5xx is not).
"""

from __future__ import annotations

import io
import math
import struct
from dataclasses import dataclass

import av
import numpy as np
import soundfile as sf

RATE = 16_000
SEED = 20_260_808

#: Error codes a refused upload may carry (never an engine or server code).
MEDIA_REFUSALS = frozenset(
    {"invalid_audio", "unsupported_media_type", "empty_file", "audio_too_short", "audio_too_long", "invalid_request"}
)


@dataclass(frozen=True)
class MediaCase:
    name: str
    data: bytes
    filename: str = "upload.wav"
    expect: str = "refuse"  # refuse | accept | either
    codes: frozenset[str] = MEDIA_REFUSALS

    def __repr__(self) -> str:  # pytest ids and failure messages stay short
        return f"MediaCase({self.name!r}, {len(self.data)} bytes, {self.filename!r}, expect={self.expect})"


# -- building blocks -------------------------------------------------------------------


def tone(seconds: float = 1.0, rate: int = RATE, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    mono = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    return np.stack([mono] * channels, axis=1) if channels > 1 else mono


def soundfile_bytes(fmt: str, subtype: str | None = None, seconds: float = 1.0, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, tone(seconds, rate), rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def chunk(tag: bytes, payload: bytes, declared: int | None = None) -> bytes:
    """A RIFF chunk; `declared` lies about its size."""
    size = len(payload) if declared is None else declared
    pad = b"\x00" if len(payload) % 2 else b""
    return tag + struct.pack("<I", size & 0xFFFFFFFF) + payload + pad


def fmt_chunk(
    *,
    tag: int = 1,
    channels: int = 1,
    rate: int = RATE,
    bits: int = 16,
    block_align: int | None = None,
    byte_rate: int | None = None,
    declared: int | None = None,
) -> bytes:
    align = block_align if block_align is not None else max(channels * bits // 8, 0)
    rate_bytes = byte_rate if byte_rate is not None else rate * align
    payload = struct.pack(
        "<HHIIHH", tag & 0xFFFF, channels & 0xFFFF, rate & 0xFFFFFFFF, rate_bytes & 0xFFFFFFFF, align & 0xFFFF, bits
    )
    return chunk(b"fmt ", payload, declared)


def riff(*chunks: bytes, magic: bytes = b"RIFF", form: bytes = b"WAVE", declared: int | None = None) -> bytes:
    body = form + b"".join(chunks)
    size = len(body) if declared is None else declared
    return magic + struct.pack("<I", size & 0xFFFFFFFF) + body


def pcm16(seconds: float = 0.5, rate: int = RATE, channels: int = 1) -> bytes:
    samples = tone(seconds, rate, channels)
    return (samples * 32767).astype("<i2").tobytes()


def float_samples(values: list[float], *, seconds: float = 0.5, dtype: str = "<f4") -> bytes:
    """Half a second of tone with the given values spliced in (NaN, Inf...)."""
    samples = tone(seconds).astype(np.float64)
    for index, value in enumerate(values):
        samples[(index + 1) * 997 % samples.size] = value
    return samples.astype(dtype).tobytes()


def pyav_bytes(fmt: str, codec: str | None, *, rate: int = RATE, seconds: float = 1.0, video: bool = False) -> bytes:
    """A small container written by FFmpeg (through PyAV)."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=fmt) as out:
        if video:
            stream = out.add_stream("mpeg4", rate=10)
            stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
            for index in range(3):
                frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
                frame.pts = index
                for packet in stream.encode(frame):
                    out.mux(packet)
        else:
            stream = out.add_stream(codec, rate=rate, layout="mono")
            frame_size = stream.codec_context.frame_size or 1024
            signal = tone(seconds, rate)
            for start in range(0, signal.size, frame_size):
                frame = av.AudioFrame.from_ndarray(
                    signal[None, start : start + frame_size], format="fltp", layout="mono"
                )
                frame.sample_rate = rate
                frame.pts = start
                for packet in stream.encode(frame):
                    out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def mp4_box(tag: bytes, payload: bytes, declared: int | None = None) -> bytes:
    size = 8 + len(payload) if declared is None else declared
    return struct.pack(">I", size & 0xFFFFFFFF) + tag + payload


def ebml_element(element_id: bytes, payload: bytes, *, unknown_size: bool = False) -> bytes:
    """An EBML element with an 8-byte size (or the 'unknown size' marker)."""
    size = b"\x01\xff\xff\xff\xff\xff\xff\xff" if unknown_size else b"\x01" + len(payload).to_bytes(7, "big")
    return element_id + size + payload


def mutate(data: bytes, rng: np.random.Generator, flips: int) -> bytes:
    """Seeded damage: bit flips, a few overwritten runs, sometimes a cut or an insertion."""
    buffer = bytearray(data)
    for _ in range(flips):
        position = int(rng.integers(0, len(buffer)))
        buffer[position] ^= 1 << int(rng.integers(0, 8))
    for _ in range(int(rng.integers(0, 3))):
        start = int(rng.integers(0, len(buffer)))
        length = int(rng.integers(1, 32))
        buffer[start : start + length] = (
            rng.integers(0, 256, size=len(buffer[start : start + length])).astype(np.uint8).tobytes()
        )
    choice = int(rng.integers(0, 4))
    if choice == 0:
        buffer = buffer[: int(rng.integers(1, len(buffer)))]
    elif choice == 1:
        position = int(rng.integers(0, len(buffer)))
        buffer[position:position] = rng.integers(0, 256, size=int(rng.integers(1, 512))).astype(np.uint8).tobytes()
    return bytes(buffer)


# -- the corpus --------------------------------------------------------------------------------


def wav_header_cases() -> list[MediaCase]:
    data = pcm16()
    good = riff(fmt_chunk(), chunk(b"data", data))
    cases = [
        MediaCase("empty", b"", codes=frozenset({"empty_file"})),
        MediaCase("one-byte", b"\x00"),
        MediaCase("riff-magic-only", b"RIFF"),
        MediaCase("riff-no-form", b"RIFF\x24\x00\x00\x00"),
        MediaCase("riff-wave-no-chunks", riff()),
        MediaCase("header-cut-mid-fmt", good[:28]),
        MediaCase("header-cut-before-data", good[:36]),
        MediaCase("header-only-no-samples", good[:44]),
        MediaCase("half-a-sample", good[:45]),
        MediaCase("wrong-magic-rifx", b"RIFX" + good[4:]),
        MediaCase("wrong-magic-form", b"XXXX" + good[4:]),
        MediaCase("wrong-form-type", riff(fmt_chunk(), chunk(b"data", data), form=b"WAVX")),
        MediaCase("data-before-fmt", riff(chunk(b"data", data), fmt_chunk()), expect="either"),
        MediaCase("no-fmt-chunk", riff(chunk(b"data", data))),
        MediaCase("zero-length-data", riff(fmt_chunk(), chunk(b"data", b""))),
        MediaCase("fmt-too-short", riff(chunk(b"fmt ", b"\x01\x00\x01\x00"), chunk(b"data", data))),
        MediaCase("fmt-declares-2gib", riff(fmt_chunk(declared=0x7FFFFFF0), chunk(b"data", data))),
        MediaCase("fmt-declares-4gib", riff(fmt_chunk(declared=0xFFFFFFFF), chunk(b"data", data))),
        MediaCase("data-declares-4gib", riff(fmt_chunk(), chunk(b"data", data, declared=0xFFFFFFFF)), expect="either"),
        MediaCase(
            "data-declares-odd", riff(fmt_chunk(), chunk(b"data", data, declared=len(data) + 1)), expect="either"
        ),
        MediaCase("riff-declares-4gib", riff(fmt_chunk(), chunk(b"data", data), declared=0xFFFFFFFF), expect="either"),
        MediaCase("riff-declares-zero", riff(fmt_chunk(), chunk(b"data", data), declared=0), expect="either"),
        MediaCase(
            "junk-chunk-declares-4gib",
            riff(chunk(b"JUNK", b"\x00" * 16, declared=0xFFFFFFF0), fmt_chunk(), chunk(b"data", data)),
        ),
        MediaCase(
            "list-chunk-declares-2gib",
            riff(fmt_chunk(), chunk(b"LIST", b"INFO" + b"\x00" * 8, declared=0x7FFFFFFF), chunk(b"data", data)),
            expect="either",
        ),
        MediaCase(
            "thousands-of-unknown-chunks",
            riff(
                *(chunk(b"zz%02d" % (i % 100), b"\xff" * 6) for i in range(20_000)), fmt_chunk(), chunk(b"data", data)
            ),
            expect="either",
        ),
        MediaCase(
            "one-mib-junk-header",
            riff(
                chunk(b"JUNK", bytes(np.random.default_rng(SEED).integers(0, 256, 1 << 20, np.uint8))),
                fmt_chunk(),
                chunk(b"data", data),
            ),
            expect="either",
        ),
    ]
    for rate in (0, 1, 999, 384_001, 1_000_000, 2**31 - 1, 2**32 - 1):
        cases.append(MediaCase(f"rate-{rate}", riff(fmt_chunk(rate=rate), chunk(b"data", data))))
    for channels in (0, 65, 255, 65_535):
        frames = pcm16(0.2) * max(1, min(channels, 255))
        cases.append(MediaCase(f"channels-{channels}", riff(fmt_chunk(channels=channels), chunk(b"data", frames))))
    for bits in (0, 1, 7, 12, 48, 128, 65_535):
        cases.append(MediaCase(f"bits-{bits}", riff(fmt_chunk(bits=bits), chunk(b"data", data)), expect="either"))
    cases += [
        MediaCase("block-align-zero", riff(fmt_chunk(block_align=0), chunk(b"data", data)), expect="either"),
        MediaCase("block-align-65535", riff(fmt_chunk(block_align=65_535), chunk(b"data", data)), expect="either"),
        MediaCase("byte-rate-zero", riff(fmt_chunk(byte_rate=0), chunk(b"data", data)), expect="either"),
        MediaCase("format-tag-unknown", riff(fmt_chunk(tag=0x1234), chunk(b"data", data))),
        MediaCase("format-tag-extensible-short", riff(fmt_chunk(tag=0xFFFE), chunk(b"data", data))),
        MediaCase("float-tag-16-bit", riff(fmt_chunk(tag=3, bits=16), chunk(b"data", data)), expect="either"),
    ]
    for label, values in (
        ("nan", [math.nan]),
        ("inf", [math.inf]),
        ("-inf", [-math.inf]),
        ("mixed", [math.nan, math.inf]),
    ):
        cases.append(
            MediaCase(f"float32-{label}", riff(fmt_chunk(tag=3, bits=32), chunk(b"data", float_samples(values))))
        )
        cases.append(
            MediaCase(
                f"float64-{label}",
                riff(fmt_chunk(tag=3, bits=64), chunk(b"data", float_samples(values, dtype="<f8"))),
            )
        )
    # Finite but far outside [-1, 1]: float64 values that do not fit float32.
    cases.append(
        MediaCase(
            "float64-overflows-float32",
            riff(fmt_chunk(tag=3, bits=64), chunk(b"data", float_samples([1e300] * 4, dtype="<f8"))),
        )
    )
    all_nan = np.full(RATE // 2, np.nan, dtype="<f4").tobytes()
    cases.append(MediaCase("float32-all-nan", riff(fmt_chunk(tag=3, bits=32), chunk(b"data", all_nan))))
    return cases


def random_byte_cases() -> list[MediaCase]:
    rng = np.random.default_rng(SEED)
    cases = [
        MediaCase(f"random-{size}", rng.integers(0, 256, size, np.uint8).tobytes(), filename=name)
        for size, name in ((7, "a.wav"), (44, "a.wav"), (1_000, "a.mp3"), (65_536, "a.m4a"), (300_000, "a.webm"))
    ]
    cases += [
        MediaCase("zeros-64k", bytes(65_536)),
        MediaCase("text-file", b"This is not audio.\n" * 100, filename="notes.txt"),
        MediaCase("json-file", b'{"error": {"message": "x"}}', filename="a.json"),
        MediaCase("png-image", b"\x89PNG\r\n\x1a\n" + bytes(200), filename="a.png"),
        MediaCase("id3-only", b"ID3\x04\x00\x00\x00\x00\x00\x00"),
        MediaCase("id3-declares-huge-tag", b"ID3\x04\x00\x00\x7f\x7f\x7f\x7f" + bytes(100), filename="a.mp3"),
        MediaCase("mp3-frame-sync-garbage", (b"\xff\xfb\x90\x64" + bytes(413)) * 20, filename="a.mp3", expect="either"),
        MediaCase("ogg-magic-garbage", b"OggS" + rng.integers(0, 256, 4_000, np.uint8).tobytes(), filename="a.ogg"),
        MediaCase("flac-magic-garbage", b"fLaC" + rng.integers(0, 256, 4_000, np.uint8).tobytes(), filename="a.flac"),
        MediaCase(
            "ftyp-garbage",
            b"\x00\x00\x00\x18ftypisom" + rng.integers(0, 256, 4_000, np.uint8).tobytes(),
            filename="a.m4a",
        ),
        MediaCase(
            "ebml-magic-garbage",
            b"\x1a\x45\xdf\xa3" + rng.integers(0, 256, 4_000, np.uint8).tobytes(),
            filename="a.webm",
        ),
    ]
    return cases


def wrong_extension_cases() -> list[MediaCase]:
    """Valid audio under a misleading or hostile name: the content decides, so these succeed."""
    wav = soundfile_bytes("WAV", "PCM_16")
    flac = soundfile_bytes("FLAC")
    m4a = pyav_bytes("ipod", "aac")
    return [
        MediaCase("wav-named-mp4", wav, filename="speech.mp4", expect="accept"),
        MediaCase("wav-named-txt", wav, filename="speech.txt", expect="accept"),
        MediaCase("wav-no-extension", wav, filename="speech", expect="accept"),
        MediaCase("flac-named-wav", flac, filename="speech.wav", expect="accept"),
        MediaCase("m4a-named-wav", m4a, filename="speech.wav", expect="accept"),
        MediaCase("wav-control-chars-name", wav, filename="a\x01b\x7f\u202e.wav", expect="accept"),
        MediaCase("wav-long-name", wav, filename="x" * 4_000 + ".wav", expect="accept"),
        MediaCase("wav-path-name", wav, filename="../../etc/passwd", expect="accept"),
    ]


def container_cases() -> list[MediaCase]:
    """Containers through PyAV: outside the allow-list, without audio, nested or damaged."""
    m4a = pyav_bytes("ipod", "aac")
    webm = pyav_bytes("webm", "libopus", rate=48_000)
    deep_mp4 = mp4_box(b"ftyp", b"isom\x00\x00\x02\x00isomiso2mp41")
    nested = b""
    for _ in range(2_000):
        nested = mp4_box(b"moov", nested)
    deep_mp4 += nested
    deep_ebml = b""
    for _ in range(2_000):
        deep_ebml = ebml_element(b"\x18\x53\x80\x67", deep_ebml)  # Segment in Segment in ...
    header = ebml_element(b"\x1a\x45\xdf\xa3", ebml_element(b"\x42\x82", b"webm"))
    moov_at = m4a.find(b"moov")
    cases = [
        MediaCase("avi-mp2", pyav_bytes("avi", "mp2"), filename="a.avi", codes=frozenset({"unsupported_media_type"})),
        MediaCase(
            "mpegts-mp2", pyav_bytes("mpegts", "mp2"), filename="a.ts", codes=frozenset({"unsupported_media_type"})
        ),
        MediaCase("nut-flac", pyav_bytes("nut", "flac"), filename="a.nut", codes=frozenset({"unsupported_media_type"})),
        MediaCase("flv-aac", pyav_bytes("flv", "aac"), filename="a.flv", codes=frozenset({"unsupported_media_type"})),
        MediaCase("mp4-video-only", pyav_bytes("mp4", None, video=True), filename="a.mp4"),
        MediaCase("m4a-cut-before-index", m4a[: max(moov_at - 4, 16)] if moov_at > 0 else m4a[: len(m4a) // 2]),
        MediaCase("m4a-cut-in-half", m4a[: len(m4a) // 2], expect="either"),
        MediaCase("webm-cut-in-half", webm[: len(webm) // 2], expect="either"),
        MediaCase("mp4-2000-nested-boxes", deep_mp4, filename="a.mp4"),
        MediaCase(
            "mp4-box-declares-4gib",
            mp4_box(b"ftyp", b"isom\x00\x00\x02\x00isom") + mp4_box(b"moov", bytes(64), 0xFFFFFFFF),
        ),
        MediaCase("mp4-box-size-zero", mp4_box(b"ftyp", b"isom\x00\x00\x02\x00isom") + mp4_box(b"mdat", bytes(64), 0)),
        MediaCase("ebml-2000-nested-segments", header + deep_ebml, filename="a.webm"),
        MediaCase(
            "ebml-unknown-size-segment",
            header + ebml_element(b"\x18\x53\x80\x67", bytes(256), unknown_size=True),
            filename="a.mkv",
        ),
    ]
    return cases


def mutant_cases(per_format: int = 6) -> list[MediaCase]:
    """Seeded damage to valid files of every supported family."""
    rng = np.random.default_rng(SEED)
    seeds = {
        "wav": soundfile_bytes("WAV", "PCM_16"),
        "wav-float": soundfile_bytes("WAV", "FLOAT"),
        "flac": soundfile_bytes("FLAC"),
        "ogg-vorbis": soundfile_bytes("OGG", "VORBIS"),
        "mp3": soundfile_bytes("MP3"),
        "m4a": pyav_bytes("ipod", "aac"),
        "webm": pyav_bytes("webm", "libopus", rate=48_000),
        "mkv-flac": pyav_bytes("matroska", "flac"),
        "adts": pyav_bytes("adts", "aac"),
    }
    cases = []
    for name, data in seeds.items():
        for index in range(per_format):
            damaged = mutate(data, rng, flips=int(rng.integers(1, 64)))
            cases.append(MediaCase(f"mutant-{name}-{index}", damaged, filename=f"a.{name}", expect="either"))
    return cases


def bomb_cases() -> list[MediaCase]:
    """Small files that declare or expand to far more audio than the limit."""
    silence = np.zeros(8_000 * 60 * 10, dtype=np.float32)  # 10 minutes at 8 kHz
    buffer = io.BytesIO()
    sf.write(buffer, silence, 8_000, format="FLAC")
    return [MediaCase("flac-10-min-silence", buffer.getvalue(), filename="a.flac", codes=frozenset({"audio_too_long"}))]


def build_corpus() -> list[MediaCase]:
    corpus = (
        wav_header_cases()
        + random_byte_cases()
        + wrong_extension_cases()
        + container_cases()
        + mutant_cases()
        + bomb_cases()
    )
    names = [case.name for case in corpus]
    assert len(names) == len(set(names)), "corpus names must be unique"
    return corpus

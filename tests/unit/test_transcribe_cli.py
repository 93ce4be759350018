"""`moss-gateway transcribe` against a gateway on the fake engine (tests/fake_server.py).

The command runs as a real subprocess (its exit status and stderr are what a user
sees), against a real HTTP server, and what it writes is compared with the API's
own answer for the same file.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_engine import FakeEngine
from gateway_process import free_port
from helpers import make_wav, open_gate

from service.app import create_app
from service.settings import GatewaySettings
from service.transcribe_cli import (
    EXTENSIONS,
    ProgressBar,
    StandaloneGateway,
    TranscribeError,
    add_arguments,
    output_paths,
    run,
    sse_events,
)

REPO = Path(__file__).resolve().parents[2]
NOT_AUDIO = b"this is a text file, not audio\n" * 20


class Tty(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state = tmp_path_factory.mktemp("fake-server")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "fake_server.py"), "--port", str(port), "--state-dir", str(state),
         "--token-delay", "0.002"],
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and process.poll() is None, "the fake server did not start"
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audio") / "meeting.wav"
    path.write_bytes(make_wav(4.0))
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "transcribe", *args], cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )


def api(url: str, path: Path, **fields: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/audio/transcriptions", data=fields, files={"file": (path.name, path.read_bytes())}, timeout=60
    )


def test_writes_one_file_per_input_equal_to_the_api(server: str, wav: Path, tmp_path: Path) -> None:
    second = tmp_path / "second.wav"
    second.write_bytes(make_wav(4.5, seed=1))
    out = tmp_path / "out"
    result = cli(str(wav), str(second), "--url", server, "-o", str(out), "--response-format", "srt")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["meeting.srt", "second.srt"]
    assert (out / "meeting.srt").read_text() == api(server, wav, response_format="srt").text
    assert "[S02] The pipeline is ready." in (out / "second.srt").read_text()
    assert f"{wav} -> {out / 'meeting.srt'} (2 segments, stop eos)" in result.stderr
    assert "warning" not in result.stderr
    assert "\r" not in result.stderr  # stderr is a pipe here: no progress bar


@pytest.mark.parametrize("fmt", ["text", "json", "diarized_json", "verbose_json", "vtt"])
def test_each_format_matches_the_api(server: str, wav: Path, tmp_path: Path, fmt: str) -> None:
    result = cli(str(wav), "--url", server, "-o", str(tmp_path), "-f", fmt)
    assert result.returncode == 0, result.stderr
    written = (tmp_path / f"meeting.{EXTENSIONS[fmt]}").read_text()
    reference = api(server, wav, response_format=fmt)
    if fmt in ("text", "vtt"):
        assert written == reference.text
        return
    got, want = json.loads(written), reference.json()
    for body in (got, want):  # what differs between two requests of the same file
        for key in ("request_id", "timings"):
            body.get("moss", {}).pop(key, None)
    assert got == want


def test_api_error_exits_non_zero_with_the_api_message(server: str, tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_bytes(NOT_AUDIO)
    refused = api(server, junk)
    assert refused.status_code >= 400
    result = cli(str(junk), "--url", server, "-o", str(tmp_path / "out"))
    assert result.returncode == 1
    assert f"moss-gateway transcribe: {junk}: {refused.json()['error']['message']}" in result.stderr
    assert not (tmp_path / "out" / "notes.srt").exists()


def test_truncated_result_is_written_with_a_warning(server: str, wav: Path, tmp_path: Path) -> None:
    result = cli(str(wav), "--url", server, "-o", str(tmp_path), "-f", "diarized_json", "--max-completion-tokens", "40")
    assert result.returncode == 0, result.stderr
    body = json.loads((tmp_path / "meeting.json").read_text())
    assert body["moss"]["truncated"] is True and body["moss"]["stop"]["stop"] == "max_tokens"
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warning == [
        f"warning: {wav}: the result is truncated ({'; '.join(body['moss']['truncation_reasons'])}, "
        f"{body['moss']['coverage']['coverage'] * 100:.0f} % of the audio covered)"
    ]


def test_unstreamed_format_warns_from_the_header(server: str, wav: Path, tmp_path: Path) -> None:
    result = cli(str(wav), "--url", server, "-o", str(tmp_path), "-f", "verbose_json", "--max-completion-tokens", "40")
    assert result.returncode == 0, result.stderr
    assert f"warning: {wav}: the result is truncated" in result.stderr


def test_no_gateway_exits_2(wav: Path, tmp_path: Path) -> None:
    result = cli(str(wav), "--url", f"http://127.0.0.1:{free_port()}", "-o", str(tmp_path))
    assert result.returncode == 2
    assert "no answer from the gateway" in result.stderr


def test_progress_bar_only_on_a_terminal(server: str, wav: Path, tmp_path: Path) -> None:
    terminal, pipe = Tty(), io.StringIO()
    for stream in (terminal, pipe):
        code = run([wav], url=server, fmt="srt", out_dir=tmp_path, api_key=None, fields={}, timeout_s=60, stderr=stream)
        assert code == 0
    drawn = terminal.getvalue()
    assert "\rmeeting.wav [" in drawn and "100 %" in drawn and "2 segments" in drawn
    # The fake engine's segments end at 1.68 s and 3.71 s of the 4 s file (its length read locally).
    assert " 42 % 1 segment " in drawn and " 93 % 2 segments" in drawn
    assert "\r" not in pipe.getvalue()
    assert pipe.getvalue() == f"{wav} -> {tmp_path / 'meeting.srt'} (2 segments, stop eos)\n"


def test_progress_bar_line_fits_the_terminal() -> None:
    bar = ProgressBar("clip.wav", Tty())
    bar.update(fraction=0.5, detail="12.0/24.0 s")
    line = bar.line(60)
    assert len(line) <= 59 and " 50 %" in line and "12.0/24.0 s" in line
    drawn = line[line.index("[") + 1 : line.index("]")]
    assert set(drawn) == {"#", "."} and drawn.count("#") == round(len(drawn) / 2)
    bar.update(fraction=None, detail="x")  # an unknown fraction keeps the last one
    assert " 50 %" in bar.line(60)


def test_sse_parser() -> None:
    lines = [": ping", "", 'data: {"type": "a"}', "", "data: {", 'data: "type": "b"}', "", "data: [DONE]", "", 'data:{"c":1}']
    assert list(sse_events(lines)) == [{"type": "a"}, {"type": "b"}, {"c": 1}]


def test_outputs_may_not_collide(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(TranscribeError, match="would both be written"):
        output_paths([tmp_path / "a" / "x.wav", tmp_path / "b" / "x.wav"], "srt", tmp_path)
    with pytest.raises(TranscribeError, match="overwrite its own input"):
        output_paths([tmp_path / "x.txt"], "text", tmp_path)
    assert output_paths([tmp_path / "a" / "x.wav"], "rttm", tmp_path / "o") == [tmp_path / "o" / "x.rttm"]


def test_arguments() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["a.wav", "b.flac", "-o", "out", "--response-format", "rttm", "--standalone"])
    assert (args.files, args.output_dir, args.response_format, args.standalone) == (["a.wav", "b.flac"], "out", "rttm", True)
    assert parser.parse_args(["a.wav"]).url == "http://127.0.0.1:8000"


def test_standalone_gateway_serves_the_app(tmp_path: Path, wav: Path) -> None:
    engine = FakeEngine()
    app = create_app(GatewaySettings(state_dir=tmp_path / "state"), engine_factory=lambda _: engine, on_ready=open_gate)
    gateway = StandaloneGateway(app)
    gateway.start(timeout_s=30, stderr=io.StringIO())
    try:
        code = run([wav], url=gateway.url, fmt="rttm", out_dir=tmp_path, api_key=None, fields={}, timeout_s=60,
                   stderr=io.StringIO())
        assert code == 0
        assert (tmp_path / "meeting.rttm").read_text() == (
            "SPEAKER meeting 1 0.500 1.180 <NA> <NA> S01 <NA> <NA>\n"
            "SPEAKER meeting 1 2.600 1.110 <NA> <NA> S02 <NA> <NA>\n"
        )
    finally:
        gateway.stop()
    assert not gateway.thread.is_alive()

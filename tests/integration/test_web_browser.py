"""The web page in a real headless Chromium: two page loads, one Chromium.

The first, against the real gateway on the tiny checkpoint, does everything a person would: the backend shows as qualified, the
frozen clip is uploaded and streams in as its four segments and two speakers, the
SRT download is byte-for-byte the API's own `response_format=srt`, a renamed speaker
reaches the view and the downloads, an upload that is not audio shows the API's own
error message, and the page's renderers agree with service/formats.py on tricky
input. Screenshots are taken on every run; they land in docs/ (the README's pictures) when
MOSS_GATEWAY_SCREENSHOT_DIR=docs is set, and in the test's temp folder otherwise, so a plain
test run leaves the work tree clean.

The second, against a gateway on the fake engine with API keys set, asks for the key and
keeps it in memory only, then plays the stream contract the gateway is moving to (deltas
tagged with their segment, progress in audio time, keep-alive comments, a truncated
result, an error event) through the page, split into arbitrary chunks.

Needs Debian's chromium and chromium-driver, which scripts/bootstrap installs; the
test skips, saying why, only when they are missing.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_engine import FakeEngine
from gateway_process import GatewayProcess
from helpers import make_wav, open_gate
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from qualification.clip import FROZEN_CLIP_PATH, FROZEN_CLIP_SEGMENTS
from service.app import create_app
from service.formats import render_rttm, render_srt, render_vtt
from service.settings import GatewaySettings
from service.transcribe_cli import StandaloneGateway
from service.transcript import Segment

REPO = Path(__file__).resolve().parents[2]
CLIP_STEM = FROZEN_CLIP_PATH.stem

#: Segments whose rendering has edge cases: rounding, backwards spans, cue breakers, odd whitespace, renames.
TRICKY = [
    Segment(0, 0.0005, 1.0004, "S01", "a --> b\n\n  <i>&c</i>  \nd"),
    Segment(1, 5.0, 4.0, "S02", "backwards"),
    Segment(2, 6.0, 6.0004, "S01", "instant"),
    Segment(3, 59.9996, 3725.5, "Ada  Lovelace", "line\u2028sep\x1cfile\x85next\r\nend  "),
    Segment(4, 0.0, 0.25, " ", "\t"),
    Segment(5, 360_000.0, 360_001.5, "S<3&", "tags <b> & ampersands"),
]


def _chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip(
            "Debian's chromium and chromium-driver are not installed (scripts/bootstrap installs them as root "
            f"with apt-get; found chromium={browser}, chromedriver={driver})"
        )
    return browser, driver


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: $MOSS_GATEWAY_SCREENSHOT_DIR (relative to the repo), else a temp folder."""
    wanted = os.environ.get("MOSS_GATEWAY_SCREENSHOT_DIR")
    folder = REPO / wanted if wanted else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[webdriver.Chrome, Path]]:
    binary, driver_path = _chromium()
    downloads = tmp_path_factory.mktemp("downloads")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1100,1250", "--mute-audio", "--no-first-run", "--disable-extensions",
                     # A synthetic microphone (a beep) that needs no permission prompt, for the recording path.
                     "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"):
        options.add_argument(argument)
    options.add_experimental_option("prefs", {
        "download.default_directory": str(downloads),
        "download.prompt_for_download": False,
        "safebrowsing.enabled": False,
    })
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver, downloads
    finally:
        driver.quit()


def _wait(driver: webdriver.Chrome, what: str, condition: Any, timeout: float = 120) -> Any:
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: condition(d))
    except TimeoutException:
        raise AssertionError(
            f"timed out waiting for {what}; page error: {d_text(driver, 'error')!r}; "
            f"evidence: {d_text(driver, 'evidence')!r}"
        ) from None


def d_text(driver: webdriver.Chrome, element_id: str) -> str:
    return str(driver.execute_script(f"return document.getElementById('{element_id}').textContent"))


def _downloaded(folder: Path, name: str, timeout: float = 20) -> str:
    path = folder / name
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and not list(folder.glob("*.crdownload")):
            return path.read_text(encoding="utf-8")
        time.sleep(0.1)
    raise AssertionError(f"{name} was not downloaded; the folder holds {sorted(p.name for p in folder.iterdir())}")


def _segments_shown(driver: webdriver.Chrome) -> list[tuple[str, str, str]]:
    return [
        (
            row.find_element(By.CSS_SELECTOR, ".time").text,
            row.find_element(By.CSS_SELECTOR, ".who").text,
            row.find_element(By.CSS_SELECTOR, ".text").text,
        )
        for row in driver.find_elements(By.CSS_SELECTOR, "#segments li.segment")
    ]


def _segment_dicts(segments: list[Segment]) -> list[dict[str, Any]]:
    return [{"id": f"seg_{s.id}", "start": s.start, "end": s.end, "speaker": s.speaker, "text": s.text} for s in segments]


@pytest.mark.engine
def test_page_transcribes_the_frozen_clip(
    qualified_gateway: GatewayProcess, browser: tuple[webdriver.Chrome, Path], shots: Path
) -> None:
    driver, downloads = browser
    with qualified_gateway.client() as client:
        api_srt = client.post(
            "/v1/audio/transcriptions", data={"response_format": "srt"},
            files={"file": (FROZEN_CLIP_PATH.name, FROZEN_CLIP_PATH.read_bytes(), "audio/wav")},
        )
        not_audio = client.post(
            "/v1/audio/transcriptions", files={"file": ("notes.txt", b"these are not audio bytes\n" * 40, "text/plain")}
        )
    assert api_srt.status_code == 200, api_srt.text
    assert not_audio.status_code >= 400

    driver.get(qualified_gateway.url + "/")
    _wait(driver, "the backend to show as qualified",
          lambda d: d.find_element(By.ID, "backend-summary").get_attribute("data-state") == "ready", timeout=30)
    words = d_text(driver, "backend-words")
    qualification_id = qualified_gateway.client().get("/v1/backend").json()["qualification"]["qualification_id"]
    assert f"Qualified: record {qualification_id}" in words and "vLLM 0.32.0" in words, words

    # Upload the frozen clip and let the stream fill the page.
    driver.find_element(By.ID, "file-input").send_keys(str(FROZEN_CLIP_PATH))
    _wait(driver, "the transcribe button", lambda d: d.find_element(By.ID, "transcribe").is_enabled(), timeout=10)
    driver.find_element(By.ID, "transcribe").click()
    _wait(driver, "the final event",
          lambda d: d.find_element(By.ID, "evidence").get_attribute("data-state") in ("complete", "truncated"))
    assert driver.find_element(By.ID, "error").get_attribute("hidden") is not None, d_text(driver, "error")
    shown = _segments_shown(driver)
    assert [(who, text) for _, who, text in shown] == [(spk, text) for *_, spk, text in FROZEN_CLIP_SEGMENTS]
    assert shown[0][0] == "0:00.50 – 0:01.68"
    evidence = d_text(driver, "evidence")
    assert evidence.startswith("Complete: the model ended the transcript itself") and "stop class eos" in evidence
    assert driver.find_element(By.ID, "progress").get_attribute("value") == "1"
    chips = driver.find_elements(By.CSS_SELECTOR, "#speakers .speaker")
    assert [chip.get_attribute("data-speaker") for chip in chips] == ["S01", "S02"]
    colours = {chip.find_element(By.CSS_SELECTOR, ".swatch").value_of_css_property("background-color") for chip in chips}
    assert len(colours) == 2

    # A timestamp plays its moment.
    driver.find_elements(By.CSS_SELECTOR, "#segments button.time")[2].click()
    _wait(driver, "the player to seek", lambda d: abs(
        float(d.execute_script("return document.getElementById('player').currentTime")) - 5.0) < 0.5, timeout=10)

    # SRT download: the page's rendering of the streamed segments is the API's SRT for the same file.
    driver.find_element(By.CSS_SELECTOR, '.downloads button[data-format="srt"]').click()
    assert _downloaded(downloads, f"{CLIP_STEM}.srt") == api_srt.text
    assert driver.save_screenshot(str(shots / "page.png"))

    # Renaming a speaker changes the view and every download.
    name_input = driver.find_element(By.CSS_SELECTOR, '#speakers .speaker[data-speaker="S01"] input')
    name_input.clear()
    name_input.send_keys("Ada Lovelace")
    assert [who for _, who, _ in _segments_shown(driver)] == ["Ada Lovelace", "S02", "Ada Lovelace", "S02"]
    renamed = [
        Segment(i, start, end, "Ada Lovelace" if spk == "S01" else spk, text)
        for i, (start, end, spk, text) in enumerate(FROZEN_CLIP_SEGMENTS)
    ]
    page = driver.execute_script(
        "return ['srt','vtt','rttm','json'].map(f => window.mossPage.downloadText(f))"
    )
    assert page[0] == render_srt(renamed)
    assert page[1] == render_vtt(renamed)
    assert page[2] == render_rttm(renamed, CLIP_STEM)
    assert page[2].splitlines()[0] == f"SPEAKER {CLIP_STEM} 1 0.500 1.180 <NA> <NA> Ada_Lovelace <NA> <NA>"
    as_json = json.loads(page[3])
    assert as_json["speakers"] == {"S01": "Ada Lovelace", "S02": "S02"}
    assert [s["speaker_label"] for s in as_json["segments"]] == ["S01", "S02", "S01", "S02"]
    assert as_json["moss"]["truncated"] is False
    coverage = as_json["moss"]["coverage"]
    assert f"cover {round(coverage['coverage'] * 100)} % of the audio" in evidence, evidence
    assert f"ends at {coverage['last_segment_end_s']:.2f} s of {coverage['audio_duration_s']:.2f} s" in evidence
    driver.find_element(By.CSS_SELECTOR, '.downloads button[data-format="rttm"]').click()
    assert _downloaded(downloads, f"{CLIP_STEM}.rttm") == page[2]
    assert driver.save_screenshot(str(shots / "page-renamed.png"))

    # The page's renderers and the server's agree on tricky input too.
    agreed = driver.execute_async_script(
        """const [segments, done] = [arguments[0], arguments[arguments.length - 1]];
        import('/ui/app.js').then(m => done([m.renderSrt(segments), m.renderVtt(segments),
                                           m.renderRttm(segments, 'my file.wav')]));""",
        _segment_dicts(TRICKY),
    )
    assert agreed == [render_srt(TRICKY), render_vtt(TRICKY), render_rttm(TRICKY, "my file.wav")]

    # An upload that is not audio: the page shows the API's own message.
    junk = downloads / "notes.txt"
    junk.write_bytes(b"these are not audio bytes\n" * 40)
    driver.find_element(By.ID, "file-input").send_keys(str(junk))
    driver.find_element(By.ID, "transcribe").click()
    _wait(driver, "the error", lambda d: d.find_element(By.ID, "error").get_attribute("hidden") is None, timeout=30)
    message = driver.find_element(By.CSS_SELECTOR, "#error .message").text
    assert message == not_audio.json()["error"]["message"]
    assert f"HTTP {not_audio.status_code}" in d_text(driver, "error")
    assert driver.save_screenshot(str(shots / "page-error.png"))


PAGE_KEY = "page-test-key-0123456789"

#: The stream the gateway is moving to, cut mid-line; the page waits at "HOLD" until the test releases it.
CONTRACT_CHUNKS = [
    ": ping\n\n",
    'data: {"type":"transcript.text.delta","delta":"Hello ","segment_id":"seg_0"}\n\ndata: {"type":"moss.pro',
    'gress","covered_s":12.3,"duration_s":40.0,"fraction":0.31}\n\n',
    "HOLD",
    'data: {"type":"transcript.text.segment","id":"seg_0","start":0.5,"end":12.3,"text":"Hello there.",'
    '"speaker":"S01"}\r\n\r\n',
    'data: {"type":"transcript.text.delta","delta":"Hello there.","segment_id":"seg_0"}\n\n: ping\n\n',
    'data: {"type":"transcript.text.delta","delta":"Still","segment_id":"seg_1"}\n\n',
    'data: {"type":"moss.progress","covered_s":20.0,"duration_s":40.0,"fraction":0.5}\n\n',
    'data: {"type":"transcript.text.done","text":"Hello there.","usage":{},"moss":{"stop":{"stop":"max_tokens",'
    '"generated_tokens":800,"max_tokens":800},"coverage":{"coverage":0.31,"audio_duration_s":40.0,'
    '"last_segment_end_s":12.3,"uncovered_tail_s":27.7},"truncated":true,'
    '"truncation_reasons":["stopped by max_tokens, not an end token"],"track":"native"}}\n\n',
]

#: Replaces the page's fetch for the transcription POST only: it records the Authorization header and
#: answers with the chunks above, holding at "HOLD" until `window.releaseStream()`.
FAKE_STREAM = """
const chunks = arguments[0];
const realFetch = window.fetch.bind(window);
window.seenAuthorization = [];
window.fetch = async (url, options = {}) => {
  if (!String(url).includes('/v1/audio/transcriptions')) return realFetch(url, options);
  window.seenAuthorization.push(new Headers(options.headers).get('Authorization'));
  let release;
  const held = new Promise(resolve => { release = resolve; });
  window.releaseStream = () => release();
  const encoder = new TextEncoder();
  const body = new ReadableStream({
    async start(controller) {
      for (const chunk of chunks) {
        if (chunk === 'HOLD') { await held; continue; }
        controller.enqueue(encoder.encode(chunk));
        await new Promise(resolve => setTimeout(resolve, 20));
      }
      controller.close();
    },
  });
  return new Response(body, { status: 200, headers: { 'Content-Type': 'text/event-stream' } });
};
"""


@pytest.fixture(scope="module")
def keyed_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway on the fake engine whose API needs a key, served on a loopback port."""
    state = tmp_path_factory.mktemp("keyed")
    settings = GatewaySettings(state_dir=state / "state", access={"api_keys": [PAGE_KEY]})
    engine = FakeEngine()
    gateway = StandaloneGateway(create_app(settings, engine_factory=lambda _: engine, on_ready=open_gate))
    gateway.start(timeout_s=30, stderr=io.StringIO(), api_key=PAGE_KEY)
    try:
        yield gateway.url
    finally:
        gateway.stop()


def test_page_asks_for_the_key_and_follows_the_stream_contract(
    keyed_gateway: str, browser: tuple[webdriver.Chrome, Path], shots: Path, tmp_path: Path
) -> None:
    driver, _ = browser
    driver.get(keyed_gateway + "/")
    _wait(driver, "the key prompt", lambda d: d.find_element(By.ID, "key-card").is_displayed(), timeout=20)
    refused = httpx.get(f"{keyed_gateway}/v1/backend")
    assert d_text(driver, "key-reason") == refused.json()["error"]["message"]
    driver.find_element(By.ID, "key-input").send_keys(PAGE_KEY)
    driver.find_element(By.CSS_SELECTOR, "#key-form button").click()
    _wait(driver, "the backend with the key",
          lambda d: d.find_element(By.ID, "backend-summary").get_attribute("data-state") == "ready", timeout=20)
    assert not driver.find_element(By.ID, "key-card").is_displayed()
    kept = driver.execute_script(
        "return [localStorage.length, sessionStorage.length, document.cookie, document.getElementById('key-input').value]"
    )
    assert kept == [0, 0, "", ""]

    # A real transcription with the key (fake engine: two segments).
    wav = tmp_path / "short.wav"
    wav.write_bytes(make_wav(4.0))
    driver.find_element(By.ID, "file-input").send_keys(str(wav))
    driver.find_element(By.ID, "transcribe").click()
    _wait(driver, "the fake engine's result",
          lambda d: d.find_element(By.ID, "evidence").get_attribute("data-state") == "complete", timeout=30)
    assert [text for *_, text in _segments_shown(driver)] == ["Good morning everyone.", "The pipeline is ready."]

    # Recording from the (synthetic) microphone: MediaRecorder's webm/ogg goes up and the gateway decodes it.
    driver.find_element(By.ID, "record").click()
    _wait(driver, "the recording to start",
          lambda d: "recording" in (d.find_element(By.ID, "record").get_attribute("class") or ""), timeout=10)
    time.sleep(3)
    driver.find_element(By.ID, "record").click()
    _wait(driver, "the recording as the input", lambda d: d_text(d, "file-name").startswith("recording-"), timeout=10)
    assert re.fullmatch(r"recording-[\dT-]+\.(webm|ogg) \(\d+ KiB\)", d_text(driver, "file-name"))
    driver.find_element(By.ID, "transcribe").click()
    _wait(driver, "the recording's result",
          lambda d: d.find_element(By.ID, "evidence").get_attribute("data-state") in ("complete", "truncated"), timeout=30)
    audio = json.loads(driver.execute_script("return window.mossPage.downloadText('json')"))["moss"]["audio"]
    assert 2.0 <= audio["duration_s"] <= 5.0 and audio["container"] in ("webm", "matroska", "ogg"), audio

    # The coming stream contract, through the same page.
    driver.execute_script(FAKE_STREAM, CONTRACT_CHUNKS)
    driver.find_element(By.ID, "transcribe").click()
    _wait(driver, "progress in audio time",
          lambda d: d.find_element(By.ID, "progress").get_attribute("value") == "0.31", timeout=10)
    assert d_text(driver, "progress-label") == "12.3 s of 40.0 s transcribed (31 %)"
    assert d_text(driver, "live") == "Hello"
    assert _segments_shown(driver) == []
    driver.execute_script("window.releaseStream()")
    _wait(driver, "the truncated result",
          lambda d: d.find_element(By.ID, "evidence").get_attribute("data-state") == "truncated", timeout=10)
    assert _segments_shown(driver) == [("0:00.50 – 0:12.30", "S01", "Hello there.")]
    assert d_text(driver, "evidence") == (
        "Truncated: the output budget ran out after 800 of 800 budgeted tokens (stop class max_tokens). "
        "The segments cover 31 % of the audio (the last segment ends at 12.30 s of 40.00 s). "
        "The last 27.70 s have no transcript. Why it counts as truncated: stopped by max_tokens, not an end token."
    )
    assert driver.execute_script("return window.seenAuthorization") == [f"Bearer {PAGE_KEY}"]
    assert driver.save_screenshot(str(shots / "page-truncated.png"))

    # An error event mid-stream: the API's words, and the segments that did arrive are kept.
    driver.execute_script(FAKE_STREAM, [
        CONTRACT_CHUNKS[4],
        'data: {"type":"error","error":{"message":"The engine died; the request was aborted.",'
        '"type":"server_error","param":null,"code":"engine_dead"}}\n\n',
    ])
    driver.find_element(By.ID, "transcribe").click()
    _wait(driver, "the error", lambda d: d.find_element(By.ID, "error").get_attribute("hidden") is None, timeout=10)
    assert driver.find_element(By.CSS_SELECTOR, "#error .message").text == "The engine died; the request was aborted."
    assert d_text(driver, "evidence").startswith("No final result: the segments above")
    assert len(_segments_shown(driver)) == 1

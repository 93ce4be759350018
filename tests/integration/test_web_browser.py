"""The web page in a real headless Chromium against the real gateway on the tiny checkpoint.

One page load does everything a person would: the backend shows as qualified, the
frozen clip is uploaded and streams in as its four segments and two speakers, the
SRT download is byte-for-byte the API's own `response_format=srt`, a renamed speaker
reaches the view and the downloads, an upload that is not audio shows the API's own
error message, and the page's renderers agree with service/formats.py on tricky
input. Screenshots land in docs/ for the README and for a person to look at.

Needs Debian's chromium and chromium-driver, which scripts/bootstrap installs; the
test skips, saying why, only when they are missing.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway_process import GatewayProcess
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from qualification.clip import FROZEN_CLIP_PATH, FROZEN_CLIP_SEGMENTS
from service.formats import render_rttm, render_srt, render_vtt
from service.transcript import Segment

pytestmark = pytest.mark.engine

DOCS = Path(__file__).resolve().parents[2] / "docs"
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
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[webdriver.Chrome, Path]]:
    binary, driver_path = _chromium()
    downloads = tmp_path_factory.mktemp("downloads")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1100,1250", "--mute-audio", "--no-first-run", "--disable-extensions"):
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


def test_page_transcribes_the_frozen_clip(
    qualified_gateway: GatewayProcess, browser: tuple[webdriver.Chrome, Path]
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
    DOCS.mkdir(exist_ok=True)
    driver.save_screenshot(str(DOCS / "page.png"))

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
    driver.save_screenshot(str(DOCS / "page-renamed.png"))

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
    driver.save_screenshot(str(DOCS / "page-error.png"))

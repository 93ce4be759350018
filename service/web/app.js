// The transcription page: one ES module, no build step, no third-party code.
//
// The top half is pure functions (subtitle and RTTM rendering, the SSE parser,
// plain-words descriptions) that the browser test imports and compares with the
// server's own renderers in service/formats.py: the rules are mirrored exactly
// (milliseconds rounded half-up once, Python's notion of whitespace and line
// breaks), so a file downloaded here matches the API's response_format for the
// same segments. The bottom half wires the page; it runs only when the page's
// markup is present, so importing this module elsewhere has no side effects.

// ---------------------------------------------------------------- rendering --

// Python's str.isspace() set, which str.strip() and str.split() use.
const PY_SPACE = "\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const STRIP = new RegExp(`^[${PY_SPACE}]+|[${PY_SPACE}]+$`, "g");
const RSTRIP = new RegExp(`[${PY_SPACE}]+$`);
const SPACE_RUN = new RegExp(`[${PY_SPACE}]+`);
// Python's str.splitlines() boundaries.
const LINE_BREAK = /\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/;

/** Whole milliseconds, half-up; negative or non-finite input is zero (as service/formats.py). */
export function millis(seconds) {
  if (!Number.isFinite(seconds) || seconds <= 0) return 0;
  return Math.floor(seconds * 1000 + 0.5);
}

function clock(ms, separator) {
  const hours = Math.floor(ms / 3600000);
  const minutes = Math.floor((ms % 3600000) / 60000);
  const secs = Math.floor((ms % 60000) / 1000);
  const rest = ms % 1000;
  const two = (n) => String(n).padStart(2, "0");
  return `${two(hours)}:${two(minutes)}:${two(secs)}${separator}${String(rest).padStart(3, "0")}`;
}

/** `HH:MM:SS<separator>mmm`, as the API's SRT (",") and WebVTT (".") print it. */
export function formatTimestamp(seconds, separator) {
  return clock(millis(seconds), separator);
}

function span(segment) {
  const start = millis(segment.start);
  return [start, Math.max(start, millis(segment.end))];
}

function cueText(text) {
  return String(text)
    .split(LINE_BREAK)
    .map((line) => line.replace(STRIP, ""))
    .filter((line) => line.length > 0)
    .join("\n");
}

function vttEscape(text) {
  return text.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;");
}

function nameOf(names, label) {
  const name = names && typeof names.get === "function" ? names.get(label) : names?.[label];
  return name || label;
}

/** SubRip: numbered cues, `[speaker] text`; `names` maps a label (S01) to its edited name. */
export function renderSrt(segments, names = null) {
  return segments
    .map((segment, index) => {
      const [start, end] = span(segment);
      const text = cueText(segment.text).replaceAll("-->", "->");
      const line = `[${nameOf(names, segment.speaker)}] ${text}`.replace(RSTRIP, "");
      return `${index + 1}\n${clock(start, ",")} --> ${clock(end, ",")}\n${line}\n`;
    })
    .join("\n");
}

/** WebVTT: a header, then cues with the speaker as a voice span. */
export function renderVtt(segments, names = null) {
  const cues = ["WEBVTT\n"];
  for (const segment of segments) {
    const [start, end] = span(segment);
    const voice = vttEscape(nameOf(names, segment.speaker));
    cues.push(`${clock(start, ".")} --> ${clock(end, ".")}\n<v ${voice}>${vttEscape(cueText(segment.text))}\n`);
  }
  return cues.join("\n");
}

function rttmToken(value, empty) {
  return String(value).split(SPACE_RUN).filter((part) => part.length > 0).join("_") || empty;
}

function seconds3(ms) {
  return `${Math.floor(ms / 1000)}.${String(ms % 1000).padStart(3, "0")}`;
}

/** NIST RTTM speaker turns; zero-length turns are left out (as service/formats.py). */
export function renderRttm(segments, fileId, names = null) {
  const file = rttmToken(fileId, "audio");
  let out = "";
  for (const segment of segments) {
    const [start, end] = span(segment);
    if (end === start) continue;
    const speaker = rttmToken(nameOf(names, segment.speaker), "unknown");
    out += `SPEAKER ${file} 1 ${seconds3(start)} ${seconds3(end - start)} <NA> <NA> ${speaker} <NA> <NA>\n`;
  }
  return out;
}

/** The diarized_json body of the result, with the edited names and the original labels kept. */
export function renderJson(result, names = null) {
  const speakers = {};
  for (const segment of result.segments) speakers[segment.speaker] = nameOf(names, segment.speaker);
  const body = {
    task: "transcribe",
    duration: result.duration ?? null,
    text: result.text ?? result.segments.map((s) => s.text).join(" "),
    speakers,
    segments: result.segments.map((s) => ({
      id: s.id, start: s.start, end: s.end, speaker: nameOf(names, s.speaker), speaker_label: s.speaker, text: s.text,
    })),
    usage: result.usage ?? null,
    backend: result.backend ?? null,
    moss: result.moss ?? null,
  };
  return JSON.stringify(body, null, 2) + "\n";
}

// ---------------------------------------------------------- server-sent events --

/** Incremental SSE parser: feed it text as it arrives, get back each complete event's parsed data. */
export class SseParser {
  constructor() {
    this.buffer = "";
    this.data = [];
  }

  /** Returns the events completed by this chunk (`null` for an undecodable one is skipped). */
  feed(chunk) {
    this.buffer += chunk;
    const events = [];
    let newline;
    while ((newline = this.buffer.search(/\r\n|\n|\r/)) >= 0) {
      const line = this.buffer.slice(0, newline);
      const width = this.buffer.startsWith("\r\n", newline) ? 2 : 1;
      // A lone "\r" at the end of a chunk may be the first half of "\r\n": wait for more.
      if (width === 1 && this.buffer[newline] === "\r" && newline === this.buffer.length - 1) break;
      this.buffer = this.buffer.slice(newline + width);
      const event = this.line(line);
      if (event !== undefined) events.push(event);
    }
    return events;
  }

  /** Whatever a stream that ended without a final blank line still held. */
  end() {
    const events = this.buffer ? this.feed("\n") : [];
    const last = this.line("");
    if (last !== undefined) events.push(last);
    return events;
  }

  line(line) {
    if (line === "") {
      if (this.data.length === 0) return undefined;
      const text = this.data.join("\n");
      this.data = [];
      if (text === "[DONE]") return undefined;
      try {
        return JSON.parse(text);
      } catch {
        return { type: "moss.unreadable", data: text };
      }
    }
    if (line.startsWith(":")) return undefined; // keep-alive comment
    if (line.startsWith("data:")) this.data.push(line.slice(5).replace(/^ /, ""));
    return undefined;
  }
}

// ------------------------------------------------------------- plain words --

const STOP_WORDS = {
  eos: "the model ended the transcript itself (end-of-sequence token)",
  stop_token: "the model wrote a stop token",
  max_tokens: "the output budget ran out",
  context_length: "the context window filled up",
  aborted: "the request was aborted",
  error: "the engine failed",
  unknown: "the engine gave no recognisable reason",
};

/** Seconds as `m:ss.cc` (or `h:mm:ss.cc`) for the transcript's timestamps. */
export function clockLabel(seconds) {
  const cs = Math.round(Math.max(0, Number(seconds) || 0) * 100);
  const h = Math.floor(cs / 360000);
  const m = Math.floor((cs % 360000) / 6000);
  const s = Math.floor((cs % 6000) / 100);
  const frac = String(cs % 100).padStart(2, "0");
  const mm = h ? String(m).padStart(2, "0") : String(m);
  return `${h ? `${h}:` : ""}${mm}:${String(s).padStart(2, "0")}.${frac}`;
}

function percent(fraction) {
  return `${Math.round(Math.max(0, Math.min(1, fraction)) * 100)} %`;
}

/**
 * The stop evidence of a result (the `moss` object) in plain words.
 * Returns `{state, words}`: state is "complete", "truncated" or "unknown".
 */
export function describeEvidence(moss) {
  if (!moss || typeof moss !== "object") {
    return { state: "unknown", words: "The gateway sent no stop evidence for this result." };
  }
  const stop = moss.stop || {};
  const coverage = moss.coverage || {};
  const parts = [];
  const truncated = moss.truncated === true;
  const why = STOP_WORDS[stop.stop] || `the stop class was "${stop.stop ?? "unknown"}"`;
  const tokens = Number.isFinite(stop.generated_tokens) && Number.isFinite(stop.max_tokens)
    ? ` after ${stop.generated_tokens} of ${stop.max_tokens} budgeted tokens`
    : "";
  parts.push(`${truncated ? "Truncated" : "Complete"}: ${why}${tokens} (stop class ${stop.stop ?? "unknown"}).`);
  if (Number.isFinite(coverage.coverage)) {
    const duration = Number.isFinite(coverage.audio_duration_s) ? ` of ${coverage.audio_duration_s.toFixed(2)} s` : "";
    const last = Number.isFinite(coverage.last_segment_end_s)
      ? `the last segment ends at ${coverage.last_segment_end_s.toFixed(2)} s${duration}`
      : "no complete segment";
    parts.push(`The segments cover ${percent(coverage.coverage)} of the audio (${last}).`);
    if (truncated && Number.isFinite(coverage.uncovered_tail_s) && coverage.uncovered_tail_s > 0) {
      parts.push(`The last ${coverage.uncovered_tail_s.toFixed(2)} s have no transcript.`);
    }
  }
  if (truncated && Array.isArray(moss.truncation_reasons) && moss.truncation_reasons.length) {
    parts.push(`Why it counts as truncated: ${moss.truncation_reasons.join("; ")}.`);
  }
  if (moss.track === "chunked" && Array.isArray(moss.chunks)) {
    parts.push(`Transcribed in ${moss.chunks.length} chunks (chunked track).`);
  }
  return { state: truncated ? "truncated" : "complete", words: parts.join(" ") };
}

/** The backend's identity and qualification state in plain words: `{state, badge, words}`. */
export function describeBackend(backend, ready, modelName) {
  const q = backend?.qualification || {};
  const id = backend?.identity || {};
  const runtime = id.runtime || {};
  const accel = runtime.accelerator || {};
  const engine = id.engine || {};
  const bits = [];
  if (modelName) bits.push(`Model ${modelName}`);
  const vllm = runtime.vllm?.version;
  if (vllm) bits.push(`served by vLLM ${vllm}${accel.kind ? ` on ${accel.kind}${accel.name ? ` (${accel.name})` : ""}` : ""}`);
  if (runtime.torch?.version) bits.push(`torch ${runtime.torch.version}`);
  if (engine.dtype) bits.push(`${engine.dtype} weights`);
  if (engine.max_model_len) bits.push(`context ${engine.max_model_len} tokens`);
  const gateway = id.gateway;
  if (gateway?.version) {
    const rev = gateway.git_revision ? `, revision ${String(gateway.git_revision).slice(0, 12)}` : "";
    bits.push(`gateway ${gateway.version}${rev}`);
  }
  const fingerprint = backend?.fingerprint ? ` Backend fingerprint ${backend.fingerprint.slice(0, 16)}…` : "";
  const identity = bits.length ? `${bits.join(", ")}.` : "The backend identity is not resolved yet.";
  let state;
  let badge;
  let gate;
  if (q.qualified) {
    state = ready?.ready === false ? "degraded" : "ready";
    badge = state === "ready" ? "Qualified and ready" : "Qualified, not ready";
    const how = [q.verdict ? `verdict ${q.verdict}` : null, q.policy ? `policy ${q.policy}` : null].filter(Boolean);
    gate = `Qualified: record ${q.qualification_id ?? "unknown"}${how.length ? ` (${how.join(", ")})` : ""}.`;
  } else {
    state = "closed";
    badge = "Not qualified";
    const progress = q.progress ? ` Qualification in progress: ${q.progress}.` : "";
    gate = `Not qualified: ${q.reason || "no passing qualification record for this backend"}. Transcription is refused until it is.${progress}`;
  }
  const reasons = ready && Array.isArray(ready.reasons) && ready.reasons.length && ready.ready === false
    ? ` Not ready: ${ready.reasons.join("; ")}.`
    : "";
  return { state, badge, words: `${gate}${reasons} ${identity}${fingerprint}` };
}

/** Remove MOSS tags (`[0.50]`, `[S01]`, a cut-off `[12`) from streamed text, for the live line. */
export function cleanDelta(text) {
  return text
    .replace(/\[\s*(?:\d+(?:\.\d*)?|\.\d+|[Ss]\s*\d+)\s*\]/g, " ")
    .replace(/\[[^\]]*$/, "")
    .replace(/[ \t]+/g, " ");
}

// A palette that stays distinguishable for the usual two to eight speakers.
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];

// ---------------------------------------------------------------- the page --

function main() {
  const $ = (id) => document.getElementById(id);
  const el = {
    summary: $("backend-summary"), backendWords: $("backend-words"), backendJson: $("backend-json"),
    keyCard: $("key-card"), keyForm: $("key-form"), keyInput: $("key-input"), keyReason: $("key-reason"),
    drop: $("drop"), fileInput: $("file-input"), record: $("record"), recordTime: $("record-time"),
    fileName: $("file-name"), player: $("player"), hotwords: $("hotwords"),
    transcribe: $("transcribe"), cancel: $("cancel"), progress: $("progress"), progressLabel: $("progress-label"),
    error: $("error"), result: $("result"), evidence: $("evidence"), speakers: $("speakers"),
    segments: $("segments"), live: $("live"), downloads: document.querySelectorAll(".downloads button"),
  };
  const state = {
    apiKey: null, // memory only, never persisted
    file: null,
    fileUrl: null,
    running: null, // AbortController of the transcription in flight
    recorder: null,
    segments: new Map(), // segment id -> {id, start, end, speaker, text}
    names: new Map(), // S01 -> edited name
    colors: new Map(),
    done: null, // the final event
    liveText: "",
    readyTimer: null,
  };

  function apiFetch(path, options = {}) {
    const headers = new Headers(options.headers || {});
    if (state.apiKey) headers.set("Authorization", `Bearer ${state.apiKey}`);
    return fetch(path, { ...options, headers });
  }

  async function errorOf(response) {
    let message = `${response.status} ${response.statusText}`;
    let code = null;
    try {
      const body = await response.json();
      if (body?.error?.message) {
        message = body.error.message;
        code = body.error.code || body.error.type || null;
      }
    } catch {
      // not JSON: keep the status line
    }
    return { message, code, status: response.status };
  }

  function showError(error) {
    if (!error) {
      el.error.hidden = true;
      el.error.textContent = "";
      return;
    }
    el.error.hidden = false;
    el.error.replaceChildren();
    const message = document.createElement("p");
    message.className = "message";
    message.textContent = error.message;
    el.error.append(message);
    const detail = [error.status ? `HTTP ${error.status}` : null, error.code].filter(Boolean).join(", ");
    if (detail) {
      const small = document.createElement("p");
      small.className = "muted";
      small.textContent = detail;
      el.error.append(small);
    }
  }

  function askForKey(reason) {
    el.keyCard.hidden = false;
    el.keyReason.textContent = reason;
    el.keyInput.focus();
  }

  // ---- backend state

  async function loadBackend() {
    clearTimeout(state.readyTimer);
    let ready = null;
    try {
      const response = await apiFetch("/ready");
      if (response.status === 401) {
        askForKey((await errorOf(response)).message);
      } else {
        ready = await response.json();
      }
      const backendResponse = await apiFetch("/v1/backend");
      if (backendResponse.status === 401) {
        const error = await errorOf(backendResponse);
        el.summary.dataset.state = "closed";
        el.summary.textContent = "API key needed";
        el.backendWords.textContent = error.message;
        askForKey(error.message);
        return;
      }
      const backend = await backendResponse.json();
      let modelName = null;
      const models = await apiFetch("/v1/models");
      if (models.ok) modelName = (await models.json())?.data?.[0]?.id ?? null;
      const described = describeBackend(backend, ready, modelName);
      el.summary.dataset.state = described.state;
      el.summary.textContent = described.badge;
      el.backendWords.textContent = described.words;
      el.backendJson.textContent = JSON.stringify(backend, null, 2);
      if (described.state !== "ready") state.readyTimer = setTimeout(loadBackend, 3000);
    } catch (error) {
      el.summary.dataset.state = "closed";
      el.summary.textContent = "Gateway unreachable";
      el.backendWords.textContent = `The gateway did not answer: ${error.message}`;
      state.readyTimer = setTimeout(loadBackend, 5000);
    }
  }

  el.keyForm.addEventListener("submit", (event) => {
    event.preventDefault();
    state.apiKey = el.keyInput.value.trim() || null;
    el.keyInput.value = "";
    el.keyCard.hidden = true;
    showError(null);
    loadBackend();
  });

  // ---- input: file, drop, microphone

  function useFile(file) {
    if (!file) return;
    state.file = file;
    if (state.fileUrl) URL.revokeObjectURL(state.fileUrl);
    state.fileUrl = URL.createObjectURL(file);
    el.player.src = state.fileUrl;
    el.player.hidden = false;
    const size = file.size >= 1 << 20 ? `${(file.size / (1 << 20)).toFixed(1)} MiB` : `${Math.ceil(file.size / 1024)} KiB`;
    el.fileName.textContent = `${file.name} (${size})`;
    el.transcribe.disabled = state.running !== null;
  }

  el.fileInput.addEventListener("change", () => useFile(el.fileInput.files[0]));
  el.drop.addEventListener("dragover", (event) => {
    event.preventDefault();
    el.drop.classList.add("over");
  });
  el.drop.addEventListener("dragleave", () => el.drop.classList.remove("over"));
  el.drop.addEventListener("drop", (event) => {
    event.preventDefault();
    el.drop.classList.remove("over");
    useFile(event.dataTransfer?.files?.[0]);
  });

  const canRecord = Boolean(navigator.mediaDevices?.getUserMedia) && typeof MediaRecorder !== "undefined";
  if (!canRecord) {
    el.record.disabled = true;
    el.record.title = "Recording needs a browser with MediaRecorder and a page served from localhost or https.";
  }

  function recordingType() {
    const wanted = ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/webm", "audio/ogg"];
    return wanted.find((type) => MediaRecorder.isTypeSupported(type)) || "";
  }

  el.record.addEventListener("click", async () => {
    if (state.recorder) {
      state.recorder.stop();
      return;
    }
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    } catch (error) {
      showError({ message: `The microphone could not be opened: ${error.message}` });
      return;
    }
    const mimeType = recordingType();
    const recorder = new MediaRecorder(stream, mimeType ? { mimeType } : {});
    const chunks = [];
    const started = Date.now();
    const tick = setInterval(() => {
      el.recordTime.textContent = clockLabel((Date.now() - started) / 1000).replace(/\.\d\d$/, "");
    }, 250);
    recorder.addEventListener("dataavailable", (event) => event.data.size && chunks.push(event.data));
    recorder.addEventListener("stop", () => {
      clearInterval(tick);
      stream.getTracks().forEach((track) => track.stop());
      state.recorder = null;
      el.record.textContent = "● Record";
      el.record.classList.remove("recording");
      el.recordTime.hidden = true;
      const type = recorder.mimeType || mimeType || "audio/webm";
      const extension = type.includes("ogg") ? "ogg" : "webm";
      const stamp = new Date().toISOString().replace(/[:.]/g, "-").slice(0, 19);
      useFile(new File(chunks, `recording-${stamp}.${extension}`, { type: type.split(";")[0] }));
    });
    recorder.start(1000);
    state.recorder = recorder;
    el.record.textContent = "■ Stop recording";
    el.record.classList.add("recording");
    el.recordTime.hidden = false;
    el.recordTime.textContent = "0:00";
  });

  // ---- transcript view

  function colorOf(label) {
    if (!state.colors.has(label)) state.colors.set(label, COLORS[state.colors.size % COLORS.length]);
    return state.colors.get(label);
  }

  function addSpeaker(label) {
    if (state.names.has(label)) return;
    state.names.set(label, label);
    const chip = document.createElement("label");
    chip.className = "speaker";
    chip.dataset.speaker = label;
    chip.style.setProperty("--spk", colorOf(label));
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    const tag = document.createElement("span");
    tag.className = "tag";
    tag.textContent = label;
    const input = document.createElement("input");
    input.type = "text";
    input.value = label;
    input.setAttribute("aria-label", `Name of speaker ${label}`);
    input.addEventListener("input", () => {
      state.names.set(label, input.value.trim() || label);
      for (const who of el.segments.querySelectorAll(`.who[data-speaker="${CSS.escape(label)}"]`)) {
        who.textContent = state.names.get(label);
      }
    });
    chip.append(swatch, tag, input);
    el.speakers.append(chip);
  }

  function addSegment(event) {
    const id = event.id ?? `seg_${state.segments.size}`;
    const segment = {
      id, start: Number(event.start), end: Number(event.end), speaker: String(event.speaker ?? "S??"), text: String(event.text ?? ""),
    };
    const known = state.segments.has(id);
    state.segments.set(id, segment);
    addSpeaker(segment.speaker);
    const item = document.createElement("li");
    item.className = "segment";
    item.dataset.id = id;
    item.style.setProperty("--spk", colorOf(segment.speaker));
    const time = document.createElement("button");
    time.type = "button";
    time.className = "time";
    time.dataset.start = String(segment.start);
    time.textContent = `${clockLabel(segment.start)} – ${clockLabel(segment.end)}`;
    time.title = `Play from ${clockLabel(segment.start)}`;
    const who = document.createElement("span");
    who.className = "who";
    who.dataset.speaker = segment.speaker;
    who.textContent = state.names.get(segment.speaker);
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = segment.text;
    item.append(time, who, text);
    const old = known ? el.segments.querySelector(`li[data-id="${CSS.escape(id)}"]`) : null;
    if (old) old.replaceWith(item);
    else el.segments.append(item);
  }

  // The segment under the play head is highlighted, so the transcript follows the audio.
  el.player.addEventListener("timeupdate", () => {
    const now = el.player.currentTime;
    for (const item of el.segments.children) {
      const segment = state.segments.get(item.dataset.id);
      item.classList.toggle("playing", Boolean(segment) && now >= segment.start && now < segment.end);
    }
  });

  el.segments.addEventListener("click", (event) => {
    const time = event.target.closest("button.time");
    if (time && state.fileUrl) {
      el.player.currentTime = Number(time.dataset.start);
      el.player.play().catch(() => {});
    }
  });

  function setLive(text) {
    state.liveText = text;
    const shown = cleanDelta(text).trim();
    el.live.hidden = shown.length === 0;
    el.live.textContent = shown;
  }

  function setProgress(fraction, label) {
    el.progress.hidden = false;
    if (fraction === null) el.progress.removeAttribute("value");
    else el.progress.value = Math.max(0, Math.min(1, fraction));
    el.progressLabel.textContent = label;
  }

  function audioDuration() {
    return Number.isFinite(el.player.duration) && el.player.duration > 0 ? el.player.duration : null;
  }

  function onProgress(event) {
    if (typeof event.fraction === "number") {
      const covered = Number.isFinite(event.covered_s) && Number.isFinite(event.duration_s)
        ? `${event.covered_s.toFixed(1)} s of ${event.duration_s.toFixed(1)} s transcribed`
        : "transcribing";
      setProgress(event.fraction, `${covered} (${percent(event.fraction)})`);
    } else if (Number.isFinite(event.covered_s) && Number.isFinite(event.duration_s) && event.duration_s > 0) {
      onProgress({ ...event, fraction: event.covered_s / event.duration_s });
    } else if (Number.isFinite(event.chunks)) {
      setProgress(null, `transcribing in ${event.chunks} chunks`);
    } else if (Number.isFinite(event.generated_tokens)) {
      setProgress(el.progress.hasAttribute("value") ? el.progress.value : null, `${event.generated_tokens} tokens written`);
    }
  }

  function progressFromSegment(segment) {
    const duration = audioDuration();
    if (duration) {
      const covered = Math.min(segment.end, duration);
      setProgress(covered / duration, `${covered.toFixed(1)} s of ${duration.toFixed(1)} s transcribed (${percent(covered / duration)})`);
    }
  }

  function resetResult() {
    state.segments.clear();
    state.names.clear();
    state.colors.clear();
    state.done = null;
    el.segments.replaceChildren();
    el.speakers.replaceChildren();
    setLive("");
    el.evidence.dataset.state = "pending";
    el.evidence.textContent = "Transcribing…";
    el.result.hidden = false;
    for (const button of el.downloads) button.disabled = true;
  }

  function handle(event) {
    switch (event.type) {
      case "transcript.text.delta": {
        if (event.segment_id && state.segments.has(event.segment_id)) return;
        setLive(state.liveText + String(event.delta ?? ""));
        return;
      }
      case "transcript.text.segment": {
        addSegment(event);
        setLive("");
        progressFromSegment(state.segments.get(event.id ?? `seg_${state.segments.size - 1}`) ?? event);
        return;
      }
      case "moss.progress":
        onProgress(event);
        return;
      case "transcript.text.done": {
        state.done = event;
        setLive("");
        const described = describeEvidence(event.moss);
        el.evidence.dataset.state = described.state;
        el.evidence.textContent = described.words;
        const fraction = event.moss?.coverage?.coverage;
        setProgress(1, Number.isFinite(fraction) ? `done, ${percent(fraction)} of the audio covered` : "done");
        for (const button of el.downloads) button.disabled = false;
        return;
      }
      case "error":
        throw Object.assign(new Error(event.error?.message || "The stream ended with an error."), {
          api: { message: event.error?.message || "The stream ended with an error.", code: event.error?.code },
        });
      default:
        return; // unknown events are ignored, so new server events do not break the page
    }
  }

  async function transcribe() {
    if (!state.file || state.running) return;
    showError(null);
    resetResult();
    setProgress(null, "uploading…");
    const controller = new AbortController();
    state.running = controller;
    el.transcribe.disabled = true;
    el.cancel.hidden = false;
    const form = new FormData();
    form.append("file", state.file, state.file.name);
    form.append("response_format", "diarized_json");
    form.append("stream", "true");
    if (el.hotwords.value.trim()) form.append("hotwords", el.hotwords.value.trim());
    try {
      const response = await apiFetch("/v1/audio/transcriptions", { method: "POST", body: form, signal: controller.signal });
      if (!response.ok) {
        const error = await errorOf(response);
        if (response.status === 401) askForKey(error.message);
        throw Object.assign(new Error(error.message), { api: error });
      }
      setProgress(null, "transcribing…");
      if (!(response.headers.get("content-type") || "").includes("text/event-stream")) {
        // A gateway that answered without streaming: the same body as the final event plus segments.
        const body = await response.json();
        for (const segment of body.segments || []) handle({ type: "transcript.text.segment", ...segment });
        handle({ ...body, type: "transcript.text.done" });
        return;
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      const parser = new SseParser();
      for (;;) {
        const { value, done } = await reader.read();
        const events = done ? parser.feed(decoder.decode()).concat(parser.end()) : parser.feed(decoder.decode(value, { stream: true }));
        for (const event of events) handle(event);
        if (done) break;
      }
      if (!state.done) throw Object.assign(new Error("The stream ended before its final event."), {});
    } catch (error) {
      if (error.name === "AbortError") {
        showError({ message: "Stopped: the transcription was cancelled in this page." });
      } else {
        showError(error.api || { message: error.message });
      }
      el.evidence.dataset.state = "unknown";
      el.evidence.textContent = state.segments.size
        ? "No final result: the segments above are what arrived before the stream ended."
        : "No result.";
      el.progress.hidden = true;
      el.progressLabel.textContent = "";
      if (state.segments.size === 0) el.result.hidden = true;
    } finally {
      state.running = null;
      el.transcribe.disabled = !state.file;
      el.cancel.hidden = true;
    }
  }

  el.transcribe.addEventListener("click", transcribe);
  el.cancel.addEventListener("click", () => state.running?.abort());

  // ---- downloads

  function baseName() {
    const name = state.file?.name || "transcript";
    return name.replace(/\.[^.]+$/, "") || "transcript";
  }

  function finalSegments() {
    return [...state.segments.values()];
  }

  /** The text of one download, rendered here from the final segments and the edited names. */
  function downloadText(format) {
    const segments = finalSegments();
    if (format === "srt") return renderSrt(segments, state.names);
    if (format === "vtt") return renderVtt(segments, state.names);
    if (format === "rttm") return renderRttm(segments, baseName(), state.names);
    return renderJson(
      {
        segments, text: state.done?.text, usage: state.done?.usage, backend: state.done?.backend,
        moss: state.done?.moss, duration: state.done?.moss?.coverage?.audio_duration_s ?? audioDuration(),
      },
      state.names,
    );
  }

  const MEDIA = { srt: "application/x-subrip", vtt: "text/vtt", json: "application/json", rttm: "text/plain" };

  for (const button of el.downloads) {
    button.addEventListener("click", () => {
      const format = button.dataset.format;
      const blob = new Blob([downloadText(format)], { type: `${MEDIA[format]};charset=utf-8` });
      const link = document.createElement("a");
      link.href = URL.createObjectURL(blob);
      link.download = `${baseName()}.${format}`;
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 60000);
    });
  }

  // For tests and the curious: the page's own rendering of the current result.
  window.mossPage = { downloadText, names: state.names, segments: finalSegments };
  loadBackend();
}

if (typeof document !== "undefined" && document.getElementById("app")) main();

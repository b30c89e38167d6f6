// The demo page: wires the controls to a SpeechStream (stream.js), the Player (player.js), the
// timeline, the level meter and the voice panel. Counters for tests and curious users are kept
// on `window.voxgate`.

import { ApiError, apiFetch, loadKey, saveKey } from "./api.js";
import { TextFeed, tokenize } from "./feed.js";
import { HEADER_BYTES, decodePayload } from "./frames.js";
import { Meter } from "./meter.js";
import { OggOpusDecoder, canDecodeOpus, opusInputRate } from "./opus.js";
import { Player } from "./player.js";
import { renderSession } from "./session-view.js";
import { SpeechStream } from "./stream.js";
import { Timeline } from "./timeline.js";
import { VOICES_PATH, VoicePanel } from "./voices.js";

const $ = (id) => document.getElementById(id);
const MIN_RATE = 8000; // the protocol's sample_rate range
const MAX_RATE = 48000;

const stats = {
  state: "idle", // idle | connecting | speaking | stopping
  utterance: null, // utterance_index of the current (or last) utterance
  framesReceived: 0, // frames of the current utterance that were played
  framesDropped: 0, // frames of cancelled or other utterances (since page load)
  bytesReceived: 0,
  payloadBytes: 0, // audio bytes of the current utterance, without the frame headers
  audioSecondsReceived: 0, // audio those bytes hold
  bitrateKbps: null, // payloadBytes per audio second, kbit/s
  pcmKbps: null, // 16-bit mono PCM at the session's rate, for comparison
  decoder: null, // the Opus decoder's counters (opus.js), for an Opus utterance
  samplesPlayed: 0, // of the current utterance, at the AudioContext's rate (counted by the worklet)
  secondsPlayed: 0,
  bufferedMs: 0,
  stoppedAt: null, // {secondsPlayed, bufferedMs} as the Stop button found them
  underruns: 0,
  peak: 0, // loudest sample played in the current utterance (Piper normalises to 0.9)
  ttfaMs: null, // first input.text sent -> first binary frame received, client clock
  firstSoundMs: null, // first input.text sent -> the worklet starts playing
  serverTtfaMs: null, // session.done first_text_to_first_audio_ms
  segments: [],
  cancelled: 0, // audio.cancelled messages received
  heard: null, // what the listener heard of the utterance Stop cut: {textSpoken, textRemaining, playedMs, source}
  sessionsDone: 0, // session.done messages received
  ready: null, // the last session.ready
  lastError: null, // the message of the last error shown
  errors: [],
  contextRate: null,
};
window.voxgate = stats;

const player = new Player();
const meter = new Meter($("meter"));
const timeline = new Timeline($("timeline-body"), $("timeline-caption"));
let stream = null;
let current = null; // the utterance being spoken (or the last one, for its timeline)
let attempt = 0; // bumped by every Speak and Stop, so a Speak still connecting knows it was overtaken

// ---- status and errors ------------------------------------------------------------------------

function status(text) {
  $("status").textContent = text;
}

function showError(err) {
  const message = err instanceof Error ? err.message : String(err);
  const code = err.code || (err.server && err.server.code) || null;
  const box = $("error");
  box.replaceChildren();
  const text = document.createElement("span");
  text.className = "error-message";
  text.textContent = message;
  box.append(text);
  if (code) {
    const tag = document.createElement("code");
    tag.textContent = code;
    box.append(" ", tag);
  }
  const close = document.createElement("button");
  close.type = "button";
  close.className = "dismiss";
  close.textContent = "Dismiss";
  close.addEventListener("click", clearError);
  box.append(close);
  stats.lastError = message;
  stats.errors.push({ message, code });
}

function clearError() {
  $("error").replaceChildren();
}

function setState(state) {
  stats.state = state;
  $("stat-state").textContent = state;
  $("speak-btn").textContent = state === "speaking" || state === "stopping" ? "Speak again" : "Speak";
  $("stop-btn").disabled = state === "idle";
  document.body.dataset.state = state;
}

// ---- API key ----------------------------------------------------------------------------------

const keyInput = $("api-key");
keyInput.value = loadKey();
let appliedKey = keyInput.value.trim();
keyInput.addEventListener("change", () => {
  const key = keyInput.value.trim();
  if (key === appliedKey) return; // Enter and leaving the field both report the same edit
  appliedKey = key;
  saveKey(key);
  if (stream) stream.close(); // the next Speak reconnects with the new key
  stream = null;
  refreshVoices();
});
$("key-show").addEventListener("click", (event) => {
  const show = keyInput.type === "password";
  keyInput.type = show ? "text" : "password";
  event.currentTarget.setAttribute("aria-pressed", String(show));
  event.currentTarget.textContent = show ? "Hide" : "Show";
});
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault(); // Enter in the key field applies it, as leaving the field does
  keyInput.dispatchEvent(new Event("change"));
});
const apiKey = () => keyInput.value.trim();

// ---- voices -----------------------------------------------------------------------------------

const voicePanel = new VoicePanel(
  {
    form: $("upload-form"),
    fieldset: $("upload-fieldset"),
    note: $("upload-note"),
    file: $("voice-file"),
    record: $("record-btn"),
    recordHelp: $("record-help"),
    preview: $("record-preview"),
    name: $("voice-name"),
    consent: $("voice-consent"),
    consentText: $("consent-text"),
    refText: $("voice-ref-text"),
    submit: $("upload-btn"),
    list: $("uploaded-list"),
    empty: $("uploaded-empty"),
  },
  { key: apiKey, status, error: showError },
);

voicePanel.addEventListener("voices", (event) => {
  const select = $("voice");
  const chosen = select.value;
  select.replaceChildren(new Option("Engine default", ""));
  const groups = [
    ["Built-in", event.detail.builtin, (v) => [v.name, v.language, v.engine].filter(Boolean).join(" · ")],
    ["Uploaded", event.detail.uploaded, (v) => v.name],
  ];
  // Uploaded voices that no engine here can speak stay listed (the panel deletes them) but cannot be chosen.
  const noCloning = Array.isArray(event.detail.cloning) && !event.detail.cloning.length;
  for (const [label, voices, text] of groups) {
    if (!voices.length) continue;
    const group = document.createElement("optgroup");
    group.label = label;
    for (const v of voices) {
      const off = noCloning && label === "Uploaded";
      const option = new Option(off ? `${text(v)} (needs an engine that clones)` : text(v), v.name);
      option.disabled = off;
      group.append(option);
    }
    select.append(group);
  }
  select.value = [...select.options].some((o) => o.value === chosen && !o.disabled) ? chosen : "";
});

async function refreshVoices() {
  try {
    await voicePanel.refresh();
  } catch (err) {
    showError(err);
  }
}

// ---- the session ------------------------------------------------------------------------------

const OPUS_NATIVE_RATE = 24000; // the gateway's default rate: an engine's own rate may not be an Opus one

function sessionConfig() {
  const format = $("format").value;
  // Opus is one Ogg stream per utterance, decoded in the page as it arrives (opus.js).
  const config = { response_format: format, stream_audio: true, frame_header: true };
  if ($("voice").value) config.voice = $("voice").value;
  const rate = $("sample-rate").value;
  if (rate === "device") config.sample_rate = Math.min(MAX_RATE, Math.max(MIN_RATE, player.sampleRate));
  else config.sample_rate = rate === "native" ? "native" : Number(rate);
  if (format === "opus") {
    config.sample_rate = config.sample_rate === "native" ? OPUS_NATIVE_RATE : opusInputRate(config.sample_rate);
  }
  const speed = Number($("speed").value);
  if (Number.isFinite(speed) && speed !== 1) config.speed = speed;
  return config;
}

async function openStream() {
  if (stream && stream.connected) return stream;
  const s = new SpeechStream(apiKey());
  s.addEventListener("message", (event) => s === stream && onMessage(event.detail));
  s.addEventListener("frame", (event) => s === stream && onFrame(event.detail));
  s.addEventListener("close", (event) => s === stream && onClose(event.detail));
  s.addEventListener("fault", (event) => s === stream && showError(event.detail));
  stream = s;
  try {
    await s.connect();
  } catch (err) {
    stream = null;
    throw await explainRefusal(err);
  }
  return s;
}

// A browser learns nothing about why a WebSocket handshake was refused, so ask a REST route with
// the same key: a bad key gets the server's own 401 message.
async function explainRefusal(err) {
  try {
    await apiFetch(VOICES_PATH, apiKey());
  } catch (probe) {
    if (probe instanceof ApiError && probe.status) return probe;
  }
  return new Error(
    `The gateway refused the WebSocket connection (close code ${err.code}). ` +
      "Check the API key, and that this page's origin is allowed.",
  );
}

// ---- speaking ---------------------------------------------------------------------------------

async function speak() {
  const text = $("text").value;
  clearError();
  if (!text.trim()) {
    showError(new Error("Type some text to speak first."));
    return;
  }
  if (stats.state !== "idle") stop();
  if (current && current.opus) current.opus.close();
  const mine = ++attempt;
  setState("connecting");
  let ready;
  try {
    if ($("format").value === "opus" && !canDecodeOpus()) {
      throw new Error("This browser has no WebCodecs AudioDecoder to decode Opus: choose another format.");
    }
    await player.start();
    stats.contextRate = player.sampleRate;
    updateDeviceRateLabel();
    const s = await openStream();
    ready = await s.configure(sessionConfig());
  } catch (err) {
    if (!err.server) showError(err); // server errors were shown as they arrived
    if (mine === attempt) setState("idle");
    return;
  }
  if (mine !== attempt) return; // stopped, or spoken again, while connecting
  const u = {
    index: stream.nextUtterance,
    t0: 0, // the feed's start, set below
    format: ready.config.response_format,
    rate: ready.config.sample_rate,
    feed: null,
    anchors: [], // [{t, sample}] where sound (re)started after buffering
    playedAtStart: player.played,
    segments: [],
    over: false,
    opus: null,
  };
  if (u.format === "opus") u.opus = opusDecoder(u);
  current = u;
  Object.assign(stats, {
    utterance: u.index, framesReceived: 0, bytesReceived: 0, samplesPlayed: 0, secondsPlayed: 0,
    ttfaMs: null, serverTtfaMs: null, firstSoundMs: null, peak: 0, segments: u.segments,
    payloadBytes: 0, audioSecondsReceived: 0, bitrateKbps: null, pcmKbps: null,
    decoder: u.opus ? u.opus.stats : null,
  });
  showBandwidth(u);
  $("ttfa-sound").textContent = "";
  $("ttfa").textContent = "…";
  $("ttfa-detail").textContent = "";
  timeline.render(u.segments);
  setState("speaking");
  status("Speaking…");
  const llm = document.querySelector('input[name="mode"]:checked').value === "llm";
  const s = stream;
  u.feed = new TextFeed(llm ? tokenize(text) : [text], Number($("token-rate").value), {
    text: (token) => s.sendText(token),
    done: () => s.done(),
    fail: (err) => {
      showError(err);
      finish(u);
    },
  });
  u.t0 = u.feed.t0;
  u.feed.start();
}

function stop() {
  attempt += 1;
  const u = current;
  stats.stoppedAt = { secondsPlayed: stats.secondsPlayed, bufferedMs: stats.bufferedMs };
  player.flush(); // silence at once; frames still in flight are dropped by utterance_index
  if (u) {
    if (u.opus) u.opus.close(); // and so is what the decoder still holds
    u.feed.stop();
    u.over = true;
    u.cancelled = true;
  }
  if (stream && stream.connected && stream.ready) { // input.cancel before a config is fatal
    stream.cancel();
    setState("stopping");
    status("Stopping…");
  } else {
    setState("idle");
  }
}

function finish(u) {
  u.feed.stop();
  u.over = true;
  if (u.opus) u.opus.close();
  player.end();
  if (u === current) setState("idle");
}

// ---- server messages and audio ----------------------------------------------------------------

function onFrame({ header, buffer }) {
  const u = current;
  if (!u || u.cancelled || header.utterance !== u.index) {
    stats.framesDropped += 1;
    return;
  }
  const now = performance.now() - u.t0;
  stats.framesReceived += 1;
  stats.bytesReceived += buffer.byteLength;
  if (stats.ttfaMs === null) {
    stats.ttfaMs = Math.round(now);
    $("ttfa").textContent = `${stats.ttfaMs}`;
  }
  const seg = u.segments[header.sentence];
  if (seg && seg.firstAudioMs === null) {
    seg.firstAudioMs = now;
    timeline.render(u.segments);
  }
  stats.payloadBytes += header.payloadBytes;
  if (u.opus) {
    try {
      u.opus.push(new Uint8Array(buffer, HEADER_BYTES)); // decoded samples reach the player as they come
    } catch (err) {
      opusFailed(u, err);
      return;
    }
    stats.audioSecondsReceived = u.opus.receivedSeconds;
  } else {
    const samples = decodePayload(buffer, u.format, header.frameIndex);
    stats.audioSecondsReceived += samples.length / u.rate;
    if (samples.length) player.push(samples, u.rate);
  }
  showBandwidth(u);
}

function opusDecoder(u) {
  return new OggOpusDecoder({
    output: (samples, rate) => {
      if (u === current && !u.cancelled) player.push(samples, rate);
    },
    error: (err) => opusFailed(u, err),
  });
}

function opusFailed(u, err) {
  const message = err instanceof Error ? err.message : String(err);
  if (u.opus) u.opus.stats.error = message;
  if (u === current && !u.cancelled) showError(new Error(`Opus decoding failed: ${message}`));
}

const FORMAT_NAMES = { pcm: "PCM", f32: "f32", mulaw: "µ-law", wav: "WAV", opus: "Opus" };

/** Bytes per audio second of the utterance so far, against 16-bit mono PCM at the same rate. */
function showBandwidth(u) {
  const box = $("bandwidth");
  if (!stats.audioSecondsReceived || !u.rate) {
    stats.bitrateKbps = stats.pcmKbps = null;
    $("stat-bitrate").textContent = "–";
    box.textContent = "";
    return;
  }
  const kbps = (8 * stats.payloadBytes) / stats.audioSecondsReceived / 1000;
  const pcm = (16 * u.rate) / 1000;
  const kbit = (v) => (v < 10 ? v.toFixed(1) : v.toFixed(0));
  stats.bitrateKbps = kbps;
  stats.pcmKbps = pcm;
  $("stat-bitrate").textContent = `${kbit(kbps)} kbit/s`;
  const name = FORMAT_NAMES[u.format] || u.format;
  if (u.format === "pcm") {
    box.textContent = `${name} ${kbit(kbps)} kbit/s (16-bit at ${u.rate} Hz)`;
  } else {
    const less = kbps <= pcm;
    const ratio = less ? pcm / kbps : kbps / pcm;
    box.textContent = `${name} ${kbit(kbps)} kbit/s — ${ratio.toFixed(1)}× ${less ? "less" : "more"} than PCM (${kbit(pcm)} kbit/s)`;
  }
}

function onMessage(msg) {
  const u = current;
  const mine = u && !u.cancelled && msg.utterance_index === u.index;
  switch (msg.type) {
    case "session.ready":
      stats.ready = msg;
      renderSession($("session-info"), $("session-empty"), msg, player.sampleRate);
      break;
    case "audio.start":
      if (!mine) break;
      u.rate = msg.sample_rate;
      u.segments[msg.sentence_index] = {
        index: msg.sentence_index,
        text: msg.sentence_text,
        startSample: msg.start_sample,
        rate: msg.sample_rate,
        textReadyMs: u.feed.readyAt(msg.sentence_text),
        textReadyEstimated: false,
        firstAudioMs: null,
        serverTtfaMs: null,
        durationMs: null,
        playStartMs: null,
        error: false,
      };
      placeSegments(u);
      timeline.render(u.segments);
      break;
    case "audio.done": {
      const seg = mine ? u.segments[msg.sentence_index] : null;
      if (!seg) break;
      seg.durationMs = msg.duration_ms;
      seg.serverTtfaMs = msg.text_to_first_audio_ms;
      seg.error = msg.error;
      if (seg.textReadyMs === null && seg.firstAudioMs !== null && msg.text_to_first_audio_ms !== null) {
        seg.textReadyMs = seg.firstAudioMs - msg.text_to_first_audio_ms;
        seg.textReadyEstimated = true;
      }
      placeSegments(u);
      timeline.render(u.segments);
      break;
    }
    case "session.done":
      stats.sessionsDone += 1;
      if (!mine) break;
      stats.serverTtfaMs = msg.first_text_to_first_audio_ms;
      $("ttfa-detail").textContent = `server: ${msg.first_text_to_first_audio_ms ?? "–"} ms; ` +
        `${msg.total_sentences} segments, ${(msg.audio_ms / 1000).toFixed(2)} s of audio`;
      u.over = true;
      u.ended = true;
      if (u.opus) {
        // The EOS page came just before session.done: let the decoder give its last samples first.
        const end = () => u === current && !u.cancelled && player.end();
        u.opus.flush().then(end, end);
      } else {
        player.end(); // play out the rest; "drained" ends the utterance
      }
      break;
    case "audio.cancelled":
      stats.cancelled += 1;
      if (stats.state === "stopping") {
        setState("idle");
        if (msg.utterance_index === null) {
          status("Stopped.");
        } else {
          // The first audio.cancelled is the utterance playing: what the listener heard of it (the text as sent).
          stats.heard = {
            textSpoken: msg.text_spoken,
            textRemaining: msg.text_remaining,
            playedMs: msg.played_ms,
            source: msg.text_spoken_source,
          };
          const how = msg.text_spoken_source === "words" ? "by word timings" : "estimated";
          const heard = msg.text_spoken ? `“${msg.text_spoken}”` : "nothing";
          status(
            `Stopped: utterance ${msg.utterance_index} cancelled after ${(msg.played_ms / 1000).toFixed(1)} s. ` +
              `Heard (${how}): ${heard}`,
          );
        }
      }
      break;
    case "error":
      if (msg.code === "idle_timeout") {
        status(`The gateway closed the idle session: ${msg.message}`);
        break;
      }
      showError(Object.assign(new Error(msg.message), { code: msg.code }));
      break;
    default:
      break; // server messages may be added; ignore the unknown ones
  }
}

function onClose({ code, reason }) {
  stream = null;
  const u = current;
  if (u && !u.over) {
    if (code !== 1000 && reason !== stats.errors.at(-1)?.code) {
      showError(new Error(`The connection closed (code ${code}${reason ? `, ${reason}` : ""}).`));
    }
    finish(u);
  } else if (stats.state === "stopping") {
    setState("idle");
  }
}

/**
 * Where each segment plays. Sound (re)starts after buffering at known points ("started" anchors:
 * time and samples played so far); from there it runs at the context's rate until the next one.
 */
function placeSegments(u) {
  const rate = player.sampleRate;
  for (const seg of u.segments) {
    if (!seg) continue;
    const at = (seg.startSample * rate) / seg.rate; // the worklet resamples to the context's rate
    const anchor = u.anchors.findLast((a) => a.sample <= at + 1);
    seg.playStartMs = anchor ? anchor.t + (1000 * (at - anchor.sample)) / rate : null;
  }
}

player.addEventListener("stats", (event) => {
  const { peaks, buffered, underruns } = event.detail;
  meter.push(peaks);
  const u = current;
  if (u) {
    // Counted from the worklet's own total even after Stop, so a Stop that did not silence shows.
    for (const p of peaks) stats.peak = Math.max(stats.peak, p);
    stats.samplesPlayed = player.played - u.playedAtStart;
    stats.secondsPlayed = stats.samplesPlayed / player.sampleRate;
  }
  stats.bufferedMs = Math.round((1000 * buffered) / player.sampleRate);
  stats.underruns = underruns;
  $("stat-frames").textContent = `${stats.framesReceived}`;
  $("stat-bytes").textContent = `${(stats.bytesReceived / 1024).toFixed(0)} KiB`;
  $("stat-played").textContent = `${stats.secondsPlayed.toFixed(2)} s`;
  $("stat-buffered").textContent = `${stats.bufferedMs} ms`;
  $("stat-underruns").textContent = `${underruns}`;
});

player.addEventListener("started", (event) => {
  const u = current;
  if (!u || u.cancelled) return;
  const t = performance.now() - u.t0;
  if (!u.anchors.length) {
    stats.firstSoundMs = Math.round(t);
    $("ttfa-sound").textContent = `first sound at ${stats.firstSoundMs} ms (after the jitter buffer)`;
  }
  u.anchors.push({ t, sample: event.detail.played - u.playedAtStart });
  placeSegments(u);
  timeline.render(u.segments);
});

player.addEventListener("drained", () => {
  const u = current;
  if (u && u.ended && stats.state === "speaking") {
    setState("idle");
    status(`Done: ${stats.secondsPlayed.toFixed(2)} s played.`);
  }
});

// ---- controls ---------------------------------------------------------------------------------

function updateDeviceRateLabel() {
  const option = $("sample-rate").querySelector('option[value="device"]');
  const device = player.sampleRate
    ? `The audio device runs at ${player.sampleRate} Hz`
    : "Device rate: the audio device's own rate";
  if (player.sampleRate) option.textContent = `Device (${player.sampleRate})`;
  $("sample-rate-help").textContent = $("format").value === "opus"
    ? `${device}. Opus encodes at 8, 12, 16, 24 or 48 kHz: other rates ask for the next one up ` +
      `(engine native: ${OPUS_NATIVE_RATE} Hz), and it decodes at 48 kHz, resampled in the page.`
    : `${device}; other rates are resampled in the page.`;
}

$("format").addEventListener("change", updateDeviceRateLabel);
if (!canDecodeOpus()) {
  const option = $("format").querySelector('option[value="opus"]');
  option.disabled = true;
  option.textContent += " (needs WebCodecs)";
}
// The sample texts: the page's own greeting, and a reply as an LLM writes it, in markdown (the gateway
// speaks it without its symbols, each list item as its own segment: docs/protocol.md, text normalization).
const SAMPLES = {
  greeting: $("text").value,
  markdown:
    "**Sure!** Here are three options:\n\n1. *Pizza* for $12.99\n2. `sushi_roll` at https://example.com/menu\n" +
    "3. ~~Tacos~~ Burgers.\n\n### Summary\n- Total: 3 items",
};
$("sample").addEventListener("change", () => {
  $("text").value = SAMPLES[$("sample").value];
});
$("speak-btn").addEventListener("click", speak);
$("stop-btn").addEventListener("click", stop);
$("text").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    speak();
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && stats.state !== "idle") stop();
});
const tokenRate = $("token-rate");
const syncRate = () => {
  $("token-rate-out").textContent = tokenRate.value;
};
tokenRate.addEventListener("input", syncRate);
syncRate();
const syncMode = () => {
  const llm = document.querySelector('input[name="mode"]:checked').value === "llm";
  tokenRate.disabled = !llm;
};
document.querySelectorAll('input[name="mode"]').forEach((r) => r.addEventListener("change", syncMode));
syncMode();

setState("idle");
refreshVoices();

// The voice panel: list voices (GET /v1/audio/voices), upload one (POST, multipart) from a file or
// the microphone, delete uploaded ones (DELETE /v1/audio/voices/{name}).
//
// Events (EventTarget): "voices" detail = {builtin: [{name, engine, language}], uploaded: [...],
// cloning: [engines that clone] or null when the server does not say, engines: [every engine]}. With no
// engine that clones, uploading is turned off, with a note saying why, before anyone picks a voice that
// could not be spoken.

import { apiFetch } from "./api.js";
import { Recorder, recordingUnavailable } from "./recorder.js";

export const VOICES_PATH = "/v1/audio/voices";

/**
 * The voice list as the page uses it. `voices` names every voice a request may use, uploaded ones too (as
 * vllm-omni lists them), so the built-in ones come from `voice_details`; a gateway without it lists names
 * (or {name, engine, language} objects), less the uploaded ones.
 */
export function normaliseVoices(body) {
  const uploaded = body.uploaded_voices || [];
  const uploadedNames = new Set(uploaded.map((v) => v.name.toLowerCase()));
  const builtin = Array.isArray(body.voice_details)
    ? body.voice_details.map((v) => ({ name: v.name, language: v.language, engine: (v.engines || []).join(", ") }))
    : (body.voices || [])
        .map((v) => (typeof v === "string" ? { name: v } : v))
        .filter((v) => !uploadedNames.has(v.name.toLowerCase()));
  const cloning = Array.isArray(body.cloning_engines) ? body.cloning_engines : null;
  const engines = [...new Set((body.voice_details || []).flatMap((v) => v.engines || []))];
  return { builtin, uploaded, cloning, engines };
}

/** What the page says after an upload: the voice, and the gateway's warning when it gave one (no engine
 * there can clone: the voice is stored, but using it is refused). */
export function uploadMessage(body) {
  const done = `Uploaded voice “${body.voice.name}”.`;
  return body.warning ? `${done} Warning: ${body.warning.message}` : done;
}

/** The note to show when no engine of the gateway can clone, else "" (also when the server does not say). */
export function cloningNote(voices) {
  if (!voices.cloning || voices.cloning.length) return "";
  const { engines } = voices;
  const who = engines.length
    ? `This gateway's engine${engines.length > 1 ? "s" : ""} (${engines.join(", ")})`
    : "This gateway";
  return `${who} cannot clone voices, so an uploaded voice could not be spoken here: uploading is off.`;
}

export class VoicePanel extends EventTarget {
  /**
   * @param {object} ui  {form, fieldset, note, file, record, recordHelp, preview, name, consent, consentText,
   *                      refText, submit, list, empty}
   * @param {object} hooks  {key(): string, status(text), error(err)}
   */
  constructor(ui, hooks) {
    super();
    this.ui = ui;
    this.hooks = hooks;
    this.recorder = new Recorder();
    this.recording = null; // WAV Blob from the microphone
    this.voices = { builtin: [], uploaded: [], cloning: null, engines: [] };
    ui.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.upload();
    });
    ui.file.addEventListener("change", () => {
      if (ui.file.files.length) this._setRecording(null);
    });
    const unavailable = recordingUnavailable();
    if (unavailable) {
      ui.record.disabled = true;
      ui.recordHelp.textContent = unavailable;
    } else {
      ui.record.addEventListener("click", () => this.toggleRecording());
    }
  }

  async refresh() {
    const body = await apiFetch(VOICES_PATH, this.hooks.key());
    this.voices = normaliseVoices(body);
    const note = cloningNote(this.voices);
    this.ui.fieldset.disabled = Boolean(note);
    this.ui.note.textContent = note;
    this.ui.note.hidden = !note;
    this._renderList();
    this.dispatchEvent(new CustomEvent("voices", { detail: this.voices }));
    return this.voices;
  }

  async toggleRecording() {
    const { record } = this.ui;
    try {
      if (this.recorder.recording) {
        record.disabled = true;
        const wav = await this.recorder.stop();
        this._setRecording(wav);
        this.hooks.status(`Recorded ${(wav.size / 1024).toFixed(0)} KiB; it will be uploaded instead of a file.`);
      } else {
        await this.recorder.start();
        record.textContent = "Stop recording";
        record.setAttribute("aria-pressed", "true");
        this.hooks.status("Recording from the microphone…");
      }
    } catch (err) {
      this.hooks.error(err);
    } finally {
      record.disabled = false;
      if (!this.recorder.recording) {
        record.textContent = "Record from microphone";
        record.setAttribute("aria-pressed", "false");
      }
    }
  }

  async upload() {
    const { ui } = this;
    const audio = this.recording || ui.file.files[0];
    const problems = [];
    if (!audio) problems.push("choose an audio file or record one");
    if (!ui.name.value.trim()) problems.push("give the voice a name");
    if (!ui.consent.checked) problems.push("confirm the speaker's consent");
    if (problems.length) {
      this.hooks.error(new Error(`To upload a voice, ${problems.join(", ")}.`));
      return;
    }
    const form = new FormData();
    form.append("audio_sample", audio, this.recording ? "recording.wav" : audio.name);
    form.append("name", ui.name.value.trim());
    form.append("consent", ui.consentText.textContent.trim());
    if (ui.refText.value.trim()) form.append("ref_text", ui.refText.value.trim());
    ui.submit.disabled = true;
    try {
      const body = await apiFetch(VOICES_PATH, this.hooks.key(), { method: "POST", body: form });
      this.hooks.status(uploadMessage(body));
      ui.form.reset();
      this._setRecording(null);
      await this.refresh();
    } catch (err) {
      this.hooks.error(err);
    } finally {
      ui.submit.disabled = false;
    }
  }

  async remove(name) {
    try {
      await apiFetch(`${VOICES_PATH}/${encodeURIComponent(name)}`, this.hooks.key(), { method: "DELETE" });
      this.hooks.status(`Deleted voice “${name}”.`);
      await this.refresh();
    } catch (err) {
      this.hooks.error(err);
    }
  }

  _setRecording(wav) {
    const { preview } = this.ui;
    if (preview.src) URL.revokeObjectURL(preview.src);
    this.recording = wav;
    if (wav) {
      preview.src = URL.createObjectURL(wav);
      preview.hidden = false;
      this.ui.file.value = "";
    } else {
      preview.removeAttribute("src");
      preview.hidden = true;
    }
  }

  _renderList() {
    const { list, empty } = this.ui;
    list.replaceChildren();
    empty.hidden = this.voices.uploaded.length > 0;
    for (const voice of this.voices.uploaded) {
      const item = document.createElement("li");
      const info = document.createElement("div");
      const name = document.createElement("strong");
      name.textContent = voice.name;
      const meta = document.createElement("span");
      meta.className = "meta";
      const parts = [];
      if (voice.duration_s) parts.push(`${voice.duration_s.toFixed(1)} s`);
      if (voice.created_at) parts.push(new Date(voice.created_at * 1000).toLocaleString());
      meta.textContent = parts.join(" · ");
      info.append(name, " ", meta);
      if (voice.consent) {
        const consent = document.createElement("span");
        consent.className = "consent";
        consent.textContent = `Consent: ${voice.consent}`;
        info.append(consent);
      }
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "danger";
      remove.textContent = "Delete";
      remove.setAttribute("aria-label", `Delete voice ${voice.name}`);
      remove.addEventListener("click", () => this.remove(voice.name));
      item.append(info, remove);
      list.append(item);
    }
  }
}

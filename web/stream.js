// One WebSocket session of WS /v1/audio/speech/stream (docs/protocol.md), without any UI.
//
// Events (EventTarget):
//   "message" detail = a server JSON message (session.ready, audio.start, audio.done, session.done,
//             audio.cancelled, error)
//   "frame"   detail = {header, buffer}: a binary frame (always sent with `frame_header: true`)
//   "close"   detail = {code, reason, opened}
//   "fault"   detail = an Error: a message that could not be parsed
//
// It also keeps the utterance numbering the server uses (§1): the index moves on at every
// input.done and at an input.cancel sent while an utterance is open, so the page knows which
// utterance_index its next text will get and can drop frames of a cancelled one.

import { parseFrame } from "./frames.js";
import { socketTarget } from "./api.js";

export const STREAM_PATH = "/v1/audio/speech/stream";
// Client messages are capped at limits.max_message_bytes (128 KiB by default); a pasted text is
// sent in pieces far below that, measured in UTF-16 units (at most 3 UTF-8 bytes each).
const MAX_TEXT_CHUNK = 8000;

export class SpeechStream extends EventTarget {
  constructor(key) {
    super();
    this.key = key;
    this.socket = null;
    this.ready = null; // the last session.ready
    this.configJson = null; // the session.config that `ready` answers
    this.nextUtterance = 0;
    this.open = false; // an utterance is open (text sent, no input.done / input.cancel yet)
    this._pending = null; // {resolve, reject} of a session.config awaiting its answer
  }

  get connected() {
    return this.socket !== null && this.socket.readyState === WebSocket.OPEN;
  }

  /** Open the socket; rejects with the close code when the server refuses it. */
  connect() {
    const { url, protocols } = socketTarget(STREAM_PATH, this.key);
    return new Promise((resolve, reject) => {
      let opened = false;
      const socket = new WebSocket(url, protocols);
      socket.binaryType = "arraybuffer";
      this.socket = socket;
      socket.onopen = () => {
        opened = true;
        resolve();
      };
      socket.onmessage = (event) => this._onMessage(event.data);
      socket.onclose = (event) => {
        if (this.socket === socket) this.socket = null;
        const detail = { code: event.code, reason: event.reason, opened };
        if (!opened) {
          reject(Object.assign(new Error(`WebSocket refused (close code ${event.code})`), detail));
        }
        if (this._pending) {
          this._pending.reject(new Error(`the connection closed (code ${event.code}) before session.ready`));
          this._pending = null;
        }
        this.dispatchEvent(new CustomEvent("close", { detail }));
      };
    });
  }

  /** Send session.config unless the same one is already in force; resolves with session.ready. */
  configure(config) {
    const json = JSON.stringify({ type: "session.config", ...config });
    if (json === this.configJson && this.ready) return Promise.resolve(this.ready);
    return new Promise((resolve, reject) => {
      this._pending = { resolve, reject, json };
      this.socket.send(json);
    });
  }

  /** Append text to the open utterance (opening one); returns its utterance_index. */
  sendText(text) {
    if (!this.open && text) this.open = true;
    for (let i = 0; i < text.length; i += MAX_TEXT_CHUNK) {
      this._send({ type: "input.text", text: text.slice(i, i + MAX_TEXT_CHUNK) });
    }
    return this.nextUtterance;
  }

  /** End the utterance: the server flushes its last segment and answers with session.done. */
  done() {
    this._send({ type: "input.done" });
    this.open = false;
    return this.nextUtterance++;
  }

  /** Barge-in: the server cancels every utterance it holds and answers audio.cancelled. */
  cancel() {
    this._send({ type: "input.cancel" });
    if (this.open) {
      this.open = false;
      this.nextUtterance++;
    }
  }

  close() {
    if (this.socket) this.socket.close(1000);
    this.socket = null;
  }

  _send(message) {
    if (!this.connected) throw new Error("the WebSocket is not open");
    this.socket.send(JSON.stringify(message));
  }

  _onMessage(data) {
    let header = null;
    let msg = null;
    try {
      if (data instanceof ArrayBuffer) header = parseFrame(data);
      else msg = JSON.parse(data);
    } catch (err) {
      this.dispatchEvent(new CustomEvent("fault", { detail: err }));
      return;
    }
    if (header) {
      this.dispatchEvent(new CustomEvent("frame", { detail: { header, buffer: data } }));
      return;
    }
    if (this._pending && msg.type === "session.ready") {
      this.ready = msg;
      this.configJson = this._pending.json;
      this._pending.resolve(msg);
      this._pending = null;
    } else if (this._pending && msg.type === "error" && msg.code !== "engine_error") {
      this._pending.reject(Object.assign(new Error(msg.message), { server: msg }));
      this._pending = null;
    }
    this.dispatchEvent(new CustomEvent("message", { detail: msg }));
  }
}

// Main-thread side of the player: one AudioContext and one AudioWorkletNode (player-worklet.js).
//
// Events (EventTarget): "stats" {played, buffered, peaks, playing, underruns},
// "started" {played} when sound (re)starts after buffering, "drained" {played} when an ended stream
// has played out. `played` counts samples at `sampleRate` since the player was created.

const WORKLET_URL = new URL("./player-worklet.js", import.meta.url);
export const PREBUFFER_MS = 100; // absorbs network jitter; well under what a listener notices

export class Player extends EventTarget {
  constructor() {
    super();
    this.context = null;
    this.node = null;
    this.played = 0;
    this.buffered = 0;
    this.underruns = 0;
    this._loading = null;
  }

  get sampleRate() {
    return this.context ? this.context.sampleRate : null;
  }

  /** Create the context on the first call (call it from a click so autoplay rules allow sound). */
  start() {
    if (!this.context) {
      if (typeof AudioWorkletNode === "undefined") {
        return Promise.reject(new Error("this browser has no AudioWorklet (a secure context is needed: https or localhost)"));
      }
      this.context = new AudioContext({ latencyHint: "interactive" });
      this._loading = this.context.audioWorklet.addModule(WORKLET_URL).then(() => {
        this.node = new AudioWorkletNode(this.context, "voxgate-player", {
          numberOfInputs: 0,
          outputChannelCount: [1],
        });
        this.node.port.onmessage = (event) => this._onMessage(event.data);
        this.node.port.postMessage({ type: "config", prebufferMs: PREBUFFER_MS });
        this.node.connect(this.context.destination);
      });
    }
    return this._loading.then(() => this.context.resume());
  }

  /** Queue samples recorded at `rate`; the worklet resamples when it differs from the context's. */
  push(samples, rate) {
    this.node.port.postMessage({ type: "push", samples, rate }, [samples.buffer]);
  }

  /** The stream is complete: play out the rest without waiting to fill the prebuffer. */
  end() {
    if (this.node) this.node.port.postMessage({ type: "end" });
  }

  /** Silence now: drop everything queued. */
  flush() {
    if (this.node) this.node.port.postMessage({ type: "flush" });
    this.buffered = 0;
  }

  _onMessage(msg) {
    this.played = msg.played;
    if (msg.type === "stats") {
      this.buffered = msg.buffered;
      this.underruns = msg.underruns;
    }
    this.dispatchEvent(new CustomEvent(msg.type, { detail: msg }));
  }
}

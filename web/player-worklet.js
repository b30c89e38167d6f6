// AudioWorklet side of the player: a jitter buffer of float32 chunks, played as they arrive.
//
// Messages in (port):
//   {type: "push", samples: Float32Array, rate}  append audio (resampled here if rate != sampleRate)
//   {type: "end"}                                no more audio for now: play out what is left, even
//                                                if it is less than the prebuffer
//   {type: "flush"}                              drop everything at once (Stop / barge-in)
//   {type: "config", prebufferMs}
// Messages out:
//   {type: "stats", played, buffered, peaks, playing, underruns}   every few render quanta while busy
//   {type: "started"} when playback (re)starts after buffering, {type: "drained"} when an ended
//   stream has played out.

const STATS_EVERY_QUANTA = 8; // ~21 ms at 48 kHz: smooth enough for a meter, cheap to post

class LinearResampler {
  // Streaming linear interpolation; state carries across chunks so segment joins stay seamless.
  constructor(inRate, outRate) {
    this.inRate = inRate;
    this.step = inRate / outRate;
    this.t = 0; // next output position, in input samples, relative to the current chunk (-1 = prev)
    this.prev = 0;
  }

  process(chunk) {
    const n = chunk.length;
    if (n === 0) return chunk;
    const out = new Float32Array(Math.ceil((n - this.t) / this.step) + 1);
    let k = 0;
    let t = this.t;
    while (t < n - 1) {
      const i = Math.floor(t);
      const frac = t - i;
      const a = i < 0 ? this.prev : chunk[i];
      const b = chunk[i + 1];
      out[k++] = a + (b - a) * frac;
      t += this.step;
    }
    this.t = t - n;
    this.prev = chunk[n - 1];
    return out.subarray(0, k);
  }
}

class PlayerProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.chunks = []; // Float32Array queue at the context's rate
    this.offset = 0; // read position in chunks[0]
    this.buffered = 0; // samples queued
    this.prebuffer = Math.round(sampleRate * 0.1);
    this.playing = false;
    this.ended = false;
    this.played = 0; // samples sent to the output since the worklet was created
    this.underruns = 0;
    this.resampler = null;
    this.quanta = 0;
    this.peaks = [];
    this.busy = false;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(msg) {
    switch (msg.type) {
      case "push": {
        let samples = msg.samples;
        if (msg.rate !== sampleRate) {
          if (!this.resampler || this.resampler.inRate !== msg.rate) {
            this.resampler = new LinearResampler(msg.rate, sampleRate);
          }
          samples = this.resampler.process(samples);
        }
        if (samples.length) {
          this.chunks.push(samples);
          this.buffered += samples.length;
        }
        this.ended = false;
        this.busy = true;
        break;
      }
      case "end":
        if (this.buffered === 0 && !this.playing) {
          this.port.postMessage({ type: "drained", played: this.played });
        } else {
          this.ended = true;
          this.busy = true;
        }
        break;
      case "flush":
        this.chunks = [];
        this.offset = 0;
        this.buffered = 0;
        this.resampler = null;
        this.ended = false;
        this.playing = false;
        this.postStats();
        break;
      case "config":
        this.prebuffer = Math.round((sampleRate * msg.prebufferMs) / 1000);
        break;
    }
  }

  postStats() {
    this.port.postMessage({
      type: "stats",
      played: this.played,
      buffered: this.buffered,
      peaks: this.peaks,
      playing: this.playing,
      underruns: this.underruns,
    });
    this.peaks = [];
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.buffered > 0 && (this.buffered >= this.prebuffer || this.ended)) {
      this.playing = true;
      this.port.postMessage({ type: "started", played: this.played });
    }
    let written = 0;
    if (this.playing) {
      while (written < out.length && this.chunks.length) {
        const chunk = this.chunks[0];
        const take = Math.min(out.length - written, chunk.length - this.offset);
        out.set(chunk.subarray(this.offset, this.offset + take), written);
        written += take;
        this.offset += take;
        if (this.offset === chunk.length) {
          this.chunks.shift();
          this.offset = 0;
        }
      }
      this.buffered -= written;
      this.played += written;
      if (this.buffered === 0) {
        this.playing = false;
        if (this.ended) {
          this.ended = false;
          this.port.postMessage({ type: "drained", played: this.played });
        } else {
          this.underruns += 1; // the stream fell behind: buffer again before resuming
        }
      }
    }
    for (let i = written; i < out.length; i++) out[i] = 0;
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    if (this.busy) {
      let peak = 0;
      for (let i = 0; i < written; i++) peak = Math.max(peak, Math.abs(out[i]));
      this.peaks.push(peak);
      if (++this.quanta % STATS_EVERY_QUANTA === 0) {
        this.postStats();
        if (!this.playing && this.buffered === 0) this.busy = false;
      }
    }
    return true;
  }
}

registerProcessor("voxgate-player", PlayerProcessor);

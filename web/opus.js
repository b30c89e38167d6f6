// Live decoding of an Ogg Opus stream (RFC 7845) with WebCodecs' AudioDecoder: bytes in as they arrive,
// float32 samples out at 48 kHz, trimmed as RFC 7845 says a player should: the pre-skip at the start, and
// at the end whatever lies past the EOS page's granule position (the last packet's padding).
//
// The decoder is configured without a `description`: for mono (and stereo) Opus, channel mapping family
// 0, WebCodecs needs none, and Chromium then decodes every packet whole. Given the OpusHead as the
// description, Chromium drops the pre-skip itself but does not trim the end, and other browsers may
// differ; trimming here works the same everywhere.

import { OggReader, isOpusTags, opusPacketSamples, parseOpusHead } from "./ogg.js";

export const OPUS_RATE = 48000; // Opus decodes at 48 kHz whatever the encoder's input rate
// The rates an Opus encoder takes (the gateway refuses others with unsupported_rate).
export const OPUS_INPUT_RATES = [8000, 12000, 16000, 24000, 48000];

const US_PER_S = 1_000_000;

/** True when this browser has WebCodecs' AudioDecoder (Chromium-based browsers, Firefox 130 and later). */
export const canDecodeOpus = () => typeof AudioDecoder !== "undefined" && typeof EncodedAudioChunk !== "undefined";

/** The smallest Opus encoder rate at or above `rate` (48000 above that). */
export function opusInputRate(rate) {
  return OPUS_INPUT_RATES.find((r) => r >= rate) ?? OPUS_INPUT_RATES.at(-1);
}

/**
 * One utterance's Ogg Opus audio. A new BOS page starts a new logical stream (a chained stream): the
 * decoder is configured again, which resets it once everything before has been decoded, so nothing of
 * the previous stream leaks into the next one and the outputs stay in order.
 *
 * @param {object} sink  {output(samples: Float32Array, rate), error(err)}
 */
export class OggOpusDecoder {
  constructor(sink) {
    this.sink = sink;
    this.reader = new OggReader();
    this.decoder = null;
    this.stream = null; // the stream being read: {head, tags, start, baseSamples}
    // Every stream on one timeline of 48 kHz samples: packets are fed at `fed`, outputs arrive at `out`,
    // and only the samples in `keep` ([from, to) of each stream: after its pre-skip, before its end) pass.
    this.fed = 0;
    this.out = 0;
    this.keep = [];
    this.closed = false;
    // Counters for the page (window.voxgate.decoder): all streams of this utterance together.
    this.stats = {
      codec: "opus",
      description: false, // the decoder is configured without the OpusHead (see the top of this file)
      streams: 0, // BOS pages seen
      pages: 0,
      packets: 0, // audio packets fed to the decoder as EncodedAudioChunks
      frames: 0, // AudioData objects the decoder gave back
      samples: 0, // 48 kHz samples passed on after trimming
      preSkip: null,
      inputRate: null,
      receivedSamples: 0, // audio the pages so far hold, 48 kHz samples after pre-skip (from granules)
      error: null,
    };
  }

  /** Seconds of audio in the pages received so far (the last page's granule, less the pre-skip). */
  get receivedSeconds() {
    return this.stats.receivedSamples / OPUS_RATE;
  }

  /** Add bytes of the stream (whole pages or not); throws on bytes that are not Ogg Opus. */
  push(bytes) {
    if (this.closed || this.stats.error) return; // a failed decoder is closed: the error was reported
    for (const page of this.reader.push(bytes)) {
      this.stats.pages += 1;
      if (page.bos) {
        const last = this.keep.at(-1);
        if (last && last.to > this.fed) last.to = this.fed; // a stream cut short, with no EOS page
        this.stats.streams += 1;
        this.stream = { head: null, tags: false, start: this.fed, baseSamples: this.stats.receivedSamples };
      }
      const s = this.stream;
      if (!s) throw new Error("Ogg Opus audio before the stream's first (BOS) page");
      for (const packet of page.packets) this._packet(s, packet);
      if (s.head && page.granule >= 0) {
        // Granules count the stream's decoded samples, pre-skip included; the EOS page's ends the audio.
        if (page.eos) this.keep.at(-1).to = s.start + page.granule;
        this.stats.receivedSamples = s.baseSamples + Math.max(0, page.granule - s.head.preSkip);
      }
    }
  }

  /** Resolves once every packet fed so far has been decoded and passed on. */
  flush() {
    return this.decoder && this.decoder.state === "configured" ? this.decoder.flush() : Promise.resolve();
  }

  /** Stop at once: what is still being decoded is dropped. */
  close() {
    this.closed = true;
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
  }

  _packet(s, packet) {
    if (!s.head) {
      s.head = parseOpusHead(packet);
      if (s.head.mapping !== 0 || s.head.channels > 2) {
        throw new Error(`Opus channel mapping ${s.head.mapping} (${s.head.channels} channels) is not supported`);
      }
      this.stats.preSkip = s.head.preSkip;
      this.stats.inputRate = s.head.inputRate;
      this.keep.push({ from: s.start + s.head.preSkip, to: Infinity, gain: 10 ** (s.head.gainDb / 20) });
      this.decoder = this.decoder || this._decoder();
      this.decoder.configure({ codec: "opus", sampleRate: OPUS_RATE, numberOfChannels: s.head.channels });
    } else if (!s.tags) {
      if (!isOpusTags(packet)) throw new Error("the Ogg Opus stream has no OpusTags after its OpusHead");
      s.tags = true;
    } else {
      const samples = opusPacketSamples(packet);
      this.decoder.decode(
        new EncodedAudioChunk({
          type: "key", // every Opus packet decodes on its own
          timestamp: Math.round((this.fed * US_PER_S) / OPUS_RATE),
          duration: Math.round((samples * US_PER_S) / OPUS_RATE),
          data: packet,
        }),
      );
      this.fed += samples;
      this.stats.packets += 1;
    }
  }

  _decoder() {
    return new AudioDecoder({
      output: (data) => this._output(data),
      error: (err) => {
        if (this.closed) return; // closed on purpose
        this.stats.error = err.message || String(err);
        this.sink.error(err);
      },
    });
  }

  _output(data) {
    try {
      if (this.closed) return;
      this.stats.frames += 1;
      const at = this.out;
      const n = data.numberOfFrames;
      this.out += n;
      // Outputs come in order: the ranges that end before this one are done with.
      while (this.keep.length > 1 && this.keep[0].to <= at) this.keep.shift();
      for (const range of this.keep) {
        const from = Math.max(0, range.from - at);
        const to = Math.min(n, range.to - at);
        if (to <= from) continue;
        const samples = mono(data, from, to - from);
        if (range.gain !== 1) for (let i = 0; i < samples.length; i++) samples[i] *= range.gain;
        this.stats.samples += samples.length;
        this.sink.output(samples, data.sampleRate);
      }
    } finally {
      data.close();
    }
  }
}

/** `frameCount` frames of `data` from `frameOffset`, as one float32 channel (stereo is averaged). */
function mono(data, frameOffset, frameCount) {
  const out = new Float32Array(frameCount);
  const options = { format: "f32-planar", frameOffset, frameCount };
  data.copyTo(out, { ...options, planeIndex: 0 });
  if (data.numberOfChannels > 1) {
    const right = new Float32Array(frameCount);
    data.copyTo(right, { ...options, planeIndex: 1 });
    for (let i = 0; i < frameCount; i++) out[i] = (out[i] + right[i]) / 2;
  }
  return out;
}

// Microphone recording for voice upload: MediaRecorder, then re-encoded as 16-bit WAV, because
// browsers record WebM/Opus (Chrome) or Ogg/Opus and the gateway decodes wav, flac, ogg and mp3.

/** Why recording cannot work here, or null when it can. */
export function recordingUnavailable() {
  if (!window.isSecureContext) return "Recording needs a secure page (https or localhost).";
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    return "This browser gives the page no microphone access (getUserMedia is unavailable).";
  }
  if (typeof MediaRecorder === "undefined") return "This browser has no MediaRecorder.";
  return null;
}

export class Recorder {
  constructor() {
    this.recorder = null;
    this.chunks = [];
    this.stream = null;
  }

  get recording() {
    return this.recorder !== null && this.recorder.state === "recording";
  }

  async start() {
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
    this.chunks = [];
    this.recorder = new MediaRecorder(this.stream);
    this.recorder.ondataavailable = (event) => {
      if (event.data.size) this.chunks.push(event.data);
    };
    this.recorder.start();
  }

  /** Stop and return the recording as a WAV Blob. */
  stop() {
    return new Promise((resolve, reject) => {
      const recorder = this.recorder;
      recorder.onstop = async () => {
        this.stream.getTracks().forEach((track) => track.stop());
        this.recorder = null;
        try {
          const encoded = new Blob(this.chunks, { type: recorder.mimeType });
          resolve(await toWav(encoded));
        } catch (err) {
          reject(err);
        }
      };
      recorder.stop();
    });
  }
}

async function toWav(blob) {
  const context = new OfflineAudioContext(1, 1, 48000);
  const audio = await context.decodeAudioData(await blob.arrayBuffer());
  const mono = new Float32Array(audio.length);
  for (let c = 0; c < audio.numberOfChannels; c++) {
    const data = audio.getChannelData(c);
    for (let i = 0; i < mono.length; i++) mono[i] += data[i] / audio.numberOfChannels;
  }
  return encodeWav(mono, audio.sampleRate);
}

/** A mono 16-bit PCM WAV file. */
export function encodeWav(samples, rate) {
  const view = new DataView(new ArrayBuffer(44 + samples.length * 2));
  const ascii = (offset, text) => [...text].forEach((ch, i) => view.setUint8(offset + i, ch.charCodeAt(0)));
  ascii(0, "RIFF");
  view.setUint32(4, 36 + samples.length * 2, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true);
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 1, true); // mono
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * 2, true);
  view.setUint16(32, 2, true);
  view.setUint16(34, 16, true);
  ascii(36, "data");
  view.setUint32(40, samples.length * 2, true);
  for (let i = 0; i < samples.length; i++) {
    view.setInt16(44 + i * 2, Math.round(Math.max(-1, Math.min(1, samples[i])) * 32767), true);
  }
  return new Blob([view.buffer], { type: "audio/wav" });
}

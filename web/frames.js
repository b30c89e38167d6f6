// Binary audio frames (docs/protocol.md §4): the 24-byte header and the four payload formats.

export const HEADER_BYTES = 24;
const MAGIC = [0x56, 0x47, 0x41, 0x31]; // "VGA1"
const WAV_HEADER_BYTES = 44; // sent once per utterance, inside frame 0's payload

export const BYTES_PER_SAMPLE = { pcm: 2, f32: 4, mulaw: 1, wav: 2 };

/** Parse a frame sent with `frame_header: true`; throws on a frame without the VGA1 magic. */
export function parseFrame(buffer) {
  const view = new DataView(buffer);
  if (buffer.byteLength < HEADER_BYTES || MAGIC.some((b, i) => view.getUint8(i) !== b)) {
    throw new Error(`binary message of ${buffer.byteLength} bytes has no VGA1 frame header`);
  }
  return {
    utterance: view.getUint32(4, true),
    sentence: view.getUint32(8, true),
    frameIndex: view.getUint32(12, true),
    startSample: Number(view.getBigUint64(16, true)),
    payloadBytes: buffer.byteLength - HEADER_BYTES,
  };
}

const MULAW = (() => {
  // G.711 u-law expansion, the inverse of the server's encoder (protocol/audio.py mulaw_decode).
  const table = new Float32Array(256);
  for (let byte = 0; byte < 256; byte++) {
    const u = ~byte & 0xff;
    const magnitude = (((u & 0x0f) << 3) + 0x84) << ((u >> 4) & 0x07);
    table[byte] = (u & 0x80 ? 0x84 - magnitude : magnitude - 0x84) / 32768;
  }
  return table;
})();

/** Decode a frame's payload (after the header) to float samples in [-1, 1]. */
export function decodePayload(buffer, format, frameIndex) {
  let offset = HEADER_BYTES;
  if (format === "wav" && frameIndex === 0) offset += WAV_HEADER_BYTES;
  const view = new DataView(buffer, offset);
  const n = Math.floor(view.byteLength / BYTES_PER_SAMPLE[format]);
  const out = new Float32Array(n);
  switch (format) {
    case "f32":
      for (let i = 0; i < n; i++) out[i] = view.getFloat32(i * 4, true);
      break;
    case "mulaw":
      for (let i = 0; i < n; i++) out[i] = MULAW[view.getUint8(i)];
      break;
    default: // pcm and wav: s16le
      for (let i = 0; i < n; i++) out[i] = view.getInt16(i * 2, true) / 32768;
  }
  return out;
}

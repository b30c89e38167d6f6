// Ogg pages (RFC 3533) and the parts of Ogg Opus (RFC 7845) and the Opus TOC (RFC 6716 §3.1) a player
// needs, without any decoding: bytes in, pages of packets out. No DOM, no WebCodecs.

export const PAGE_HEADER_BYTES = 27; // capture pattern to segment count; the segment table follows
const CAPTURE = [0x4f, 0x67, 0x67, 0x53]; // "OggS"
const FLAG_CONTINUED = 0x01;
const FLAG_BOS = 0x02;
const FLAG_EOS = 0x04;

/**
 * Splits a byte stream into Ogg pages and the pages into packets. Bytes may come in any pieces (voxgate
 * sends whole pages per message, but nothing here relies on it); a packet that spans pages (a 255 lacing
 * value at the end of a page) is joined with the rest of it on the next one.
 */
export class OggReader {
  constructor() {
    this._buffer = new Uint8Array(0);
    this._carry = []; // the pieces of a packet that continues on the next page
  }

  /**
   * Add bytes; returns the pages now complete: {bos, eos, granule, serial, sequence, packets}, where
   * `packets` (Uint8Array views) are those that end on the page and `granule` is -1 when none does.
   * Throws on bytes that are not an Ogg page.
   */
  push(bytes) {
    this._buffer = this._buffer.length ? concat([this._buffer, bytes]) : bytes;
    const pages = [];
    let offset = 0;
    for (;;) {
      const page = this._page(offset);
      if (!page) break;
      pages.push(page.page);
      offset = page.end;
    }
    this._buffer = this._buffer.subarray(offset);
    return pages;
  }

  _page(offset) {
    const data = this._buffer;
    if (data.length - offset < PAGE_HEADER_BYTES) return null;
    if (CAPTURE.some((b, i) => data[offset + i] !== b)) {
      throw new Error(`not an Ogg page: no "OggS" capture pattern at byte ${offset}`);
    }
    const view = new DataView(data.buffer, data.byteOffset + offset);
    if (view.getUint8(4) !== 0) throw new Error(`Ogg stream structure version ${view.getUint8(4)}, not 0`);
    const segments = view.getUint8(26);
    const tableEnd = offset + PAGE_HEADER_BYTES + segments;
    if (data.length < tableEnd) return null;
    const lacing = data.subarray(offset + PAGE_HEADER_BYTES, tableEnd);
    let bodyBytes = 0;
    for (const value of lacing) bodyBytes += value;
    if (data.length < tableEnd + bodyBytes) return null;

    const flags = view.getUint8(5);
    // A continued page whose start we never saw (or a continuation that never came) loses that packet.
    let skip = Boolean(flags & FLAG_CONTINUED) && !this._carry.length;
    if (!(flags & FLAG_CONTINUED)) this._carry = [];
    const packets = [];
    let at = tableEnd;
    let start = at;
    for (const value of lacing) {
      at += value;
      if (value < 255) {
        if (!skip) {
          this._carry.push(data.subarray(start, at));
          packets.push(this._carry.length === 1 ? this._carry[0] : concat(this._carry));
        }
        this._carry = [];
        skip = false;
        start = at;
      }
    }
    if (start < at && !skip) this._carry.push(data.slice(start, at)); // copied: the buffer moves on
    return {
      page: {
        bos: Boolean(flags & FLAG_BOS),
        eos: Boolean(flags & FLAG_EOS),
        granule: Number(view.getBigInt64(6, true)),
        serial: view.getUint32(14, true),
        sequence: view.getUint32(18, true),
        packets,
      },
      end: at,
    };
  }
}

function concat(parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

function startsWith(packet, magic) {
  return packet.length >= magic.length && [...magic].every((c, i) => packet[i] === c.charCodeAt(0));
}

/** True for an Opus comment header (the second packet of a stream). */
export const isOpusTags = (packet) => startsWith(packet, "OpusTags");

/**
 * The Opus identification header (RFC 7845 §5.1): {channels, preSkip, inputRate, gainDb, mapping}.
 * `preSkip` counts 48 kHz samples; `inputRate` is the encoder's input rate (information only: Opus
 * decodes at 48 kHz). Throws on a packet that is not one.
 */
export function parseOpusHead(packet) {
  if (!startsWith(packet, "OpusHead") || packet.length < 19) throw new Error("the Ogg stream has no OpusHead");
  const view = new DataView(packet.buffer, packet.byteOffset, packet.byteLength);
  const version = view.getUint8(8);
  if (version >> 4 !== 0) throw new Error(`OpusHead version ${version} is not supported`);
  return {
    channels: view.getUint8(9),
    preSkip: view.getUint16(10, true),
    inputRate: view.getUint32(12, true),
    gainDb: view.getInt16(16, true) / 256, // Q7.8 dB
    mapping: view.getUint8(18),
  };
}

// Frame size in 48 kHz samples of each TOC config (RFC 6716 §3.1, table 2): SILK 10/20/40/60 ms,
// hybrid 10/20 ms, CELT 2.5/5/10/20 ms.
const FRAME_SAMPLES = [
  ...[0, 1, 2].flatMap(() => [480, 960, 1920, 2880]),
  ...[0, 1].flatMap(() => [480, 960]),
  ...[0, 1, 2, 3].flatMap(() => [120, 240, 480, 960]),
];

/** The duration of an Opus packet in 48 kHz samples, from its TOC byte (0 for an empty packet). */
export function opusPacketSamples(packet) {
  if (!packet.length) return 0;
  const toc = packet[0];
  const code = toc & 0x03;
  const frames = code === 0 ? 1 : code === 3 ? (packet.length > 1 ? packet[1] & 0x3f : 0) : 2;
  return frames * FRAME_SAMPLES[toc >> 3];
}

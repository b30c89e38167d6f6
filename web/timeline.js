// The utterance timeline: one table row per segment, with a bar showing when its text was complete,
// when its first audio arrived and when it played. Times are ms since the utterance's first text.

const fmt = (ms) => (ms === null || ms === undefined ? "–" : `${Math.round(ms)}`);

function cell(row, label, text) {
  const td = document.createElement("td");
  td.dataset.label = label;
  td.textContent = text;
  row.append(td);
  return td;
}

function mark(track, cls, start, end, span, title) {
  const el = document.createElement("span");
  el.className = `mark ${cls}`;
  el.style.left = `${(100 * start) / span}%`;
  if (end !== null) el.style.width = `${Math.max(0.5, (100 * (end - start)) / span)}%`;
  el.title = title;
  track.append(el);
}

export class Timeline {
  constructor(body, caption) {
    this.body = body;
    this.caption = caption;
  }

  /**
   * @param {Array} segments  {index, text, textReadyMs, textReadyEstimated, firstAudioMs, serverTtfaMs,
   *                           durationMs, playStartMs, error}
   */
  render(segments) {
    const rows = segments.filter(Boolean);
    this.body.replaceChildren();
    this.caption.textContent = rows.length
      ? `${rows.length} segment${rows.length === 1 ? "" : "s"}; times in ms from the first text sent.`
      : "No segments yet.";
    let span = 1;
    for (const s of rows) {
      const playEnd = s.playStartMs !== null && s.durationMs !== null ? s.playStartMs + s.durationMs : null;
      span = Math.max(span, s.textReadyMs ?? 0, s.firstAudioMs ?? 0, playEnd ?? 0);
    }
    for (const s of rows) {
      const row = document.createElement("tr");
      if (s.error) row.className = "failed";
      cell(row, "#", `${s.index}`);
      cell(row, "Text", s.text).className = "text";
      cell(row, "Text ready", `${s.textReadyEstimated && s.textReadyMs !== null ? "≈" : ""}${fmt(s.textReadyMs)}`);
      cell(row, "First audio", fmt(s.firstAudioMs));
      cell(row, "Text → audio (server)", fmt(s.serverTtfaMs));
      cell(row, "Duration", s.error ? `${fmt(s.durationMs)} (engine error)` : fmt(s.durationMs));
      const track = document.createElement("div");
      track.className = "track";
      track.setAttribute("aria-hidden", "true");
      if (s.textReadyMs !== null) mark(track, "ready", s.textReadyMs, null, span, "text complete");
      if (s.playStartMs !== null && s.durationMs !== null) {
        mark(track, "play", s.playStartMs, s.playStartMs + s.durationMs, span, "playing");
      }
      if (s.firstAudioMs !== null) mark(track, "arrival", s.firstAudioMs, null, span, "first audio arrived");
      cell(row, "When", "").append(track);
      this.body.append(row);
    }
  }
}

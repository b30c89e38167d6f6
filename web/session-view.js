// The "Session" panel: what the last session.ready reported (effective config and limits).

export function renderSession(list, placeholder, ready, playbackRate) {
  const { config, limits } = ready;
  const resampled = config.sample_rate !== playbackRate ? ` (played at ${playbackRate} Hz)` : "";
  const opus = config.response_format === "opus" && config.sample_rate !== 48000; // Opus decodes at 48 kHz
  const decoded = opus ? ", decoded at 48000 Hz" : "";
  const rows = [
    ["Session", ready.session_id, "mono"],
    ["Engine", config.engine],
    ["Voice", config.voice],
    ["Format", config.response_format],
    ...(config.bitrate ? [["Bit rate", `${config.bitrate / 1000} kbit/s`]] : []),
    ["Sample rate", `${config.sample_rate} Hz${decoded}${resampled}`],
    ["Speed", `${config.speed}`],
    ["Frames", `${config.frame_ms} ms${config.frame_header ? ", with header" : ""}`],
    ["Segments", `${config.split_granularity}${config.eager_first_segment ? ", eager first" : ""}`],
    ["Max message", `${limits.max_message_bytes} bytes`],
    ["Idle timeout", `${limits.idle_timeout_s} s`],
    ["Max buffered audio", `${limits.max_buffered_audio_s} s`],
    ["Send timeout", `${limits.send_timeout_s} s`],
  ];
  list.replaceChildren();
  for (const [term, value, className] of rows) {
    const div = document.createElement("div");
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = term;
    dd.textContent = value;
    if (className) dd.className = className;
    div.append(dt, dd);
    list.append(div);
  }
  placeholder.hidden = true;
}

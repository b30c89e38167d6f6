// The text side of an utterance: sends it whole or token by token at a steady rate, as an LLM's
// stream would arrive, and remembers when each character went out, so the timeline can say when a
// segment's text was complete on the client.

/** Split text into 2 to 5 character tokens. */
export function tokenize(text) {
  const tokens = [];
  for (let i = 0; i < text.length; ) {
    const size = 2 + Math.floor(Math.random() * 4);
    tokens.push(text.slice(i, i + size));
    i += size;
  }
  return tokens;
}

export class TextFeed {
  /**
   * @param {string[]} tokens  sent in order; one token sends the text at once
   * @param {number} perSecond  token rate
   * @param {object} sink  {text(token), done(), fail(err)}: input.text, input.done, a send failed
   */
  constructor(tokens, perSecond, sink) {
    this.tokens = tokens;
    this.perSecond = perSecond;
    this.sink = sink;
    this.t0 = performance.now();
    this.sent = "";
    this.log = []; // [ms since t0, characters sent so far]
    this.doneAt = null;
    this.timer = null;
    this.stopped = false;
    this._next = 0;
    this._searchFrom = 0;
  }

  start() {
    this._tick();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  /**
   * When a segment's text was complete, in ms since t0: the server cuts a segment only once the
   * character after it has arrived, so that is the first token that went past its end, or
   * input.done for the last one. Segments are looked up in order; null if the text is not found.
   */
  readyAt(segmentText) {
    const at = this.sent.indexOf(segmentText, this._searchFrom);
    if (at < 0) return null;
    const end = at + segmentText.length;
    this._searchFrom = end;
    const entry = this.log.find(([, length]) => length > end);
    return entry ? entry[0] : this.doneAt;
  }

  _tick() {
    if (this.stopped) return;
    const elapsed = performance.now() - this.t0;
    const due = (i) => (i * 1000) / this.perSecond;
    try {
      // Send every token that is due, so a throttled timer catches up instead of drifting.
      while (this._next < this.tokens.length && due(this._next) <= elapsed) {
        const token = this.tokens[this._next++];
        this.sink.text(token);
        this.sent += token;
        this.log.push([performance.now() - this.t0, this.sent.length]);
      }
      if (this._next === this.tokens.length) {
        this.sink.done();
        this.doneAt = performance.now() - this.t0;
        this.stopped = true;
        return;
      }
    } catch (err) {
      this.stopped = true;
      this.sink.fail(err);
      return;
    }
    this.timer = setTimeout(() => this._tick(), Math.max(0, due(this._next) - elapsed));
  }
}

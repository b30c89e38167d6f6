// A scrolling level meter on a canvas: the peak of each 128-sample render quantum the worklet played,
// drawn as a mirrored envelope, newest on the right, with the current level as a bar at the edge.

const HISTORY = 600; // quanta kept: ~1.6 s at 48 kHz, enough to see words and pauses

export class Meter {
  constructor(canvas) {
    this.canvas = canvas;
    this.peaks = new Float32Array(HISTORY);
    this.head = 0;
    this.level = 0;
    this.scheduled = false;
    new ResizeObserver(() => this._resize()).observe(canvas);
    this._resize();
  }

  push(peaks) {
    for (const p of peaks) {
      this.peaks[this.head] = p;
      this.head = (this.head + 1) % HISTORY;
    }
    if (peaks.length) this.level = Math.max(...peaks);
    this._schedule();
  }

  clear() {
    this.peaks.fill(0);
    this.level = 0;
    this._schedule();
  }

  _resize() {
    const ratio = window.devicePixelRatio || 1;
    const { width, height } = this.canvas.getBoundingClientRect();
    this.canvas.width = Math.max(1, Math.round(width * ratio));
    this.canvas.height = Math.max(1, Math.round(height * ratio));
    this._schedule();
  }

  _schedule() {
    if (this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => {
      this.scheduled = false;
      this._draw();
    });
  }

  _draw() {
    const { canvas } = this;
    const ctx = canvas.getContext("2d");
    const style = getComputedStyle(canvas);
    const w = canvas.width;
    const h = canvas.height;
    const bar = Math.max(4, Math.round(w * 0.03));
    const plot = w - bar - 4;
    ctx.clearRect(0, 0, w, h);
    ctx.fillStyle = style.getPropertyValue("--meter-bg") || "#eee";
    ctx.fillRect(0, 0, w, h);
    ctx.fillStyle = style.getPropertyValue("--meter-fg") || "#36c";
    const mid = h / 2;
    const step = plot / HISTORY;
    for (let i = 0; i < HISTORY; i++) {
      const p = Math.min(1, this.peaks[(this.head + i) % HISTORY]);
      const half = Math.max(0.5, p * mid);
      ctx.fillRect(i * step, mid - half, Math.max(1, step), 2 * half);
    }
    const level = Math.min(1, this.level);
    ctx.fillStyle = level > 0.95 ? style.getPropertyValue("--meter-hot") || "#c33" : ctx.fillStyle;
    ctx.fillRect(w - bar, h - level * h, bar, level * h);
  }
}

// Hand-drawn canvas charts: a time series and a holder timeline. Both take
// the time window [from, to] in milliseconds of the database clock, so that
// every chart on the page scrolls in step.

const fontFamily = getComputedStyle(document.documentElement).fontFamily;

// css reads a colour (or any value) from the page's custom properties, so
// that the charts follow the light and dark themes.
export function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

// fit sizes the canvas's backing store to its CSS box and the device pixel
// ratio, and returns a context scaled to CSS pixels with its width and height.
function fit(canvas, cssHeight) {
  const dpr = window.devicePixelRatio || 1;
  if (cssHeight) canvas.style.height = cssHeight + "px";
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = `11px ${fontFamily}`;
  ctx.textBaseline = "middle";
  return { ctx, w, h };
}

// niceMax rounds a maximum up to 1, 2 or 5 times a power of ten.
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function formatTick(v) {
  if (v >= 1e6) return (v / 1e6).toFixed(v % 1e6 ? 1 : 0) + "M";
  if (v >= 1e4) return (v / 1e3).toFixed(0) + "k";
  if (v >= 1000) return (v / 1e3).toFixed(1) + "k";
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

// timeAxis draws minute marks ("-4m" … "now") along the bottom.
function timeAxis(ctx, x0, x1, y, from, to) {
  ctx.fillStyle = css("--muted");
  ctx.textAlign = "center";
  const span = to - from;
  for (let m = 0; m * 60000 <= span; m++) {
    const x = x1 - (m * 60000 / span) * (x1 - x0);
    ctx.fillText(m === 0 ? "now" : `-${m}m`, Math.min(Math.max(x, x0 + 10), x1 - 12), y);
  }
}

// series draws points [{t, v}] (v null for "unknown") as a filled line.
export function series(canvas, points, { from, to, color, fill, unit = "", minMax = 1 }) {
  const { ctx, w, h } = fit(canvas);
  const left = 44, right = 12, top = 8, bottom = 20;
  const x0 = left, x1 = w - right, y0 = top, y1 = h - bottom;
  const known = points.filter(p => p.v !== null && p.t >= from && p.t <= to);
  const max = niceMax(Math.max(minMax, ...known.map(p => p.v)));
  const x = t => x0 + (t - from) / (to - from) * (x1 - x0);
  const y = v => y1 - (v / max) * (y1 - y0);

  ctx.strokeStyle = css("--grid");
  ctx.lineWidth = 1;
  ctx.fillStyle = css("--muted");
  ctx.textAlign = "right";
  for (let i = 0; i <= 4; i++) {
    const v = max * i / 4, yy = Math.round(y(v)) + .5;
    ctx.beginPath(); ctx.moveTo(x0, yy); ctx.lineTo(x1, yy); ctx.stroke();
    if (i % 2 === 0) ctx.fillText(formatTick(v) + unit, x0 - 6, yy);
  }
  timeAxis(ctx, x0, x1, h - 8, from, to);
  if (known.length === 0) {
    ctx.textAlign = "center";
    ctx.fillText("waiting for data", (x0 + x1) / 2, (y0 + y1) / 2);
    return;
  }
  // One path per run of known points, so that a gap stays a gap.
  const runs = [];
  let run = [];
  for (const p of points) {
    if (p.t < from || p.t > to) continue;
    if (p.v === null) { if (run.length) runs.push(run); run = []; continue; }
    run.push(p);
  }
  if (run.length) runs.push(run);
  for (const r of runs) {
    ctx.beginPath();
    r.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p.v)) : ctx.moveTo(x(p.t), y(p.v))));
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.75;
    ctx.lineJoin = "round";
    ctx.stroke();
    ctx.lineTo(x(r[r.length - 1].t), y1);
    ctx.lineTo(x(r[0].t), y1);
    ctx.closePath();
    ctx.fillStyle = fill;
    ctx.fill();
  }
  const last = known[known.length - 1];
  ctx.fillStyle = color;
  ctx.beginPath(); ctx.arc(x(last.t), y(last.v), 3, 0, 2 * Math.PI); ctx.fill();
}

// timeline draws one row per resource with its holding intervals
// [{start, end, holder, open}] as bars coloured by holder.
export function timeline(canvas, rows, { from, to, colorOf }) {
  const rowH = 22, top = 4, bottom = 20;
  const labelW = Math.min(220, Math.max(120, canvas.clientWidth * 0.18));
  const { ctx, w, h } = fit(canvas, top + bottom + Math.max(1, rows.length) * rowH);
  const x0 = labelW, x1 = w - 12;
  const x = t => x0 + (Math.min(Math.max(t, from), to) - from) / (to - from) * (x1 - x0);

  ctx.strokeStyle = css("--grid");
  ctx.lineWidth = 1;
  for (let m = 0; m * 60000 <= to - from; m++) {
    const xx = Math.round(x1 - (m * 60000 / (to - from)) * (x1 - x0)) + .5;
    ctx.beginPath(); ctx.moveTo(xx, top); ctx.lineTo(xx, h - bottom); ctx.stroke();
  }
  timeAxis(ctx, x0, x1, h - 8, from, to);
  if (rows.length === 0) {
    ctx.fillStyle = css("--muted");
    ctx.textAlign = "center";
    ctx.fillText("no lease held in this window", (x0 + x1) / 2, top + rowH / 2);
    return;
  }
  rows.forEach((row, i) => {
    const yMid = top + i * rowH + rowH / 2;
    ctx.fillStyle = css("--ink");
    ctx.textAlign = "right";
    ctx.fillText(clip(ctx, row.resource, labelW - 14), labelW - 10, yMid);
    for (const iv of row.intervals) {
      if (iv.end < from || iv.start > to) continue;
      const a = x(iv.start), b = Math.max(x(iv.end), a + 2);
      ctx.fillStyle = colorOf(iv.holder);
      ctx.globalAlpha = iv.open ? 1 : 0.72;
      roundRect(ctx, a, yMid - 7, b - a, 14, 3);
      ctx.fill();
      ctx.globalAlpha = 1;
      if (b - a > 60) {
        ctx.fillStyle = "#fff";
        ctx.textAlign = "left";
        ctx.fillText(clip(ctx, iv.holder, b - a - 10), a + 5, yMid + .5);
      }
    }
  });
}

function roundRect(ctx, x, y, w, h, r) {
  r = Math.min(r, w / 2, h / 2);
  ctx.beginPath();
  ctx.moveTo(x + r, y);
  ctx.arcTo(x + w, y, x + w, y + h, r);
  ctx.arcTo(x + w, y + h, x, y + h, r);
  ctx.arcTo(x, y + h, x, y, r);
  ctx.arcTo(x, y, x + w, y, r);
  ctx.closePath();
}

// clip shortens text with an ellipsis to fit width pixels.
function clip(ctx, text, width) {
  if (ctx.measureText(text).width <= width) return text;
  let lo = 0, hi = text.length;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (ctx.measureText(text.slice(0, mid) + "…").width <= width) lo = mid; else hi = mid - 1;
  }
  return text.slice(0, lo) + "…";
}

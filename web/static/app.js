// The leasehold dashboard. Everything the overview shows comes from /ws: a
// snapshot on every connection, which replaces the page's state, then one
// message per change. Buttons act through the REST API of whichever replica
// serves the page. The overview never asks for all tasks: the server sends
// counts and the newest items. The tasks view (#tasks, tasks.js) reads
// pages of tasks through the REST API, again whenever the stream says
// tasks changed; the schedules view (#schedules, schedules.js) reads the
// schedules whenever the stream says a schedule or one of its tasks did.
// The flow control panels (flow.js) show the paused queues and the limited
// keys that come with the tasks messages, and pause and resume queues.

import { Stream } from "./stream.js";
import { css, series, timeline } from "./charts.js";
import { createTasksView, parseRoute, routeHash } from "./tasks.js";
import { createSchedulesView, parseRoute as parseScheduleRoute } from "./schedules.js";
import { createFlowPanels } from "./flow.js";

const $ = (id) => document.getElementById(id);

// ---- The clock -------------------------------------------------------------
// Lease decisions use the database clock. The snapshot says what time the
// database had; from then on the page counts with the browser's monotonic
// clock, so countdowns are right however wrong the browser's wall clock is.
const clock = { db: 0, perf: 0 };
function now() {
  return clock.db ? clock.db + (performance.now() - clock.perf) : Date.now();
}
const ms = (s) => (s ? Date.parse(s) : NaN);

// ---- Formatting ------------------------------------------------------------
const timeFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
const numFmt = new Intl.NumberFormat();

function age(msAgo) {
  if (!(msAgo >= 0)) msAgo = 0;
  const s = msAgo / 1000;
  if (s < 10) return s.toFixed(1) + " s";
  if (s < 90) return Math.round(s) + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function timeLeft(msLeft) {
  const s = Math.max(0, msLeft) / 1000;
  if (s < 60) return s.toFixed(1) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}:${String(Math.floor(s % 60)).padStart(2, "0")}`;
  return `${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}`;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  e.append(...children);
  return e;
}

// Holders get colours in the order the page first sees them, so that the
// three replicas of a demo are always three clearly different colours.
// Dark enough for white labels on the timeline.
const palette = ["#2f6db5", "#c2571a", "#2e8b57", "#8e44ad", "#b8336a", "#00838f", "#7a5c2e", "#5560b8", "#8a7a00", "#4f6370"];
const holderColors = new Map();
function colorOf(holder) {
  let c = holderColors.get(holder);
  if (!c) {
    c = palette[holderColors.size % palette.length];
    holderColors.set(holder, c);
  }
  return c;
}

// ---- State -----------------------------------------------------------------
const maxEvents = 1000; // kept in memory
const shownEvents = 200; // in the feed at once
const windowMs = 5 * 60 * 1000; // of the timeline and the charts
const timelineRows = 12;

const state = {
  thisInstance: "",
  leases: new Map(), // resource → {lease, row, cells}
  order: [], // sort keys of the lease rows, in table order
  events: [], // oldest first
  eventIDs: new Set(),
  intervals: new Map(), // resource → Map(fence → {start, end, holder, open})
  lastActivity: new Map(), // resource → ms of its last change
  tasks: null,
  samples: [], // {t, done, pending}: one per tasks message, for the charts
  generator: null,
  instances: [],
  filter: "",
};

function matches(resource) {
  return !state.filter || resource.toLowerCase().includes(state.filter);
}

// System leases (replicas, generator, reaper) sort after the user's own.
function sortKey(resource) {
  return (resource.startsWith("instance:") || resource.startsWith("leasehold:") ? "1" : "0") + resource;
}

// ---- Leases ----------------------------------------------------------------
const leaseBody = $("leases");
const reducedMotion = matchMedia("(prefers-reduced-motion: reduce)");
const visibleRows = new Set();
const rowObserver = new IntersectionObserver((entries) => {
  for (const e of entries) {
    if (e.isIntersecting) visibleRows.add(e.target);
    else visibleRows.delete(e.target);
  }
}, { root: $("lease-scroll") });

function makeRow(resource) {
  const fill = el("div", { class: "fill" });
  const secs = el("span", { class: "secs" });
  const cells = {
    resource: el("td", { class: "ellipsis", title: resource, text: resource }),
    swatch: el("span", { class: "swatch", "aria-hidden": "true" }),
    holder: el("span"),
    fence: el("td", { class: "num" }),
    state: el("span", { class: "state" }),
    fill, secs,
  };
  const row = el("tr", { "data-resource": resource },
    cells.resource,
    el("td", { class: "ellipsis" }, cells.swatch, cells.holder),
    cells.fence,
    el("td", {}, cells.state),
    el("td", {}, el("div", { class: "left" }, el("div", { class: "track" }, fill), secs)));
  row.hidden = !matches(resource);
  rowObserver.observe(row);
  return { row, cells };
}

function fillRow(entry, lease, flash) {
  const { row, cells } = entry;
  entry.lease = lease;
  entry.expires = ms(lease.expires_at);
  entry.ttl = (lease.ttl_seconds || 1) * 1000;
  cells.holder.textContent = lease.holder;
  cells.swatch.style.background = colorOf(lease.holder);
  cells.fence.textContent = lease.fence;
  cells.state.textContent = lease.state;
  row.className = "state-" + lease.state;
  entry.shownSecs = "";
  drawCountdown(entry, now());
  if (flash && !reducedMotion.matches) {
    row.animate([{ backgroundColor: css("--flash") }, { backgroundColor: "transparent" }], { duration: 1200, easing: "ease-out" });
  }
}

// upsertLease puts the lease in its row, making the row when it is new.
function upsertLease(lease, flash) {
  let entry = state.leases.get(lease.resource);
  if (entry) {
    // Batched fetches can race a later change: never go back in time.
    if (lease.fence < entry.lease.fence) return;
    fillRow(entry, lease, flash);
    return;
  }
  entry = makeRow(lease.resource);
  state.leases.set(lease.resource, entry);
  const key = sortKey(lease.resource);
  let lo = 0, hi = state.order.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (state.order[mid] < key) lo = mid + 1; else hi = mid;
  }
  const next = state.order[lo];
  state.order.splice(lo, 0, key);
  leaseBody.insertBefore(entry.row, next ? state.leases.get(next.slice(1)).row : null);
  fillRow(entry, lease, flash);
}

function replaceLeases(leases) {
  for (const { row } of state.leases.values()) rowObserver.unobserve(row);
  visibleRows.clear();
  state.leases.clear();
  const seen = new Set();
  const entries = leases
    .filter((l) => !seen.has(l.resource) && seen.add(l.resource))
    .map((l) => ({ key: sortKey(l.resource), lease: l }))
    .sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  state.order = entries.map((e) => e.key);
  const frag = document.createDocumentFragment();
  for (const { lease } of entries) {
    const entry = makeRow(lease.resource);
    state.leases.set(lease.resource, entry);
    fillRow(entry, lease, false);
    frag.append(entry.row);
  }
  leaseBody.replaceChildren(frag);
}

function drawCountdown(entry, t) {
  const active = entry.lease.state === "active";
  const left = active ? Math.max(0, entry.expires - t) : 0;
  const frac = Math.min(1, left / entry.ttl);
  entry.cells.fill.style.transform = `scaleX(${frac})`;
  entry.cells.fill.classList.toggle("low", frac < 0.25);
  // The database decides when a lease has expired: at zero the bar is empty
  // but the state stays until the server says "expired".
  const text = active ? timeLeft(left) : "–";
  if (text !== entry.shownSecs) {
    entry.cells.secs.textContent = text;
    entry.shownSecs = text;
  }
}

function leaseSummary() {
  let active = 0, expired = 0, released = 0;
  for (const { lease } of state.leases.values()) {
    if (lease.state === "active") active++;
    else if (lease.state === "expired") expired++;
    else released++;
  }
  $("lease-summary").textContent = `${numFmt.format(active)} active · ${numFmt.format(expired)} expired · ${numFmt.format(released)} released`;
  $("leases-empty").hidden = state.leases.size > 0;
}

// ---- Timeline --------------------------------------------------------------
// Holding intervals per resource, keyed by fence (one per acquisition), so
// that the snapshot's leases, its event history and later messages can be
// applied in any order and more than once.
function interval(resource, fence, holder, start) {
  let byFence = state.intervals.get(resource);
  if (!byFence) state.intervals.set(resource, (byFence = new Map()));
  let iv = byFence.get(fence);
  if (!iv) byFence.set(fence, (iv = { start, end: start, holder, open: true }));
  return iv;
}

function applyEventToTimeline(ev) {
  const at = ms(ev.at), expires = ms(ev.expires_at);
  const iv = interval(ev.resource, ev.fence, ev.holder, ev.kind === "acquired" ? at : Math.min(at, expires));
  if (ev.kind === "acquired") iv.start = Math.min(iv.start, at);
  if (ev.kind === "released") { iv.end = at; iv.open = false; }
  else if (ev.kind === "expired") { iv.end = Math.min(expires, Math.max(iv.end, expires)); iv.open = false; }
  else if (iv.open) iv.end = Math.max(iv.end, expires);
  state.lastActivity.set(ev.resource, Math.max(state.lastActivity.get(ev.resource) || 0, at));
}

function applyLeaseToTimeline(lease) {
  const start = ms(lease.created_at);
  const iv = interval(lease.resource, lease.fence, lease.holder, start);
  iv.start = Math.min(iv.start, start);
  if (lease.state === "active") { iv.end = Math.max(iv.end, ms(lease.expires_at)); iv.open = true; }
  else { iv.end = ms(lease.released_at) || ms(lease.expires_at); iv.open = false; }
  const changed = Math.max(start, ms(lease.renewed_at) || 0, ms(lease.released_at) || 0);
  state.lastActivity.set(lease.resource, Math.max(state.lastActivity.get(lease.resource) || 0, changed));
}

function drawTimeline() {
  const to = now(), from = to - windowMs;
  const candidates = [];
  for (const [resource, byFence] of state.intervals) {
    if (!matches(resource)) continue;
    const intervals = [];
    for (const [fence, iv] of byFence) {
      // An open interval ends now at the latest: the bar grows with time.
      const end = iv.open ? Math.min(iv.end, to) : iv.end;
      if (end < from && !iv.open) {
        if (end < from - windowMs) byFence.delete(fence); // long gone
        continue;
      }
      intervals.push({ ...iv, end });
    }
    if (intervals.length) candidates.push({ resource, intervals, last: state.lastActivity.get(resource) || 0 });
  }
  // The most recently active resources, shown in name order so that rows
  // do not jump about while they stay on screen.
  candidates.sort((a, b) => b.last - a.last);
  const rows = candidates.slice(0, timelineRows).sort((a, b) => (sortKey(a.resource) < sortKey(b.resource) ? -1 : 1));
  timeline($("timeline"), rows, { from, to, colorOf });
  $("timeline-note").textContent = candidates.length > rows.length
    ? `the ${rows.length} most recently active of ${candidates.length} resources; filter to narrow`
    : "";
}

// ---- Event feed ------------------------------------------------------------
const feed = $("events");
const showRenewals = $("show-renewals");

function feedItem(ev) {
  const li = el("li", { class: ev.kind },
    el("time", { datetime: ev.at, text: timeFmt.format(new Date(ms(ev.at))) }),
    el("span", { class: "kind", text: ev.kind }),
    el("span", { class: "what", title: `${ev.resource} · ${ev.holder} · fence ${ev.fence}` },
      ev.resource + " ", el("span", { class: "who", text: `${ev.holder} · ${ev.fence}` })));
  return li;
}

function feedShows(ev) {
  return matches(ev.resource) && (showRenewals.checked || ev.kind !== "renewed");
}

function renderFeed() {
  const items = [];
  for (let i = state.events.length - 1; i >= 0 && items.length < shownEvents; i--) {
    if (feedShows(state.events[i])) items.push(feedItem(state.events[i]));
  }
  feed.replaceChildren(...items);
}

function addEvent(ev) {
  if (state.eventIDs.has(ev.id)) return;
  state.eventIDs.add(ev.id);
  state.events.push(ev);
  if (state.events.length > maxEvents) {
    for (const old of state.events.splice(0, state.events.length - maxEvents)) state.eventIDs.delete(old.id);
  }
  applyEventToTimeline(ev);
  if (!feedShows(ev)) return;
  feed.prepend(feedItem(ev));
  while (feed.childElementCount > shownEvents) feed.lastElementChild.remove();
}

// ---- Tasks -----------------------------------------------------------------
function setTasks(t) {
  state.tasks = t;
  for (const k of ["pending", "running", "done", "dead", "cancelled"]) $("tasks-" + k).textContent = numFmt.format(t[k] ?? 0);
  $("tasks-rate").textContent = numFmt.format(t.done_last_minute ?? 0);
  state.samples.push({ t: now(), done: t.done ?? 0, pending: t.pending ?? 0 });
  const cutoff = now() - windowMs - 60000;
  while (state.samples.length > 2 && state.samples[1].t < cutoff) state.samples.shift();
  renderRunning();
  renderDead();
  renderPending();
  flow.set(t);
}

// The kind and queue of a task, as two cells.
function kindCells(task) {
  return [
    el("td", { class: "ellipsis tag task-kind", title: task.kind ?? "", text: task.kind ?? "–" }),
    el("td", { class: "ellipsis tag task-queue", title: task.queue ?? "", text: task.queue ?? "–" }),
  ];
}

// idCell is a task's id, linking to its detail in the tasks view.
function idCell(task) {
  return el("td", { class: "num" }, el("a", { class: "plain", href: routeHash({ id: String(task.id) }), title: `Task ${task.id} and its attempts` }, String(task.id)));
}

function renderRunning() {
  const running = state.tasks?.running_tasks ?? [];
  const t = now();
  $("running").replaceChildren(...running.map((task) => el("tr", {},
    idCell(task),
    ...kindCells(task),
    el("td", { class: "ellipsis", title: task.processor ?? "", text: task.processor ?? "–" }),
    el("td", { class: "num", text: `${task.attempts}/${task.max_attempts}` }),
    el("td", { class: "num", "data-since": task.last_heartbeat_at ?? task.started_at ?? "", text: age(t - ms(task.last_heartbeat_at ?? task.started_at)) }))));
  $("running-empty").hidden = running.length > 0;
}

function renderDead() {
  const dead = state.tasks?.dead_tasks ?? [];
  $("dead").replaceChildren(...dead.map((task) => el("tr", {},
    idCell(task),
    ...kindCells(task),
    el("td", { class: "num", text: task.attempts }),
    el("td", { class: "wrap", text: task.last_error ?? "–" }))));
  $("dead-empty").hidden = dead.length > 0;
}

// ---- Pending by kind -------------------------------------------------------
// The replicas' own workers run only the kind "sleep"; every other kind
// waits for a program that brings its handler. A due task left waiting
// longer than longWaitMs is highlighted: no live worker takes its kind, or
// all of them are busy.
const longWaitMs = 60 * 1000;
// The server counts each (queue, kind) up to this many (internal/hub).
const maxPendingCount = 100000;

function renderPending() {
  const rows = state.tasks?.pending_by_kind ?? [];
  const t = now();
  $("pending-kinds").replaceChildren(...rows.map((p) => {
    const wait = el("td", { class: "num wait" });
    // No message comes while nothing changes, yet the wait goes on
    // growing: keep when it began (database clock) and count from there.
    if (p.oldest_wait_seconds > 0) wait.dataset.since = String(t - p.oldest_wait_seconds * 1000);
    // Each row leads to its pending tasks in the tasks view.
    const href = routeHash({ state: "pending", kind: p.kind, queue: p.queue });
    return el("tr", { class: "link", "data-queue": p.queue, "data-kind": p.kind, "data-href": href },
      el("td", { class: "ellipsis tag" }, el("a", { class: "plain", href, title: `The pending ${p.kind} tasks of ${p.queue}` }, p.queue)),
      el("td", { class: "ellipsis tag" }, el("a", { class: "plain", href, title: `The pending ${p.kind} tasks of ${p.queue}`, tabindex: "-1" }, p.kind)),
      el("td", { class: "num", text: p.count >= maxPendingCount ? numFmt.format(maxPendingCount) + "+" : numFmt.format(p.count) }),
      wait);
  }));
  $("pending-kinds-empty").hidden = rows.length > 0;
  drawPendingWaits(t);
}

function drawPendingWaits(t) {
  let long = 0;
  for (const tr of $("pending-kinds").rows) {
    const td = tr.querySelector("td.wait");
    const since = Number(td.dataset.since || 0);
    const waited = since ? t - since : 0;
    td.textContent = since ? age(waited) : "not due";
    const isLong = waited > longWaitMs;
    tr.classList.toggle("long", isLong);
    tr.title = isLong ? `${tr.dataset.kind} in ${tr.dataset.queue} has waited over a minute: is a worker for this kind running?` : "";
    if (isLong) long++;
  }
  const note = $("pending-note");
  note.textContent = long ? `${long} waiting over a minute` : "";
  note.classList.toggle("long", long > 0);
}

// bucketed turns the samples into points every step ms over the window:
// the done counter and the queue depth as they stood at each point.
function bucketed(from, to, step) {
  const points = [];
  let i = 0, last = null;
  for (let t = from; t <= to + 1; t += step) {
    while (i < state.samples.length && state.samples[i].t <= t) last = state.samples[i++];
    points.push({ t, done: last ? last.done : null, pending: last ? last.pending : null });
  }
  return points;
}

function drawTaskCharts() {
  const step = 2000;
  const to = now(), from = to - windowMs;
  const points = bucketed(from - step, to, step);
  const rate = [];
  for (let i = 1; i < points.length; i++) {
    const a = points[i - 1].done, b = points[i].done;
    rate.push({ t: points[i].t, v: a === null || b === null ? null : Math.max(0, b - a) / (step / 1000) });
  }
  series($("throughput"), rate, { from, to, color: css("--chart"), fill: css("--chart-fill"), unit: "/s", minMax: 1 });
  series($("depth"), points.slice(1).map((p) => ({ t: p.t, v: p.pending })), { from, to, color: css("--chart2"), fill: css("--chart2-fill"), minMax: 10 });
}

// ---- Generator and replicas ------------------------------------------------
function setGenerator(g) {
  state.generator = { status: g.status, holder: g.holder ?? null, fence: g.fence ?? null };
  const s = $("generator-status");
  s.textContent = g.status;
  s.className = "status " + String(g.status).toLowerCase();
  $("generator-holder").textContent = g.holder ?? "none";
  $("generator-fence").textContent = g.fence ?? "–";
  if (!generatorBusy) {
    $("generator-start").disabled = g.status === "STARTED";
    $("generator-stop").disabled = g.status === "STOPPED";
  }
  renderInstances();
}

let generatorBusy = false;
async function setGeneratorRunning(start) {
  generatorBusy = true;
  $("generator-start").disabled = $("generator-stop").disabled = true;
  $("generator-error").textContent = "";
  try {
    const res = await api("POST", `/api/generator/${start ? "start" : "stop"}`);
    if (!res.ok) throw new Error(await errorText(res));
    // The stream will say so too; asking makes the page right at once even
    // when the stream is between connections.
    const now = await api("GET", "/api/generator");
    if (now.ok) setGenerator(await now.json());
  } catch (e) {
    $("generator-error").textContent = `Could not ${start ? "start" : "stop"} the generator: ${e.message}`;
  } finally {
    generatorBusy = false;
    if (state.generator) setGenerator(state.generator);
    else $("generator-start").disabled = $("generator-stop").disabled = false;
  }
}

function renderInstances() {
  const t = now();
  const holders = {
    generator: state.generator?.status === "STARTED" ? state.generator?.holder : null,
    reaper: activeHolder("leasehold:reaper"),
    scheduler: activeHolder("leasehold:scheduler"),
  };
  const rows = [...state.instances].sort((a, b) => (a.id < b.id ? -1 : 1)).map((inst) => {
    const seen = t - ms(inst.last_seen_at);
    const id = el("td", { class: "ellipsis", title: inst.addr ? `${inst.id} at ${inst.addr}` : inst.id, text: inst.id });
    if (inst.id === state.thisInstance) id.append(el("span", { class: "me", text: "this page" }));
    const roles = el("td", {}, ...(inst.roles ?? []).map((r) => el("span", {
      class: "role" + (holders[r] === inst.id ? " holds" : ""),
      title: holders[r] === inst.id ? `holds the ${r} lease` : "",
      text: r,
    })));
    return el("tr", {}, id, roles, el("td", { class: "num" + (seen > 15000 ? " stale" : ""), "data-seen": inst.last_seen_at, text: age(seen) + " ago" }));
  });
  $("instances").replaceChildren(...rows);
}

function activeHolder(resource) {
  const e = state.leases.get(resource);
  return e && e.lease.state === "active" ? e.lease.holder : null;
}

// ---- Messages --------------------------------------------------------------
function onMessage(msg) {
  switch (msg.type) {
    case "snapshot": applySnapshot(msg); readSession(); tasksView.hint(); return schedulesView.hint();
    case "lease": return applyLease(msg);
    case "tasks": setTasks(msg); tasksView.hint(); return schedulesView.tasksChanged(msg);
    case "schedule": return schedulesView.hint();
    case "generator": return setGenerator(msg);
    case "instances": state.instances = msg.instances ?? []; return renderInstances();
    case "instance": return upsertInstance(msg.instance);
    default: return; // "task" and anything newer: the next "tasks" says it all
  }
}

function applySnapshot(s) {
  if (s.db_now) {
    clock.db = ms(s.db_now);
    clock.perf = performance.now();
  }
  state.thisInstance = s.this_instance ?? "";
  $("via").textContent = state.thisInstance ? `via ${state.thisInstance}` : "";
  // Replace, never merge: whatever happened while the page was away is in
  // the snapshot, and whatever the page believed before may be stale.
  state.events = [];
  state.eventIDs.clear();
  state.intervals.clear();
  state.lastActivity.clear();
  const leases = s.leases ?? [];
  replaceLeases(leases);
  for (const l of leases) applyLeaseToTimeline(l);
  for (const ev of s.events ?? []) addEvent(ev);
  renderFeed();
  leaseSummary();
  // The task charts keep their history: it is what this page measured over
  // time, and the counters come from the same database after a reconnect.
  setTasks(s.tasks ?? {});
  if (s.generator) setGenerator(s.generator);
  state.instances = s.instances ?? [];
  renderInstances();
  drawTimeline();
  drawTaskCharts();
}

function applyLease(msg) {
  const lease = msg.lease;
  if (!lease) return;
  upsertLease(lease, msg.kind !== "renewed");
  applyLeaseToTimeline(lease);
  const ev = msg.event ?? { id: `local-${lease.id}-${lease.fence}-${msg.kind}-${lease.expires_at}`, at: new Date(now()).toISOString(), lease_id: lease.id, resource: lease.resource, holder: lease.holder, fence: lease.fence, kind: msg.kind, expires_at: lease.expires_at };
  addEvent(ev);
  leaseSummary();
  if (lease.resource === "leasehold:reaper" || lease.resource === "leasehold:scheduler") renderInstances();
}

function upsertInstance(inst) {
  if (!inst) return;
  state.instances = state.instances.filter((i) => i.id !== inst.id).concat([inst]);
  renderInstances();
}

// ---- API and sign-in -------------------------------------------------------
// showScopes marks the page with what the signed-in token may do
// (body[data-may]): the style sheet hides the controls it may not use, so
// that a read-only token shows a read-only dashboard. An open cluster (no
// tokens) may do everything.
function showScopes(session) {
  const scopes = session?.scopes ?? [];
  const may = new Set(scopes.includes("admin") ? ["read", "lease", "produce", "work", "admin"] : scopes);
  document.body.dataset.may = [...may].join(" ");
  $("who").textContent = session?.open ? "" : session?.name ? `signed in as ${session.name}` : "";
  $("signout").hidden = !!session?.open || !session?.name;
  flow.setSession(session);
}

async function readSession() {
  try {
    const res = await fetch("/api/session", { credentials: "same-origin", cache: "no-store" });
    if (res.ok) showScopes(await res.json());
  } catch { /* the replica is down: the stream retries, and so does this on sign-in */ }
}

$("signout").addEventListener("click", async () => {
  await fetch("/api/session", { method: "DELETE", credentials: "same-origin" });
  showScopes(null);
  $("signin").hidden = false;
  $("token").focus();
});

function api(method, path, body) {
  return fetch(path, {
    method,
    credentials: "same-origin",
    headers: body ? { "Content-Type": "application/json" } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
}

async function errorText(res) {
  try {
    return (await res.json()).error ?? res.statusText;
  } catch {
    return `${res.status} ${res.statusText}`;
  }
}

$("signin").addEventListener("submit", async (e) => {
  e.preventDefault();
  $("signin-error").textContent = "";
  const res = await fetch("/api/session", {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token: $("token").value }),
  });
  if (!res.ok) {
    $("signin-error").textContent = res.status === 401 ? "That token is not one of the cluster's API tokens." : await errorText(res);
    return;
  }
  showScopes(await res.json());
  $("token").value = "";
  $("signin").hidden = true;
  stream.resume();
  tasksView.reload();
  schedulesView.reload();
});

// ---- Connection ------------------------------------------------------------
const connection = $("connection");
let retryAt = 0;
function onState(s, delay) {
  const shown = s === "connected" ? "connected" : s === "connecting" ? "connecting" : "disconnected";
  connection.textContent = shown;
  connection.className = "conn " + shown;
  document.body.classList.toggle("offline", s !== "connected");
  retryAt = delay ? performance.now() + delay : 0;
  if (s !== "connected") $("via").textContent = retryAt ? "" : state.thisInstance ? `was via ${state.thisInstance}` : "";
}

const wsURL = new URL("/ws", location.href);
wsURL.protocol = location.protocol === "https:" ? "wss:" : "ws:";
const stream = new Stream(wsURL.href, {
  onMessage,
  onState,
  // A websocket that never opened does not say why. A plain GET of /ws
  // with the same cookie does: 401 when the cluster wants a token we do not
  // have (anything else, or no answer at all, means try again later).
  refused: async () => {
    try {
      const res = await fetch("/ws", { credentials: "same-origin", cache: "no-store" });
      if (res.status === 401) {
        $("signin").hidden = false;
        $("token").focus();
        return true;
      }
    } catch { /* the replica is down: keep trying */ }
    return false;
  },
});

// ---- Views -----------------------------------------------------------------
// The overview at #, the tasks view at #tasks (its filters and task in the
// hash too, so that both can be linked to and Back works), the schedules
// view at #schedules.
const signIn = () => { $("signin").hidden = false; };
const tasksView = createTasksView({ $, el, api, errorText, now, age, signIn });
const schedulesView = createSchedulesView({ $, el, api, errorText, now, age, signIn });
const flow = createFlowPanels({ $, el, api, errorText, now, age, signIn });

function route() {
  const tasks = parseRoute(location.hash);
  const schedules = parseScheduleRoute(location.hash);
  const view = tasks ? "tasks" : schedules ? "schedules" : "overview";
  $("overview").hidden = view !== "overview";
  $("tasks-view").hidden = view !== "tasks";
  $("schedules-view").hidden = view !== "schedules";
  $("lease-filter").hidden = view !== "overview";
  for (const [id, on] of [["nav-overview", view === "overview"], ["nav-tasks", view === "tasks"], ["nav-schedules", view === "schedules"]]) {
    if (on) $(id).setAttribute("aria-current", "page");
    else $(id).removeAttribute("aria-current");
  }
  if (tasks) tasksView.open(tasks);
  else tasksView.close();
  if (schedules) schedulesView.open(schedules);
  else schedulesView.close();
  if (view === "overview") tick(); // the charts were not drawn while hidden
}
window.addEventListener("hashchange", route);
$("pending-kinds").addEventListener("click", (e) => {
  const tr = e.target.closest("tr[data-href]");
  if (tr && !e.target.closest("a")) location.hash = tr.dataset.href;
});

// ---- Controls --------------------------------------------------------------
let filterTimer = 0;
$("filter").addEventListener("input", (e) => {
  clearTimeout(filterTimer);
  filterTimer = setTimeout(() => {
    state.filter = e.target.value.trim().toLowerCase();
    for (const [resource, { row }] of state.leases) row.hidden = !matches(resource);
    renderFeed();
    drawTimeline();
  }, 120);
});
showRenewals.addEventListener("change", renderFeed);
$("only-active").addEventListener("change", (e) => $("lease-table").classList.toggle("only-active", e.target.checked));
$("generator-start").addEventListener("click", () => setGeneratorRunning(true));
$("generator-stop").addEventListener("click", () => setGeneratorRunning(false));

// ---- Animation -------------------------------------------------------------
// Countdowns move every frame (only the rows on screen); ages, the timeline
// and the charts every half second.
function frame() {
  const t = now();
  for (const row of visibleRows) {
    const entry = state.leases.get(row.dataset.resource);
    if (entry && entry.lease.state === "active") drawCountdown(entry, t);
  }
  if (retryAt) {
    const left = Math.max(0, retryAt - performance.now());
    $("via").textContent = `retrying in ${(left / 1000).toFixed(1)} s`;
  }
  requestAnimationFrame(frame);
}

function tick() {
  const t = now();
  tasksView.tick(t);
  schedulesView.tick(t);
  if ($("overview").hidden) return;
  for (const td of $("running").querySelectorAll("td[data-since]")) td.textContent = age(t - ms(td.dataset.since));
  drawPendingWaits(t);
  flow.tick(t);
  for (const td of $("instances").querySelectorAll("td[data-seen]")) {
    const seen = t - ms(td.dataset.seen);
    td.textContent = age(seen) + " ago";
    td.classList.toggle("stale", seen > 15000);
  }
  drawTimeline();
  drawTaskCharts();
}

requestAnimationFrame(frame);
setInterval(tick, 500);
window.addEventListener("resize", tick);
leaseSummary();
route();
stream.start();

// The schedules view (#schedules): every schedule from GET /api/schedules
// with its definition, its next and last tick, the last task it made (a
// link to that task's detail in the tasks view) and that task's outcome,
// and the ticks it missed and skipped; and Remove, behind an inline
// confirmation (DELETE /api/schedules/{name}).
//
// The rows come from the REST API; the stream says when to read them
// again, as in the tasks view: a "schedule" message (a schedule added,
// replaced, removed or ticked, from NOTIFY, so on every replica whichever
// replica made the change), a snapshot (a new connection: whatever
// happened meanwhile), and a "tasks" message that may concern a
// schedule's task: one listing a running or dead task that a schedule
// made, or any that moved the counts while a schedule's last task has not
// ended yet. Reads are one in flight and one per minGap. A removal's own
// answer is not applied to the page: the row goes when the stream's hint
// brings the change, as a removal made by anyone else does.
//
// The view's place is in the URL: #schedules, or #schedules?name= to pick
// out one schedule (a scheduled task's detail links there).

import { routeHash as taskHash } from "./tasks.js";

const minGap = 500; // ms between two reads on hints
const pageSize = 1000; // schedules read at once, in name order
// A next tick this far in the past is not being made: no replica runs the
// scheduler (a failover takes up to the scheduler lease's TTL, 5 s).
const lateMs = 15 * 1000;

const ms = (s) => (s ? Date.parse(s) : NaN);
const clockFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
const dayFmt = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });

// parseRoute returns the view's parameters from a location hash, or null
// when the hash is not the schedules view's.
export function parseRoute(hash) {
  const m = /^#schedules(?:\?(.*))?$/.exec(hash);
  if (!m) return null;
  return { name: new URLSearchParams(m[1] ?? "").get("name") ?? "" };
}

// routeHash is the location hash of the view, picking out the schedule
// name when it is given.
export function routeHash({ name } = {}) {
  return "#schedules" + (name ? "?" + new URLSearchParams({ name }) : "");
}

// ended says whether a task in state will change no more by itself.
const ended = (state) => state === "done" || state === "dead" || state === "cancelled";

// createSchedulesView wires the view's elements. deps: $ and el (the
// page's DOM helpers), api(method, path, body) and errorText(res) (its REST
// calls), now() (the database clock, ms), age(ms) (a duration for people),
// and signIn() (shows the sign-in box when the API wants a token).
export function createSchedulesView({ $, el, api, errorText, now, age, signIn }) {
  let params = null; // the route while the view is open
  const rows = new Map(); // name → {tr, cells, s}
  // Removals under way, by name: {mode: confirm|busy|sent, answeredAt}.
  const acts = new Map();
  const errors = new Map(); // where → message
  let listSeq = 0;
  let scrolledTo = ""; // the picked schedule once it was scrolled into view
  // What the last tasks message said about the schedules' tasks.
  let scheduledSig = "", countsSig = "";

  // ---- Errors --------------------------------------------------------------
  function setError(key, msg) {
    if (msg) errors.set(key, msg);
    else errors.delete(key);
    $("schedules-error").textContent = [...errors.values()].join("\n");
  }

  // problem is the message of a refused request: the server's own words,
  // and for a 401 what to do about it.
  async function problem(res, what) {
    const msg = await errorText(res);
    if (res.status === 401) {
      signIn();
      return `Could not ${what}: ${msg} (${res.status}). Sign in above with the cluster's API token.`;
    }
    return `Could not ${what}: ${msg}`;
  }

  // ---- Reading -------------------------------------------------------------
  async function load() {
    const startedAt = performance.now();
    const seq = ++listSeq;
    let list, msg = "";
    try {
      const res = await api("GET", `/api/schedules?limit=${pageSize}`);
      if (res.ok) list = await res.json();
      else msg = await problem(res, "list the schedules");
    } catch (e) {
      msg = `Could not list the schedules: ${e.message}`;
    }
    if (seq !== listSeq || !params) return;
    setError("list", msg);
    if (list) render(list, startedAt);
  }

  // Hints from the stream: one read in flight, the next after minGap, and
  // none while the tab is hidden (it reads when it shows again).
  let dirty = false, inFlight = false, timer = 0, lastRead = -Infinity;
  function pump() {
    if (!params || !dirty || inFlight || timer || document.hidden) return;
    const wait = lastRead + minGap - performance.now();
    if (wait > 0) {
      timer = setTimeout(() => { timer = 0; pump(); }, wait);
      return;
    }
    dirty = false;
    inFlight = true;
    lastRead = performance.now();
    load().finally(() => { inFlight = false; pump(); });
  }
  document.addEventListener("visibilitychange", pump);

  function hint() {
    if (!params) return;
    dirty = true;
    pump();
  }

  // ---- The rows ------------------------------------------------------------
  function makeRow(name) {
    const cells = {
      name: el("span", { class: "line sched-name", title: name, text: name }),
      cron: el("span", { class: "line sub sched-cron" }),
      kind: el("span", { class: "line sched-kind" }),
      queue: el("span", { class: "line sub sched-queue" }),
      lock: el("td", { class: "sched-lock" }),
      next: el("span", { class: "line sched-next", "data-label": "next" }),
      nextAt: el("span", { class: "line sub" }),
      lastTick: el("span", { class: "line sched-last-tick", "data-label": "last" }),
      lastTickAt: el("span", { class: "line sub" }),
      lastTask: el("td", { class: "num sched-last-task" }),
      outcome: el("td", { class: "sched-outcome" }),
      missed: el("td", { class: "num sched-missed" }),
      skipped: el("td", { class: "num sched-skipped" }),
      actions: el("td", { class: "actions", "data-schedule": name }),
    };
    const tr = el("tr", { class: "schedule-row", "data-schedule": name },
      el("td", {}, cells.name, cells.cron), el("td", {}, cells.kind, cells.queue), cells.lock,
      el("td", {}, cells.next, cells.nextAt), el("td", {}, cells.lastTick, cells.lastTickAt),
      cells.lastTask, cells.outcome, cells.missed, cells.skipped, cells.actions);
    return { tr, cells, s: null };
  }

  // drawTime writes how far span's instant (data-at) is from t.
  function drawTime(span, t) {
    const at = ms(span.dataset.at);
    if (Number.isNaN(at)) { span.textContent = "–"; return; }
    const d = at - t;
    if (span.dataset.label === "last") {
      span.textContent = `${age(-d)} ago`;
      return;
    }
    const late = -d > lateMs;
    span.textContent = d >= 0 ? `in ${age(d)}` : late ? `due ${age(-d)} ago` : "due now";
    span.classList.toggle("late", late);
    span.title = late ? "This tick is overdue: is a replica with the scheduler role running?" : span.dataset.at;
  }

  function stamp(iso) {
    const at = ms(iso);
    if (Number.isNaN(at)) return "";
    // The day too when it is not within the next or the last day.
    return Math.abs(at - now()) < 86400e3 ? clockFmt.format(new Date(at)) : dayFmt.format(new Date(at));
  }

  function fillRow(row, s, flash) {
    const { cells } = row;
    row.s = s;
    const cron = `${s.cron} · ${s.zone}`;
    cells.cron.textContent = cells.cron.title = cron;
    if (s.unique) cells.cron.append(el("span", { class: "badge", title: "No task for a tick while the previous one is pending or running: the tick is skipped", text: "unique" }));
    cells.kind.textContent = cells.kind.title = s.kind;
    cells.queue.textContent = cells.queue.title = s.priority ? `${s.queue} · priority ${s.priority}` : s.queue;
    cells.lock.textContent = s.lock ?? "–";
    cells.lock.title = s.lock ? `Each task holds the lease of ${s.lock} while it runs` : "";
    cells.next.dataset.at = s.next_tick ?? "";
    cells.nextAt.textContent = stamp(s.next_tick);
    cells.nextAt.title = s.next_tick ?? "";
    cells.lastTick.dataset.at = s.last_tick ?? "";
    cells.lastTickAt.textContent = stamp(s.last_tick);
    cells.lastTickAt.title = s.last_tick ?? "";
    const t = now();
    drawTime(cells.next, t);
    drawTime(cells.lastTick, t);

    const task = s.last_task;
    const taskId = task ? String(task.id) : "";
    // The link is made anew only when the task changes: a link replaced
    // under the pointer between press and release loses the click.
    if (cells.lastTask.dataset.taskId !== taskId || !cells.lastTask.firstChild) {
      cells.lastTask.dataset.taskId = taskId;
      cells.lastTask.replaceChildren(task
        ? el("a", { class: "plain task-link", href: taskHash({ id: taskId }), title: `Task ${task.id} and its attempts`, text: taskId })
        : "–");
    }
    if (task) {
      const state = el("span", { class: "state task-state", "data-state": task.state, text: task.state });
      const when = task.processed_at ? [el("span", { class: "line sub", title: task.processed_at, text: `ended ${stamp(task.processed_at)}` })] : [];
      const error = task.last_error ? [el("span", { class: "line sub sched-error", title: task.last_error, text: task.last_error })] : [];
      cells.outcome.replaceChildren(state, ...when, ...error);
    } else {
      cells.outcome.replaceChildren(el("span", { class: "muted", text: s.last_tick ? "pruned" : "no tick yet" }));
    }
    cells.outcome.dataset.state = task?.state ?? "";
    cells.missed.textContent = String(s.missed_ticks);
    cells.missed.title = "Ticks that fell due while no scheduler ran: each such run of ticks was made one task, for the latest";
    cells.skipped.textContent = String(s.skipped_ticks);
    cells.skipped.title = "Ticks a unique schedule made no task for: its previous task was still pending or running";
    renderActions(cells.actions, s.name);
    if (flash && !matchMedia("(prefers-reduced-motion: reduce)").matches) {
      row.tr.animate([{ backgroundColor: getComputedStyle(document.documentElement).getPropertyValue("--flash") }, { backgroundColor: "transparent" }], { duration: 1200, easing: "ease-out" });
    }
  }

  function render(list, startedAt) {
    // A removal is over once a read that began after its answer came: the
    // row is gone, or a schedule of that name was added again since.
    for (const [name, act] of acts) {
      if (act.mode === "sent" && startedAt > act.answeredAt) acts.delete(name);
    }
    const next = new Map();
    for (const s of list) {
      const row = rows.get(s.name) ?? makeRow(s.name);
      const was = row.s?.last_task;
      const flash = row.s !== null && (was?.id !== s.last_task?.id || was?.state !== s.last_task?.state);
      fillRow(row, s, flash);
      row.tr.classList.toggle("selected", params.name === s.name);
      next.set(s.name, row);
    }
    for (const name of acts.keys()) if (!next.has(name)) acts.delete(name);
    rows.clear();
    for (const [name, row] of next) rows.set(name, row);
    // Rows that stay where they were are not touched, so that a
    // confirmation keeps its focus.
    const body = $("schedule-rows");
    let i = 0;
    for (const { tr } of next.values()) {
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] ?? null);
      i++;
    }
    while (body.children.length > i) body.lastElementChild.remove();
    $("schedule-rows-empty").hidden = list.length > 0;
    const n = list.length;
    $("schedule-list-note").textContent = n >= pageSize
      ? `the first ${n} schedules by name`
      : `${n} schedule${n === 1 ? "" : "s"}, by name`;
    if (params.name && scrolledTo !== params.name) {
      const row = rows.get(params.name);
      if (row) {
        scrolledTo = params.name;
        row.tr.scrollIntoView({ block: "nearest" });
      } else {
        setError("pick", `No schedule is named ${params.name}: it may have been removed.`);
      }
    }
    if (!params.name || rows.has(params.name)) setError("pick", "");
  }

  // ---- Remove --------------------------------------------------------------
  // renderActions draws the removal of schedule name in container,
  // redrawing only when what it shows changes.
  function renderActions(container, name) {
    const act = acts.get(name);
    const sig = act ? act.mode : "idle";
    if (container.dataset.sig === sig) return;
    container.dataset.sig = sig;
    if (!act) {
      container.replaceChildren(el("button", { type: "button", class: "act schedule-remove", "data-act": "remove", "aria-label": `Remove schedule ${name}`, text: "Remove" }));
      return;
    }
    if (act.mode !== "confirm") {
      container.replaceChildren(el("span", { class: "muted sent", role: "status", text: "removing…" }));
      return;
    }
    const yes = el("button", { type: "button", class: "act confirm-yes remove", "data-act": "yes", "aria-label": `Remove schedule ${name}: no more ticks`, text: "Remove it" });
    const no = el("button", { type: "button", class: "act confirm-no", "data-act": "no", text: "Keep it" });
    container.replaceChildren(el("div", { class: "confirm" },
      el("span", { class: "ask", text: "No more ticks? Its tasks stay." }), el("div", { class: "confirm-buttons" }, yes, no)));
    yes.focus();
  }

  function redraw(name) {
    const row = rows.get(name);
    if (row) renderActions(row.cells.actions, name);
  }

  // remove sends the confirmed removal. Its answer only says whether it
  // was taken; the row goes when the stream's hint brings the change.
  async function remove(name) {
    const act = acts.get(name);
    if (!act || act.mode !== "confirm") return;
    act.mode = "busy";
    setError(`act-${name}`, "");
    redraw(name);
    const what = `remove schedule ${name}`;
    let msg = "";
    try {
      const res = await api("DELETE", `/api/schedules/${encodeURIComponent(name)}`);
      // 404: removed already, by someone else; the stream says so too.
      if (!res.ok && res.status !== 404) msg = await problem(res, what);
    } catch (e) {
      msg = `Could not ${what}: ${e.message}`;
    }
    if (msg) {
      acts.delete(name);
      setError(`act-${name}`, msg);
    } else {
      act.mode = "sent";
      act.answeredAt = performance.now();
    }
    redraw(name);
  }

  const root = $("schedules-view");
  root.addEventListener("click", (e) => {
    const b = e.target.closest("button[data-act]");
    if (!b) return;
    const name = b.closest("[data-schedule]").dataset.schedule;
    if (b.dataset.act === "remove") {
      acts.set(name, { mode: "confirm" });
      setError(`act-${name}`, "");
    } else if (b.dataset.act === "no") {
      acts.delete(name);
    } else if (b.dataset.act === "yes") {
      remove(name);
      return;
    }
    redraw(name);
  });
  root.addEventListener("keydown", (e) => {
    const container = e.target.closest?.("td.actions[data-schedule]");
    if (e.key !== "Escape" || !container) return;
    const name = container.dataset.schedule;
    if (acts.get(name)?.mode === "confirm") {
      acts.delete(name);
      redraw(name);
    }
  });

  return {
    // open shows the view at route p (from parseRoute) and reads it.
    open(p) {
      if (params?.name !== p.name) scrolledTo = "";
      params = p;
      for (const [name, row] of rows) row.tr.classList.toggle("selected", p.name === name);
      dirty = false;
      load();
    },
    close() {
      params = null;
      clearTimeout(timer);
      timer = 0;
    },
    // hint says that schedules may have changed: read again, soon.
    hint,
    // tasksChanged hears of a tasks message, and reads again when it may
    // concern a schedule's task: it lists one (running or dead) or stops
    // listing one, or the counts moved while a last task had not ended
    // (it may have ended, or been cancelled, without showing in the lists).
    tasksChanged(msg) {
      const scheduled = [...(msg.running_tasks ?? []), ...(msg.dead_tasks ?? [])]
        .filter((t) => t.schedule).map((t) => `${t.id}:${t.state}`).sort().join(",");
      const counts = ["pending", "running", "done", "dead", "cancelled"].map((k) => msg[k]).join(",");
      const moved = scheduled !== scheduledSig, counted = counts !== countsSig;
      scheduledSig = scheduled;
      countsSig = counts;
      const waiting = [...rows.values()].some((r) => r.s?.last_task && !ended(r.s.last_task.state));
      if (moved || (counted && waiting)) hint();
    },
    // reload reads the view again now (after signing in).
    reload() {
      if (params) load();
    },
    // tick redraws the times that move.
    tick(t) {
      if (!params) return;
      for (const span of $("schedule-rows").querySelectorAll(".sched-next, .sched-last-tick")) drawTime(span, t);
    },
  };
}

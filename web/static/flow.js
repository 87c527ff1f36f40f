// Flow control on the overview: the queues, paused or not, with Pause
// (behind an inline confirmation that asks for an optional reason) and
// Resume (one click); and the keys with a limit: their slots held, the
// tasks waiting on them, and their rate.
//
// Both come with every "tasks" message and the snapshot's tasks
// (paused_queues and limits, read with the counts). The queues listed are
// the paused ones and those the same messages name: the queues of the
// pending kinds and of the running and dead tasks; the form under the
// table pauses any other.
//
// Pausing and resuming go through the REST API (PUT and DELETE
// /api/queues/{queue}/pause, admin scope). The server's answer is shown
// at once: a pause notifies nothing, so the stream says so only with its
// next reading, within a few seconds. Until the stream agrees, or for
// settleMs at most, the page shows what the answer said over what an
// older reading says.

import { routeHash } from "./tasks.js";

const settleMs = 10000; // twice the server's refresh of the tasks message
const maxWaiting = 10000; // the server counts the tasks waiting on a key up to this

const ms = (s) => (s ? Date.parse(s) : NaN);
const clockFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
const dayFmt = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hour12: false });
const numFmt = new Intl.NumberFormat();

// periodText is a rate's period for people: "minute", "5 min", "hour", "90 s".
function periodText(seconds) {
  if (seconds === 86400) return "day";
  if (seconds === 3600) return "hour";
  if (seconds === 60) return "minute";
  if (seconds % 86400 === 0) return `${seconds / 86400} days`;
  if (seconds % 3600 === 0) return `${seconds / 3600} h`;
  if (seconds % 60 === 0) return `${seconds / 60} min`;
  return `${seconds} s`;
}

// within says whether a token limited to the queue prefixes may act on
// queue (no prefixes: every queue), as the server decides.
function within(prefixes, queue) {
  return !prefixes.length || prefixes.some((p) => queue.startsWith(p));
}

// createFlowPanels wires the panels' elements. deps: $ and el (the page's
// DOM helpers), api(method, path, body) and errorText(res) (its REST
// calls), now() (the database clock, ms), age(ms) (a duration for people),
// and signIn() (shows the sign-in box when the API wants a token).
export function createFlowPanels({ $, el, api, errorText, now, age, signIn }) {
  let paused = []; // the stream's paused_queues
  let others = []; // the other queues the stream named, by name
  let limits = []; // the stream's limits
  // What this page's own actions did, by queue, shown over the stream's
  // older word: {pause (the answer's, or null once resumed), until (ms)}.
  const acted = new Map();
  // Actions under way, by queue: {kind: pause|resume, mode: confirm|busy}.
  const acts = new Map();
  let session = null; // what the signed-in token may do (GET /api/session)
  const rows = new Map(); // queue → {tr, cells}
  let nextEnd = Infinity; // when the next timed pause shown ends (ms)
  const errors = new Map(); // where → message

  function setError(key, msg) {
    if (msg) errors.set(key, msg);
    else errors.delete(key);
    $("flow-error").textContent = [...errors.values()].join("\n");
  }

  // problem is the message of a refused request: the server's own words
  // (a 403 says which scope or queue the token lacks), and for a 401 what
  // to do about it.
  async function problem(res, what) {
    const msg = await errorText(res);
    if (res.status === 401) {
      signIn();
      return `Could not ${what}: ${msg} (401). Sign in above with the cluster's API token.`;
    }
    return `Could not ${what}: ${msg} (${res.status})`;
  }

  // mayAct says whether the session's token may pause and resume queue:
  // the admin scope, and queue among its queues. An open cluster may.
  function mayAct(queue) {
    if (!session) return false;
    if (session.open) return true;
    return (session.scopes ?? []).includes("admin") && within(session.queues ?? [], queue);
  }

  // ---- The queues ----------------------------------------------------------
  // shownPauses is the pauses to show now: the stream's, corrected by this
  // page's own actions, without those whose until has passed.
  function shownPauses(t) {
    const byQueue = new Map(paused.map((p) => [p.queue, p]));
    for (const [queue, a] of acted) {
      const streamSays = byQueue.has(queue);
      if (streamSays === (a.pause !== null) || performance.now() > a.until) {
        acted.delete(queue);
        continue;
      }
      if (a.pause) byQueue.set(queue, a.pause);
      else byQueue.delete(queue);
    }
    return [...byQueue.values()].filter((p) => !p.until || ms(p.until) > t).sort((a, b) => (a.queue < b.queue ? -1 : 1));
  }

  function makeRow(queue) {
    const cells = {
      // The name leads to the queue's pending tasks in the tasks view.
      name: el("td", { class: "ellipsis tag queue-name" }, el("a", { class: "plain", href: routeHash({ state: "pending", queue }), title: `The pending tasks of ${queue}`, text: queue })),
      state: el("span", { class: "state queue-state" }),
      since: el("span", { class: "line queue-since" }),
      until: el("span", { class: "line sub queue-until" }),
      reason: el("td", { class: "ellipsis queue-reason" }),
      actions: el("td", { class: "actions", "data-queue": queue }),
    };
    const tr = el("tr", { "data-queue": queue }, cells.name, el("td", {}, cells.state), el("td", {}, cells.since, cells.until), cells.reason, cells.actions);
    return { tr, cells };
  }

  function drawSince(row, t) {
    const { since, until } = row.cells;
    const at = ms(since.dataset.at);
    since.textContent = Number.isNaN(at) ? "–" : `${age(t - at)} ago`;
    const end = ms(until.dataset.at);
    if (row.tr.dataset.state !== "paused") until.textContent = "";
    else if (Number.isNaN(end)) until.textContent = "until resumed";
    else until.textContent = `until ${Math.abs(end - t) < 86400e3 ? clockFmt.format(new Date(end)) : dayFmt.format(new Date(end))} (in ${age(end - t)})`;
  }

  function fillRow(row, queue, pause, t) {
    const { tr, cells } = row;
    tr.dataset.state = pause ? "paused" : "active";
    cells.state.textContent = cells.state.dataset.state = pause ? "paused" : "active";
    cells.since.dataset.at = pause?.paused_at ?? "";
    cells.since.title = pause ? `paused at ${pause.paused_at}` : "";
    cells.until.dataset.at = pause?.until ?? "";
    cells.until.title = pause?.until ?? "";
    drawSince(row, t);
    cells.reason.textContent = pause ? pause.reason || "–" : "";
    cells.reason.title = pause?.reason ?? "";
    renderActions(cells.actions, queue, !!pause);
  }

  // renderActions draws the queue's control, redrawing only when what it
  // shows changes, so that a message arriving mid-confirmation keeps the
  // reason being typed.
  function renderActions(container, queue, isPaused) {
    const act = acts.get(queue);
    const may = mayAct(queue);
    const sig = act ? `${act.mode}:${act.kind}` : `idle:${isPaused}:${may}`;
    if (container.dataset.sig === sig) return;
    container.dataset.sig = sig;
    if (!act) {
      const kind = isPaused ? "resume" : "pause";
      container.replaceChildren(...(may ? [el("button", {
        type: "button", class: `act queue-${kind}`, "data-act": kind,
        "aria-label": `${isPaused ? "Resume" : "Pause"} the queue ${queue}`, text: isPaused ? "Resume" : "Pause",
      })] : []));
      return;
    }
    if (act.mode === "busy") {
      container.replaceChildren(el("span", { class: "muted sent", role: "status", text: act.kind === "pause" ? "pausing…" : "resuming…" }));
      return;
    }
    const reason = el("input", { class: "reason", type: "text", placeholder: "reason (optional)", "aria-label": `Why pause the queue ${queue} (optional)`, maxlength: "1000" });
    container.replaceChildren(el("div", { class: "confirm" }, reason, el("div", { class: "confirm-buttons" },
      el("button", { type: "button", class: "act confirm-yes pause", "data-act": "yes", "aria-label": `Pause the queue ${queue}`, text: "Pause it" }),
      el("button", { type: "button", class: "act confirm-no", "data-act": "no", text: "Keep it running" }))));
    reason.focus();
  }

  function renderQueues() {
    const t = now();
    const pauses = shownPauses(t);
    const byQueue = new Map(pauses.map((p) => [p.queue, p]));
    // Paused first, then the others, each in name order; a queue acted on
    // stays listed after it is resumed.
    const names = [...pauses.map((p) => p.queue),
      ...[...new Set([...others, ...acts.keys(), ...acted.keys()])].filter((q) => !byQueue.has(q)).sort()];
    const next = new Map();
    for (const queue of names) {
      const row = rows.get(queue) ?? makeRow(queue);
      fillRow(row, queue, byQueue.get(queue) ?? null, t);
      next.set(queue, row);
    }
    rows.clear();
    for (const [q, row] of next) rows.set(q, row);
    // Rows that stay where they were are not touched: moving a row would
    // blur a reason being typed in it.
    const body = $("queues");
    let i = 0;
    for (const { tr } of next.values()) {
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] ?? null);
      i++;
    }
    while (body.children.length > i) body.lastElementChild.remove();
    $("queues-empty").hidden = names.length > 0;
    $("queues-note").textContent = pauses.length ? `${pauses.length} paused` : "none paused";
    $("queues-note").classList.toggle("paused", pauses.length > 0);
    nextEnd = Math.min(Infinity, ...pauses.map((p) => ms(p.until)).filter((x) => !Number.isNaN(x)));
  }

  // send pauses or resumes queue (reason: the pause's, "" for none) and
  // shows the server's answer at once.
  async function send(kind, queue, reason) {
    acts.set(queue, { kind, mode: "busy" });
    setError(`act-${queue}`, "");
    renderQueues();
    const what = `${kind} the queue ${queue}`;
    const path = `/api/queues/${encodeURIComponent(queue)}/pause`;
    let msg = "";
    try {
      const res = kind === "pause" ? await api("PUT", path, reason ? { reason } : {}) : await api("DELETE", path);
      if (res.ok) acted.set(queue, { pause: kind === "pause" ? await res.json() : null, until: performance.now() + settleMs });
      else if (kind === "resume" && res.status === 404) acted.set(queue, { pause: null, until: performance.now() + settleMs }); // it was over already
      else msg = await problem(res, what);
    } catch (e) {
      msg = `Could not ${what}: ${e.message}`;
    }
    acts.delete(queue);
    setError(`act-${queue}`, msg);
    renderQueues();
  }

  const card = $("queues-card");
  card.addEventListener("click", (e) => {
    const b = e.target.closest("button[data-act]");
    if (!b) return;
    const queue = b.closest("[data-queue]").dataset.queue;
    switch (b.dataset.act) {
      case "pause": acts.set(queue, { kind: "pause", mode: "confirm" }); setError(`act-${queue}`, ""); return renderQueues();
      case "resume": return send("resume", queue, "");
      case "no": acts.delete(queue); return renderQueues();
      case "yes": return send("pause", queue, b.closest("[data-queue]").querySelector("input.reason")?.value.trim() ?? "");
    }
  });
  card.addEventListener("keydown", (e) => {
    const input = e.target.closest?.("td.actions input.reason");
    if (!input) return;
    const queue = input.closest("[data-queue]").dataset.queue;
    if (e.key === "Enter") send("pause", queue, input.value.trim());
    if (e.key === "Escape") { acts.delete(queue); renderQueues(); }
  });
  $("pause-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const queue = $("pause-queue").value.trim();
    if (!queue) {
      setError("form", "Enter the name of the queue to pause.");
      return;
    }
    setError("form", "");
    $("pause-queue").value = "";
    const reason = $("pause-reason").value.trim();
    $("pause-reason").value = "";
    send("pause", queue, reason);
  });

  // ---- The limited keys ----------------------------------------------------
  function drawNext(td, t) {
    if (!td.dataset.rate) { td.textContent = "–"; return; }
    const at = ms(td.dataset.at);
    td.textContent = Number.isNaN(at) || at <= t ? "now" : `in ${age(at - t)}`;
  }

  function renderLimits() {
    const t = now();
    $("limits").replaceChildren(...limits.map((l) => {
      const full = l.held >= l.slots;
      const rated = l.rate_starts > 0;
      const next = el("td", { class: "num limit-next", "data-at": l.rate_next_at ?? "", title: l.rate_next_at ? `the next start is allowed at ${l.rate_next_at}` : "" });
      if (rated) next.dataset.rate = "1";
      drawNext(next, t);
      return el("tr", { "data-key": l.resource, class: full ? "full" : "" },
        el("td", { class: "ellipsis limit-key", title: l.resource, text: l.resource }),
        el("td", { class: "num limit-held", title: full ? "every slot is held: its tasks wait" : "", text: `${numFmt.format(l.held)} / ${numFmt.format(l.slots)}` }),
        el("td", { class: "num limit-waiting", text: l.waiting >= maxWaiting ? numFmt.format(maxWaiting) + "+" : numFmt.format(l.waiting) }),
        el("td", { class: "num limit-rate", title: rated ? `at most ${l.rate_starts} starts in any ${l.rate_period_seconds} s; ${l.rate_spent} in the last` : "",
          text: rated ? `${numFmt.format(l.rate_spent)} / ${numFmt.format(l.rate_starts)} per ${periodText(l.rate_period_seconds)}` : "–" }),
        next);
    }));
    $("limits-empty").hidden = limits.length > 0;
    $("limits-note").textContent = limits.length >= 100 ? "the first 100 keys by name" : "";
  }

  return {
    // set shows a tasks message's (or a snapshot's tasks') flow control.
    set(tasks) {
      paused = tasks.paused_queues ?? [];
      limits = tasks.limits ?? [];
      const named = new Set();
      for (const p of tasks.pending_by_kind ?? []) named.add(p.queue);
      for (const tk of [...(tasks.running_tasks ?? []), ...(tasks.dead_tasks ?? [])]) if (tk.queue) named.add(tk.queue);
      others = [...named];
      renderQueues();
      renderLimits();
    },
    // setSession says what the signed-in token may do (null: nothing yet).
    setSession(s) {
      session = s;
      renderQueues();
    },
    // tick redraws the times that move, and the queues once a timed pause ends.
    tick(t) {
      if (t >= nextEnd) renderQueues();
      for (const row of rows.values()) drawSince(row, t);
      for (const td of $("limits").querySelectorAll("td.limit-next")) drawNext(td, t);
    },
  };
}

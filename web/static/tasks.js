// The tasks view (#tasks): a page of tasks from GET /api/tasks with its
// filters, one task's detail from GET /api/tasks/{id} with its attempts,
// and the Cancel and Retry actions, each behind an inline confirmation.
//
// The rows and the detail come from the REST API; the stream says when to
// read them again. The hub sends a "tasks" message after every change to
// the tasks table (from NOTIFY, so on every replica whichever replica made
// the change) and a snapshot on every connection: each is a hint, and the
// view reads its page and its detail again, with at most one read in
// flight and one per minGap, so that a burst of changes costs a read or
// two, not one per change. An action's own answer is not applied to the
// page: its result shows when the stream's hint brings it, as a change
// made by anyone else does.
//
// The view's place is in the URL: #tasks?state=&kind=&queue=&after=&id=,
// so that a filtered list or a task can be linked to, and Back works.

const pageSize = 50;
const minGap = 500; // ms between two reads on hints

const ms = (s) => (s ? Date.parse(s) : NaN);
const timeMs = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", fractionalSecondDigits: 3, hour12: false });
const stampFmt = new Intl.DateTimeFormat(undefined, { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", fractionalSecondDigits: 3, hour12: false });

// actionOf is what can be done to a task in state: cancel a pending or
// running one, retry a dead or cancelled one.
function actionOf(state) {
  if (state === "pending" || state === "running") return "cancel";
  if (state === "dead" || state === "cancelled") return "retry";
  return "";
}

// parseRoute returns the view's parameters from a location hash, or null
// when the hash is not the tasks view's.
export function parseRoute(hash) {
  const m = /^#tasks(?:\?(.*))?$/.exec(hash);
  if (!m) return null;
  const q = new URLSearchParams(m[1] ?? "");
  const num = (name) => (/^[1-9][0-9]{0,17}$/.test(q.get(name) ?? "") ? q.get(name) : "");
  return { state: q.get("state") ?? "", kind: q.get("kind") ?? "", queue: q.get("queue") ?? "", after: num("after"), id: num("id") };
}

// routeHash is the location hash of the view with params p.
export function routeHash(p) {
  const q = new URLSearchParams();
  for (const k of ["state", "kind", "queue", "after", "id"]) if (p[k]) q.set(k, p[k]);
  const s = q.toString();
  return "#tasks" + (s ? "?" + s : "");
}

// createTasksView wires the view's elements. deps: $ and el (the page's DOM
// helpers), api(method, path, body) and errorText(res) (its REST calls),
// now() (the database clock, ms), age(ms) (a duration for people), and
// signIn() (shows the sign-in box when the API wants a token).
export function createTasksView({ $, el, api, errorText, now, age, signIn }) {
  let params = null; // the route while the view is open
  let listKey = ""; // the query of the rows shown
  const rows = new Map(); // task id → {tr, cells, task}
  // Rows that left the page's query after an action of ours: kept, marked,
  // and read one by one, so that the action's result stays in sight.
  const kept = new Set();
  // Actions under way, by task id: {kind, mode: confirm|busy|sent, where,
  // sentState, answeredAt}.
  const acts = new Map();
  let detail = null; // the task shown in the detail
  let listSeq = 0, detailSeq = 0;
  const errors = new Map(); // where → message

  // ---- Errors --------------------------------------------------------------
  function setError(key, msg) {
    if (msg) errors.set(key, msg);
    else errors.delete(key);
    $("tasks-error").textContent = [...errors.values()].join("\n");
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
  function listQuery() {
    const q = new URLSearchParams();
    for (const k of ["state", "kind", "queue"]) if (params[k]) q.set(k, params[k]);
    q.set("limit", String(pageSize));
    if (params.after) q.set("after_id", params.after);
    return q.toString();
  }

  async function get(path, what) {
    try {
      const res = await api("GET", path);
      if (res.ok) return { value: await res.json() };
      return { status: res.status, error: await problem(res, what) };
    } catch (e) {
      return { error: `Could not ${what}: ${e.message}` };
    }
  }

  async function loadList(startedAt) {
    const q = listQuery();
    const seq = ++listSeq;
    const r = await get("/api/tasks?" + q, "list the tasks");
    if (seq !== listSeq || !params) return;
    setError("list", r.error);
    if (r.error) return;
    const same = q === listKey;
    listKey = q;
    if (!same) kept.clear();
    const shown = new Map(r.value.map((t) => [t.id, t]));
    const gone = same ? [...rows.keys()].filter((id) => !shown.has(id) && (acts.has(id) || kept.has(id))) : [];
    for (const id of gone) kept.add(id);
    const fetched = await Promise.all(gone.map((id) => get(`/api/tasks/${id}`, `read task ${id}`)));
    if (seq !== listSeq || !params) return;
    const entries = r.value.map((t) => ({ task: t, gone: false }));
    fetched.forEach((f, i) => {
      if (f.value) entries.push({ task: f.value, gone: true });
      else kept.delete(gone[i]);
    });
    entries.sort((a, b) => a.task.id - b.task.id);
    renderRows(entries, same, startedAt);
  }

  async function loadDetail(startedAt) {
    const id = params.id;
    if (!id) {
      detail = null;
      setError("detail", "");
      renderDetail();
      return;
    }
    const seq = ++detailSeq;
    const r = await get(`/api/tasks/${id}`, `read task ${id}`);
    if (seq !== detailSeq || !params || params.id !== id) return;
    if (r.status === 404) {
      detail = null;
      setError("detail", "");
      renderDetail(`No task has the id ${id}.`);
      return;
    }
    setError("detail", r.error);
    if (r.error) return;
    settle(r.value, startedAt);
    detail = r.value;
    renderDetail();
    // The row shows what the detail read, which may be newer.
    const row = rows.get(detail.id);
    if (row) fillRow(row, detail, row.task.state !== detail.state);
  }

  function refresh() {
    const startedAt = performance.now();
    return Promise.all([loadList(startedAt), loadDetail(startedAt)]);
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
    refresh().finally(() => { inFlight = false; pump(); });
  }
  document.addEventListener("visibilitychange", pump);

  // settle ends an action once the task shows its result: a new state, or
  // any read that began after the answer came (the change was committed
  // before it). A confirmation whose action no longer applies goes too.
  function settle(task, startedAt) {
    const act = acts.get(task.id);
    if (!act) return;
    if ((act.mode === "sent" && (task.state !== act.sentState || startedAt > act.answeredAt)) ||
        (act.mode === "confirm" && actionOf(task.state) !== act.kind)) {
      acts.delete(task.id);
    }
  }

  // ---- The list ------------------------------------------------------------
  function whenOf(task) {
    if (task.state === "pending") return { at: task.scheduled_at, label: "due" };
    if (task.state === "running") return { at: task.started_at, label: "running" };
    return { at: task.processed_at, label: "ended" };
  }

  function drawWhen(span, t) {
    const at = ms(span.dataset.at);
    if (Number.isNaN(at)) { span.textContent = ""; return; }
    const d = t - at;
    switch (span.dataset.label) {
      case "due": span.textContent = d >= 0 ? `due ${age(d)} ago` : `due in ${age(-d)}`; break;
      case "running": span.textContent = `for ${age(d)}`; break;
      default: span.textContent = `ended ${age(d)} ago`;
    }
  }

  function makeRow(id) {
    const cells = {
      id: el("td", { class: "num" }, el("a", { class: "plain", href: "#" }, String(id))),
      kind: el("span", { class: "line" }),
      queue: el("span", { class: "line sub task-queue" }),
      state: el("span", { class: "state task-state" }),
      when: el("span", { class: "line sub when" }),
      attempts: el("td", { class: "num" }),
      processor: el("td", { class: "ellipsis task-processor" }),
      error: el("td", { class: "ellipsis task-error" }),
      actions: el("td", { class: "actions", "data-task-id": String(id), "data-place": "row" }),
    };
    const tr = el("tr", { class: "task-row", "data-task-id": String(id) },
      cells.id, el("td", { class: "task-kind" }, cells.kind, cells.queue), el("td", {}, cells.state, cells.when),
      cells.attempts, cells.processor, cells.error, cells.actions);
    return { tr, cells, task: null };
  }

  function fillRow(row, task, flash) {
    const { tr, cells } = row;
    row.task = task;
    tr.dataset.state = task.state;
    cells.id.firstChild.href = routeHash({ ...params, id: String(task.id) });
    cells.kind.textContent = cells.kind.title = task.kind ?? "";
    cells.queue.textContent = cells.queue.title = task.queue ?? "";
    cells.state.textContent = cells.state.dataset.state = task.state;
    cells.attempts.textContent = `${task.attempts}/${task.max_attempts}`;
    cells.processor.textContent = task.processor ?? "–";
    cells.processor.title = task.processor ?? "";
    const when = whenOf(task);
    cells.when.dataset.at = when.at ?? "";
    cells.when.dataset.label = when.label;
    cells.when.title = when.at ? `${when.label}: ${when.at}` : "";
    drawWhen(cells.when, now());
    cells.error.textContent = task.last_error ?? "";
    cells.error.title = task.last_error ?? "";
    renderActions(cells.actions, task);
    if (flash && !matchMedia("(prefers-reduced-motion: reduce)").matches) {
      tr.animate([{ backgroundColor: getComputedStyle(document.documentElement).getPropertyValue("--flash") }, { backgroundColor: "transparent" }], { duration: 1200, easing: "ease-out" });
    }
  }

  function renderRows(entries, same, startedAt) {
    const next = new Map();
    for (const { task, gone } of entries) {
      settle(task, startedAt);
      const row = rows.get(task.id) ?? makeRow(task.id);
      const changed = same && row.task && row.task.state !== task.state;
      fillRow(row, task, changed);
      row.tr.classList.toggle("gone", gone);
      row.tr.title = gone ? "No longer matches the filters; shown because you acted on it." : "";
      row.tr.classList.toggle("selected", params.id === String(task.id));
      next.set(task.id, row);
    }
    rows.clear();
    for (const [id, row] of next) rows.set(id, row);
    // Rows that stay where they were are not touched: moving a row would
    // blur a reason being typed in it.
    const body = $("task-rows");
    let i = 0;
    for (const { tr } of next.values()) {
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] ?? null);
      i++;
    }
    while (body.children.length > i) body.lastElementChild.remove();
    const listed = entries.filter((e) => !e.gone).length;
    $("task-rows-empty").hidden = entries.length > 0;
    $("tasks-next").disabled = listed < pageSize;
    $("tasks-first").disabled = !params.after;
    const filters = ["state", "kind", "queue"].filter((k) => params[k]).map((k) => `${k} ${params[k]}`);
    $("task-list-note").textContent = `${listed} task${listed === 1 ? "" : "s"}${params.after ? ` after id ${params.after}` : ""}, oldest first` +
      (filters.length ? ` · ${filters.join(", ")}` : "");
  }

  // ---- Actions -------------------------------------------------------------
  const verbs = { cancel: ["Cancel", "cancelling…"], retry: ["Retry", "retrying…"] };

  // renderActions draws the task's action in container (a row's cell or
  // the detail's), redrawing only when what it shows changes, so that a
  // read arriving mid-confirmation keeps the reason being typed.
  function renderActions(container, task) {
    const kind = actionOf(task.state);
    const act = acts.get(task.id);
    const place = container.dataset.place;
    const sig = act ? `${act.mode}:${act.kind}:${act.where === place}` : `idle:${kind}`;
    if (container.dataset.sig === sig) return;
    container.dataset.sig = sig;
    if (!act) {
      container.replaceChildren(...(kind ? [el("button", { type: "button", class: `act task-${kind}`, "data-act": kind, text: verbs[kind][0] })] : []));
      return;
    }
    if (act.mode !== "confirm") {
      container.replaceChildren(el("span", { class: "muted sent", role: "status", text: verbs[act.kind][1] }));
      return;
    }
    if (act.where !== place) {
      container.replaceChildren(el("span", { class: "muted", text: "confirming…" }));
      return;
    }
    const yes = el("button", { type: "button", class: `act confirm-yes ${act.kind}`, "data-act": "yes",
      "aria-label": `${verbs[act.kind][0]} task ${task.id}`, text: `${verbs[act.kind][0]} it` });
    const no = el("button", { type: "button", class: "act confirm-no", "data-act": "no", text: act.kind === "cancel" ? "Keep it" : "Leave it" });
    const ask = act.kind === "cancel"
      ? el("input", { class: "reason", type: "text", placeholder: "reason (optional)", "aria-label": `Why cancel task ${task.id} (optional)`, maxlength: "4096" })
      : el("span", { class: "ask", text: task.state === "dead" ? "Run it again?" : "Back to the queue?" });
    container.replaceChildren(el("div", { class: "confirm" }, ask, el("div", { class: "confirm-buttons" }, yes, no)));
    (container.querySelector("input.reason") ?? yes).focus();
  }

  function redraw(id) {
    const row = rows.get(id);
    if (row?.task) renderActions(row.cells.actions, row.task);
    if (detail?.id === id) renderActions($("td-actions"), detail);
  }

  function taskOf(id) {
    return rows.get(id)?.task ?? (detail?.id === id ? detail : null);
  }

  // send posts the confirmed action. Its answer only says whether it was
  // taken; the row changes when the stream's hint brings the change.
  async function send(id, container) {
    const act = acts.get(id);
    const task = taskOf(id);
    if (!act || act.mode !== "confirm" || !task) return;
    const reason = container.querySelector("input.reason")?.value.trim() ?? "";
    act.mode = "busy";
    act.sentState = task.state;
    setError(`act-${id}`, "");
    redraw(id);
    const what = `${act.kind} task ${id}`;
    let msg = "";
    try {
      const res = await api("POST", `/api/tasks/${id}/${act.kind}`, act.kind === "cancel" && reason ? { reason } : {});
      if (!res.ok) msg = await problem(res, what);
    } catch (e) {
      msg = `Could not ${what}: ${e.message}`;
    }
    if (msg) {
      acts.delete(id);
      setError(`act-${id}`, msg);
    } else {
      act.mode = "sent";
      act.answeredAt = performance.now();
      // The hint may have come, and the read after it shown the change,
      // before this answer did.
      const now = taskOf(id);
      if (now && now.state !== act.sentState) acts.delete(id);
    }
    redraw(id);
  }

  const root = $("tasks-view");
  root.addEventListener("click", (e) => {
    const b = e.target.closest("button[data-act]");
    if (b) {
      const container = b.closest("[data-task-id]");
      const id = Number(container.dataset.taskId);
      const which = b.dataset.act;
      if (which === "cancel" || which === "retry") {
        acts.set(id, { kind: which, mode: "confirm", where: container.dataset.place });
        setError(`act-${id}`, "");
        redraw(id);
      } else if (which === "no") {
        acts.delete(id);
        redraw(id);
      } else if (which === "yes") {
        send(id, container);
      }
      return;
    }
    // A click anywhere else on a row opens the task's detail.
    const tr = e.target.closest("#task-rows tr[data-task-id]");
    if (tr && !e.target.closest("td.actions, a") && params) location.hash = routeHash({ ...params, id: tr.dataset.taskId });
  });
  root.addEventListener("keydown", (e) => {
    const input = e.target.closest?.("input.reason");
    if (!input) return;
    const container = input.closest("[data-task-id]");
    if (e.key === "Enter") send(Number(container.dataset.taskId), container);
    if (e.key === "Escape") {
      acts.delete(Number(container.dataset.taskId));
      redraw(Number(container.dataset.taskId));
    }
  });

  // ---- The detail ----------------------------------------------------------
  const stamp = (iso) => (iso ? stampFmt.format(new Date(ms(iso))) : "–");

  // history is the task's attempts, oldest first: the ended ones of
  // earlier_attempts, then the one the task's own fields describe while it
  // runs or once it is done.
  function history(task) {
    const h = [...(task.earlier_attempts ?? [])];
    if (task.state === "running" || task.state === "done") {
      h.push({
        processor: task.processor, fence: task.fence, started_at: task.started_at, expires_at: task.must_heartbeat_before,
        ended_at: task.state === "done" ? task.processed_at : null, outcome: task.state === "done" ? "completed" : "running", error: null,
      });
    }
    return h;
  }

  function attemptItem(a) {
    const start = ms(a.started_at), end = ms(a.ended_at);
    const took = Number.isNaN(end) ? (a.outcome === "running" ? ` · ${age(now() - start)} so far` : "") : ` · ${age(end - start)}`;
    return el("li", { class: "attempt", "data-outcome": a.outcome },
      el("div", { class: "line" },
        el("span", { class: "outcome", "data-outcome": a.outcome, text: a.outcome }),
        el("span", { class: "ellipsis who", title: a.processor ?? "", text: a.processor ?? "–" }),
        el("span", { class: "muted", text: `fence ${a.fence ?? "–"}` })),
      el("div", { class: "line muted times" },
        el("time", { datetime: a.started_at ?? "", title: a.started_at ?? "", text: a.started_at ? timeMs.format(new Date(start)) : "–" }),
        " → ",
        el("time", { datetime: a.ended_at ?? "", title: a.ended_at ?? "", text: a.ended_at ? timeMs.format(new Date(end)) : "…" }),
        took),
      ...(a.expires_at ? [el("div", { class: "line muted times", title: a.expires_at, text: `lease until ${timeMs.format(new Date(ms(a.expires_at)))}` })] : []),
      ...(a.error ? [el("pre", { class: "attempt-error", text: a.error })] : []));
  }

  function renderDetail(emptyText) {
    const body = $("task-detail-body");
    for (const tr of rows.values()) tr.tr.classList.toggle("selected", params?.id === String(tr.task?.id));
    if (!detail) {
      body.hidden = true;
      $("h-task-detail").textContent = "Task";
      $("task-detail-empty").hidden = false;
      $("task-detail-empty").textContent = emptyText ?? "Click a task, or enter its id, to see it and its attempts.";
      return;
    }
    const t = detail;
    $("task-detail-empty").hidden = true;
    body.hidden = false;
    body.dataset.taskId = String(t.id);
    body.dataset.state = t.state;
    $("h-task-detail").textContent = `Task ${t.id}`;
    const st = $("td-state");
    st.textContent = st.dataset.state = t.state;
    const facts = [
      ["kind", t.kind], ["queue", t.queue], ["priority", t.priority], ["attempts", `${t.attempts} of ${t.max_attempts}`],
      ["scheduled", stamp(t.scheduled_at)], ["created", stamp(t.created_at)],
      ["processor", t.processor ?? "–"], ["fence", t.fence ?? "–"],
      ["started", stamp(t.started_at)], ["heartbeat", stamp(t.last_heartbeat_at)], ["lease until", stamp(t.must_heartbeat_before)],
      ["processed", stamp(t.processed_at)], ["lease TTL", t.ttl_seconds ? `${t.ttl_seconds} s` : "–"],
      ["unique key", t.unique_key ?? "–"], ["last error", t.last_error ?? "–"],
    ];
    // A task holding a lock holds its resource's lease while it runs; a
    // scheduled one links to its schedule in the schedules view.
    if (t.lock) facts.push(["lock", t.lock]);
    if (t.schedule) facts.push(["schedule", t.schedule, "#schedules?" + new URLSearchParams({ name: t.schedule })]);
    if (t.schedule_tick) facts.push(["schedule tick", stamp(t.schedule_tick), "", t.schedule_tick]);
    $("td-facts").replaceChildren(...facts.flatMap(([k, v, href, title]) => [el("dt", { text: k }),
      el("dd", { title: title ?? String(v), "data-fact": k }, href ? el("a", { class: "plain", href, text: String(v) }) : String(v))]));
    const actions = $("td-actions");
    if (actions.dataset.taskId !== String(t.id)) {
      actions.dataset.taskId = String(t.id);
      delete actions.dataset.sig;
    }
    renderActions(actions, t);
    const h = history(t);
    $("td-attempts").replaceChildren(...h.map(attemptItem));
    $("td-attempts-empty").hidden = h.length > 0;
    $("td-data").textContent = JSON.stringify(t.task_data, null, 2);
    $("td-output").textContent = JSON.stringify(t.task_output, null, 2);
  }

  // ---- The forms -----------------------------------------------------------
  $("task-filters").addEventListener("submit", (e) => {
    e.preventDefault();
    location.hash = routeHash({ state: $("tf-state").value, kind: $("tf-kind").value.trim(), queue: $("tf-queue").value.trim(), id: params?.id ?? "" });
  });
  $("tf-clear").addEventListener("click", () => { location.hash = routeHash({ id: params?.id ?? "" }); });
  $("task-open").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = $("tf-id").value.trim();
    if (!/^[1-9][0-9]{0,17}$/.test(id)) {
      setError("open", `"${id}" is not a task id; enter a whole number from 1 up.`);
      return;
    }
    setError("open", "");
    location.hash = routeHash({ ...(params ?? {}), id });
  });
  $("tasks-next").addEventListener("click", () => {
    const ids = [...rows.values()].filter((r) => !r.tr.classList.contains("gone")).map((r) => r.task.id);
    if (ids.length) location.hash = routeHash({ ...params, after: String(Math.max(...ids)) });
  });
  $("tasks-first").addEventListener("click", () => { location.hash = routeHash({ ...params, after: "" }); });

  return {
    // open shows the view at route p (from parseRoute) and reads it.
    open(p) {
      const wasOpen = params !== null;
      params = p;
      $("tf-state").value = p.state;
      $("tf-kind").value = p.kind;
      $("tf-queue").value = p.queue;
      $("tf-id").value = p.id;
      if (!wasOpen) listKey = "";
      if (detail && String(detail.id) !== p.id) detail = null;
      renderDetail();
      refresh();
    },
    close() {
      params = null;
      clearTimeout(timer);
      timer = 0;
    },
    // hint says that tasks changed: read again, soon.
    hint() {
      if (!params) return;
      dirty = true;
      pump();
    },
    // reload reads the view again now (after signing in).
    reload() {
      if (params) refresh();
    },
    // tick redraws the times that move.
    tick(t) {
      if (!params) return;
      for (const when of $("task-rows").querySelectorAll(".when")) drawWhen(when, t);
    },
  };
}

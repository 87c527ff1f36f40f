#!/usr/bin/env node
// A leasehold task worker in Node 18+ (built-in fetch only, no packages): the REST protocol, as a
// guide. The same worker as examples/python/worker.py.
//
// Run it next to a replica (or the front door of `go tool task run`), then give it work:
//
//     node examples/node/worker.mjs
//     curl -s -X POST localhost:8080/api/tasks -d '{"kind": "greet", "task_data": {"name": "Ada"}}'
//
// Environment:
//     LEASEHOLD_URL        the server (default http://localhost:8080)
//     LEASEHOLD_API_TOKEN  the server's API token, when it has one (sent as Authorization: Bearer)
//     LEASEHOLD_KINDS      the kinds to claim, comma-separated (default: every kind in HANDLERS)
//     LEASEHOLD_QUEUES     the queues to claim from, comma-separated (default: every queue)
//
// One task at a time:
//   1. POST /api/tasks/next {processor, kinds, queues?, wait_seconds} waits for a task (no polling):
//      200 is a task, now ours under a lease with a fence for ttl_seconds; 204 means nothing came, ask
//      again; 503 means the replica is shutting down, ask again in a moment (another one answers).
//   2. While the handler runs, PUT /api/tasks/{id}/heartbeat {processor, fence} every ttl_seconds/3.
//      409 means the lease is gone (it lapsed, or the task was cancelled): stop, and report nothing.
//   3. PUT /api/tasks/{id}/complete {processor, fence, task_output} with the handler's result, or
//      PUT /api/tasks/{id}/fail {processor, fence, error} (retried after a backoff, dead after max_attempts).
// SIGTERM or Ctrl-C: no new claims; the task in hand is finished and reported; exit 0.
import os from "node:os";

const URL = (process.env.LEASEHOLD_URL || "http://localhost:8080").replace(/\/+$/, "");
const TOKEN = process.env.LEASEHOLD_API_TOKEN || "";
const PROCESSOR = `node-${os.hostname()}-${process.pid}`; // who holds our tasks' leases
const WAIT_SECONDS = 30;

// sleep resolves after seconds, or at once when signal aborts; true when it slept the whole time.
const sleep = (seconds, signal) => new Promise((resolve) => {
  if (signal?.aborted) return resolve(false);
  const onAbort = () => { clearTimeout(timer); resolve(false); };
  const timer = setTimeout(() => { signal?.removeEventListener("abort", onAbort); resolve(true); }, seconds * 1000);
  signal?.addEventListener("abort", onAbort, { once: true });
});

// Kind "greet": {"name": "Ada", "seconds": 0.5, "fail": false} -> {"greeting": "hello, Ada"}.
async function greet(data, lost) {
  if (!(await sleep(Number(data.seconds ?? 0), lost))) return null; // the "work"; give up once lost aborts
  if (data.fail) throw new Error("the task asked to fail");
  return { greeting: `hello, ${data.name ?? "world"}` };
}

const HANDLERS = { greet }; // kind -> async handler(task_data, lost: AbortSignal) returning task_output or throwing

const log = (msg) => console.log(msg);

// call sends body as JSON; it returns {status, answer, retryAfter} and throws when the server cannot be reached.
async function call(method, path, body, { timeoutSeconds = 10, signal } = {}) {
  const headers = { "Content-Type": "application/json" };
  if (TOKEN) headers.Authorization = `Bearer ${TOKEN}`;
  const ctl = new AbortController(); // aborted by the timeout, or by the caller's signal
  const timer = setTimeout(() => ctl.abort(new Error(`no answer within ${timeoutSeconds} s`)), timeoutSeconds * 1000);
  const onAbort = () => ctl.abort(signal.reason);
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    const res = await fetch(URL + path, { method, headers, body: JSON.stringify(body), signal: ctl.signal });
    const text = await res.text();
    return { status: res.status, answer: text.trim() ? JSON.parse(text) : null, retryAfter: Number(res.headers.get("retry-after")) || 1 };
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort);
  }
}

const holder = (task) => ({ processor: PROCESSOR, fence: task.fence }); // the fence makes every write a compare-and-set

// keepLease heartbeats every ttl/3 until done aborts; it aborts lost once the lease is gone or cannot be renewed in time.
async function keepLease(task, lost, done) {
  const ttl = task.ttl_seconds;
  let goodUntil = performance.now() + ttl * 1000;
  while (await sleep(ttl / 3, done)) {
    const sent = performance.now();
    let status = null;
    try {
      ({ status } = await call("PUT", `/api/tasks/${task.id}/heartbeat`, holder(task), { timeoutSeconds: ttl / 3 }));
    } catch { /* unreachable for now: the next beat tries again */ }
    if (status === 202) {
      goodUntil = sent + ttl * 1000; // by our clock, counted from when we asked: never later than the server's
    } else if (status === 404 || status === 409 || performance.now() >= goodUntil) {
      lost.abort();
      return;
    }
  }
}

// report PUTs complete or fail, trying again while the server cannot answer; it returns the task's new state.
async function report(task, op, body) {
  let answer = null;
  for (let i = 0; i < 5; i++) {
    let status = null, retryAfter = 1;
    try {
      ({ status, answer, retryAfter } = await call("PUT", `/api/tasks/${task.id}/${op}`, { ...holder(task), ...body }));
    } catch (e) {
      answer = { error: e.message };
    }
    if (status === 202) return answer.state; // done; or, after fail, pending (to be retried) or dead
    if (status === 404 || status === 409) return "lease lost (refused with 409; another worker may have it now)";
    if (status !== null && status !== 429 && status < 500) return `refused with ${status}: ${answer?.error}`;
    await sleep(retryAfter);
  }
  return `not reported (${answer?.error}); the task comes back when its lease lapses`;
}

async function work(task) {
  const name = `task ${task.id} (${task.kind}, fence ${task.fence})`;
  log(`${name}: started`);
  const lost = new AbortController(), done = new AbortController();
  const heartbeat = keepLease(task, lost, done.signal);
  let output = null, error = null;
  try {
    output = await HANDLERS[task.kind](task.task_data, lost.signal);
  } catch (e) { // a handler's failure fails the task, not the worker
    error = String(e?.message || e || "failed").slice(0, 1000);
  }
  done.abort();
  await heartbeat;
  if (lost.signal.aborted) {
    log(`${name}: lease lost (it lapsed or the task was cancelled); reporting nothing`);
  } else if (error === null) {
    const state = await report(task, "complete", { task_output: output });
    log(state === "done" ? `${name}: ${state} ${JSON.stringify(output)}` : `${name}: ${state}`);
  } else {
    log(`${name}: failed (${error}), now ${await report(task, "fail", { error })}`);
  }
}

async function main() {
  if (typeof fetch !== "function") throw new Error(`Node ${process.version} has no built-in fetch; use Node 18 or later`);
  const list = (v) => (v || "").split(",").map((s) => s.trim()).filter(Boolean);
  const kinds = list(process.env.LEASEHOLD_KINDS || Object.keys(HANDLERS).join(","));
  const queues = list(process.env.LEASEHOLD_QUEUES);
  if (kinds.length === 0 || kinds.some((k) => !(k in HANDLERS))) {
    throw new Error(`LEASEHOLD_KINDS='${kinds}': this worker has handlers for ${Object.keys(HANDLERS).join(", ")} only`);
  }
  const claim = { processor: PROCESSOR, kinds, wait_seconds: WAIT_SECONDS };
  if (queues.length > 0) claim.queues = queues; // left out: every queue (an empty list is refused)

  const stopping = new AbortController(); // ends a wait for a task, never a task in hand
  let busy = false;
  const onSignal = () => {
    // Waiting: the request is dropped. The server hands back a task it claimed for us just then
    // (in the instant it was sending it, the task comes back when its lease lapses).
    if (busy && !stopping.signal.aborted) log("stopping: finishing the task in hand first");
    stopping.abort();
  };
  process.on("SIGTERM", onSignal);
  process.on("SIGINT", onSignal);
  log(`worker ${PROCESSOR} claiming ${kinds.join(",")} from ${URL}`);
  while (!stopping.signal.aborted) {
    let status, answer, retryAfter;
    try {
      ({ status, answer, retryAfter } = await call("POST", "/api/tasks/next", claim,
        { timeoutSeconds: WAIT_SECONDS + 15, signal: stopping.signal }));
    } catch (e) {
      if (stopping.signal.aborted) break;
      log(`cannot reach ${URL} (${e.cause?.message || e.message}); trying again in 2 s`);
      await sleep(2, stopping.signal);
      continue;
    }
    if (status === 200) {
      busy = true;
      await work(answer);
      busy = false;
    } else if (status === 429 || status >= 500) { // busy, shutting down (503), or the database is away
      await sleep(retryAfter, stopping.signal);
    } else if (status !== 204) {
      throw new Error(`POST /api/tasks/next: ${status} ${answer?.error}`);
    }
  }
  log("stopped");
}

main().catch((e) => {
  console.error(e.message);
  process.exit(1);
});

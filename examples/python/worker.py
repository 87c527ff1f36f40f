#!/usr/bin/env python3
"""A leasehold task worker in Python 3, standard library only: the REST protocol, as a guide.

Run it next to a replica (or the front door of `go tool task run`), then give it work:

    python3 examples/python/worker.py
    curl -s -X POST localhost:8080/api/tasks -d '{"kind": "greet", "task_data": {"name": "Ada"}}'

Environment:
    LEASEHOLD_URL        the server (default http://localhost:8080)
    LEASEHOLD_API_TOKEN  the server's API token, when it has one (sent as Authorization: Bearer)
    LEASEHOLD_KINDS      the kinds to claim, comma-separated (default: every kind in HANDLERS)
    LEASEHOLD_QUEUES     the queues to claim from, comma-separated (default: every queue)

One task at a time:
  1. POST /api/tasks/next {processor, kinds, queues?, wait_seconds} waits for a task (no polling):
     200 is a task, now ours under a lease with a fence for ttl_seconds; 204 means nothing came, ask
     again; 503 means the replica is shutting down, ask again in a moment (another one answers).
  2. While the handler runs, PUT /api/tasks/{id}/heartbeat {processor, fence} every ttl_seconds/3.
     409 means the lease is gone (it lapsed, or the task was cancelled): stop, and report nothing.
  3. PUT /api/tasks/{id}/complete {processor, fence, task_output} with the handler's result, or
     PUT /api/tasks/{id}/fail {processor, fence, error} (retried after a backoff, dead after max_attempts).
SIGTERM or Ctrl-C: no new claims; the task in hand is finished and reported; exit 0.
"""
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

URL = os.environ.get("LEASEHOLD_URL", "http://localhost:8080").rstrip("/")
TOKEN = os.environ.get("LEASEHOLD_API_TOKEN", "")
PROCESSOR = f"python-{socket.gethostname()}-{os.getpid()}"  # who holds our tasks' leases
WAIT_SECONDS = 30
TRANSIENT = (OSError, http.client.HTTPException)  # the server unreachable, a connection cut


def greet(data, lost):
    """Kind "greet": {"name": "Ada", "seconds": 0.5, "fail": false} -> {"greeting": "hello, Ada"}."""
    if lost.wait(float(data.get("seconds", 0))):  # the "work"; a long handler gives up once lost is set
        return None
    if data.get("fail"):
        raise ValueError("the task asked to fail")
    return {"greeting": f"hello, {data.get('name', 'world')}"}


HANDLERS = {"greet": greet}  # kind -> handler(task_data, lost) returning task_output or raising


def log(msg):
    print(msg, flush=True)


def call(method, path, body, timeout=10):
    """Sends body as JSON; returns (status, the decoded answer or None, Retry-After in seconds)."""
    req = urllib.request.Request(URL + path, data=json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    if TOKEN:
        req.add_header("Authorization", "Bearer " + TOKEN)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, headers, raw = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:  # 4xx and 5xx are answers, not exceptions
        status, headers, raw = e.code, e.headers, e.read()
    answer = json.loads(raw) if raw.strip() else None
    return status, answer, float(headers.get("Retry-After") or 1)


def holder(task):
    return {"processor": PROCESSOR, "fence": task["fence"]}  # the fence makes every write a compare-and-set


def keep_lease(task, lost, done):
    """Heartbeats every ttl/3 until done is set; sets lost once the lease is gone or cannot be renewed in time."""
    ttl = task["ttl_seconds"]
    good_until = time.monotonic() + ttl
    while not done.wait(ttl / 3):
        sent = time.monotonic()
        try:
            status, _, _ = call("PUT", f"/api/tasks/{task['id']}/heartbeat", holder(task), timeout=ttl / 3)
        except TRANSIENT:
            status = None
        if status == 202:
            good_until = sent + ttl  # by our clock, counted from when we asked: never later than the server's
        elif status in (404, 409) or time.monotonic() >= good_until:
            lost.set()
            return


def report(task, op, body):
    """PUTs complete or fail, trying again while the server cannot answer; returns the task's new state."""
    for _ in range(5):
        try:
            status, answer, retry_after = call("PUT", f"/api/tasks/{task['id']}/{op}", {**holder(task), **body})
        except TRANSIENT as e:
            status, answer, retry_after = None, {"error": str(e)}, 1
        if status == 202:
            return answer["state"]  # done; or, after fail, pending (to be retried) or dead
        if status in (404, 409):
            return "lease lost (refused with 409; another worker may have it now)"
        if status not in (None, 429) and status < 500:
            return f"refused with {status}: {answer and answer.get('error')}"
        time.sleep(retry_after)
    return f"not reported ({answer and answer.get('error')}); the task comes back when its lease lapses"


def work(task):
    name = f"task {task['id']} ({task['kind']}, fence {task['fence']})"
    log(f"{name}: started")
    lost, done = threading.Event(), threading.Event()
    heartbeat = threading.Thread(target=keep_lease, args=(task, lost, done), daemon=True)
    heartbeat.start()
    try:
        output, error = HANDLERS[task["kind"]](task["task_data"], lost), None
    except Exception as e:  # a handler's failure fails the task, not the worker
        output, error = None, (str(e) or type(e).__name__)[:1000]
    done.set()
    heartbeat.join()
    if lost.is_set():
        log(f"{name}: lease lost (it lapsed or the task was cancelled); reporting nothing")
    elif error is None:
        state = report(task, "complete", {"task_output": output})
        log(f"{name}: {state} {json.dumps(output)}" if state == "done" else f"{name}: {state}")
    else:
        log(f"{name}: failed ({error}), now {report(task, 'fail', {'error': error})}")


class Stop(BaseException):
    """Raised by the signal handler to end a wait for a task (never while a task is in hand)."""


def main():
    kinds = [k.strip() for k in (os.environ.get("LEASEHOLD_KINDS") or ",".join(HANDLERS)).split(",") if k.strip()]
    queues = [q.strip() for q in os.environ.get("LEASEHOLD_QUEUES", "").split(",") if q.strip()]
    if not kinds or any(k not in HANDLERS for k in kinds):
        sys.exit(f"LEASEHOLD_KINDS={','.join(kinds)!r}: this worker has handlers for {', '.join(HANDLERS)} only")
    claim = {"processor": PROCESSOR, "kinds": kinds, "wait_seconds": WAIT_SECONDS}
    if queues:  # left out: every queue (an empty list is refused)
        claim["queues"] = queues

    stopping, busy = threading.Event(), False

    def on_signal(signum, frame):
        stopping.set()
        if not busy:
            # Waiting: drop the request. The server hands back a task it claimed for us just then
            # (in the instant it was sending it, the task comes back when its lease lapses).
            raise Stop
        log("stopping: finishing the task in hand first")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log(f"worker {PROCESSOR} claiming {','.join(kinds)} from {URL}")
    try:
        while not stopping.is_set():
            try:
                status, answer, retry_after = call("POST", "/api/tasks/next", claim, timeout=WAIT_SECONDS + 15)
            except TRANSIENT as e:
                log(f"cannot reach {URL} ({e}); trying again in 2 s")
                time.sleep(2)
                continue
            if status == 200:
                busy = True
                work(answer)
                busy = False
            elif status == 429 or status >= 500:  # busy, shutting down (503), or the database is away
                time.sleep(retry_after)
            elif status != 204:
                sys.exit(f"POST /api/tasks/next: {status} {answer and answer.get('error')}")
    except Stop:
        pass
    log("stopped")


if __name__ == "__main__":
    main()

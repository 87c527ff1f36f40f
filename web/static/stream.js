// Stream keeps one websocket to /ws open: it reconnects after every close
// with exponential backoff and jitter, and starts over from the snapshot
// the server sends on every connection.
//
//   idle ──start──▶ connecting ──open──▶ connected
//                     │  ▲                   │
//     refused (401) ◀─┤  └─ waiting ◀─close──┘
//     = paused until  └──close──▶ ▲  (backoff with jitter, then connecting)
//     resume()

const baseDelay = 500; // ms before the first retry
const maxDelay = 15000; // ms, the longest wait between tries
// The serving replica renews its own instance lease every few seconds, and
// every renewal is an event: this long a silence means a dead connection
// that the browser has not noticed (a replica gone without a FIN).
const silenceLimit = 45000;

export class Stream {
  // onMessage(msg) gets each parsed message; onState(state, detail) hears of
  // "connecting", "connected" and "disconnected" (detail: ms to the next try);
  // refused() is asked after a connection that never opened and may answer
  // true to stop trying until resume() (e.g. /ws wants a token).
  constructor(url, { onMessage, onState, refused }) {
    this.url = url;
    this.onMessage = onMessage;
    this.onState = onState;
    this.refused = refused;
    this.ws = null;
    this.failures = 0;
    this.timer = 0;
    this.watchdog = 0;
    this.paused = false;
    // Come back at once when the network or the tab does.
    window.addEventListener("online", () => this.retryNow());
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") this.retryNow();
    });
  }

  start() {
    this.paused = false;
    this.open();
  }

  resume() {
    this.failures = 0;
    this.start();
  }

  retryNow() {
    if (this.paused || this.ws) return;
    clearTimeout(this.timer);
    this.open();
  }

  open() {
    this.timer = 0;
    const ws = new WebSocket(this.url);
    this.ws = ws;
    let opened = false;
    this.onState("connecting");
    ws.onopen = () => {
      opened = true;
      this.onState("connected");
      this.feedWatchdog();
    };
    ws.onmessage = (e) => {
      this.feedWatchdog();
      let msg;
      try {
        msg = JSON.parse(e.data);
      } catch {
        return; // not ours to understand; the next snapshot puts things right
      }
      if (msg.type === "snapshot") this.failures = 0;
      this.onMessage(msg);
    };
    ws.onclose = async () => {
      clearTimeout(this.watchdog);
      if (this.ws !== ws) return;
      this.ws = null;
      this.onState("disconnected");
      if (this.paused) return;
      if (!opened && this.refused && (await this.refused())) {
        this.paused = true;
        return;
      }
      this.schedule();
    };
  }

  schedule() {
    // Exponential backoff with "equal jitter": between half and all of the
    // capped delay, so that the browsers of a whole office do not all come
    // back in the same millisecond after a replica restarts.
    const cap = Math.min(maxDelay, baseDelay * 2 ** this.failures);
    const delay = Math.round(cap / 2 + Math.random() * cap / 2);
    this.failures++;
    this.onState("disconnected", delay);
    this.timer = setTimeout(() => this.open(), delay);
  }

  feedWatchdog() {
    clearTimeout(this.watchdog);
    this.watchdog = setTimeout(() => {
      const ws = this.ws;
      if (!ws) return;
      // Do not wait for a close handshake on a connection that is gone.
      ws.onclose = null;
      ws.close();
      this.ws = null;
      this.onState("disconnected");
      this.schedule();
    }, silenceLimit);
  }
}

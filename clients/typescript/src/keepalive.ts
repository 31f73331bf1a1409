// Keepalives that scale: over the session stream the sessions of one
// Client are renewed together. The scheduler keeps each session's next due
// time; at the earliest one it sends one KeepAliveBatch naming every session
// due within half a renew interval (renewing early is safe: it only moves a
// deadline from an earlier send time), so a client's sessions fall into
// step and a round costs one frame. Each session's lease is confirmed from
// the batch's send time. Where no stream can be used, each session sends
// its own unary KeepAlive.
import type { Client } from "./client.js";
import { LockdError, toLockdError } from "./errors.js";
import { durationMs, keepaliveTimeout, now, renewInterval } from "./lease.js";
import type { Policy } from "./retry.js";
import type { Session } from "./session.js";
import { fromStreamError } from "./stream.js";

/** KaResult is a session's outcome of one keepalive round. */
export interface KaResult {
  sent: number; // the (batch's) send time
  ttl: number;
  err?: LockdError;
  unary?: boolean; // no stream on the endpoint: renew with a unary KeepAlive
}

/** maxBatch: the most sessions one frame names (the server's bound). */
const maxBatch = 1000;
/** maxBatchBytes bounds a frame's encoded sessions: the server reads at most 64 KiB per frame. */
const maxBatchBytes = 60 << 10;

/** splitBatch cuts a round into frames of at most maxBatch sessions and maxBatchBytes. */
export function splitBatch(batch: Session[]): Session[][] {
  const frames: Session[][] = [];
  while (batch.length) {
    let n = 0, size = 0;
    while (n < batch.length && n < maxBatch) {
      const e = batch[n].id.length + batch[n].secret.length + 12;
      if (n > 0 && size + e > maxBatchBytes) break;
      size += e;
      n++;
    }
    frames.push(batch.slice(0, n));
    batch = batch.slice(n);
  }
  return frames;
}

export class KeepaliveScheduler {
  private readonly due = new Map<Session, { at: number; resolve: (r: KaResult) => void }>();
  private timer?: NodeJS.Timeout;
  private timerAt = Infinity;
  private closed = false;
  constructor(private readonly c: Client) {}

  /** schedule asks for s to be renewed at `at`; the promise resolves with its outcome (or {} when unscheduled). */
  schedule(s: Session, at: number): Promise<KaResult> {
    return new Promise((done) => {
      const abort = () => this.unschedule(s);
      // The listener goes with the round: a session lives many rounds.
      const resolve = (r: KaResult) => { s.signal.removeEventListener("abort", abort); done(r); };
      this.due.set(s, { at, resolve });
      s.signal.addEventListener("abort", abort, { once: true });
      if (s.signal.aborted) abort();
      this.arm();
    });
  }

  unschedule(s: Session) {
    const d = this.due.get(s);
    if (!d) return;
    this.due.delete(s);
    d.resolve({ sent: 0, ttl: 0 });
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    for (const s of [...this.due.keys()]) this.unschedule(s);
  }

  private arm() {
    if (this.closed) return;
    let first = Infinity;
    for (const d of this.due.values()) first = Math.min(first, d.at);
    if (first === Infinity || first >= this.timerAt) return;
    clearTimeout(this.timer);
    this.timerAt = first;
    this.timer = setTimeout(() => this.fire(), Math.max(0, first - now()));
  }

  private fire() {
    this.timerAt = Infinity;
    const t = now();
    const batch: Session[] = [];
    for (const [s, d] of this.due) if (d.at <= t + renewInterval(s.ttlMs) / 2) batch.push(s);
    for (const f of splitBatch(batch)) {
      const resolvers = f.map((s) => this.due.get(s)!.resolve);
      for (const s of f) this.due.delete(s);
      void this.send(f, resolvers, t);
    }
    this.arm();
  }

  private async send(batch: Session[], resolvers: ((r: KaResult) => void)[], sent: number) {
    const c = this.c;
    const ttl = Math.min(...batch.map((s) => s.ttlMs));
    const until = Math.min(...batch.map((s) => s.deadlineMonotonic));
    const p: Policy = { idempotent: true, once: true, abandon: true, timeoutMs: keepaliveTimeout(ttl, c.requestTimeoutMs), until: () => until };
    const frame = { sessions: batch.map((s) => ({ sessionId: s.id, secret: s.secret })) };
    let unary = false;
    let results: KaResult[];
    try {
      const resp = await c.do({}, p, "", async (ep, signal) => {
        const st = await ep.stream.get(c, signal);
        if (!st) { unary = true; return undefined; }
        const r = await st.call({ case: "keepAlive", value: frame }, signal);
        c.checkCluster(ep, r.clusterId);
        if (r.body.case !== "keepAlive" || r.body.value.results.length !== batch.length) throw new Error("keepalive batch: malformed answer");
        return r.body.value;
      });
      results = batch.map((s, i) => {
        if (unary || !resp) return { sent, ttl: 0, unary: true };
        const res = resp.results[i];
        if (res.sessionId !== s.id) return { sent, ttl: 0, err: new LockdError("other", "keepalive batch: answer names another session") };
        if (res.error) return { sent, ttl: 0, err: toLockdError(fromStreamError(res.error)) };
        return { sent, ttl: durationMs(res.ttl) };
      });
    } catch (e) {
      const err = toLockdError(e);
      results = batch.map(() => ({ sent, ttl: 0, err }));
    }
    resolvers.forEach((r, i) => r(results[i]));
  }
}

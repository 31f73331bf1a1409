// Session: a lease on the cluster, kept alive in the background, that
// every lock lives and dies with.
import { randomBytes } from "node:crypto";
import { setMaxListeners } from "node:events";
import { hostname } from "node:os";
import { type CallOptions, type Client } from "./client.js";
import { send } from "./call.js";
import { definitive, LockdError, toLockdError } from "./errors.js";
import { duration, durationMs, jeopardyInterval, keepaliveTimeout, leaseDeadline, now, renewInterval, toUnixMs } from "./lease.js";
import { type Ctx, ctxWithin, delay, type Policy, sleep } from "./retry.js";
import { SeqTracker } from "./seq.js";
import { Election } from "./election.js";
import { Mutex, RWMutex, Semaphore, type LockOptions } from "./lock.js";
import { MultiLock, type MultiLockOptions } from "./multilock.js";
import type { KaResult } from "./keepalive.js";

/** Options of a session. */
export interface SessionOptions extends CallOptions {
  /** The lease TTL asked for (1 s to 1 h; default 10000 ms). The server's grant is Session.ttlMs. */
  ttlMs?: number;
  /** A label for people (default host/pid). */
  owner?: string;
}

const maxCreateRounds = 3;

const randomHex = (n: number) => randomBytes(n).toString("hex");

/** openSession creates a session and starts keeping it alive. */
export async function openSession(c: Client, opts: SessionOptions): Promise<Session> {
  const ttl = opts.ttlMs ?? 10_000;
  if (!(ttl >= 1000 && ttl <= 3_600_000)) throw new LockdError("invalid", `lockd: ttl ${ttl} ms outside [1 s, 1 h]`);
  const owner = opts.owner ?? `${hostname() || "unknown"}/${process.pid}`;
  const ctx = ctxWithin({ signal: opts.signal }, opts.timeoutMs);
  for (let round = 1; ; round++) {
    // The lease counts from the first attempt's send time: a retry may be
    // answered with the session that attempt created.
    const sent = now();
    const msg = {
      ttl: duration(ttl), owner,
      requestId: randomHex(16),
      // 256 random bits, made here so that a retry of this create (same
      // request id) presents the same secret.
      secret: randomHex(32),
    };
    // An answer later than the lease's whole client deadline would create
    // a session already lost: give up on such an attempt in time to try
    // another endpoint.
    const p: Policy = { idempotent: true, timeoutMs: leaseDeadline(sent, ttl) - sent };
    const resp = await c.do(ctx, p, "", (ep, signal) => send(c, ep, signal, { case: "createSession", value: msg }));
    const s = new Session(c, resp.sessionId, msg.secret, durationMs(resp.ttl) || ttl, owner, sent);
    if (!s.lostAtBirth()) {
      c.sessions.add(s);
      c.log("info", "session created", { session: s.id, ttlMs: s.ttlMs });
      return s;
    }
    // Confirmed after its client deadline (a hung endpoint first, then a
    // late answer): ask again, with a new request and a new send time.
    void s.close();
    if (round === maxCreateRounds || ctx.signal?.aborted) throw s.err!;
  }
}

/**
 * Session is a lease on the lockd cluster, kept alive in the background.
 * The client treats the lease as lost strictly before any server may
 * expire it: at sent + TTL·0.99 − max(100 ms, 2 % TTL), sent being when
 * the newest confirmed keepalive left the client. Keepalives go out every
 * TTL/3, every TTL/10 while confirmations fail. Once lost, a session stays
 * lost: `signal` fires (reason: a LockdError "lease_lost"), every lock
 * taken through it reports the loss, and the client closes it on the
 * server. `await using` closes it.
 */
export class Session {
  readonly seqs = new SeqTracker();
  private sent: number;
  private deadlineMono: number;
  private readonly ac = new AbortController();
  private timer?: NodeJS.Timeout;
  err?: LockdError;
  private closing = false;
  private toldServer = false;
  private readonly loop: Promise<void>;
  private readonly bg = new Set<Promise<void>>();
  kaResolve?: (r: KaResult) => void;

  constructor(readonly client: Client, readonly id: string, readonly secret: string, readonly ttlMs: number, readonly owner: string, sent: number) {
    this.sent = sent;
    this.deadlineMono = leaseDeadline(sent, ttlMs);
    setMaxListeners(0, this.ac.signal); // every lock and call of the session listens to it
    if (now() >= this.deadlineMono) {
      this.lose("the session was confirmed after its client deadline");
      this.loop = Promise.resolve();
      return;
    }
    this.arm();
    this.loop = this.keepalive();
  }

  /** lostAtBirth reports whether the create was confirmed too late. */
  lostAtBirth(): boolean {
    return this.err?.code === "lease_lost";
  }

  /** signal fires when the session ends (lease lost, or closed); its reason is the LockdError saying which. */
  get signal(): AbortSignal {
    return this.ac.signal;
  }

  /** deadline is when the client will consider the lease lost unless a keepalive is confirmed first (Unix ms). */
  get deadline(): number {
    return toUnixMs(this.deadlineMono);
  }

  /** deadlineMonotonic is the deadline on performance.now()'s clock. */
  get deadlineMonotonic(): number {
    return this.deadlineMono;
  }

  /** live throws the session's error when it ended; past the deadline it loses the session at once, whatever its timer (an event loop that was blocked). */
  live(): void {
    if (this.err) throw this.err;
    if (now() >= this.deadlineMono) {
      this.lose("no keepalive confirmed before the client deadline");
      throw this.err!;
    }
  }

  private arm() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      if (this.err) return;
      if (now() < this.deadlineMono) return this.arm();
      this.lose("no keepalive confirmed before the client deadline");
    }, Math.max(0, this.deadlineMono - now()));
  }

  /** lose marks the session lost (unless it already ended). */
  lose(why: string | LockdError) {
    if (this.err) return;
    const msg = typeof why === "string" ? why : why.message;
    this.err = new LockdError("lease_lost", `lockd: lease lost: session ${this.id}: ${msg}`, { cause: typeof why === "string" ? undefined : why });
    clearTimeout(this.timer);
    this.ac.abort(this.err);
    this.client.log("warn", "session lost", { session: this.id, err: msg });
  }

  /** confirmed applies a keepalive first sent at sent: the deadline moves later, never back; a confirmation at or after the deadline does not revive the lease. */
  confirmed(sent: number, ttl: number) {
    if (this.err) return;
    if (now() >= this.deadlineMono) return this.lose("keepalive confirmed after the client deadline");
    const d = leaseDeadline(sent, ttl);
    if (d <= this.deadlineMono) return;
    this.sent = sent;
    this.deadlineMono = d;
  }

  /** policy bounds a call's attempts by the lease: an answer after the deadline is of no use. */
  policy(p: Policy): Policy {
    return { ...p, until: () => this.deadlineMono };
  }

  /** bind returns ctx also ended when the session ends. */
  bind(ctx: Ctx): Ctx {
    return { signal: ctx.signal, also: this.ac.signal, deadline: ctx.deadline };
  }

  private async keepalive() {
    const c = this.client;
    const p: Policy = { idempotent: true, once: true, abandon: true, timeoutMs: keepaliveTimeout(this.ttlMs, c.requestTimeoutMs), until: () => this.deadlineMono };
    let next = this.sent + renewInterval(this.ttlMs);
    while (!this.err) {
      let r: KaResult;
      try {
        r = await this.renew(p, next);
      } catch (e) {
        r = { sent: 0, ttl: 0, err: toLockdError(e) };
      }
      if (this.err) break;
      if (!r.err) {
        this.confirmed(r.sent, r.ttl || this.ttlMs);
        next = this.sent + renewInterval(r.ttl || this.ttlMs);
      } else if (r.err.code === "lease_lost" || r.err.code === "permission_denied") {
        this.lose(r.err);
      } else {
        c.log("warn", "keepalive failed", { session: this.id, err: r.err.message });
        next = now() + jeopardyInterval(this.ttlMs);
      }
    }
    c.ka.unschedule(this);
    if (this.closing || this.err?.code !== "lease_lost") return;
    // Lost: drop the session on the server too, so that its locks go to
    // others now rather than at the server's deadline.
    await this.closeOnServer(ctxWithin({}, c.requestTimeoutMs)).catch(() => {});
    c.sessions.delete(this);
  }

  /** renew renews the lease at next: in the client's next keepalive batch over the stream, else with a unary KeepAlive. */
  private async renew(p: Policy, next: number): Promise<KaResult> {
    const c = this.client;
    if (c.streamOn) {
      const r = await c.ka.schedule(this, next);
      if (!r.unary) return r;
    } else {
      await sleep(next - now(), this.ac.signal);
      if (this.err) return { sent: 0, ttl: 0 };
    }
    const sent = now();
    try {
      const resp = await c.do({ signal: this.ac.signal }, p, "", (ep, signal) =>
        c.rpc(ep, signal, (o) => ep.unary().keepAlive({ sessionId: this.id, secret: this.secret }, o)));
      return { sent, ttl: durationMs(resp.ttl) };
    } catch (e) {
      return { sent, ttl: 0, err: toLockdError(e) };
    }
  }

  /** keepTrying runs fn in the background (close waits for it) with backoff until it succeeds or fails definitively, or the session ends. */
  keepTrying(fn: () => Promise<unknown>, done: () => void = () => {}) {
    if (this.err) return done();
    const run = (async () => {
      try {
        for (let attempt = 0; !this.err; attempt++) {
          try {
            await fn();
            return;
          } catch (e) {
            if (definitive(toLockdError(e))) return;
          }
          await sleep(delay(attempt), this.ac.signal);
        }
      } finally {
        done();
      }
    })();
    this.bg.add(run);
    void run.finally(() => this.bg.delete(run));
  }

  /**
   * close ends the session: keepalives stop, `signal` fires (the locks'
   * signals first), and the server is told to release every hold and drop
   * every wait, best effort within opts; if that fails the server still
   * expires the session after its TTL. Closing a lost session, or twice,
   * resolves.
   */
  async close(opts: CallOptions = {}): Promise<void> {
    if (this.closing) return this.loop;
    this.closing = true;
    const lost = !!this.err;
    if (!lost) {
      this.err = new LockdError("session_closed", `lockd: session ${this.id} closed`);
      clearTimeout(this.timer);
      this.ac.abort(this.err);
    }
    await this.loop;
    await Promise.allSettled([...this.bg]);
    try {
      await this.closeOnServer(ctxWithin({ signal: opts.signal }, opts.timeoutMs ?? (lost ? this.client.requestTimeoutMs : undefined)));
    } catch (e) {
      if (!lost) throw toLockdError(e);
    } finally {
      this.client.sessions.delete(this);
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** closeOnServer sends CloseSession once per session; a session the server no longer knows is closed already. */
  private async closeOnServer(ctx: Ctx = {}) {
    if (this.toldServer) return;
    this.toldServer = true;
    const c = this.client;
    const seq = this.seqs.begin();
    try {
      const msg = { sessionId: this.id, seq: seq.seq, secret: this.secret };
      // Each attempt gets a keepalive's time, so a frozen node is left
      // for another (nothing else would notice it now).
      const p: Policy = { idempotent: true, abandon: true, timeoutMs: keepaliveTimeout(this.ttlMs, c.requestTimeoutMs) };
      await c.do(ctx, p, "", (ep, signal) => send(c, ep, signal, { case: "closeSession", value: msg }));
    } catch (e) {
      if (toLockdError(e).code !== "lease_lost") throw e;
    } finally {
      seq.end();
    }
  }

  /** mutex returns an exclusive lock on name, taken through this session. */
  mutex(name: string, opts: LockOptions = {}): Mutex {
    return new Mutex(this, name, opts);
  }

  /** semaphore returns a lock of `permits` holders on name; every user of the name must agree on permits. */
  semaphore(name: string, permits: number, opts: LockOptions = {}): Semaphore {
    return new Semaphore(this, name, permits, opts);
  }

  /** rwmutex returns a read-write lock on name: any number of readers, or one writer; a waiting writer holds back later readers. */
  rwmutex(name: string, opts: LockOptions = {}): RWMutex {
    return new RWMutex(this, name, opts);
  }

  /** multiLock returns a handle on the exclusive locks names (2 to 32, distinct), taken all at once or not at all (AcquireMany). */
  multiLock(names: string[], opts: MultiLockOptions = {}): MultiLock {
    return new MultiLock(this, names, opts);
  }

  /** election returns an election on name: its leader holds the exclusive lock name, candidates queue in campaign order. */
  election(name: string): Election {
    return new Election(this, name);
  }
}

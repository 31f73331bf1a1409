// Mutex, Semaphore and RWMutex: thin views over one mechanism (LockBase):
// one hold at a time, taken through a session.
import { type CallOptions } from "./client.js";
import { send } from "./call.js";
import { definitive, LockdError, toLockdError } from "./errors.js";
import { Mode } from "./gen/lockd/v1/lockd_pb.js";
import { duration, durationMs, leaseDeadline, now, toUnixMs } from "./lease.js";
import { type Ctx, ctxDone, ctxWithin, sleep } from "./retry.js";
import type { SeqReq } from "./seq.js";
import type { Session } from "./session.js";

/** Options of a lock handle. */
export interface LockOptions {
  /** Small metadata kept with the hold (at most 1 KiB), shown to others (busy errors, observers). */
  value?: Uint8Array | string;
  /** Lock-delay, fixed when the lock is created: after a holder's session expires the lock is not granted again for this long. */
  lockDelayMs?: number;
  /** Hold budget (1 s to 720 h): the server ends each hold after it even while the session lives; the client stops believing in the hold before (see `deadline`). */
  maxHoldMs?: number;
}

/** maxLongPoll: one queued Acquire blocks at most this long on the server before the client repeats it (below the server's 30 s cap). */
const maxLongPoll = 25_000;
/** waitRepeatPause: pause before a wait is repeated after the cluster did not answer. */
const waitRepeatPause = 100;
const maxRetentionMs = 400 * 24 * 3600 * 1000;

interface Hold { token: bigint; shared: boolean; ac: AbortController; until?: number; timer?: ReturnType<typeof setTimeout> }

/** released is the reason of a hold's signal after unlock or complete (one object: an Error per release costs a stack trace). */
const released = new LockdError("not_held", "lockd: lock released");
const notHeld = (() => { const ac = new AbortController(); ac.abort(new LockdError("not_held", "lockd: lock not held")); return ac.signal; })();

/** LockBase is the machinery shared by the lock types. */
export class LockBase {
  private busy = false;
  private hold?: Hold;
  protected readonly value: Uint8Array;
  constructor(readonly session: Session, readonly name: string, private readonly limit: number | undefined, private readonly opts: LockOptions) {
    const v = opts.value;
    this.value = typeof v === "string" ? new TextEncoder().encode(v) : v ?? new Uint8Array();
  }

  /** token is the fencing token of the current hold, 0n when not held. Pass it to the resource the lock protects. */
  get token(): bigint {
    return this.hold?.token ?? 0n;
  }

  /** signal fires when the hold ends (unlock, lease lost); already aborted when not held. Run the protected work under it. */
  get signal(): AbortSignal {
    return this.hold?.ac.signal ?? notHeld;
  }

  /** deadline is until when the current hold may be believed (Unix ms): the earlier of the session's lease deadline and the hold budget's client deadline; 0 when not held. */
  get deadline(): number {
    const h = this.hold;
    if (!h) return 0;
    const d = this.session.deadline;
    return h.until === undefined ? d : Math.min(d, toUnixMs(h.until));
  }

  /** held reports whether the lock is held and its lease live now. */
  get held(): boolean {
    try { this.guard(); return true; } catch { return false; }
  }

  /** guard returns the token when the client still holds the lock (lease deadline not passed), else throws: ask it right before each protected write. */
  guard(): bigint {
    const h = this.hold;
    if (!h || h.ac.signal.aborted) {
      throw h?.ac.signal.reason instanceof LockdError ? h.ac.signal.reason : new LockdError("not_held", `lockd: lock "${this.name}" not held`);
    }
    this.session.live();
    if (h.until !== undefined && now() >= h.until) {
      const err = new LockdError("hold_expired", `lockd: lock "${this.name}": hold budget ran out`);
      h.ac.abort(err);
      throw err;
    }
    return h.token;
  }

  /** acquire takes the lock in a mode; with wait it queues until granted or opts end, then withdraws the wait. */
  protected async acquire(shared: boolean, wait: boolean, opts: CallOptions = {}): Promise<void> {
    const s = this.session;
    const c = s.client;
    s.live();
    if (this.hold || this.busy) throw new LockdError("already_held", `lockd: lock "${this.name}" already held or waited for by this handle`);
    const ctx = ctxWithin({ signal: opts.signal }, opts.timeoutMs);
    if (ctxDone(ctx)) throw new LockdError(opts.signal?.aborted ? "cancelled" : "deadline", "lockd: call ended before it started");
    this.busy = true;
    // Every repeat of a long poll resumes the same wait: same seq. The seq
    // stays in flight until this returns, or until the withdrawal that
    // takes it over ends.
    const seq = s.seqs.begin();
    const maxHoldMs = this.opts.maxHoldMs;
    if (maxHoldMs !== undefined && !(maxHoldMs >= 1000 && maxHoldMs <= 720 * 3600 * 1000)) {
      this.busy = false;
      seq.end();
      throw new LockdError("invalid", `lockd: lock "${this.name}": maxHoldMs outside [1 s, 720 h]`);
    }
    // since: the send of a call known to precede the grant (the acquire
    // granted at once, or the last repeat the leader answered "queued"):
    // the hold budget's client deadline counts from it.
    let since = 0;
    try {
      const bctx = s.bind(ctx);
      for (;;) {
        const sent = now();
        if (!since) since = sent;
        let pollMs = 0;
        if (wait) {
          pollMs = maxLongPoll;
          if (ctx.deadline !== undefined) pollMs = Math.max(Math.min(pollMs, ctx.deadline - performance.now()), 1);
        }
        const msg = {
          sessionId: s.id, secret: s.secret, seq: seq.seq, ack: s.seqs.ack(), name: this.name,
          mode: shared ? Mode.SHARED : Mode.EXCLUSIVE, limit: this.limit, wait, value: this.value,
          lockDelay: this.opts.lockDelayMs ? duration(this.opts.lockDelayMs) : undefined,
          pollTimeout: wait ? duration(pollMs) : undefined,
          maxHold: maxHoldMs ? duration(maxHoldMs) : undefined,
        };
        let resp;
        try {
          resp = await c.do(bctx, s.policy({ idempotent: true, pollMs }), this.name, (ep, sig) => send(c, ep, sig, { case: "acquire", value: msg }));
        } catch (e) {
          const err = toLockdError(e, this.name);
          if (s.err) throw s.err;
          if (err.code === "lease_lost") { s.lose(err); throw s.err!; }
          if (wait && !ctxDone(ctx) && err.code === "unavailable") {
            // No answer within the retry timeout while the session lives:
            // its lease says the cluster is reachable enough. Wait on
            // with the same seq, keeping the place in the queue.
            c.log("warn", "lock wait: cluster unavailable, still waiting", { lock: this.name, err: err.message });
            await sleep(waitRepeatPause, bctx.signal);
            if (s.err) throw s.err;
            continue;
          }
          if (ctxDone(ctx) || !definitive(err)) this.withdraw(seq); // it may sit in the queue, or even hold the lock
          throw err;
        }
        if (resp.status === 1 /* GRANTED */) {
          // A grant is never reported after the session ended (the server
          // releases such a hold when it ends the session).
          s.live();
          const budget = durationMs(resp.maxHold);
          const h: Hold = { token: resp.token, shared, ac: new AbortController() };
          if (budget > 0) {
            h.until = leaseDeadline(since, budget);
            if (now() >= h.until) {
              const token = resp.token;
              s.keepTrying(() => this.releaseToken(token, {}));
              throw new LockdError("hold_expired", `lockd: acquire "${this.name}": granted after the hold's client deadline`);
            }
            h.timer = setTimeout(() => h.ac.abort(new LockdError("hold_expired", `lockd: lock "${this.name}": hold budget ran out`)), h.until - now());
            h.timer.unref?.(); // a forgotten hold does not keep the process alive
          }
          this.hold = h;
          const onEnd = () => h.ac.abort(s.signal.reason);
          s.signal.addEventListener("abort", onEnd, { once: true });
          h.ac.signal.addEventListener("abort", () => { clearTimeout(h.timer); s.signal.removeEventListener("abort", onEnd); }, { once: true });
          return;
        }
        if (resp.status === 2 /* QUEUED */ && wait) { since = sent; continue; }
        this.withdraw(seq);
        throw new LockdError("other", `lockd: acquire "${this.name}": unexpected status ${resp.status}`);
      }
    } finally {
      this.busy = false;
      seq.end();
    }
  }

  /** withdraw cancels the acquire on the server; if that fails it keeps trying in the background until it succeeds or the session ends, so a wait nobody listens to cannot be granted and stick. */
  private withdraw(acq: SeqReq) {
    const owned = acq.pass();
    if (!owned) return;
    const s = this.session;
    const once = () => this.cancelWait(owned.seq, ctxWithin({}, 2 * s.client.requestTimeoutMs));
    void once().then(() => owned.end(), (e) => {
      if (s.err || definitive(toLockdError(e))) return owned.end();
      s.client.log("warn", "cancel of wait failed; retrying in the background", { lock: this.name });
      s.keepTrying(() => this.cancelWait(owned.seq, {}), () => owned.end());
    });
  }

  /** @internal cancelWait sends Cancel for the acquire of seq acquireSeq (MultiLock uses it too). */
  async cancelWait(acquireSeq: bigint, ctx: Ctx) {
    const s = this.session;
    const c = s.client;
    const seq = s.seqs.begin();
    try {
      const msg = { sessionId: s.id, secret: s.secret, seq: seq.seq, ack: s.seqs.ack(), name: this.name, acquireSeq };
      await c.do(s.bind(ctx), s.policy({ idempotent: true }), this.name, (ep, sig) => send(c, ep, sig, { case: "cancel", value: msg }));
    } catch (e) {
      const err = toLockdError(e, this.name);
      if (err.code === "lease_lost") s.lose(err);
      throw err;
    } finally {
      seq.end();
    }
  }

  /** release gives up the hold; its signal fires before the server is asked, so work under it stops before the next holder may start. */
  protected async release(shared: boolean, opts: CallOptions = {}): Promise<void> {
    const s = this.session;
    const h = this.hold;
    if (!h || h.shared !== shared) throw new LockdError("not_held", `lockd: release "${this.name}": lock not held`);
    this.hold = undefined;
    h.ac.abort(released);
    if (s.err) throw s.err; // the server dropped (or will drop) the hold
    try {
      await this.releaseToken(h.token, ctxWithin({ signal: opts.signal }, opts.timeoutMs));
    } catch (e) {
      const err = toLockdError(e, this.name);
      if (s.err) throw s.err;
      if (!definitive(err)) {
        c(s).log("warn", "release failed; retrying in the background", { lock: this.name });
        s.keepTrying(() => this.releaseToken(h.token, {}));
      }
      throw err;
    }
  }

  /** @internal releaseToken releases the hold of token (MultiLock uses it too). */
  async releaseToken(token: bigint, ctx: Ctx) {
    const s = this.session;
    const seq = s.seqs.begin();
    try {
      const msg = { sessionId: s.id, secret: s.secret, seq: seq.seq, ack: s.seqs.ack(), name: this.name, token };
      await s.client.do(s.bind(ctx), s.policy({ idempotent: true }), this.name, (ep, sig) => send(s.client, ep, sig, { case: "release", value: msg }));
    } catch (e) {
      const err = toLockdError(e, this.name);
      if (err.code === "lease_lost") s.lose(err);
      throw err;
    } finally {
      seq.end();
    }
  }

  /**
   * complete marks the job this exclusive lock guards as done and releases
   * the lock: for retentionMs (1 s to 400 days) every acquire of the name
   * fails with code "done" naming who did it. Complete only after the
   * work's effects are durable.
   */
  async complete(retentionMs: number, opts: CallOptions = {}): Promise<void> {
    const s = this.session;
    const h = this.hold;
    if (!h || h.shared) throw new LockdError("not_held", `lockd: complete "${this.name}": lock not held`);
    if (!(retentionMs >= 1000 && retentionMs <= maxRetentionMs)) throw new LockdError("invalid", `lockd: complete "${this.name}": retention outside [1 s, 400 days]`);
    s.live();
    const seq = s.seqs.begin();
    let err: LockdError | undefined;
    try {
      const msg = { sessionId: s.id, secret: s.secret, seq: seq.seq, ack: s.seqs.ack(), name: this.name, token: h.token, retention: duration(retentionMs) };
      const ctx = s.bind(ctxWithin({ signal: opts.signal }, opts.timeoutMs));
      await s.client.do(ctx, s.policy({ idempotent: true }), this.name, (ep, sig) => send(s.client, ep, sig, { case: "complete", value: msg }));
    } catch (e) {
      err = toLockdError(e, this.name);
      if (err.code === "lease_lost") s.lose(err);
    } finally {
      seq.end();
    }
    if (!err || err.code === "not_held" || err.code === "lease_lost") {
      // Done, or the hold is gone anyway; after another error the hold stays and unlock still works.
      if (this.hold === h) this.hold = undefined;
      h.ac.abort(released);
    }
    if (err) throw err;
  }

  /** setValue replaces the hold's value on the server (Election.proclaim). */
  protected async setValue(value: Uint8Array, opts: CallOptions = {}): Promise<void> {
    const s = this.session;
    const h = this.hold;
    if (!h) throw new LockdError("not_held", `lockd: proclaim "${this.name}": not held`);
    s.live();
    const seq = s.seqs.begin();
    try {
      const msg = { sessionId: s.id, secret: s.secret, seq: seq.seq, ack: s.seqs.ack(), name: this.name, token: h.token, value };
      await s.client.do(s.bind(ctxWithin({ signal: opts.signal }, opts.timeoutMs)), s.policy({ idempotent: true }), this.name, (ep, sig) =>
        s.client.rpc(ep, sig, (o) => ep.unary().setValue(msg, o)));
    } catch (e) {
      const err = toLockdError(e, this.name);
      if (err.code === "lease_lost") s.lose(err);
      throw err;
    } finally {
      seq.end();
    }
  }

  /** Disposal releases the hold if there is one (await using). */
  async [Symbol.asyncDispose](): Promise<void> {
    const h = this.hold;
    if (!h) return;
    await this.release(h.shared).catch(() => {});
  }
}

const c = (s: Session) => s.client;

/** Mutex is an exclusive lock. Not re-entrant; one handle holds at most one grant at a time. */
export class Mutex extends LockBase {
  constructor(s: Session, name: string, opts: LockOptions) { super(s, name, undefined, opts); }
  /** lock waits in the server's FIFO queue until granted, the signal fires or timeoutMs runs out (then the wait is withdrawn: code "deadline"/"cancelled"); lease loss ends it with "lease_lost". Returns this, for `await using`. */
  async lock(opts?: CallOptions): Promise<this> { await this.acquire(false, true, opts); return this; }
  /** tryLock takes the lock if it is free now; otherwise throws code "busy" with the holders. */
  async tryLock(opts?: CallOptions): Promise<this> { await this.acquire(false, false, opts); return this; }
  /** unlock releases the lock ("not_held" when not held, "lease_lost" when the lease is gone). */
  unlock(opts?: CallOptions): Promise<void> { return this.release(false, opts); }
}

/** Semaphore lets up to `permits` holders hold a lock at once, each with its own token. */
export class Semaphore extends LockBase {
  constructor(s: Session, name: string, readonly permits: number, opts: LockOptions) {
    super(s, name, permits, opts);
    if (!(Number.isInteger(permits) && permits > 0)) throw new LockdError("invalid", `lockd: semaphore "${name}" needs at least one permit`);
  }
  async lock(opts?: CallOptions): Promise<this> { await this.acquire(true, true, opts); return this; }
  async tryLock(opts?: CallOptions): Promise<this> { await this.acquire(true, false, opts); return this; }
  unlock(opts?: CallOptions): Promise<void> { return this.release(true, opts); }
}

/** RWMutex is a read-write lock: any number of readers or one writer; a waiting writer holds back later readers. */
export class RWMutex extends LockBase {
  constructor(s: Session, name: string, opts: LockOptions) { super(s, name, 0, opts); }
  async lock(opts?: CallOptions): Promise<this> { await this.acquire(false, true, opts); return this; }
  async tryLock(opts?: CallOptions): Promise<this> { await this.acquire(false, false, opts); return this; }
  unlock(opts?: CallOptions): Promise<void> { return this.release(false, opts); }
  async rlock(opts?: CallOptions): Promise<this> { await this.acquire(true, true, opts); return this; }
  async tryRLock(opts?: CallOptions): Promise<this> { await this.acquire(true, false, opts); return this; }
  runlock(opts?: CallOptions): Promise<void> { return this.release(true, opts); }
}

/** ElectionLock exposes setValue to Election. */
export class ElectionLock extends Mutex {
  proclaim(value: Uint8Array, opts?: CallOptions) { return this.setValue(value, opts); }
}

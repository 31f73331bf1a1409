// MultiLock: several exclusive locks taken all at once (AcquireMany), decided
// by the server in one entry: granted whole or queued whole, never part of
// the set held while waiting for the rest, so sets taken in any order cannot
// deadlock among themselves.
import { type CallOptions } from "./client.js";
import { definitive, LockdError, toLockdError } from "./errors.js";
import { Mode } from "./gen/lockd/v1/lockd_pb.js";
import { duration } from "./lease.js";
import { type Ctx, ctxDone, ctxWithin, sleep } from "./retry.js";
import type { SeqReq } from "./seq.js";
import type { Session } from "./session.js";
import type { Mutex } from "./lock.js";

/** Options of a MultiLock. */
export interface MultiLockOptions {
  /** Small metadata kept with every hold of the set (at most 1 KiB). */
  value?: Uint8Array | string;
}

/** maxMultiLocks is the most locks one set takes (the server's limit). */
const maxMultiLocks = 32;
/** As in lock.ts: one queued request blocks at most this long on the server before it is repeated. */
const maxLongPoll = 25_000;
const waitRepeatPause = 100;

interface SetHold { tokens: Map<string, bigint>; ac: AbortController }

/** MultiLock takes exclusive locks on several names at once, one fencing token per name. Not re-entrant. */
export class MultiLock {
  readonly names: readonly string[];
  private readonly locks = new Map<string, Mutex>();
  private readonly value: Uint8Array;
  private readonly bad?: LockdError;
  private busy = false;
  private hold?: SetHold;

  constructor(readonly session: Session, names: string[], opts: MultiLockOptions = {}) {
    this.names = [...names];
    const v = opts.value;
    this.value = typeof v === "string" ? new TextEncoder().encode(v) : v ?? new Uint8Array();
    if (names.length < 2 || names.length > maxMultiLocks) {
      this.bad = new LockdError("invalid", `lockd: multi-lock ${JSON.stringify(names)}: takes 2 to ${maxMultiLocks} locks, not ${names.length}`);
    } else if (new Set(names).size !== names.length) {
      this.bad = new LockdError("invalid", `lockd: multi-lock ${JSON.stringify(names)}: a lock named twice`);
    }
    for (const n of names) this.locks.set(n, session.mutex(n));
  }

  /** tokens is the fencing token of each lock of the set still held, by name; empty when not held. */
  get tokens(): Map<string, bigint> {
    return new Map(this.hold?.tokens ?? []);
  }

  /** signal fires when the set's hold ends (unlock, lease lost). */
  get signal(): AbortSignal {
    if (this.hold) return this.hold.ac.signal;
    const ac = new AbortController();
    ac.abort(new LockdError("not_held", "lockd: multi-lock not held"));
    return ac.signal;
  }

  /** guard returns the tokens when the client still holds the set (lease deadline not passed), else throws. */
  guard(): Map<string, bigint> {
    const h = this.hold;
    if (!h || h.ac.signal.aborted) {
      throw h?.ac.signal.reason instanceof LockdError ? h.ac.signal.reason : new LockdError("not_held", `lockd: multi-lock ${JSON.stringify(this.names)} not held`);
    }
    this.session.live();
    return new Map(h.tokens);
  }

  /** lock waits until the server grants every lock of the set at once, or the signal/timeoutMs ends the wait (then it is withdrawn). */
  async lock(opts?: CallOptions): Promise<this> { await this.acquire(true, opts); return this; }

  /** tryLock takes every lock if all are free now; otherwise throws code "busy", holding none. */
  async tryLock(opts?: CallOptions): Promise<this> { await this.acquire(false, opts); return this; }

  private async acquire(wait: boolean, opts: CallOptions = {}): Promise<void> {
    if (this.bad) throw this.bad;
    const s = this.session;
    const c = s.client;
    s.live();
    if (this.hold || this.busy) throw new LockdError("already_held", `lockd: multi-lock ${JSON.stringify(this.names)} already held or waited for by this handle`);
    const ctx = ctxWithin({ signal: opts.signal }, opts.timeoutMs);
    if (ctxDone(ctx)) throw new LockdError(opts.signal?.aborted ? "cancelled" : "deadline", "lockd: call ended before it started");
    this.busy = true;
    const seq = s.seqs.begin();
    const key = this.names[0];
    try {
      const bctx = s.bind(ctx);
      for (;;) {
        let pollMs = 0;
        if (wait) {
          pollMs = maxLongPoll;
          if (ctx.deadline !== undefined) pollMs = Math.max(Math.min(pollMs, ctx.deadline - performance.now()), 1);
        }
        const msg = {
          sessionId: s.id, secret: s.secret, seq: seq.seq, ack: s.seqs.ack(), wait, value: this.value,
          locks: this.names.map((name) => ({ name, mode: Mode.EXCLUSIVE })),
          pollTimeout: wait ? duration(pollMs) : undefined,
        };
        let resp;
        try {
          // AcquireMany is unary only (docs/protocol.md).
          resp = await c.do(bctx, s.policy({ idempotent: true, pollMs }), key, (ep, sig) => c.rpc(ep, sig, (o) => ep.unary().acquireMany(msg, o)));
        } catch (e) {
          const err = toLockdError(e, key);
          if (s.err) throw s.err;
          if (err.code === "lease_lost") { s.lose(err); throw s.err!; }
          if (wait && !ctxDone(ctx) && err.code === "unavailable") {
            // The lease says the cluster is reachable enough: repeat with
            // the same seq, keeping the request's place.
            await sleep(waitRepeatPause, bctx.signal);
            if (s.err) throw s.err;
            continue;
          }
          if (ctxDone(ctx) || !definitive(err)) this.withdraw(seq);
          throw err;
        }
        if (resp.status === 1 /* GRANTED */) {
          const tokens = new Map<string, bigint>();
          for (const g of resp.grants) tokens.set(g.name, g.token);
          if (this.names.some((n) => !tokens.get(n))) {
            this.withdraw(seq);
            throw new LockdError("other", `lockd: multi-lock ${JSON.stringify(this.names)}: grant without a token for every lock`);
          }
          // Never report a grant after the session ended (the server drops
          // such holds with the session).
          s.live();
          const h: SetHold = { tokens, ac: new AbortController() };
          this.hold = h;
          const onEnd = () => h.ac.abort(s.signal.reason);
          s.signal.addEventListener("abort", onEnd, { once: true });
          h.ac.signal.addEventListener("abort", () => s.signal.removeEventListener("abort", onEnd), { once: true });
          return;
        }
        if (resp.status === 2 /* QUEUED */ && wait) continue;
        this.withdraw(seq);
        throw new LockdError("other", `lockd: multi-lock ${JSON.stringify(this.names)}: unexpected status ${resp.status}`);
      }
    } finally {
      this.busy = false;
      seq.end();
    }
  }

  /** withdraw drops the request on the server: a Cancel naming a lock of the set drops the whole queued request; if the set was granted meanwhile, a Cancel per lock releases each hold. Failures are retried in the background until the session ends. */
  private withdraw(acq: SeqReq) {
    const owned = acq.pass();
    if (!owned) return;
    const s = this.session;
    const all = async (ctx: Ctx) => { for (const n of this.names) await this.locks.get(n)!.cancelWait(owned.seq, ctx); };
    void all(ctxWithin({}, 2 * s.client.requestTimeoutMs)).then(() => owned.end(), (e) => {
      if (s.err || definitive(toLockdError(e))) return owned.end();
      s.keepTrying(() => all({}), () => owned.end());
    });
  }

  /** unlock releases every lock of the set still held; the set's signal fires first, so work under it stops before another holder may start. */
  async unlock(opts: CallOptions = {}): Promise<void> {
    const s = this.session;
    const h = this.hold;
    if (!h) throw new LockdError("not_held", `lockd: release ${JSON.stringify(this.names)}: not held`);
    this.hold = undefined;
    h.ac.abort(new LockdError("not_held", "lockd: multi-lock released"));
    if (s.err) throw s.err;
    const errs: LockdError[] = [];
    for (const [n, token] of h.tokens) {
      const l = this.locks.get(n)!;
      try {
        await l.releaseToken(token, ctxWithin({ signal: opts.signal }, opts.timeoutMs));
      } catch (e) {
        const err = toLockdError(e, n);
        if (s.err) throw s.err;
        if (!definitive(err)) s.keepTrying(() => l.releaseToken(token, {}));
        errs.push(err);
      }
    }
    if (errs.length) throw errs[0];
  }
}

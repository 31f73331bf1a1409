// The retry loop every call goes through: which endpoint to try, how long
// an attempt may take, which failures are retried, leader hints, the
// cluster-id check. It follows the Go client's rules (rpc.go, retry.go).
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorReason } from "./gen/lockd/v1/lockd_pb.js";
import { detailOf, LockdError, toLockdError } from "./errors.js";
import { now } from "./lease.js";

/** Policy says how one call may be retried and how long its attempts may take. */
export interface Policy {
  /** The server deduplicates the request (a read, or a mutation with a seq or request id): a resend after an unknown outcome is safe. */
  idempotent: boolean;
  /** Caps each attempt's request part below the request timeout. */
  timeoutMs?: number;
  /** Added to each attempt's time: the long poll the server may block for. */
  pollMs?: number;
  /** A time (monotonic ms) past which no attempt runs: the session's lease deadline. */
  until?: () => number;
  /** A single attempt (and one immediate retry after a leader hint or a broken stream): the keepalive loop runs its own schedule. */
  once?: boolean;
  /** An attempt that times out abandons the endpoint's stream (a keepalive overdue means the node stopped answering), so the calls pending on it are re-sent elsewhere. */
  abandon?: boolean;
}

/** Ctx is a call's cancellation: an AbortSignal and an optional deadline (monotonic ms). */
export interface Ctx {
  signal?: AbortSignal;
  /** A second signal (the session's), so a call needs no AbortSignal.any (costly in Node 20). */
  also?: AbortSignal;
  deadline?: number;
}

/** Errors the retry loop knows how to treat; a stream's broken call carries streamBroken. */
export const streamBroken = Symbol("lockd.streamBroken");

const backoffBase = 50;
const backoffCap = 2000;
const electionPoll = 200;
const minAttempt = 10;

/** delay is exponential backoff with full jitter. */
export function delay(attempt: number, base = backoffBase, cap = backoffCap): number {
  return Math.random() * Math.min(cap, base * 2 ** Math.min(attempt, 30));
}

/** sleep waits ms, or until signal fires (then it resolves early). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

function causeChain(err: unknown): unknown[] {
  const out: unknown[] = [];
  for (let e: any = err; e && out.length < 8; e = e.cause) out.push(e);
  return out;
}

function sysCode(err: unknown): string | undefined {
  for (const e of causeChain(err)) {
    const c = (e as any)?.code;
    if (typeof c === "string" && c.startsWith("E")) return c;
  }
  return undefined;
}

/** isRefused: nothing listens at the endpoint. */
export const isRefused = (err: unknown) => sysCode(err) === "ECONNREFUSED";

/** resetConn: the connection was reset or its pipe broke before an answer (connect-node reports it as Aborted or Internal, not as a server's answer). */
export const resetConn = (err: unknown) => { const c = sysCode(err); return c === "ECONNRESET" || c === "EPIPE"; };

/** notSent: the request surely never reached a server. */
export function notSent(err: unknown): boolean {
  const c = sysCode(err);
  return c === "ECONNREFUSED" || c === "ENOTFOUND" || c === "EAI_AGAIN" || c === "EHOSTUNREACH" || c === "ENETUNREACH";
}

/** unanswered: the attempt got no answer from a server (the connection failed or broke first). */
export function unanswered(err: unknown): boolean {
  if (detailOf(err) || (err instanceof LockdError && err.code === "cluster_mismatch")) return false;
  if (!(err instanceof ConnectError)) return true;
  if (resetConn(err)) return true;
  switch (err.code) {
    case Code.Unavailable: case Code.Unknown: case Code.DeadlineExceeded: return true;
    case Code.Canceled: { const c = sysCode(err); return c === "ECONNRESET" || c === "EPIPE"; }
  }
  return false;
}

/**
 * retryable reports whether a failed attempt may be retried under the
 * given idempotency, and the leader the server named, if any (a server may
 * name it in any answer; the client goes there next).
 */
export function retryable(err: unknown, idempotent: boolean, timedOut: boolean): [boolean, string] {
  if (err instanceof LockdError && err.code === "cluster_mismatch") return [true, ""];
  const d = detailOf(err);
  let hint = "";
  if (d) {
    hint = d.leaderApi;
    switch (d.reason) {
      case ErrorReason.NOT_LEADER: case ErrorReason.NO_LEADER: return [true, hint]; // not taken
      case ErrorReason.OUTCOME_UNKNOWN: return [idempotent, hint];
      case ErrorReason.UNSPECIFIED: break;
      default: return [false, hint];
    }
  }
  if (timedOut) return [idempotent, hint];
  if ((err as any)?.[streamBroken]) return [idempotent, hint];
  if (!(err instanceof ConnectError)) return [idempotent || notSent(err), hint];
  if (!d && resetConn(err)) return [idempotent, hint];
  switch (err.code) {
    case Code.Unavailable: case Code.Unknown: case Code.DeadlineExceeded: case Code.Canceled:
      return [idempotent || notSent(err), hint];
  }
  return [false, hint];
}

/** electionUnderWay: a live node answered that it knows no leader (no hint). */
export function electionUnderWay(err: unknown): boolean {
  const d = detailOf(err);
  return !!d && !d.leaderApi && (d.reason === ErrorReason.NOT_LEADER || d.reason === ErrorReason.NO_LEADER);
}

/** attemptTimeout returns how long the next attempt may take. */
export function attemptTimeout(requestTimeoutMs: number, p: Policy, ctx: Ctx, others: boolean, connectLeft = -1): number {
  let d = requestTimeoutMs;
  if (p.timeoutMs && p.timeoutMs > 0) d = Math.min(d, p.timeoutMs);
  if (p.until) d = Math.min(d, p.until() - now());
  if (ctx.deadline !== undefined && others) d = Math.min(d, (ctx.deadline - now()) / 2);
  if (connectLeft >= 0) d = Math.min(d, connectLeft); // the connect timeout's rest, while nobody answered
  return Math.max(d, minAttempt) + (p.pollMs ?? 0);
}

/** ctxError is the error of a call whose ctx ended: deadline or cancelled. */
export function ctxError(ctx: Ctx, last?: unknown): LockdError {
  const deadline = ctx.deadline !== undefined && now() >= ctx.deadline - 1;
  const reason = ctx.also?.aborted ? ctx.also.reason : ctx.signal?.reason;
  if (reason instanceof LockdError) return reason;
  const e = deadline || (reason as any)?.name === "TimeoutError"
    ? new LockdError("deadline", "lockd: deadline exceeded", { cause: last })
    : new LockdError("cancelled", "lockd: call cancelled", { cause: last });
  return e;
}

/** ctxDone reports whether ctx has ended. */
export const ctxDone = (ctx: Ctx) => !!ctx.signal?.aborted || !!ctx.also?.aborted || (ctx.deadline !== undefined && now() >= ctx.deadline);

/** withTimeout returns a Ctx whose signal also fires after ms (and a disposer). */
export function ctxWithin(parent: Ctx, ms: number | undefined): Ctx {
  if (ms === undefined || ms < 0) return parent;
  const deadline = Math.min(parent.deadline ?? Infinity, now() + ms);
  const t = AbortSignal.timeout(Math.max(0, Math.ceil(deadline - now())));
  return { signal: parent.signal ? AbortSignal.any([parent.signal, t]) : t, also: parent.also, deadline };
}

export { toLockdError };

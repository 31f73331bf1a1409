// Errors: every error the client throws is a LockdError whose `code` says
// what happened, mapped from the server's ErrorDetail reason first and its
// Connect code second (the same mapping as the Go client's sentinels).
import { Code, ConnectError } from "@connectrpc/connect";
import { type ErrorDetail, ErrorDetailSchema, ErrorReason, Mode, type Holder as PbHolder } from "./gen/lockd/v1/lockd_pb.js";

/** What went wrong. */
export type ErrorCode =
  | "busy" // the lock is not free and the call did not wait
  | "not_held" // the lock is not held (or no longer a grant of the session)
  | "lease_lost" // the session's lease is gone, or may be gone
  | "session_closed" // the session was closed
  | "already_held" // the session already holds or waits for the lock
  | "limit_mismatch" // the lock exists with another number of permits
  | "invalid" // a bad argument
  | "unavailable" // no endpoint could serve the call in time
  | "cluster_mismatch" // an endpoint belongs to another cluster
  | "wait_dropped" // the server dropped the queued wait
  | "too_many" // a server limit was reached
  | "rate_limited" // a per-identity rate limit was reached
  | "done" // the lock's job was completed (run once)
  | "permission_denied" // wrong session secret, or the identity may not
  | "unauthenticated" // no or unknown bearer token
  | "no_leader" // an election has no leader
  | "watch_reset" // a watch lost events; re-read the state
  | "hold_expired" // the hold's budget ran out (maxHoldMs): the client stopped believing in it
  | "deadlock" // the wait would close a cycle of sessions waiting for each other; nothing was queued
  | "deadline" // the call's timeout ran out
  | "cancelled" // the call's AbortSignal fired
  | "closed" // the Client was closed
  | "other";

/** One holder of a lock, as a busy error names it. */
export interface Holder {
  sessionId: string;
  owner: string;
  shared: boolean;
  token: bigint;
  value: Uint8Array;
}

/** Who completed a run-once job (code "done"). */
export interface Mark {
  sessionId: string;
  owner: string;
  token: bigint;
  completedAt?: Date;
}

/** LockdError is every error the client throws; test `code`. */
export class LockdError extends Error {
  readonly code: ErrorCode;
  /** For "busy": the current holders (may be truncated). */
  holders: Holder[] = [];
  /** For "done": who completed the job. */
  mark?: Mark;
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = "LockdError";
  }
}

/** resetConn: a connection reset or broken pipe in err's cause chain. */
function resetConn(err: unknown): boolean {
  for (let e: any = err, i = 0; e && i < 8; e = e.cause, i++) if (e?.code === "ECONNRESET" || e?.code === "EPIPE") return true;
  return false;
}

/** detailOf returns the lockd ErrorDetail a server error carries, if any. */
export function detailOf(err: unknown): ErrorDetail | undefined {
  if (!(err instanceof ConnectError)) return undefined;
  try {
    return err.findDetails(ErrorDetailSchema)[0];
  } catch {
    return undefined;
  }
}

const reasonCodes: Partial<Record<ErrorReason, ErrorCode>> = {
  [ErrorReason.INVALID_ARGUMENT]: "invalid",
  [ErrorReason.SESSION_NOT_FOUND]: "lease_lost",
  [ErrorReason.SESSION_REVOKED]: "lease_lost",
  [ErrorReason.BUSY]: "busy",
  [ErrorReason.ALREADY_HELD]: "already_held",
  [ErrorReason.NOT_HELD]: "not_held",
  [ErrorReason.LIMIT_MISMATCH]: "limit_mismatch",
  [ErrorReason.NOT_LEADER]: "unavailable",
  [ErrorReason.NO_LEADER]: "unavailable",
  [ErrorReason.OUTCOME_UNKNOWN]: "unavailable",
  [ErrorReason.WAIT_DROPPED]: "wait_dropped",
  [ErrorReason.TOO_MANY]: "too_many",
  [ErrorReason.ALREADY_DONE]: "done",
  [ErrorReason.PERMISSION_DENIED]: "permission_denied",
  [ErrorReason.UNAUTHENTICATED]: "unauthenticated",
  [ErrorReason.RATE_LIMITED]: "rate_limited",
  [ErrorReason.DEADLOCK]: "deadlock",
};

const connectCodes: Partial<Record<Code, ErrorCode>> = {
  [Code.InvalidArgument]: "invalid",
  [Code.NotFound]: "lease_lost",
  [Code.AlreadyExists]: "already_held",
  [Code.Unavailable]: "unavailable",
  [Code.Aborted]: "wait_dropped",
  [Code.ResourceExhausted]: "too_many",
  [Code.PermissionDenied]: "permission_denied",
  [Code.Unauthenticated]: "unauthenticated",
  [Code.DeadlineExceeded]: "unavailable",
};

/** toLockdError maps any error of a call to a LockdError. name: the lock concerned. */
export function toLockdError(err: unknown, name = ""): LockdError {
  if (err instanceof LockdError) return err;
  if (!(err instanceof ConnectError)) {
    return new LockdError("other", String((err as Error)?.message ?? err), { cause: err });
  }
  const d = detailOf(err);
  let code: ErrorCode = (d && reasonCodes[d.reason]) || connectCodes[err.code] || "other";
  if (!d && resetConn(err)) code = "unavailable"; // a broken connection, not the server's "wait dropped"
  const what = name ? `lock "${name}": ` : "";
  const e = new LockdError(code, `lockd: ${code.replace("_", " ")}: ${what}${err.rawMessage}`, { cause: err });
  if (d && code === "busy") e.holders = d.holders.map(holderOf);
  if (d?.mark && code === "done") {
    const m = d.mark;
    e.mark = { sessionId: m.sessionId, owner: m.owner, token: m.token };
    if (m.completedAt) e.mark.completedAt = new Date(Number(m.completedAt.seconds) * 1000 + m.completedAt.nanos / 1e6);
  }
  return e;
}

function holderOf(h: PbHolder): Holder {
  return { sessionId: h.sessionId, owner: h.owner, shared: h.mode === Mode.SHARED, token: h.token, value: h.value };
}

/**
 * definitive reports whether err is a refusal the server decided on, so
 * that the request is surely not queued or granted (or, for closed and
 * cluster_mismatch, no retry can ever reach the cluster).
 */
export function definitive(err: LockdError): boolean {
  switch (err.code) {
    case "busy": case "invalid": case "already_held": case "limit_mismatch": case "wait_dropped":
    case "too_many": case "rate_limited": case "not_held": case "closed": case "cluster_mismatch": case "done": case "deadlock":
      return true;
  }
  return false;
}

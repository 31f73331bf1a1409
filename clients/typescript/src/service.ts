// The raw API (Client.service, Client.clusterService): the calls the
// client does not wrap, each through the client's retry loop (failover,
// leader hints, the cluster-id check, LockdError). Which calls may be
// re-sent after an unknown outcome follows the server's method table
// (internal/rpcs): reads always; ClearMark with its mark's token and
// SetValue with its seq (the server deduplicates them); ForceRelease and
// TransferLeadership never (a second one would act again).
import type { Client as RpcClient } from "@connectrpc/connect";
import type { ClusterService, LockService } from "./gen/lockd/v1/lockd_pb.js";
import type { CallOptions, Client } from "./client.js";

type L = RpcClient<typeof LockService>;
type C = RpcClient<typeof ClusterService>;
type Raw<S, K extends keyof S> = S[K] extends (req: infer Q, ...rest: any[]) => infer R ? (req: Q, opts?: CallOptions) => R : never;

/** LockServiceRaw is the raw lock API: each call takes the request message (or its fields) and per-call options. */
export interface LockServiceRaw {
  /** Every session, or those of an owner: needs read on every name. */
  listSessions: Raw<L, "listSessions">;
  /** The locks under a prefix, held or waited for. */
  listLocks: Raw<L, "listLocks">;
  /** Releases a lock whoever holds it (admin); not re-sent after an unknown outcome. */
  forceRelease: Raw<L, "forceRelease">;
  /** Clears a run-once mark so the job may run again (admin); re-sent only with the mark's token. */
  clearMark: Raw<L, "clearMark">;
  /** Changes the value of a hold of the session (with its secret and a seq). */
  setValue: Raw<L, "setValue">;
  checkToken: Raw<L, "checkToken">;
  describeLock: Raw<L, "describeLock">;
  status: Raw<L, "status">;
}

/** ClusterServiceRaw is the raw membership API. */
export interface ClusterServiceRaw {
  join: Raw<C, "join">;
  removeMember: Raw<C, "removeMember">;
  /** Not re-sent after an unknown outcome: a second one would move leadership again. */
  transferLeadership: Raw<C, "transferLeadership">;
}

type Req = Record<string, unknown> | undefined;
const always = () => true;
const never = () => false;
/** has: the request carries a non-zero dedup field. */
const has = (field: string) => (r: Req) => { const v = r?.[field]; return v !== undefined && v !== 0n && v !== 0 && v !== ""; };
const field = (f: string) => (r: Req) => String(r?.[f] ?? "");

function method(c: Client, svc: (ep: any) => any, k: string, idempotent: (r: Req) => boolean, subject: (r: Req) => string) {
  return (req: Req, opts: CallOptions = {}) =>
    c.call({ idempotent: idempotent(req) }, subject(req), opts, (ep, signal) => c.rpc(ep, signal, (o) => svc(ep)[k](req, o)));
}

/** lockService builds Client.service(). */
export function lockService(c: Client): LockServiceRaw {
  const u = (ep: any) => ep.unary();
  const none = () => "";
  return {
    listSessions: method(c, u, "listSessions", always, none),
    listLocks: method(c, u, "listLocks", always, field("prefix")),
    forceRelease: method(c, u, "forceRelease", never, field("name")),
    clearMark: method(c, u, "clearMark", has("token"), field("name")),
    setValue: method(c, u, "setValue", has("seq"), field("name")),
    checkToken: method(c, u, "checkToken", always, field("name")),
    describeLock: method(c, u, "describeLock", always, field("name")),
    status: method(c, u, "status", always, none),
  } as unknown as LockServiceRaw;
}

/** clusterService builds Client.clusterService(). */
export function clusterService(c: Client): ClusterServiceRaw {
  const cl = (ep: any) => ep.cluster;
  const none = () => "";
  return {
    join: method(c, cl, "join", always, none),
    removeMember: method(c, cl, "removeMember", always, none),
    transferLeadership: method(c, cl, "transferLeadership", never, none),
  } as unknown as ClusterServiceRaw;
}

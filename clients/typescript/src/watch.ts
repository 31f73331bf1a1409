// Watch: the events of the locks under a prefix, from any node, resumed by
// position after a broken stream so that no event is lost, repeated or
// reordered; a reset event says events were lost all the same.
import { Code, ConnectError } from "@connectrpc/connect";
import { EventKind, Mode } from "./gen/lockd/v1/lockd_pb.js";
import { type Client, clusterIdHeader } from "./client.js";
import { LockdError, toLockdError } from "./errors.js";
import { delay, sleep } from "./retry.js";
import { tlsError, tlsRefusal } from "./tls.js";

export { EventKind };

/** Options of a watch. */
export interface WatchOptions {
  /** Resume after this position (an event's `position`). */
  from?: string;
  /** Start with the state: a HELD event per hold, then SYNCED, and again after every reset. */
  state?: boolean;
  /** Ends the watch (the iterator returns). */
  signal?: AbortSignal;
}

/** WatchEvent is one change of one lock, in the order the cluster's log applied it. */
export interface WatchEvent {
  /** Opaque cursor: pass as `from` to resume after this event. */
  position: string;
  kind: EventKind;
  /** The kind's name: GRANTED, RELEASED, EXPIRED, QUEUED, …, RESET, HELD, SYNCED. */
  kindName: string;
  name: string;
  session: string;
  owner: string;
  token: bigint;
  shared: boolean;
  limit: number;
  value: Uint8Array;
  /** Set on the last event of its log entry: show a state only there. */
  entryEnd: boolean;
}

/** watchIdle: a stream silent this long is taken for dead (the server sends a keepalive every 15 s). */
const watchIdle = 40_000;

export async function* watch(c: Client, prefix: string, opts: WatchOptions): AsyncGenerator<WatchEvent> {
  let cursor = opts.from ?? "";
  const state = !!opts.state;
  let attempt = 0;
  for (let round = 0; ; round++) {
    if (opts.signal?.aborted || c.closed) return;
    const ep = c.eps[round % c.eps.length];
    const ac = new AbortController();
    const stop = () => ac.abort();
    opts.signal?.addEventListener("abort", stop, { once: true });
    let idle = setTimeout(stop, watchIdle).unref();
    let got = false;
    let err: unknown;
    let cluster = "";
    try {
      const st = ep.watch.watch({ prefix, from: cursor, state }, { signal: ac.signal, onHeader: (h) => { cluster = h.get(clusterIdHeader) ?? ""; } });
      for await (const m of st) {
        if (!got) c.checkCluster(ep, cluster);
        got = true;
        clearTimeout(idle);
        idle = setTimeout(stop, watchIdle).unref();
        if (m.kind === EventKind.UNSPECIFIED) {
          if (m.position) cursor = m.position; // a keepalive: where the stream is
          continue;
        }
        // A state dump is whole only at its SYNCED: the cursor stays
        // before it, so a stream broken midway starts the dump again.
        if (!(state && (m.kind === EventKind.HELD || m.kind === EventKind.RESET))) cursor = m.position;
        yield {
          position: m.position, kind: m.kind, kindName: EventKind[m.kind] ?? String(m.kind), name: m.name, session: m.session,
          owner: m.owner, token: m.token, shared: m.mode === Mode.SHARED, limit: m.limit, value: m.value, entryEnd: m.entryEnd,
        };
      }
      err = new Error("watch stream ended");
    } catch (e) {
      err = e;
    } finally {
      clearTimeout(idle);
      opts.signal?.removeEventListener("abort", stop);
      ac.abort();
    }
    if (opts.signal?.aborted) return;
    // A TLS misconfiguration: no reconnect heals it.
    if (tlsRefusal(err)) throw tlsError(err, ep.url);
    if (!got) { const refusal = await c.tlsRefused(ep, err); if (refusal) throw refusal; }
    if (err instanceof ConnectError) {
      if (err.code === Code.InvalidArgument) throw new LockdError("invalid", `lockd: watch "${prefix}": ${err.rawMessage}`, { cause: err });
      if (err.code === Code.Unauthenticated || err.code === Code.PermissionDenied) throw toLockdError(err);
    }
    c.log("debug", "watch stream broke; resuming", { endpoint: ep.url, err: String(err) });
    attempt = got ? 0 : attempt + 1;
    await sleep(delay(attempt), opts.signal);
  }
}

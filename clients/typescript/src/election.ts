// Election: the leader is the holder of the exclusive lock of the
// election's name; candidates wait in the server's FIFO queue, so
// leadership passes in campaign order, only at resign or lease loss.
import type { CallOptions, Client } from "./client.js";
import { LockdError } from "./errors.js";
import { ElectionLock } from "./lock.js";
import type { Session } from "./session.js";
import { EventKind } from "./watch.js";

/** Leader is who leads an election; token 0n means there is no leader. */
export interface Leader {
  sessionId: string;
  owner: string;
  value: Uint8Array;
  token: bigint;
}

const enc = (v: Uint8Array | string) => (typeof v === "string" ? new TextEncoder().encode(v) : v);

export class Election {
  private m?: ElectionLock;
  private campaigning = false;
  constructor(readonly session: Session, readonly name: string) {}

  /** campaign waits until this session leads, announcing value; when opts end first the campaign is withdrawn. */
  async campaign(value: Uint8Array | string, opts?: CallOptions): Promise<this> {
    if (this.campaigning || this.m?.held) throw new LockdError("already_held", `lockd: campaign "${this.name}": already campaigning or leading`);
    const m = new ElectionLock(this.session, this.name, { value: enc(value) });
    this.m = m;
    this.campaigning = true;
    try {
      await m.lock(opts);
      return this;
    } finally {
      this.campaigning = false;
    }
  }

  /** resign gives up leadership; the next candidate becomes the leader. */
  async resign(opts?: CallOptions): Promise<void> {
    if (!this.m) throw new LockdError("not_held", `lockd: resign "${this.name}": not the leader`);
    await this.m.unlock(opts);
  }

  /** proclaim replaces the value this leader announced, without giving up leadership. */
  async proclaim(value: Uint8Array | string, opts?: CallOptions): Promise<void> {
    if (!this.m) throw new LockdError("not_held", `lockd: proclaim "${this.name}": not the leader`);
    await this.m.proclaim(enc(value), opts);
  }

  /** token is this session's leadership token, 0n when not leading. */
  get token(): bigint { return this.m?.token ?? 0n; }
  /** signal fires when this session's leadership ends. */
  get signal(): AbortSignal { return this.m?.signal ?? AbortSignal.abort(new LockdError("not_held", "not the leader")); }
  /** guard returns the token while this session leads (lease live), else throws. */
  guard(): bigint {
    if (!this.m) throw new LockdError("not_held", `lockd: not the leader of "${this.name}"`);
    return this.m.guard();
  }

  /** leader returns the current leader (linearizable), or throws code "no_leader". */
  async leader(opts?: CallOptions): Promise<Leader> {
    const r = await this.session.client.describeLock(this.name, opts);
    const h = r.lock?.holders[0];
    if (!h) throw new LockdError("no_leader", `lockd: election "${this.name}" has no leader`);
    return { sessionId: h.sessionId, owner: h.owner, value: h.value, token: h.token };
  }

  /** observe yields the leader now and at each change (token 0n: none). */
  observe(opts: { signal?: AbortSignal } = {}): AsyncGenerator<Leader> {
    return observeElection(this.session.client, this.name, opts);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (this.m?.held) await this.resign().catch(() => {});
  }
}

/** observeElection yields the leader of the election on name now and at each change, in the order the cluster decided them; it needs no session. */
export async function* observeElection(c: Client, name: string, opts: { signal?: AbortSignal } = {}): AsyncGenerator<Leader> {
  const none = (): Leader => ({ sessionId: "", owner: "", value: new Uint8Array(), token: 0n });
  let next = none(), last = none();
  let synced = false, yielded = false;
  for await (const ev of c.watch(name, { state: true, signal: opts.signal })) {
    if (ev.name !== name && ev.kind !== EventKind.RESET && ev.kind !== EventKind.SYNCED) continue;
    switch (ev.kind) {
      case EventKind.RESET: synced = false; next = none(); continue;
      case EventKind.HELD: case EventKind.GRANTED:
        next = { sessionId: ev.session, owner: ev.owner, value: ev.value, token: ev.token }; break;
      case EventKind.VALUE_CHANGED:
        if (ev.token === next.token) next = { ...next, value: ev.value }; break;
      case EventKind.RELEASED: case EventKind.EXPIRED: case EventKind.FORCE_RELEASED: case EventKind.COMPLETED:
        if (ev.token === next.token) next = none(); break;
      case EventKind.SYNCED: synced = true; break;
      default: continue;
    }
    if (!synced || (ev.kind !== EventKind.SYNCED && !ev.entryEnd)) continue;
    if (yielded && next.token === last.token && Buffer.compare(Buffer.from(next.value), Buffer.from(last.value)) === 0) continue;
    last = next;
    yielded = true;
    yield next;
  }
}

// The session stream: one HTTP/2 stream per (Client, endpoint) carrying
// every session-scoped call as a frame (SessionService.Stream), instead of
// one HTTP exchange per call. It is transport only: the retry loop runs
// above it unchanged, a broken stream fails its pending calls with an
// "outcome unknown" error that the loop re-sends with the same seq, and an
// endpoint where no stream can be opened (a proxy that does not pass
// HTTP/2, an old server) is used over unary HTTP/1.1 for a minute.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { type StreamError, type StreamRequest, StreamRequestSchema, type StreamResponse } from "./gen/lockd/v1/lockd_pb.js";
import { ErrorDetailSchema } from "./gen/lockd/v1/lockd_pb.js";
import type { Client, Endpoint } from "./client.js";
import { now } from "./lease.js";
import { notSent, streamBroken } from "./retry.js";
import { H2Bidi } from "./wire.js";

/** unaryFor: an endpoint where no stream could be opened is used unary only for this long. */
const unaryFor = 60_000;
/** maxStreamAcquires bounds the Acquires (long polls) in flight on one stream: half of what the server serves at once per stream (256), so a KeepAlive, Release or Cancel never waits behind them. */
const maxStreamAcquires = 128;

type Body = NonNullable<MessageInitShape<typeof StreamRequestSchema>["body"]>;

/** brokenError is the error of a call cut by a broken stream: outcome unknown, re-sent with its seq. */
function brokenError(url: string, cause: unknown): ConnectError {
  const e = new ConnectError(`session stream to ${url} broke; outcome unknown: ${(cause as Error)?.message ?? cause}`, Code.Unavailable, undefined, undefined, cause);
  (e as any)[streamBroken] = true;
  return e;
}

/** fromStreamError rebuilds the ConnectError a unary call would have thrown. */
export function fromStreamError(e: StreamError): ConnectError {
  const details = e.detail ? [{ desc: ErrorDetailSchema, value: e.detail }] : [];
  return new ConnectError(e.message, e.code as Code, undefined, details);
}

/** Stream is one open session stream. */
export class Stream {
  private readonly pending = new Map<bigint, { resolve: (r: StreamResponse) => void; reject: (e: unknown) => void }>();
  private nextId = 0n;
  private acquires = 0;
  private acquireWaiters: (() => void)[] = [];
  err: unknown;
  constructor(private readonly slot: StreamSlot, private readonly c: Client) {}

  private wire?: H2Bidi;
  private hello?: (e?: unknown) => void;
  private ended?: () => void;
  private readonly endedP = new Promise<void>((r) => { this.ended = r; });

  /** dial opens the stream and waits for the server's first frame (call_id 0). */
  async dial(timeoutMs: number, signal?: AbortSignal): Promise<void> {
    const ep = this.slot.ep;
    const opened = new Promise<void>((res, rej) => { this.hello = (e) => (e ? rej(e) : res()); });
    this.wire = new H2Bidi(ep.url, ep.dial, this.c.streamHeaders, (m) => this.message(m), (e) => { this.hello?.(e ?? new Error("stream ended")); this.ended?.(); this.fail(e); });
    let timer: NodeJS.Timeout | undefined;
    const abort = () => this.wire?.end(new ConnectError("open session stream: aborted", Code.Canceled));
    signal?.addEventListener("abort", abort, { once: true });
    try {
      this.wire.open();
      await Promise.race([
        opened,
        new Promise<never>((_, rej) => { timer = setTimeout(() => { rej(new ConnectError(`open session stream to ${ep.url}: no answer within ${timeoutMs} ms`, Code.Unavailable)); }, timeoutMs); }),
      ]);
    } catch (e) {
      this.wire.end(e);
      throw e;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", abort);
    }
  }

  private message(r: StreamResponse) {
    if (this.hello) {
      const h = this.hello;
      this.hello = undefined;
      try { this.c.checkCluster(this.slot.ep, r.clusterId); } catch (e) { h(e); return; }
      h();
      return;
    }
    const p = this.pending.get(r.callId);
    if (p) { this.pending.delete(r.callId); p.resolve(r); }
  }

  /** fail ends the stream: every pending call fails with an outcome-unknown error, and the endpoint's next call opens a new stream. */
  fail(cause: unknown) {
    if (this.err) return;
    this.err = cause;
    this.wire?.end(cause);
    for (const [, p] of this.pending) p.reject(brokenError(this.slot.ep.url, cause));
    this.pending.clear();
    for (const w of this.acquireWaiters) w();
    this.acquireWaiters = [];
    this.slot.dropped(this);
  }

  /** call sends one request and waits for its answer, the stream's end or signal. */
  async call(body: Body, signal: AbortSignal): Promise<StreamResponse> {
    const isAcquire = body.case === "acquire";
    if (isAcquire) {
      while (this.acquires >= maxStreamAcquires && !this.err && !signal.aborted) {
        await new Promise<void>((r) => { this.acquireWaiters.push(r); signal.addEventListener("abort", () => r(), { once: true }); });
      }
      this.acquires++;
    }
    try {
      if (this.err) throw brokenError(this.slot.ep.url, this.err);
      if (signal.aborted) throw new ConnectError("call aborted", Code.Canceled);
      const id = ++this.nextId;
      const answer = new Promise<StreamResponse>((resolve, reject) => this.pending.set(id, { resolve, reject }));
      const onAbort = () => {
        const p = this.pending.get(id);
        this.pending.delete(id);
        p?.reject(new ConnectError("call aborted", Code.Canceled));
      };
      signal.addEventListener("abort", onAbort, { once: true });
      try {
        this.wire!.send(create(StreamRequestSchema, { callId: id, body }));
      } catch (e) {
        this.fail(e);
      }
      try {
        const r = await answer;
        if (r.body.case === "error") throw fromStreamError(r.body.value);
        return r;
      } finally {
        signal.removeEventListener("abort", onAbort);
      }
    } finally {
      if (isAcquire) {
        this.acquires--;
        this.acquireWaiters.shift()?.();
      }
    }
  }

  /** close ends the request side and waits (up to 1 s) for the server to end the stream, so the connection can be closed cleanly. */
  async close() {
    this.wire?.closeSend();
    let t: NodeJS.Timeout | undefined;
    await Promise.race([this.endedP, new Promise((r) => { t = setTimeout(r, 1000); })]);
    clearTimeout(t);
    this.fail(new Error("client closed"));
  }
}

/** StreamSlot is an endpoint's stream state. */
export class StreamSlot {
  private cur?: Stream;
  private opening?: Promise<Stream | undefined>;
  private unaryTill = 0;
  constructor(readonly ep: Endpoint) {}

  isOpen(): boolean {
    return !!this.cur;
  }

  /** get returns the endpoint's open stream, opening one if needed; undefined: send unary. */
  async get(c: Client, signal: AbortSignal): Promise<Stream | undefined> {
    for (;;) {
      if (this.cur) return this.cur;
      if (!this.ep.sessions || now() < this.unaryTill || c.closed) return undefined;
      if (this.opening) {
        await Promise.race([this.opening.catch(() => undefined), new Promise((r) => signal.addEventListener("abort", r, { once: true }))]);
        if (signal.aborted) throw new ConnectError("open session stream: aborted", Code.Canceled);
        if (!this.cur && !this.opening) {
          // The open failed; this caller tries itself (below) unless the endpoint went unary.
        }
        continue;
      }
      const s = new Stream(this, c);
      this.opening = s.dial(c.requestTimeoutMs, signal).then(() => s);
      try {
        await this.opening;
        if (c.closed) { void s.close(); return undefined; }
        this.cur = s;
        return s;
      } catch (e) {
        if (e instanceof ConnectError && (e.code === Code.Unavailable || e.code === Code.Canceled || e.code === Code.DeadlineExceeded) || notSent(e)) {
          // The connection failed, not an answer without a stream: retry, not unary.
          throw e instanceof ConnectError ? e : new ConnectError(`open session stream to ${this.ep.url}: ${(e as Error).message}`, Code.Unavailable, undefined, undefined, e);
        }
        if ((e as any)?.code === "cluster_mismatch") throw e;
        c.log("info", "session stream unavailable, using unary calls", { endpoint: this.ep.url, err: String(e) });
        this.unaryTill = now() + unaryFor;
        return undefined;
      } finally {
        this.opening = undefined;
      }
    }
  }

  dropped(s: Stream) {
    if (this.cur === s) this.cur = undefined;
  }

  /** abandon fails the open stream (a node that did not answer in time): its pending calls are re-sent elsewhere. */
  abandon() {
    this.cur?.fail(new Error("endpoint did not answer in time"));
  }

  async close() {
    await this.cur?.close();
  }
}

// The session stream's wire: the Connect streaming protocol
// (application/connect+proto) over one node:http2 request, written here
// rather than through connect-es's generic stream pipeline, which costs
// several promises and async-iterator steps per frame: the stream carries
// every acquire and release, so its per-frame cost is most of the
// client's CPU. Each message is an envelope: 1 flag byte, a 4-byte
// big-endian length, the protobuf bytes; flag 0x02 marks the end-of-stream
// message, JSON, that carries the error if the call failed.
import { connect as h2connect, type ClientHttp2Session, type ClientHttp2Stream, constants } from "node:http2";
import type { Socket } from "node:net";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { type StreamRequest, StreamRequestSchema, type StreamResponse, StreamResponseSchema } from "./gen/lockd/v1/lockd_pb.js";

const codeOf: Record<string, Code> = {
  canceled: Code.Canceled, unknown: Code.Unknown, invalid_argument: Code.InvalidArgument, deadline_exceeded: Code.DeadlineExceeded,
  not_found: Code.NotFound, already_exists: Code.AlreadyExists, permission_denied: Code.PermissionDenied, resource_exhausted: Code.ResourceExhausted,
  failed_precondition: Code.FailedPrecondition, aborted: Code.Aborted, out_of_range: Code.OutOfRange, unimplemented: Code.Unimplemented,
  internal: Code.Internal, unavailable: Code.Unavailable, data_loss: Code.DataLoss, unauthenticated: Code.Unauthenticated,
};

/** maxFrame bounds an incoming message (the server's frames are small). */
const maxFrame = 4 << 20;

/** H2Bidi is one SessionService.Stream call. */
export class H2Bidi {
  private session?: ClientHttp2Session;
  private req?: ClientHttp2Stream;
  private buf: Buffer = Buffer.alloc(0);
  private ended = false;
  private pinger?: NodeJS.Timeout;
  private answered = false;

  /**
   * failure is the error of a connection or call that failed. An HTTP/2
   * protocol error before any response means something answered that does
   * not speak HTTP/2 (a proxy passing only HTTP/1.1): no stream here, use
   * unary calls (Unimplemented). Anything else is a failed connection: retry.
   */
  private failure(e: Error & { code?: string }): ConnectError {
    const noH2 = !this.answered && typeof e.code === "string" && /^ERR_HTTP2_(ERROR|SESSION_ERROR|STREAM_ERROR|INVALID_SESSION)$/.test(e.code);
    return new ConnectError(`session stream to ${this.url}: ${e.message}`, noH2 ? Code.Unimplemented : Code.Unavailable, undefined, undefined, e);
  }

  constructor(
    private readonly url: string,
    private readonly dial: () => Socket,
    private readonly headers: Record<string, string>,
    private readonly onMessage: (m: StreamResponse) => void,
    private readonly onEnd: (err: unknown) => void,
  ) {}

  /** open starts the call; onMessage gets the server's frames, onEnd the stream's end (once). */
  open(): void {
    // The connection is the endpoint's (dialer in tls.ts): TCP, or TLS with the client's CA and certificate.
    const s = h2connect(this.url, { createConnection: this.dial });
    this.session = s;
    s.on("error", (e) => this.end(this.failure(e)));
    s.on("close", () => this.end(new ConnectError(`session stream to ${this.url}: connection closed`, Code.Unavailable)));
    // A connection that does not answer a ping within a second is dead (a
    // frozen or unplugged node): end it, so its calls are re-sent elsewhere.
    this.pinger = setInterval(() => {
      const t = setTimeout(() => s.destroy(new Error("ping timed out")), 1000);
      try { s.ping((err) => { clearTimeout(t); if (err) s.destroy(err); }); } catch { clearTimeout(t); }
    }, 1000);
    this.pinger.unref();
    const req = s.request({
      ":method": "POST", ":path": "/lockd.v1.SessionService/Stream",
      "content-type": "application/connect+proto", "connect-protocol-version": "1", ...this.headers,
    }, { endStream: false });
    this.req = req;
    req.on("response", (h) => {
      this.answered = true;
      const status = Number(h[":status"]);
      const ct = String(h["content-type"] ?? "");
      if (status !== 200 || !ct.startsWith("application/connect+proto")) {
        this.end(new ConnectError(`session stream to ${this.url}: HTTP ${status} ${ct}`, status === 404 || status === 415 ? Code.Unimplemented : Code.Internal));
      }
    });
    req.on("data", (chunk: Buffer) => this.data(chunk));
    req.on("end", () => this.end(new ConnectError("session stream ended", Code.Unavailable)));
    req.on("error", (e) => this.end(this.failure(e)));
    req.on("close", () => this.end(new ConnectError(`session stream to ${this.url} closed`, Code.Unavailable)));
  }

  private data(chunk: Buffer) {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    while (this.buf.length >= 5) {
      const flags = this.buf[0];
      const len = this.buf.readUInt32BE(1);
      if (len > maxFrame) return this.end(new ConnectError("session stream: frame too large", Code.ResourceExhausted));
      if (this.buf.length < 5 + len) return;
      const payload = this.buf.subarray(5, 5 + len);
      this.buf = this.buf.subarray(5 + len);
      if (flags & 0x02) {
        let err: unknown = new ConnectError("session stream ended", Code.Unavailable);
        try {
          const j = JSON.parse(payload.toString("utf8"));
          if (j.error) err = new ConnectError(j.error.message ?? "", codeOf[j.error.code] ?? Code.Unknown);
        } catch { /* keep the generic error */ }
        return this.end(err);
      }
      let m: StreamResponse;
      try {
        m = fromBinary(StreamResponseSchema, payload);
      } catch (e) {
        return this.end(new ConnectError(`session stream: bad frame: ${(e as Error).message}`, Code.Internal));
      }
      this.onMessage(m);
    }
  }

  /** send writes one request frame. */
  send(msg: StreamRequest): void {
    if (this.ended || !this.req) throw new ConnectError("session stream closed", Code.Unavailable);
    const b = toBinary(StreamRequestSchema, msg);
    const env = Buffer.allocUnsafe(5 + b.length);
    env[0] = 0;
    env.writeUInt32BE(b.length, 1);
    env.set(b, 5);
    this.req.write(env);
  }

  /** closeSend ends the request side (the server then ends the stream). */
  closeSend(): void {
    if (!this.ended) this.req?.end();
  }

  /** end tears the call and its connection down, once. */
  end(err: unknown): void {
    if (this.ended) return;
    this.ended = true;
    clearInterval(this.pinger);
    try { this.req?.close(constants.NGHTTP2_CANCEL); } catch { /* closed */ }
    try { this.session?.close(); this.session?.destroy(); } catch { /* closed */ }
    this.onEnd(err);
  }
}

// The client deadline rule and the keepalive cadence, the same numbers as
// the Go client's. A client gives a lease up at
//   sent + TTL·(1 − 1 %) − max(100 ms, 2 % TTL)
// where sent is when the first attempt of the request that confirmed it
// (CreateSession or a KeepAlive) left the client. The server starts its TTL
// when it receives the request, after sent, so with a client clock at most
// 1 % slow the client gives up strictly before the server may expire the
// lease; the margin covers scheduling delays between deciding and acting.
// Times here are monotonic milliseconds (performance.now()).

/** leaseDeadline returns the client-side end of a lease of ttlMs confirmed by a request sent at sent. */
export function leaseDeadline(sent: number, ttlMs: number): number {
  return sent + ttlMs - ttlMs / 100 - Math.max(100, ttlMs / 50);
}

/** renewInterval: a keepalive goes out TTL/3 after the last confirmed one was sent, so two may fail before the lease is in danger. */
export function renewInterval(ttlMs: number): number {
  return ttlMs / 3;
}

/** jeopardyInterval: after a failed keepalive the next goes out after max(50 ms, TTL/10). */
export function jeopardyInterval(ttlMs: number): number {
  return Math.max(50, ttlMs / 10);
}

/** keepaliveTimeout bounds one KeepAlive attempt: min(request timeout, max(50 ms, TTL/4)), leaving time to try another endpoint. */
export function keepaliveTimeout(ttlMs: number, requestTimeoutMs: number): number {
  return Math.min(requestTimeoutMs, Math.max(50, ttlMs / 4));
}

/** now is the monotonic clock in milliseconds. */
export const now = (): number => performance.now();

/** toUnixMs converts a monotonic time to Unix milliseconds (for display and the driver). */
export const toUnixMs = (mono: number): number => performance.timeOrigin + mono;

/** durationMs reads a google.protobuf.Duration as milliseconds. */
export function durationMs(d: { seconds: bigint; nanos: number } | undefined): number {
  if (!d) return 0;
  return Number(d.seconds) * 1000 + d.nanos / 1e6;
}

/** duration makes a google.protobuf.Duration init from milliseconds. */
export function duration(ms: number): { seconds: bigint; nanos: number } {
  const whole = Math.floor(ms / 1000);
  return { seconds: BigInt(whole), nanos: Math.round((ms - whole * 1000) * 1e6) };
}

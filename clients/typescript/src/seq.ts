// A session's request sequence numbers and its ack: the lowest seq whose
// answer the client has not seen yet. The server remembers the answer of
// every seq at or above the ack, so a request re-sent with its seq (after a
// timeout, a broken stream, a leader change) gets the same answer and is
// never applied twice.

/** SeqReq is one request's seq, in flight from begin until end. */
export class SeqReq {
  private ended = false;
  constructor(private readonly t: SeqTracker, readonly seq: bigint) {}
  /** end marks the request answered or abandoned; only the first call counts. */
  end(): void {
    if (this.ended) return;
    this.ended = true;
    this.t.remove(this.seq);
  }
  /** pass hands the seq to a new owner (a cleanup that outlives its call); undefined when it already ended. */
  pass(): SeqReq | undefined {
    if (this.ended) return undefined;
    this.ended = true;
    return new SeqReq(this.t, this.seq);
  }
}

/** SeqTracker hands out seqs (1, 2, …) and computes the ack. */
export class SeqTracker {
  private last = 0n;
  private inflight: bigint[] = []; // ascending
  begin(): SeqReq {
    this.last++;
    this.inflight.push(this.last);
    return new SeqReq(this, this.last);
  }
  remove(seq: bigint): void {
    const i = this.inflight.indexOf(seq);
    if (i >= 0) this.inflight.splice(i, 1);
  }
  /** ack is the lowest seq in flight, or the next seq when none is. */
  ack(): bigint {
    return this.inflight.length ? this.inflight[0] : this.last + 1n;
  }
}

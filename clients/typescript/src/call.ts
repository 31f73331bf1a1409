// Session-scoped calls: over the endpoint's session stream when it is on,
// else unary, with the same message (and seq) either way.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { StreamRequestSchema } from "./gen/lockd/v1/lockd_pb.js";
import type { Client, Endpoint } from "./client.js";

export type Body = Exclude<NonNullable<MessageInitShape<typeof StreamRequestSchema>["body"]>, { case: undefined } | { case: "keepAlive" } | { case: "subscribeNotices" }>;

/** send makes one attempt of a session-scoped call on ep and returns the answer's message. */
export async function send(c: Client, ep: Endpoint, signal: AbortSignal, body: Body): Promise<any> {
  if (c.streamOn) {
    const s = await ep.stream.get(c, signal);
    if (s) {
      const r = await s.call(body, signal);
      c.checkCluster(ep, r.clusterId);
      if (r.body.case !== body.case) throw new Error(`session stream: answer of call ${r.callId} is of another kind`);
      return r.body.value;
    }
  }
  return c.rpc<any>(ep, signal, (o): Promise<any> => {
    const u = ep.unary();
    switch (body.case) {
      case "createSession": return u.createSession(body.value, o);
      case "acquire": return u.acquire(body.value, o);
      case "release": return u.release(body.value, o);
      case "cancel": return u.cancel(body.value, o);
      case "complete": return u.complete(body.value, o);
      case "closeSession": return u.closeSession(body.value, o);
    }
  });
}

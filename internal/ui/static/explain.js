// lockd dashboard: the Explain view of the lock selected in the Locks
// table (RPC Explain): its holders, with a pending request to let go; its
// waiters and how long each has waited; and the chain of what each holder
// itself waits for, across locks. Loaded before app.js, whose helpers
// (esc, since, until, human, secs, ms, modeName, lockCall) it calls.
"use strict";

// explainOf asks Explain for the lock name; an error comes back as
// { error } so that the other tables still render. No name: null.
function explainOf(name) {
  if (!name) return Promise.resolve(null);
  return lockCall("Explain", { name }).catch((e) => ({ error: e.message }));
}

// A countdown to a time in milliseconds (until() takes an RFC 3339 string).
const untilMs = (t) => `<span data-until="${Number(t)}"></span>`;
// A session by owner, with its id's start (the whole id on hover).
const who = (owner, id) =>
  `<b>${esc(owner || id)}</b> <span class="token muted" title="${esc(id)}">${esc(String(id || "").slice(0, 8))}</span>`;

// releaseAsked: a holder's pending request to let go (RequestRelease):
// since when, why, and when its session is revoked if a grace applies.
function releaseAsked(h) {
  if (!h.releaseRequestedAt) return "–";
  let s = `<span class="soon">asked ${since(h.releaseRequestedAt)} ago</span>`;
  if (h.releaseReason) s += `: <span class="reason">${esc(h.releaseReason)}</span>`;
  if (h.revokeGrace) s += ` · revoke in ${untilMs(ms(h.revokeGraceFrom || h.releaseRequestedAt) + secs(h.revokeGrace) * 1000)}`;
  return s;
}

function explainHolders(l) {
  const hs = l.holders || [];
  if (!hs.length) return `<p class="muted">no holder${l.delayed ? " (lock-delay runs)" : ""}</p>`;
  return `<table class="explain-holders"><thead><tr><th>holder</th><th>token</th><th>mode</th><th>held for</th><th>lease</th><th>asked to let go</th></tr></thead><tbody>` +
    hs.map((h) => `<tr><td>${who(h.owner, h.sessionId)}</td><td class="token">#${esc(h.token)}</td><td>${modeName(h.mode)}</td>` +
      `<td>${since(h.grantedAt)}</td><td>${until(state.expiresBySession.get(h.sessionId))}</td><td class="release">${releaseAsked(h)}</td></tr>`).join("") +
    "</tbody></table>";
}

function explainWaiters(l) {
  const ws = l.waiters || [];
  if (!ws.length) return `<p class="muted">nobody waits</p>`;
  return `<table class="explain-waiters"><thead><tr><th>#</th><th>waiter</th><th>mode</th><th>waiting for</th></tr></thead><tbody>` +
    ws.map((w, i) => `<tr><td>${i + 1}</td><td>${who(w.owner, w.sessionId)}</td><td>${modeName(w.mode)}</td><td>${since(w.queuedAt)}</td></tr>`).join("") +
    "</tbody></table>";
}

// explainChain: one row per link, "session waits for lock since T: blocked
// by session (holding it | queued before it)", the first cell indented by
// depth (set through the CSSOM below: the page's CSP allows no inline style).
function explainChain(r) {
  const chain = r.chain || [];
  if (!chain.length) return `<p class="muted">the holders wait for nothing</p>`;
  let s = `<table class="explain-chain"><thead><tr><th>session</th><th>waits for</th><th>since</th><th>blocked by</th><th>how</th><th></th></tr></thead><tbody>` +
    chain.map((st) => `<tr class="step${st.cycle ? " cycle" : ""}" data-depth="${Number(st.depth) || 1}">` +
      `<td class="who">${who(st.owner, st.sessionId)}</td><td class="name">${esc(st.lock)}</td><td>${since(st.queuedAt)}</td>` +
      `<td>${who(st.blockedByOwner, st.blockedBy)}</td><td class="muted">${st.holding ? "holding it" : "queued before it"}</td>` +
      `<td>${st.cycle ? '<span class="bad" title="the blocking session appears earlier in the chain">cycle: deadlock</span>' : ""}</td></tr>`).join("") +
    "</tbody></table>";
  if (r.truncated) s += `<p class="muted truncated">the chain was cut at 1000 steps</p>`;
  return s;
}

// renderExplain shows the answer r for the lock name (null: hide the view;
// r null: keep what is shown until the answer comes).
function renderExplain(name, r) {
  $("explain-section").hidden = !name;
  if (!name) return;
  $("explain-name").textContent = name;
  if (!r) return;
  const out = $("explain");
  if (r.error) {
    out.innerHTML = `<p class="bad">${esc(r.error)}</p>`;
    return;
  }
  const l = r.lock;
  if (!l) {
    out.innerHTML = `<p class="muted">no such lock: it is free and nobody waits for it</p>`;
    return;
  }
  const limit = l.limit > 1 ? ` <span class="muted">(limit ${l.limit})</span>` : "";
  out.innerHTML = `<h3>Holders (${(l.holders || []).length})${limit}</h3>${explainHolders(l)}` +
    `<h3>Waiters (${(l.waiters || []).length}), first in line first</h3>${explainWaiters(l)}` +
    `<h3>What the holders wait for</h3>${explainChain(r)}`;
  for (const tr of out.querySelectorAll("tr[data-depth]")) {
    tr.cells[0].style.paddingLeft = (0.5 + 1.5 * Math.min(Number(tr.dataset.depth) - 1, 30)) + "rem";
  }
}

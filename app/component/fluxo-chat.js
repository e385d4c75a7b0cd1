/* Fluxo browser view, the chat: prompts sent over the view's own connection (fluxo-live.js), each
 * answer streamed token by token with its request id, queue position, status and TTFT, or the
 * engine's refusal and its reason. */
(function () {
  "use strict";
  const S = window.fluxo;
  const {w, esc} = S;
  const $ = id => document.getElementById(id);

  function chatByRef(ref) { return S.chats.find(c => c.ref === ref); }
  S.chatByRef = chatByRef;

  function sendChat(prompt, maxTokens) {
    const ref = `b${++S.chatSeq}`;
    const chat = {ref: ref, prompt: prompt, request: null, text: "", tokens: 0, status: "sent", position: null,
                  error: null, stats: {}, ended: false, sentAt: performance.now()};
    S.chats.push(chat);
    if (S.chats.length > 50) S.chats.shift();
    if (!S.send({type: "chat", ref: ref, prompt: prompt, max_tokens: maxTokens, temperature: 0})) {
      chat.status = "error"; chat.ended = true; chat.error = w("v_not_connected");
    }
    S.chatDirty = true;
    renderChats();
    return ref;
  }
  S.sendChat = sendChat;

  function onChat(m) {
    const chat = chatByRef(m.ref);
    if (!chat) return;
    if (m.type === "accepted") {
      chat.request = m.request;
      S.people.add(m.request);
      chat.position = m.queue_position || null;
      chat.status = chat.position ? "queued" : "accepted";
    } else if (m.type === "queued") {
      chat.position = m.position;
      chat.status = m.position ? "queued" : "accepted";
    } else if (m.type === "token") {
      chat.text += m.text || "";
      chat.tokens++;
      chat.position = null;
      chat.status = "streaming";
    } else if (m.type === "done") {
      chat.status = m.status || "finished";
      chat.stats = m.stats || {};
      chat.ended = true;
    } else if (m.type === "error") {
      chat.status = chat.request === null ? "refused" : "error";
      chat.error = `${m.code}: ${m.message}`;
      chat.code = m.code;
      chat.ended = true;
    }
    S.chatDirty = true;
  }
  S.onChat = onChat;

  /* One turn: the prompt, then the answer so far and its status line (or the refusal). */
  function turnHtml(c) {
    let body;
    if (c.status === "refused") {
      body = `<div class="refused">${esc(w("v_refused"))} · ${esc(c.error)}</div>`;
    } else if (c.error) {
      body = `<div class="bot">${esc(c.text)}</div><div class="refused">${esc(w("v_failed"))} · ${esc(c.error)}</div>`;
    } else {
      const wait = c.status === "queued" ? `<span class="queued">${esc(w("v_queued", {n: c.position}))}</span> · ` : "";
      const ttft = c.stats.ttft_s ? ` · TTFT ${esc(Math.round(1000 * c.stats.ttft_s))} ms` : "";
      const req = c.request !== null ? `request #${esc(c.request)} · ` : "";
      body = `<div class="bot">${esc(c.text)}${c.ended ? "" : " …"}</div>` +
        `<div class="meta">${wait}${req}${esc(c.status)} · ${esc(c.tokens)} tokens${ttft}</div>`;
    }
    return `<div class="user">${esc(c.prompt)}</div>${body}`;
  }

  function renderChats() {
    S.chatDirty = false;
    const log = $("fluxo-chat-log");
    if ($("fluxo-chat").hidden) return;
    const shown = S.chats.slice(-6);
    while (log.childElementCount > shown.length) log.removeChild(log.firstChild);
    while (log.childElementCount < shown.length) {
      const d = document.createElement("div");
      d.className = "turn";
      log.appendChild(d);
    }
    shown.forEach((c, i) => {
      const d = log.children[i];
      const html = turnHtml(c);
      if (d.dataset.html !== html) { d.innerHTML = html; d.dataset.html = html; d.dataset.ref = c.ref; d.dataset.status = c.status; }
    });
  }
  S.renderChats = renderChats;

  $("fluxo-chat-form").addEventListener("submit", ev => {
    ev.preventDefault();
    const box = $("fluxo-chat-input");
    const prompt = box.value.trim();
    if (!prompt) return;
    box.value = "";
    sendChat(prompt, parseInt($("fluxo-chat-max").value, 10));
  });
})();

/* Fluxo browser view, the chat: prompts sent over the view's own connection (fluxo-live.js), each
 * answer streamed token by token with its request id, queue position, status and TTFT, or the
 * engine's refusal and its reason; to a watched engine's OpenAI API where the state says so. */
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
    const watched = S.state && S.state.observed;
    if (watched && watched.http_url) {
      toApi(watched, chat, maxTokens);
    } else if (!S.send({type: "chat", ref: ref, prompt: prompt, max_tokens: maxTokens, temperature: 0})) {
      chat.status = "error"; chat.ended = true; chat.error = w("v_not_connected");
    }
    S.chatDirty = true;
    renderChats();
    return ref;
  }
  S.sendChat = sendChat;

  /* An engine Fluxo only watches (engine/observe: state.observed) takes no chat over this
   * connection: the chat goes to its own OpenAI API, streamed, and the charts show it as that
   * engine's scheduler ran it. */
  async function toApi(watched, chat, maxTokens) {
    const body = {model: watched.model, messages: [{role: "user", content: chat.prompt}],
                  max_tokens: maxTokens, temperature: 0, stream: true};
    try {
      const r = await fetch(watched.http_url + "/v1/chat/completions", {method: "POST",
        headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
      if (!r.ok) throw new Error(`HTTP ${r.status}: ${(await r.text()).slice(0, 200)}`);
      chat.status = "accepted";
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const {done, value} = await reader.read();
        if (done) break;
        buf += dec.decode(value, {stream: true});
        const events = buf.split("\n\n");
        buf = events.pop();
        events.forEach(e => onApiEvent(chat, e.trim()));
        S.chatDirty = true;
      }
      chat.status = "finished";
    } catch (e) {
      chat.status = chat.tokens ? "error" : "refused";
      chat.error = String(e.message || e);
    }
    chat.ended = true;
    S.chatDirty = true;
    renderChats();
  }

  function onApiEvent(chat, event) {
    if (!event.startsWith("data:") || event === "data: [DONE]") return;
    const m = JSON.parse(event.slice(5));
    const delta = (m.choices && m.choices[0] && m.choices[0].delta) || {};
    if (!delta.content) return;
    if (!chat.tokens) chat.stats.ttft_s = (performance.now() - chat.sentAt) / 1000;
    chat.text += delta.content;
    chat.tokens++;
    chat.status = "streaming";
  }

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
      const ttft = c.stats.ttft_s ? ` · TTFT ${esc(S.fmt(c.stats.ttft_s, " ms", 1000, 0))}` : "";
      const req = c.request !== null ? `${esc(w("v_request"))} #${esc(c.request)} · ` : "";
      const words = (S.args && S.args.words) || {};
      const key = "v_st_" + c.status;  // v_st_finished, ...: the status in the page's language
      const status = words[key] ? w(key) : c.status;
      body = `<div class="bot">${esc(c.text)}${c.ended ? "" : " …"}</div>` +
        `<div class="meta">${wait}${req}${esc(status)} · ${esc(c.tokens)} ${esc(w("v_tokens"))}${ttft}</div>`;
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

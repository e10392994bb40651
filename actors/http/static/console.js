// sessionray web console: plain JS, no build step. See actors/http/console.py for the routes it uses.
"use strict";

const $ = (id) => document.getElementById(id);
const SAVED = "sessionray.console.login";  // sessionStorage: this tab's login, so a reload resumes it
const ARGS_INLINE_CHARS = 120;
const SESSIONS_REFRESH_MS = 5000;  // the master's live-session list follows the runtime on its own
const state = {
  user: "", scene: "private", group: "", bot: "", token: "", masterToken: "", stream: null,
  seen: new Set(), view: 0, refresher: null,
};

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.token) h["X-Console-Token"] = state.token;
  // A master's proof (docs/decisions.md#security-console-master-proof): a name alone is no master.
  if (state.masterToken) h["X-Console-Master-Token"] = state.masterToken;
  return h;
}

function sceneId() { return state.scene === "private" ? state.user : state.group; }
function sessionKey() { return `console:${state.bot}:${state.scene}:${sceneId()}`; }
function newId() {
  if (window.crypto && crypto.randomUUID) return "c-" + crypto.randomUUID();
  return "c-" + Date.now().toString(36) + Math.random().toString(36).slice(2);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function scrollToEnd() { const log = $("log"); log.scrollTop = log.scrollHeight; }

function line(cls, who, content, testid) {
  const li = el("li", { class: cls, "data-testid": testid || cls });
  if (who) li.append(el("span", { class: "who" }, who));
  li.append(content);
  return li;
}

function addLine(cls, who, content, testid) {
  const li = line(cls, who, content, testid);
  $("log").append(li);
  scrollToEnd();
  return li;
}

function note(text) { return addLine("note", "", text, "note"); }

// Only http(s) URLs become links or media sources: never javascript:, data:, file: or anything
// else a reply may carry (docs/decisions.md#security-console-scope). Returns the URL or null.
function safeUrl(value) {
  try {
    const url = new URL(String(value));
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch (e) {
    return null;
  }
}

function mediaSrc(media) {
  if (media.kind === "url") return safeUrl(media.value);
  if (media.kind === "base64") return "data:application/octet-stream;base64," + media.value;
  return null;  // an opaque platform file reference cannot be shown
}

// Render one canonical segment (docs/decisions.md#reply-segments) into DOM nodes.
function renderSegment(seg) {
  const d = seg.data || {};
  switch (seg.type) {
    case "text": return el("span", { class: "seg-text" }, d.text);
    case "markdown": return el("span", { class: "seg-markdown" }, d.content);
    case "mention": {
      const cls = "mention" + (d.target === state.user ? " me" : "");
      return el("span", { class: cls, "data-testid": "mention" }, "@" + d.target);
    }
    case "image": {
      const src = mediaSrc(d.media);
      if (!src) return el("span", { class: "seg-file" }, `[image ${d.media.value}]`);
      const img = el("img", { alt: "image", "data-testid": "image" });
      img.src = d.media.kind === "base64" ? "data:image/*;base64," + d.media.value : src;
      return img;
    }
    case "audio": case "video": {
      const src = mediaSrc(d.media);
      if (!src) return el("span", {}, `[${seg.type} ${d.media.value}]`);
      const m = el(seg.type, { controls: "" });
      m.src = src;
      return m;
    }
    case "file": {
      const src = mediaSrc(d.media);
      if (!src) return el("span", {}, `[file ${d.media.value}]`);
      const a = el("a", { download: "" }, "📎 file");
      a.href = src;
      return a;
    }
    case "reply": return el("span", { class: "quote" }, "↪ replying to " + d.message_id);
    case "forward": return el("span", { class: "quote" }, "⤷ forwarded " + d.forward_id);
    case "face": return el("span", {}, `[face ${d.id}]`);
    case "dice": return el("span", { title: "dice" }, "🎲");
    case "rps": return el("span", { title: "rock-paper-scissors" }, "✊✋✌️");
    case "share": {
      const label = "🔗 " + (d.title || d.url);
      const href = safeUrl(d.url);
      if (!href) return el("span", { class: "share", "data-testid": "share-unsafe" }, `${label} <${d.url}>`);
      const a = el("a", { class: "share", target: "_blank", rel: "noopener noreferrer" }, label);
      a.href = href;
      return a;
    }
    default: return el("span", {}, `[${seg.type}]`);
  }
}

function segmentsNode(segments) {
  const body = el("span", { class: "segments" });
  for (const seg of segments) body.append(renderSegment(seg));
  return body;
}

function showReply(ev) {
  if (state.seen.has(ev.message_id)) return;
  state.seen.add(ev.message_id);
  addLine("bot", ev.bot_id || "bot", segmentsNode(ev.segments), "reply");
}

// A collapsible event line: the summary carries data-testid=agent-event (or summaryTestid), the body the details.
function foldable(cls, summary, body, bodyTestid, summaryTestid = "agent-event") {
  const pre = el("pre", { "data-testid": bodyTestid }, body);
  const details = el("details", {}, el("summary", { "data-testid": summaryTestid }, summary), pre);
  return el("li", { class: "event " + cls }, details);
}

// The completed-reply line: the turn's validated reply as readable text (never streamed half
// JSON: the session publishes it only after validation, docs/decisions.md#reply-final-output).
function previewLine(e) {
  const text = typeof e.text === "string" ? e.text : "";
  const head = text.length > ARGS_INLINE_CHARS ? text.slice(0, ARGS_INLINE_CHARS) + "…" : text;
  return foldable("preview", `✔ reply ready: ${head}`, text, "reply-preview-text", "reply-preview");
}

function eventLine(e) {
  if (e.type === "reply_preview") return previewLine(e);
  if (e.type === "tool_call") {
    const args = JSON.stringify(e.args ?? {});
    const inline = args.length > ARGS_INLINE_CHARS ? args.slice(0, ARGS_INLINE_CHARS) + "…" : args;
    return foldable("tool", `🔧 ${e.name}(${inline})`, JSON.stringify(e.args ?? {}, null, 2), "tool-args");
  }
  if (e.type === "tool_result") {
    const result = typeof e.result === "string" && e.result ? e.result : "(no output)";
    return foldable(e.is_error ? "tool error" : "tool", `${e.is_error ? "✗" : "✓"} ${e.name}`, result, "tool-result");
  }
  const text = e.type === "notice" ? `⚠ ${e.text}` : e.type === "thinking" ? `💭 ${e.text}` : e.text || e.type;
  const cls = e.type === "notice" ? "notice" : e.type === "thinking" ? "thinking" : "status";
  return el("li", { class: "event " + cls }, el("span", { "data-testid": "agent-event" }, text));
}

function showAgentEvent(ev) {
  $("log").append(eventLine(ev.event || {}));
  scrollToEnd();
}

function onEvent(view, msg) {
  if (view !== state.view) return;
  const ev = JSON.parse(msg.data);
  if (ev.type === "reply") showReply(ev);
  else if (ev.type === "agent") showAgentEvent(ev);
  else if (ev.type === "message" && ev.user !== state.user) {
    addLine("", ev.user, ev.text, "message");
  }
}

// One stored message (GET /console/api/history) as a log line, or null when already shown.
function historyLine(m) {
  if (state.seen.has(m.message_id)) return null;
  state.seen.add(m.message_id);
  if (m.direction === "outbound") {
    const body = m.segments ? segmentsNode(m.segments) : el("span", { class: "seg-text" }, m.text);
    return line("bot", m.sender_id || "bot", body, "reply");
  }
  if (m.sender_id === state.user) return line("mine", state.user, m.text, "mine");
  return line("", m.sender, m.text, "message");
}

async function loadHistory(view) {
  const q = new URLSearchParams({ user: state.user, bot: state.bot, scene: state.scene });
  if (state.scene === "group") q.set("group", state.group);
  let resp = null;
  let answer = {};
  try {
    resp = await fetch("/console/api/history?" + q, { headers: headers() });
    answer = await resp.json().catch(() => ({}));
  } catch (e) {
    answer = { error: String(e) };
  }
  if (view !== state.view) return;
  const ok = resp !== null && resp.ok;
  if (!ok) note(`history unavailable (${resp ? resp.status : "network"}): ${answer.error || ""}`);
  else $("log").prepend(...answer.messages.map(historyLine).filter((li) => li));  // before live lines
  $("log").dataset.history = ok ? "loaded" : "failed";
  $("text").disabled = false;  // typing waits for the history: a new line always follows it
  $("text").focus();
  scrollToEnd();
}

// The role /console/api/me grants: "master" (name and master token) shows the live sessions and
// the controls, refreshed every few seconds; "locked" (a master's name without the token) asks for
// the token; anyone else sees neither.
async function loadRole(view) {
  const q = new URLSearchParams({ user: state.user, bot: state.bot });
  const resp = await fetch("/console/api/me?" + q, { headers: headers() });
  const answer = await resp.json().catch(() => ({}));
  if (view !== state.view || !resp.ok) return;
  const master = answer.master === true;
  const locked = !master && answer.master_name === true;
  $("master").hidden = !(master || locked);
  $("master-tools").hidden = !master;
  $("unlock-form").hidden = !locked;
  $("chat").classList.toggle("with-master", master || locked);
  $("chat").dataset.role = master ? "master" : locked ? "locked" : "user";
  if (locked && state.masterToken) $("unlock-result").textContent = "wrong master token";
  if (!master) return;
  await refreshSessions();
  if (state.refresher === null) state.refresher = setInterval(refreshSessions, SESSIONS_REFRESH_MS);
}

function saveLogin() {
  const { user, scene, group, bot, token, masterToken } = state;
  sessionStorage.setItem(SAVED, JSON.stringify({ user, scene, group, bot, token, masterToken }));
}

async function unlock(event) {
  event.preventDefault();
  state.masterToken = $("unlock-token").value;
  $("unlock-token").value = "";
  $("unlock-result").textContent = "";
  saveLogin();
  await loadRole(state.view);
}

// Forget everything the previous view showed: a new login (another name, scene or bot) starts empty.
function resetView() {
  state.view += 1;
  if (state.stream) state.stream.close();
  state.stream = null;
  if (state.refresher !== null) clearInterval(state.refresher);
  state.refresher = null;
  state.seen = new Set();
  $("log").replaceChildren();
  delete $("log").dataset.history;
  delete $("chat").dataset.role;
  $("sessions").replaceChildren();
  $("control-result").textContent = "";
  $("control-text").value = "";
  $("master").hidden = true;
  $("master-tools").hidden = true;
  $("unlock-form").hidden = true;
  $("unlock-result").textContent = "";
  $("chat").classList.remove("with-master");
}

function connect() {
  const login = {
    user: $("user").value.trim(), scene: $("scene").value, group: $("group").value.trim(),
    bot: $("bot").value, token: $("token").value, masterToken: $("master-token").value,
  };
  const ok = /^[\w.-]{1,32}$/u;
  if (!ok.test(login.user) || (login.scene === "group" && !ok.test(login.group))) {
    alert("Names: 1-32 letters, digits, _ . -");
    return;
  }
  resetView();
  Object.assign(state, login);
  saveLogin();
  const view = state.view;
  const q = new URLSearchParams({ user: state.user });
  if (state.scene === "group") q.set("group", state.group);
  if (state.token) q.set("token", state.token);
  state.stream = new EventSource("/console/api/stream?" + q);
  state.stream.onmessage = (msg) => onEvent(view, msg);
  state.stream.onopen = () => { if (view === state.view) $("status").textContent = `connected as ${state.user}`; };
  state.stream.onerror = () => { if (view === state.view) $("status").textContent = "reconnecting…"; };
  $("login").hidden = true;
  $("chat").hidden = false;
  $("logout").hidden = false;
  $("mention-label").hidden = state.scene !== "group";
  $("scene-title").textContent = state.scene === "private"
    ? `Private chat: ${state.user} ↔ ${state.bot}` : `Group ${state.group} (as ${state.user})`;
  $("control-key").value = sessionKey();
  $("text").disabled = true;
  loadHistory(view);
  loadRole(view);
}

function logout() {
  resetView();
  sessionStorage.removeItem(SAVED);
  state.user = "";
  state.masterToken = "";
  $("master-token").value = "";
  $("chat").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("status").textContent = "not connected";
  $("user").focus();
}

async function send(event) {
  event.preventDefault();
  const text = $("text").value;
  if (!text.trim()) return;
  $("text").value = "";
  const body = { message_id: newId(), user: state.user, scene: state.scene, text, time_ms: Date.now() };
  if (state.scene === "group") { body.group_id = state.group; body.mention_bot = $("mention").checked; }
  state.seen.add(body.message_id);
  addLine("mine", state.user, text, "mine");
  const resp = await fetch(`/webhooks/console/${encodeURIComponent(state.bot)}`, {
    method: "POST", headers: headers(), body: JSON.stringify(body),
  });
  const answer = await resp.json().catch(() => ({}));
  if (resp.status === 503) note(`the bot is busy: retry in ${answer.retry_after_s || 1} s`);
  else if (!resp.ok) note(`error ${resp.status}: ${answer.error || ""}`);
  else if (answer.status === "untriggered") note("(not addressed to the bot: stored, no reply)");
  if (state.scene === "group") {
    fetch("/console/api/echo", { method: "POST", headers: headers(),
      body: JSON.stringify({ user: state.user, group_id: state.group, text, message_id: body.message_id }) });
  }
}

async function refreshSessions() {
  const view = state.view;
  let resp = null;
  let answer = {};
  try {
    resp = await fetch("/console/api/sessions?" + new URLSearchParams({ user: state.user }),
      { headers: headers() });
    answer = await resp.json().catch(() => ({}));
  } catch (e) {
    answer = { error: String(e) };
  }
  if (view !== state.view) return;
  const list = $("sessions");
  list.replaceChildren();
  if (!resp || !resp.ok) {
    list.append(el("li", {}, `error ${resp ? resp.status : "network"}: ${answer.error || ""}`));
    return;
  }
  if (!answer.sessions.length) {
    list.append(el("li", {}, "no live console session yet: a chat becomes live with its first message"));
  }
  for (const s of answer.sessions) {
    const pick = el("button", { type: "button" }, "select");
    pick.onclick = () => { $("control-key").value = s.session_key; };
    list.append(el("li", { "data-testid": "session" }, `${s.session_key} · ${s.turns} turns · idle ${Math.round(s.idle_s)} s `, pick));
  }
  list.dataset.loaded = "1";
}

async function control(kind) {
  const text = $("control-text").value;
  const resp = await fetch(`/console/api/${kind}`, {
    method: "POST", headers: headers(),
    body: JSON.stringify({ user: state.user, session_key: $("control-key").value, text }),
  });
  const answer = await resp.json().catch(() => ({}));
  $("control-result").textContent = resp.ok ? `${kind}: ${answer.outcome}` : `${kind} refused (${resp.status}): ${answer.error}`;
  if (resp.ok) { $("control-text").value = ""; note(`${kind} by ${state.user}: ${text}`); }
}

function resumeSaved(bots) {
  let saved = null;
  try { saved = JSON.parse(sessionStorage.getItem(SAVED) || "null"); } catch (e) { saved = null; }
  if (!saved || !bots.includes(saved.bot)) return;
  $("user").value = saved.user;
  $("scene").value = saved.scene;
  $("group").value = saved.group;
  $("bot").value = saved.bot;
  if (!$("token").value) $("token").value = saved.token || "";
  if (!$("master-token").value) $("master-token").value = saved.masterToken || "";
  $("group-label").hidden = saved.scene !== "group";
  connect();
}

async function init() {
  $("scene").onchange = () => { $("group-label").hidden = $("scene").value !== "group"; };
  $("group-label").hidden = true;
  $("connect").onclick = connect;
  $("logout").onclick = logout;
  $("composer").onsubmit = send;
  $("refresh").onclick = refreshSessions;
  $("steer").onclick = () => control("steer");
  $("follow-up").onclick = () => control("follow_up");
  $("unlock-form").onsubmit = unlock;
  const frag = new URLSearchParams(location.hash.slice(1));
  if (frag.get("token")) $("token").value = frag.get("token");
  if (frag.get("master")) $("master-token").value = frag.get("master");
  // the secrets leave the address bar and the history entry at once (they stay in the form)
  if (frag.get("token") || frag.get("master")) history.replaceState(null, "", location.pathname + location.search);
  const resp = await fetch("/console/api/info");
  const info = await resp.json();
  for (const b of info.bots) $("bot").append(el("option", { value: b }, b));
  $("token-label").hidden = !info.token_required;
  $("master-token-label").hidden = !info.master_token;
  resumeSaved(info.bots);
  $("connect").dataset.ready = "1";
}

init();

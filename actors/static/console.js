// sessionray web console: plain JS, no build step. See actors/console.py for the routes it uses.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { user: "", scene: "private", group: "", bot: "", token: "", stream: null, seen: new Set() };

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.token) h["X-Console-Token"] = state.token;
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

function addLine(cls, who, content, testid) {
  const li = el("li", { class: cls, "data-testid": testid || cls });
  if (who) li.append(el("span", { class: "who" }, who));
  li.append(content);
  $("log").append(li);
  li.scrollIntoView({ block: "end" });
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

function showReply(ev) {
  if (state.seen.has(ev.message_id)) return;
  state.seen.add(ev.message_id);
  const body = el("span", { class: "segments" });
  for (const seg of ev.segments) body.append(renderSegment(seg));
  addLine("bot", ev.bot_id || "bot", body, "reply");
}

function showAgentEvent(ev) {
  const e = ev.event || {};
  let text;
  if (e.type === "tool_call") text = `🔧 ${e.name}(${JSON.stringify(e.args ?? {})})`;
  else if (e.type === "tool_result") text = `${e.is_error ? "✗" : "✓"} ${e.name}`;
  else if (e.type === "notice") text = `⚠ ${e.text}`;
  else if (e.type === "thinking") text = `💭 ${e.text}`;
  else text = e.text || e.type;
  const li = el("li", { "data-testid": "agent-event", class: e.is_error ? "error" : "" }, text);
  $("events").append(li);
  li.scrollIntoView({ block: "end" });
}

function onEvent(msg) {
  const ev = JSON.parse(msg.data);
  if (ev.type === "reply") showReply(ev);
  else if (ev.type === "agent") showAgentEvent(ev);
  else if (ev.type === "message" && ev.user !== state.user) {
    addLine("", ev.user, ev.text, "message");
  }
}

function connect() {
  state.user = $("user").value.trim();
  state.scene = $("scene").value;
  state.group = $("group").value.trim();
  state.bot = $("bot").value;
  state.token = $("token").value;
  const ok = /^[\w.-]{1,32}$/u;
  if (!ok.test(state.user) || (state.scene === "group" && !ok.test(state.group))) {
    alert("Names: 1-32 letters, digits, _ . -");
    return;
  }
  const q = new URLSearchParams({ user: state.user });
  if (state.scene === "group") q.set("group", state.group);
  if (state.token) q.set("token", state.token);
  state.stream = new EventSource("/console/api/stream?" + q);
  state.stream.onmessage = onEvent;
  state.stream.onopen = () => { $("status").textContent = `connected as ${state.user}`; };
  state.stream.onerror = () => { $("status").textContent = "reconnecting…"; };
  $("login").hidden = true;
  $("chat").hidden = false;
  $("mention-label").hidden = state.scene !== "group";
  $("scene-title").textContent = state.scene === "private"
    ? `Private chat: ${state.user} ↔ ${state.bot}` : `Group ${state.group} (as ${state.user})`;
  $("control-key").value = sessionKey();
  $("text").focus();
  refreshSessions();
}

async function send(event) {
  event.preventDefault();
  const text = $("text").value;
  if (!text.trim()) return;
  $("text").value = "";
  const body = { message_id: newId(), user: state.user, scene: state.scene, text, time_ms: Date.now() };
  if (state.scene === "group") { body.group_id = state.group; body.mention_bot = $("mention").checked; }
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
  const resp = await fetch("/console/api/sessions", { headers: headers() });
  const list = $("sessions");
  list.replaceChildren();
  if (!resp.ok) { list.append(el("li", {}, `error ${resp.status}`)); return; }
  const { sessions } = await resp.json();
  if (!sessions.length) list.append(el("li", {}, "none"));
  for (const s of sessions) {
    const pick = el("button", { type: "button" }, "select");
    pick.onclick = () => { $("control-key").value = s.session_key; };
    list.append(el("li", { "data-testid": "session" }, `${s.session_key} · ${s.turns} turns · idle ${Math.round(s.idle_s)} s `, pick));
  }
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

async function init() {
  $("scene").onchange = () => { $("group-label").hidden = $("scene").value !== "group"; };
  $("group-label").hidden = true;
  $("connect").onclick = connect;
  $("composer").onsubmit = send;
  $("refresh").onclick = refreshSessions;
  $("steer").onclick = () => control("steer");
  $("follow-up").onclick = () => control("follow_up");
  const frag = new URLSearchParams(location.hash.slice(1));
  if (frag.get("token")) $("token").value = frag.get("token");
  const resp = await fetch("/console/api/info");
  const info = await resp.json();
  for (const b of info.bots) $("bot").append(el("option", { value: b }, b));
  $("token-label").hidden = !info.token_required;
  $("connect").dataset.ready = "1";
}

init();

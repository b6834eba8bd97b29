// replog console: plain JavaScript, no library, nothing fetched from outside this server.
"use strict";

const state = { csrf: "", admin: false, refreshMs: 2000, page: "cluster" };
const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", body: JSON.stringify(body),
    headers: { "Content-Type": "application/json", "X-CSRF-Token": state.csrf },
  };
  const resp = await fetch(path, { credentials: "same-origin", ...init });
  const doc = await resp.json();
  if (!resp.ok) throw new Error(doc.error || resp.statusText);
  return doc;
}

function banner(text) {
  const b = $("#banner");
  b.textContent = text || "";
  b.hidden = !text;
}

// ---- session ------------------------------------------------------------------------------
async function loadSession() {
  const s = await api("/api/session");
  setSession(s.admin, s.csrf, s.writable);
}

function setSession(admin, csrf, writable = true) {
  state.admin = admin;
  state.csrf = csrf || "";
  document.body.classList.toggle("admin", admin);
  $("#who").textContent = admin ? "admin" : (writable ? "read-only (log in to change)" : "read-only console");
  $("#login-form").hidden = admin || !writable;
  $("#logout").hidden = !admin;
}

$("#login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    const s = await api("/api/login", { password: $("#password").value });
    $("#password").value = "";
    setSession(true, s.csrf);
    banner("");
  } catch (e) { banner(e.message); }
});

$("#logout").addEventListener("click", async () => {
  await api("/api/logout", {});
  setSession(false, "");
});

// ---- pages --------------------------------------------------------------------------------
function show(page) {
  state.page = page;
  for (const s of document.querySelectorAll(".page")) s.hidden = s.id !== `page-${page}`;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === page);
  refresh();
}

window.addEventListener("hashchange", () => show(location.hash.slice(1) || "cluster"));

function fmtBytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function fmtRate(x) { return x === null || x === undefined ? "" : Number(x).toFixed(0); }

async function refreshCluster() {
  const c = await api("/api/cluster");
  state.refreshMs = c.refreshMs || 2000;
  $("#cluster-name").textContent = c.cluster ? `${c.cluster}${c.controller ? " (controller mode)" : ""}` : "";
  $("#cluster-updated").textContent = c.updatedAtMs ? `read ${new Date(c.updatedAtMs).toLocaleTimeString()}` : "";
  banner(c.error || "");
  const body = $("#groups tbody");
  body.replaceChildren(...c.groups.map((g) => {
    const members = el("td");
    for (const m of g.members) {
      const label = `${m.address} ${m.reachable ? (m.role || "") : "unreachable"}`;
      members.append(el("div", { class: m.reachable ? (m.address === g.master ? "master" : "") : "down",
                                 "data-address": m.address }, label));
    }
    return el("tr", { "data-group": g.brokerName },
      el("td", {}, g.brokerName), el("td", { class: g.master ? "master" : "down" }, g.master || "no master"),
      el("td", {}, g.masterEpoch), el("td", {}, `[${g.syncStateSet.join(", ")}]`), members,
      el("td", {}, g.topics), el("td", {}, fmtRate(g.putTps)), el("td", {}, fmtRate(g.getTps)),
      el("td", {}, fmtBytes(g.replicationLagBytes)));
  }));
  $("#timeline").replaceChildren(...c.timeline.map((e) =>
    el("li", { "data-kind": e.kind }, `${new Date(e.atMs).toLocaleTimeString()} ${e.group}: ${e.text}`)));
  drawChart(await api("/api/history"));
}

function drawChart(series) {
  const W = 720, H = 160, pad = 30;
  const names = Object.keys(series).sort();
  const all = names.flatMap((n) => series[n]);
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  if (all.length) {
    const t0 = Math.min(...all.map((p) => p.atMs)), t1 = Math.max(...all.map((p) => p.atMs), t0 + 1);
    const ymax = Math.max(1, ...all.map((p) => p.putTps));
    const colors = ["#2f6fde", "#d9480f", "#2b8a3e", "#862e9c", "#e67700"];
    names.forEach((n, i) => {
      const pts = series[n].map((p) => `${pad + (p.atMs - t0) / (t1 - t0) * (W - 2 * pad)},${H - pad - p.putTps / ymax * (H - 2 * pad)}`);
      const line = document.createElementNS(svgNS, "polyline");
      line.setAttribute("points", pts.join(" "));
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", colors[i % colors.length]);
      line.setAttribute("stroke-width", "1.5");
      svg.append(line);
      const label = document.createElementNS(svgNS, "text");
      label.setAttribute("x", W - pad - 90); label.setAttribute("y", 14 + 14 * i);
      label.setAttribute("fill", colors[i % colors.length]); label.setAttribute("font-size", "12");
      label.textContent = n;
      svg.append(label);
    });
    const top = document.createElementNS(svgNS, "text");
    top.setAttribute("x", 2); top.setAttribute("y", pad); top.setAttribute("font-size", "11");
    top.textContent = `${ymax.toFixed(0)}/s`;
    svg.append(top);
  }
  $("#chart").replaceChildren(svg);
}

async function refreshTopics() {
  const t = await api("/api/topics");
  $("#topics tbody").replaceChildren(...t.topics.map((x) => el("tr", { "data-topic": x.topic },
    el("td", {}, x.topic), el("td", {}, x.queues),
    el("td", {}, Object.entries(x.groups).map(([g, n]) => `${g}: ${n}`).join(", ")),
    el("td", {}, Object.entries(x.attributes).map(([k, v]) => `${k}=${v}`).join(", ")))));
}

$("#create-topic").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    await api("/api/topics", { topic: $("#new-topic").value, queues: Number($("#new-queues").value) });
    banner("");
    await refreshTopics();
  } catch (e) { banner(e.message); }
});

$("#send-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    const r = await api("/api/send", { topic: $("#send-topic").value, keys: $("#send-keys").value, body: $("#send-body").value });
    $("#send-result").textContent = `${r.status}: ${r.msgId} (${r.brokerName} queue ${r.queueId} offset ${r.queueOffset})`;
    $("#send-result").dataset.msgid = r.msgId;
    banner("");
  } catch (e) { banner(e.message); }
});

$("#find-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const q = new URLSearchParams();
  if ($("#find-msgid").value) q.set("msgId", $("#find-msgid").value);
  else { q.set("topic", $("#find-topic").value); q.set("key", $("#find-key").value); }
  try {
    const r = await api(`/api/messages?${q}`);
    banner(r.messages.length ? "" : "no such message");
    $("#found").replaceChildren(...r.messages.map((m) => el("div", { class: "message", "data-msgid": m.msgId },
      el("h3", {}, m.msgId),
      el("p", { class: "muted" }, `${m.topic} · ${m.brokerName} queue ${m.queueId} offset ${m.queueOffset} · stored ${new Date(m.storeTimestamp).toLocaleString()} · ${m.bodyBytes} bytes (${m.bodyKind})`),
      el("table", {}, ...Object.entries(m.properties).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v)))),
      el("pre", { class: "body" }, m.body))));
  } catch (e) { banner(e.message); }
});

// ---- refresh loop ---------------------------------------------------------------------------
let timer = null;
async function refresh() {
  clearTimeout(timer);
  try {
    if (state.page === "cluster") await refreshCluster();
    else if (state.page === "topics") await refreshTopics();
  } catch (e) { banner(`the console does not answer: ${e.message}`); }
  timer = setTimeout(refresh, state.refreshMs);
}

loadSession().then(() => show(location.hash.slice(1) || "cluster"));

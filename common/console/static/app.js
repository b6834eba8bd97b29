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
  if (s.login === "acl") {  // an account of the brokers' ACL: its access key and secret key
    $("#account").hidden = false;
    $("#password").placeholder = "secret key";
  }
  setSession(s.admin, s.csrf, s.writable, s.who);
}

function setSession(admin, csrf, writable = true, who = "admin") {
  state.admin = admin;
  state.csrf = csrf || "";
  document.body.classList.toggle("admin", admin);
  $("#who").textContent = admin ? (who || "admin") : (writable ? "read-only (log in to change)" : "read-only console");
  $("#login-form").hidden = admin || !writable;
  $("#logout").hidden = !admin;
}

$("#login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    const s = await api("/api/login", { password: $("#password").value, account: $("#account").value });
    $("#password").value = "";
    setSession(true, s.csrf, true, $("#account").value || "admin");
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

function fmtLag(ms) {
  if (ms === null || ms === undefined) return "over an hour behind";
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
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
      const label = `${m.address} ${m.reachable ? (m.role || "") : (m.reachable === null ? "..." : "unreachable")}`;
      const line = el("div", { class: m.reachable !== false ? (m.address === g.master ? "master" : "") : "down",
                               "data-address": m.address }, label);
      if (m.reachable && m.address !== g.master) {
        const button = el("button", { class: "switch admin-only", "data-switch": m.address }, "make master");
        button.addEventListener("click", () => switchover(g.brokerName, m.address));
        line.append(button);
      }
      members.append(line);
    }
    return el("tr", { "data-group": g.brokerName },
      el("td", {}, g.brokerName), el("td", { class: g.master ? "master" : "down" }, g.master || "no master"),
      el("td", {}, g.masterEpoch), el("td", {}, `[${g.syncStateSet.join(", ")}]`), members,
      el("td", {}, g.topics), el("td", {}, fmtRate(g.putTps)), el("td", {}, fmtRate(g.getTps)),
      el("td", {}, `${fmtBytes(g.replicationLagBytes)}, ${fmtLag(g.replicationLagMs)}`),
      el("td", { class: "pre" }, g.members.filter((m) => m.reachable).map((m) => `${m.address.split(":").pop()}: ${fmtBytes(m.commitLogBytes)} log, ${m.diskUsedRatio ?? "?"}% disk`).join("\n")));
  }));
  $("#timeline").replaceChildren(...c.timeline.map((e) =>
    el("li", { "data-kind": e.kind }, `${new Date(e.atMs).toLocaleTimeString()} ${e.group}: ${e.text}`)));
  $("#terms").replaceChildren(...c.groups.map((g) => el("p", { "data-group": g.brokerName },
    el("strong", {}, `${g.brokerName}: `),
    (g.terms || []).map((t) => `epoch ${t.epoch} (member ${t.memberId}) from offset ${t.startOffset}`).join(" \u2190 ") || "no term recorded")));
  const history = await api("/api/history");
  drawChart("#chart-put", "put/s", history, "putTps", (x) => `${x.toFixed(0)}/s`);
  drawChart("#chart-get", "get/s", history, "getTps", (x) => `${x.toFixed(0)}/s`);
  drawChart("#chart-lag", "replication lag", history, "lagBytes", fmtBytes);
  const consumers = await api("/api/consumer-history");
  drawChart("#chart-consumer-lag", "consumer lag (messages)", consumers, "lag", (x) => x.toFixed(0));
  drawChart("#chart-consumed", "consumed/s", consumers, "ratePerS", (x) => `${x.toFixed(0)}/s`);
  state.consumers = consumers;
}

async function switchover(group, address) {
  const typed = window.prompt(`Make ${address} the master of ${group}? Its clients will follow it. Type the group's name to confirm.`);
  if (typed === null) return;
  try {
    const r = await api("/api/switchover", { address, confirm: typed });
    banner("");
    $("#cluster-updated").textContent = `switched over: ${r.address} is the master of ${r.group} (epoch ${r.epoch})`;
    await refreshCluster();
  } catch (e) { banner(e.message); }
}

function drawChart(where, title, series, key, fmt) {
  const W = 420, H = 150, pad = 26;
  const names = Object.keys(series).sort();
  const all = names.flatMap((n) => series[n]);
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  if (all.length) {
    const t0 = Math.min(...all.map((p) => p.atMs)), t1 = Math.max(...all.map((p) => p.atMs), t0 + 1);
    const ymax = Math.max(1, ...all.map((p) => p[key]));
    const colors = ["#2f6fde", "#d9480f", "#2b8a3e", "#862e9c", "#e67700"];
    names.forEach((n, i) => {
      const pts = series[n].map((p) => `${pad + (p.atMs - t0) / (t1 - t0) * (W - 2 * pad)},${H - pad - p[key] / ymax * (H - 2 * pad)}`);
      const line = document.createElementNS(svgNS, "polyline");
      line.setAttribute("points", pts.join(" "));
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", colors[i % colors.length]);
      line.setAttribute("stroke-width", "1.5");
      svg.append(line);
    });
    const top = document.createElementNS(svgNS, "text");
    top.setAttribute("x", 2); top.setAttribute("y", pad); top.setAttribute("font-size", "11");
    top.textContent = fmt(ymax);
    svg.append(top);
  }
  const colors = ["#2f6fde", "#d9480f", "#2b8a3e", "#862e9c", "#e67700"];
  const legend = el("div", { class: "legend" });
  names.forEach((n, i) => {
    const key = el("span", {}, `\u25A0 ${n}`);
    key.style.color = colors[i % colors.length];
    legend.append(key);
  });
  $(where).replaceChildren(el("h4", {}, title), svg, legend);
}

async function refreshGroups() {
  const g = await api("/api/groups");
  const rates = await api("/api/consumer-history");
  $("#consumer-groups tbody").replaceChildren(...g.groups.map((x) => {
    const queues = el("td");
    for (const t of x.topics) {
      queues.append(el("div", {}, `${t.topic}: lag ${t.lag}`));
      for (const q of t.queues) {
        queues.append(el("div", { class: "muted" }, `${q.brokerName ? q.brokerName + " " : ""}queue ${q.queueId}: committed ${q.committedOffset} of ${q.maxOffset} (lag ${q.lag})`));
      }
    }
    const cfg = x.config ? [x.config.consumeMessageOrderly ? "FIFO" : "", `retryMaxTimes ${x.config.retryMaxTimes}`, x.config.consumeEnable === false ? "disabled" : ""].filter(Boolean).join(", ") : "";
    return el("tr", { "data-group": x.group }, el("td", {}, x.group), el("td", { class: "pre" }, [x.members, ...(x.memberIds || [])].join("\n")),
      el("td", {}, x.lag), el("td", {}, ((rates[x.group] || []).slice(-1)[0] || {}).ratePerS ?? ""), queues, el("td", {}, x.deadLetters), el("td", {}, x.pop.inFlight), el("td", {}, cfg));
  }));
}

$("#reset-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const at = new Date($("#reset-time").value).getTime();
  try {
    const r = await api("/api/groups/reset", { group: $("#reset-group").value, topic: $("#reset-topic").value, timestampMs: at });
    $("#reset-result").textContent = `${r.group} on ${r.topic}: ` + r.queues.map((q) => `queue ${q.queueId} ${q.previousOffset} -> ${q.committedOffset}`).join(", ");
    banner("");
    await refreshGroups();
  } catch (e) { banner(e.message); }
});

async function showDeadLetters() {
  const r = await api(`/api/dlq?group=${encodeURIComponent($("#dlq-group").value)}`);
  $("#dlq").replaceChildren(r.letters.length ? el("p", { class: "muted" }, `${r.letters.length} dead letter(s) of ${r.group}`) : el("p", { class: "muted" }, `no dead letter of ${r.group}`),
    ...r.letters.map((m) => el("div", { class: "letter", "data-msgid": m.msgId }, el("strong", {}, m.msgId), " ",
      el("span", { class: "muted" }, `DLQ offset ${m.dlqOffset}, first topic ${m.properties.RETRY_TOPIC || m.topic}`), el("pre", {}, m.body))));
}

$("#dlq-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try { await showDeadLetters(); banner(""); } catch (e) { banner(e.message); }
});

$("#dlq-resend").addEventListener("click", async () => {
  try {
    const r = await api("/api/dlq/resend", { group: $("#dlq-group").value });
    banner("");
    await showDeadLetters();
    $("#dlq").prepend(el("p", { class: "muted", id: "dlq-resent" }, `${r.resent} resent to ${r.group}`));
  } catch (e) { banner(e.message); }
});

async function refreshSecurity() {
  const a = await api("/api/acl");
  if (!a.aclEnable) {
    $("#acl-summary").textContent = "aclEnable is off: no ACL, nothing is checked";
    $("#accounts tbody").replaceChildren();
    return;
  }
  $("#acl-summary").textContent = `${a.aclFile}, version ${a.aclVersion}${a.reloadError ? " (the file on disk is refused: " + a.reloadError + ")" : ""}`;
  $("#accounts tbody").replaceChildren(...a.accounts.map((x) => el("tr", { "data-account": x.accessKey },
    el("td", {}, x.accessKey), el("td", {}, x.key), el("td", {}, x.grpc ? "yes" : ""), el("td", {}, x.admin ? "yes" : ""),
    el("td", {}, x.replica ? "yes" : ""), el("td", {}, x.enabled ? "yes" : "no"),
    el("td", { class: "pre" }, x.unrestricted ? "everything (admin without perm keys)" : [
      `topics: ${Object.entries(x.topicPerms || {}).map(([t, p]) => `${t}=${p}`).join(", ") || "-"} (default ${x.defaultTopicPerm})`,
      `groups: ${Object.entries(x.groupPerms || {}).map(([g, p]) => `${g}=${p}`).join(", ") || "-"} (default ${x.defaultGroupPerm})`,
      x.whiteRemoteAddress ? `from ${x.whiteRemoteAddress}` : ""].filter(Boolean).join("\n")))));
  $("#refusals tbody").replaceChildren(...(a.refusals || []).map((r) => el("tr", {}, el("td", {}, r.port), el("td", {}, r.op), el("td", {}, r.reason), el("td", {}, r.count))));
  $("#recent-refusals").replaceChildren(...(a.recentRefusals || []).map((r) => el("li", {}, `${new Date(r.atMs).toLocaleTimeString()} ${r.port} ${r.ip} ${r.account}: ${r.op} ${r.resource}: ${r.reason}`)));
}

async function refreshTopics() {
  const t = await api("/api/topics");
  $("#topics tbody").replaceChildren(...t.topics.map((x) => el("tr", { "data-topic": x.topic },
    link(x.topic, () => showTopic(x.topic)), el("td", {}, x.queues),
    el("td", {}, Object.entries(x.groups).map(([g, n]) => `${g}: ${n}`).join(", ")),
    el("td", {}, Object.entries(x.attributes).map(([k, v]) => `${k}=${v}`).join(", ")))));
}

function link(text, onclick) {
  const a = el("a", { href: "#topics" }, text);
  a.addEventListener("click", (ev) => { ev.preventDefault(); onclick(); });
  return el("td", {}, a);
}

async function showTopic(topic) {
  try {
    const d = await api(`/api/topic?topic=${encodeURIComponent(topic)}`);
    $("#topic-detail").replaceChildren(el("h3", {}, `${d.topic}: ${d.messages} messages kept`),
      el("p", { class: "muted" }, Object.entries(d.masters).map(([g, m]) => `${g}: master ${m || "none"}`).join(" · ")),
      el("table", { id: "topic-queues" }, el("tr", {}, el("th", {}, "group"), el("th", {}, "queue"), el("th", {}, "min offset"), el("th", {}, "max offset")),
        ...d.queues.map((q) => el("tr", { "data-queue": `${q.brokerName}/${q.queueId}` }, el("td", {}, q.brokerName), el("td", {}, q.queueId), el("td", {}, q.minOffset), el("td", {}, q.maxOffset)))));
    banner("");
  } catch (e) { banner(e.message); }
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
  else if ($("#find-from").value) {
    q.set("topic", $("#find-topic").value);
    q.set("fromMs", new Date($("#find-from").value).getTime());
    if ($("#find-to").value) q.set("toMs", new Date($("#find-to").value).getTime());
  } else { q.set("topic", $("#find-topic").value); q.set("key", $("#find-key").value); }
  try {
    const r = await api(`/api/messages?${q}`);
    banner(r.messages.length ? "" : "no such message");
    $("#found").replaceChildren(...r.messages.map((m) => el("div", { class: "message", "data-msgid": m.msgId },
      el("h3", {}, m.msgId),
      el("p", { class: "muted" }, `${m.topic} · ${m.brokerName} queue ${m.queueId} offset ${m.queueOffset} · stored ${new Date(m.storeTimestamp).toLocaleString()} · ${m.bodyBytes} bytes (${m.bodyKind})`),
      el("table", {}, ...Object.entries(m.properties).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v)))),
      el("ul", { class: "delivery" }, ...(m.delivery || []).map((d) => el("li", { "data-group": d.group }, `${d.group}: ${d.state} (committed ${d.committedOffset})`))),
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
    else if (state.page === "groups") await refreshGroups();
    else if (state.page === "security") await refreshSecurity();
  } catch (e) { banner(`the console does not answer: ${e.message}`); }
  // the cluster page asks twice per round of the console's (it answers from memory), so a
  // change shows within one round of the console having read it
  timer = setTimeout(refresh, state.page === "cluster" ? state.refreshMs / 2 : state.refreshMs);
}

loadSession().then(() => show(location.hash.slice(1) || "cluster"));

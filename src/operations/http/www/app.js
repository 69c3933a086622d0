// FerryMQ's dashboard: plain JavaScript over the management API (/api/...), no build step.
// Every value from the broker is put into the page as text (never as HTML).
"use strict";

const AUTH_KEY = "ferrymq.auth";
const state = { rates: [], timer: null, mqtt: null, scripts: {} };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick" || k === "onsubmit" || k === "onchange") e[k] = v;
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

async function api(method, path, body, headers) {
  const h = Object.assign({ authorization: sessionStorage.getItem(AUTH_KEY) || "", "x-requested-with": "XMLHttpRequest" }, headers || {});
  const init = { method, headers: h };
  if (body !== undefined) {
    h["content-type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  const resp = await fetch("api" + path, init);
  const text = await resp.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = text; }
  if (resp.status === 401) { logout(); throw new Error("not authorised"); }
  if (!resp.ok) throw new Error((json && json.reason) || resp.statusText);
  return json;
}

const enc = encodeURIComponent;
const fmt = n => (n === undefined || n === null) ? "" : Number(n).toLocaleString("en");
function bytes(n) {
  if (n === undefined || n === null) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0; n = Number(n);
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}
const when = ms => ms ? new Date(ms).toISOString().replace("T", " ").replace(/\..*/, "") : "";

function table(id, columns, rows, keyOf) {
  const head = el("tr", {}, columns.map(c => el("th", { class: c.num ? "num" : null }, c.title)));
  const body = rows.map(r => el("tr", { "data-name": keyOf ? keyOf(r) : null },
    columns.map(c => el("td", { class: c.num ? "num" : null }, c.cell(r)))));
  return el("table", { id }, el("thead", {}, head), el("tbody", {}, body));
}

function note(target, text, ok) {
  target.replaceChildren(el("span", { class: ok ? "ok" : "error" }, text));
}

function page(title, ...content) {
  const main = document.getElementById("main");
  main.replaceChildren(el("h2", { id: "page-title" }, title), ...content);
}

function guard(fn) {
  return async (...args) => {
    try { await fn(...args); } catch (e) {
      const main = document.getElementById("main");
      main.append(el("p", { class: "error", role: "alert" }, "Error: " + e.message));
    }
  };
}

// ----- pages -----------------------------------------------------------------------------

async function overview() {
  const [o, nodes] = await Promise.all([api("GET", "/overview"), api("GET", "/nodes")]);
  const n = nodes[0] || {};
  const stat = (label, value, id) => el("div", { class: "card stat", id }, el("div", { class: "value" }, value), el("div", { class: "label" }, label));
  const alarms = [n.mem_alarm ? "memory" : null, n.disk_free_alarm ? "disk" : null].filter(Boolean);
  const canvas = el("canvas", { id: "rates", width: 900, height: 180 });
  const caption = el("p", { id: "rates-caption", class: "muted" });
  page("Overview",
    el("div", { class: "cards" },
      stat("connections", fmt(o.object_totals.connections), "stat-connections"),
      stat("queues", fmt(o.object_totals.queues), "stat-queues"),
      stat("messages", fmt(o.queue_totals.messages), "stat-messages"),
      stat("consumers", fmt(o.object_totals.consumers), "stat-consumers"),
      stat("publish / s", (o.message_stats.publish_details.rate || 0).toFixed(1), "stat-publish-rate"),
      stat("deliver / s", (o.message_stats.deliver_get_details.rate || 0).toFixed(1), "stat-deliver-rate")),
    el("div", { class: "card" }, el("h2", {}, "Message rates (sampled every 5 s)"), canvas, caption),
    el("div", { class: "card", id: "alarms" }, el("h2", {}, "Alarms"),
      alarms.length ? el("p", { class: "error" }, "raised: " + alarms.join(", ")) : el("p", { class: "ok" }, "none")),
    el("div", { class: "card" }, el("h2", {}, "Listeners"), table("listeners-table", [
      { title: "protocol", cell: l => l.protocol }, { title: "address", cell: l => l.ip_address },
      { title: "port", cell: l => l.port, num: true }], o.listeners)),
    el("div", { class: "card" }, el("h2", {}, "Node"), table("node-table", [
      { title: "node", cell: x => x.name }, { title: "uptime", cell: x => Math.round(x.uptime / 1000) + " s", num: true },
      { title: "memory", cell: x => bytes(x.mem_used) + " of " + bytes(x.mem_limit) },
      { title: "disk free", cell: x => bytes(x.disk_free) },
      { title: "journal", cell: x => `${fmt(x.journal.segments)} segments, ${bytes(x.journal.log_bytes)}, ${fmt(x.journal.group_commits)} group commits, ${fmt(x.journal.fsyncs)} fsyncs` }],
      [n])),
    // A cluster member lists every member as it sees them (role in the metadata group,
    // heard from within 5 s, last contact).
    ...(nodes.length > 1 ? [el("div", { class: "card" }, el("h2", {}, "Cluster"), table("cluster-table", [
      { title: "member", cell: x => x === n ? x.name + " (this node)" : x.name },
      { title: "role", cell: x => (x.ferrymq_cluster || {}).role || "" },
      { title: "running", cell: x => x.running === false ? "no" : "yes" },
      { title: "last contact", cell: x => { const ms = (x.ferrymq_cluster || {}).last_contact_ms; return ms == null ? "" : fmt(ms) + " ms"; }, num: true }],
      nodes, x => x.name))] : []),
    el("p", { class: "muted" }, `${o.product_name} ${o.product_version} — RabbitMQ management API ${o.management_version} — ${o.node}`));
  state.rates.push({ t: Date.now(), publish: o.message_stats.publish_details.rate || 0, deliver: o.message_stats.deliver_get_details.rate || 0 });
  state.rates = state.rates.slice(-120);
  drawRates(canvas, caption);
}

/** The rates as two lines inside the canvas's frame; the scale and legend go in `caption`,
 *  under the chart, where no line can cross them. */
function drawRates(canvas, caption) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pts = state.rates, pad = 4;
  ctx.clearRect(0, 0, w, h);
  const max = Math.max(1, ...pts.map(p => Math.max(p.publish, p.deliver)));
  ctx.strokeStyle = "#d9dde5"; ctx.strokeRect(0, 0, w, h);
  const line = (key, color) => {
    ctx.strokeStyle = color; ctx.beginPath();
    pts.forEach((p, i) => {
      const x = pts.length < 2 ? w - pad : pad + (i / (pts.length - 1)) * (w - 2 * pad);
      const y = h - pad - (p[key] / max) * (h - 2 * pad);
      i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
    });
    ctx.stroke();
  };
  line("publish", "#0b6e99"); line("deliver", "#067647");
  caption.replaceChildren(`max ${max.toFixed(1)}/s — `, el("span", { class: "publish" }, "publish"), ", ",
    el("span", { class: "deliver" }, "deliver"));
}

async function connections() {
  const list = await api("GET", "/connections");
  const status = el("p", { id: "connections-status" });
  const close = c => el("button", { class: "danger", "data-close": c.name, onclick: guard(async () => {
    await api("DELETE", "/connections/" + enc(c.name), undefined, { "x-reason": "Closed from the FerryMQ dashboard" });
    note(status, "closed " + c.name, true);
    refreshSoon();
  }) }, "Close");
  page("Connections", status, table("connections-table", [
    { title: "name", cell: c => c.name }, { title: "protocol", cell: c => c.protocol },
    { title: "client", cell: c => c.client_id || (c.client_properties && (c.client_properties.connection_name || c.client_properties.product)) || "" },
    { title: "user", cell: c => c.user }, { title: "vhost", cell: c => c.vhost },
    { title: "channels", cell: c => c.channels, num: true },
    { title: "received", cell: c => bytes(c.recv_oct), num: true }, { title: "sent", cell: c => bytes(c.send_oct), num: true },
    { title: "connected", cell: c => when(c.connected_at) }, { title: "", cell: close }], list, c => c.name));
}

async function queues() {
  const list = await api("GET", "/queues");
  const status = el("p", { id: "queues-status" });
  const form = el("form", { class: "card", id: "declare-queue", onsubmit: guard(async ev => {
    ev.preventDefault();
    const f = ev.target;
    const args = f.type.value === "classic" ? {} : { "x-queue-type": f.type.value };
    await api("PUT", `/queues/${enc(f.vhost.value)}/${enc(f.name.value)}`, { durable: f.durable.checked, arguments: args });
    note(status, "declared " + f.name.value, true);
    route();
  }) }, el("h2", {}, "Declare a queue"),
    el("label", {}, "vhost ", el("input", { name: "vhost", value: "/" })),
    el("label", {}, "name ", el("input", { name: "name", required: true })),
    el("label", {}, "type ", el("select", { name: "type" }, el("option", {}, "classic"), el("option", {}, "stream"))),
    el("label", {}, el("input", { name: "durable", type: "checkbox", checked: true }), " durable"),
    el("button", { type: "submit" }, "Declare"));
  const link = q => el("a", { href: `#queue/${enc(q.vhost)}/${enc(q.name)}` }, q.name);
  page("Queues and streams", status, table("queues-table", [
    { title: "vhost", cell: q => q.vhost }, { title: "name", cell: link }, { title: "type", cell: q => q.type },
    { title: "durable", cell: q => q.durable ? "yes" : "no" },
    { title: "ready", cell: q => fmt(q.messages_ready), num: true },
    { title: "unacked", cell: q => fmt(q.messages_unacknowledged), num: true },
    { title: "total", cell: q => fmt(q.messages), num: true },
    { title: "bytes", cell: q => bytes(q.message_bytes), num: true },
    { title: "in / s", cell: q => rateOf(q, "publish"), num: true },
    { title: "out / s", cell: q => rateOf(q, "deliver_get"), num: true },
    { title: "ack / s", cell: q => rateOf(q, "ack"), num: true },
    { title: "consumers", cell: q => q.consumers, num: true }], list, q => q.name), form);
}

/** A queue's message rate (`message_stats.<kind>_details.rate`) for a table cell. */
function rateOf(q, kind) {
  const d = (q.message_stats || {})[kind + "_details"];
  return ((d && d.rate) || 0).toFixed(1);
}

async function queue(vhost, name) {
  const path = `/queues/${enc(vhost)}/${enc(name)}`;
  const q = await api("GET", path);
  const status = el("p", { id: "queue-status" });
  const got = el("div", { id: "got-messages" });
  const publish = el("form", { class: "card", id: "publish-form", onsubmit: guard(async ev => {
    ev.preventDefault();
    const f = ev.target;
    const r = await api("POST", `/exchanges/${enc(vhost)}/amq.default/publish`, {
      routing_key: name, payload: f.payload.value, payload_encoding: "string",
      properties: { delivery_mode: f.persistent.checked ? 2 : 1 } });
    note(status, r.routed ? "published" : "not routed", r.routed);
  }) }, el("h2", {}, "Publish a test message"),
    el("label", {}, "payload ", el("input", { name: "payload", id: "publish-payload", required: true, size: 40 })),
    el("label", {}, el("input", { name: "persistent", type: "checkbox", checked: true }), " persistent"),
    el("button", { type: "submit", id: "publish-button" }, "Publish"));
  const get = el("form", { class: "card", id: "get-form", onsubmit: guard(async ev => {
    ev.preventDefault();
    const f = ev.target;
    const msgs = await api("POST", path + "/get", { count: Number(f.count.value), ackmode: f.ackmode.value, encoding: "auto", truncate: 50000 });
    got.replaceChildren(msgs.length ? table("got-table", [
      { title: "payload", cell: m => m.payload }, { title: "encoding", cell: m => m.payload_encoding },
      { title: "routing key", cell: m => m.routing_key }, { title: "exchange", cell: m => m.exchange },
      { title: "redelivered", cell: m => m.redelivered ? "yes" : "no" },
      { title: "properties", cell: m => JSON.stringify(m.properties) }], msgs) : el("p", { class: "muted" }, "queue empty"));
  }) }, el("h2", {}, "Get messages"),
    el("label", {}, "count ", el("input", { name: "count", type: "number", value: 1, min: 1 })),
    el("label", {}, "mode ", el("select", { name: "ackmode" },
      el("option", { value: "ack_requeue_true" }, "look (requeue)"), el("option", { value: "ack_requeue_false" }, "take (ack)"),
      el("option", { value: "reject_requeue_true" }, "reject, requeue"))),
    el("button", { type: "submit", id: "get-button" }, "Get"), got);
  const purge = el("button", { class: "danger", id: "purge-button", onclick: guard(async () => {
    await api("DELETE", path + "/contents"); note(status, "purged", true); route();
  }) }, "Purge");
  const remove = el("button", { class: "danger", id: "delete-button", onclick: guard(async () => {
    await api("DELETE", path); location.hash = "#queues";
  }) }, "Delete");
  const facts = table("queue-facts", [
    { title: "type", cell: x => x.type }, { title: "durable", cell: x => x.durable ? "yes" : "no" },
    { title: "arguments", cell: x => JSON.stringify(x.arguments) },
    { title: "ready", cell: x => fmt(x.messages_ready), num: true }, { title: "unacked", cell: x => fmt(x.messages_unacknowledged), num: true },
    { title: "bytes", cell: x => bytes(x.message_bytes), num: true },
    ...(x => x.type === "stream" ? [{ title: "offsets", cell: x => x.last_offset === null ? "empty" : `${fmt(x.first_offset)}–${fmt(x.last_offset)}` }] : [])(q),
    { title: "consumers", cell: x => x.consumers, num: true },
    { title: "published", cell: x => fmt((x.message_stats || {}).publish || 0), num: true },
    { title: "delivered / got", cell: x => fmt((x.message_stats || {}).deliver_get || 0), num: true },
    { title: "acked", cell: x => fmt((x.message_stats || {}).ack || 0), num: true },
    { title: "in / s", cell: x => rateOf(x, "publish"), num: true },
    { title: "out / s", cell: x => rateOf(x, "deliver_get"), num: true }], [q]);
  const parts = [status, el("div", { class: "card" }, facts, el("p", {}, purge, " ", remove)), publish];
  if (q.type === "stream") parts.push(await streamGroups(vhost, name));
  else parts.push(get);
  page(`Queue ${name} (${vhost})`, ...parts);
}

async function streamGroups(vhost, name) {
  const s = await api("GET", `/ferrymq/streams/${enc(vhost)}/${enc(name)}/groups`);
  const status = el("p", {});
  const reset = g => el("form", { onsubmit: guard(async ev => {
    ev.preventDefault();
    const r = await api("POST", `/ferrymq/streams/${enc(vhost)}/${enc(name)}/groups/${enc(g.name)}/reset`, { offset: Number(ev.target.offset.value) });
    note(status, `${g.name} reset to ${r.committed_offset}`, true);
  }) }, el("input", { name: "offset", type: "number", min: 0, value: s.first_offset, size: 8 }), " ", el("button", { type: "submit" }, "Reset"));
  return el("div", { class: "card", id: "stream-groups" }, el("h2", {}, `Consumer groups (offsets ${s.first_offset}–${s.end_offset})`), status,
    table("groups-table", [{ title: "group", cell: g => g.name }, { title: "committed", cell: g => fmt(g.committed_offset), num: true },
      { title: "lag", cell: g => fmt(g.lag), num: true }, { title: "members", cell: g => g.members, num: true },
      { title: "reset to offset", cell: reset }], s.groups, g => g.name));
}

async function exchanges() {
  const [xs, bs] = await Promise.all([api("GET", "/exchanges"), api("GET", "/bindings")]);
  page("Exchanges",
    table("exchanges-table", [{ title: "vhost", cell: x => x.vhost }, { title: "name", cell: x => x.name || "(AMQP default)" },
      { title: "type", cell: x => x.type }, { title: "durable", cell: x => x.durable ? "yes" : "no" },
      { title: "arguments", cell: x => JSON.stringify(x.arguments) }], xs, x => x.name),
    el("h2", {}, "Bindings"),
    table("bindings-table", [{ title: "vhost", cell: b => b.vhost }, { title: "source", cell: b => b.source || "(AMQP default)" },
      { title: "destination", cell: b => `${b.destination_type} ${b.destination}` }, { title: "routing key", cell: b => b.routing_key },
      { title: "arguments", cell: b => JSON.stringify(b.arguments) }], bs));
}

/** An MQTT session expiry interval in seconds; 4294967295 (0xFFFFFFFF) is "never expires". */
function expiry(secs) {
  if (secs === undefined || secs === null) return "";
  return secs >= 4294967295 ? "never" : fmt(secs) + " s";
}

async function mqtt() {
  const [clients, sessions, subs, retained, bridges] = await Promise.all([api("GET", "/ferrymq/mqtt/clients"),
    api("GET", "/ferrymq/mqtt/sessions"), api("GET", "/ferrymq/mqtt/subscriptions"), api("GET", "/ferrymq/mqtt/retained"),
    api("GET", "/ferrymq/bridges")]);
  const status = el("p", { id: "mqtt-status" });
  const action = (label, method, path, done) => el("button", { class: "danger", onclick: guard(async () => {
    await api(method, path); note(status, done, true); refreshSoon();
  }) }, label);
  page("MQTT", status,
    el("h2", {}, "Clients"), table("clients-table", [{ title: "client id", cell: c => c.clientid }, { title: "version", cell: c => c.proto_ver },
      { title: "user", cell: c => c.username }, { title: "peer", cell: c => `${c.ip_address}:${c.port}` },
      { title: "keep-alive", cell: c => c.keepalive, num: true }, { title: "clean start", cell: c => c.clean_start ? "yes" : "no" },
      { title: "session expiry", cell: c => expiry(c.expiry_interval), num: true }, { title: "subscriptions", cell: c => c.subscriptions_cnt, num: true },
      { title: "", cell: c => action("Kick", "DELETE", "/ferrymq/mqtt/clients/" + enc(c.clientid), "kicked " + c.clientid) }], clients, c => c.clientid),
    el("h2", {}, "Sessions"), table("sessions-table", [{ title: "client id", cell: s => s.clientid },
      { title: "connected", cell: s => s.connected ? "yes" : "no" }, { title: "persistent", cell: s => s.persistent ? "yes" : "no" },
      { title: "expiry", cell: s => expiry(s.expiry_interval), num: true },
      { title: "queued", cell: s => s.mqueue_len === null ? "" : fmt(s.mqueue_len), num: true },
      { title: "subscriptions", cell: s => s.subscriptions.map(x => `${x.topic} (QoS ${x.qos})`).join(", ") },
      { title: "", cell: s => action("Delete", "DELETE", "/ferrymq/mqtt/sessions/" + enc(s.clientid), "deleted session " + s.clientid) }], sessions, s => s.clientid),
    el("h2", {}, "Subscriptions"), table("subscriptions-table", [{ title: "client id", cell: s => s.clientid },
      { title: "filter", cell: s => s.topic }, { title: "QoS", cell: s => s.qos, num: true }], subs),
    el("h2", {}, "Retained messages"), table("retained-table", [{ title: "topic", cell: r => r.topic },
      { title: "payload", cell: r => r.payload }, { title: "bytes", cell: r => r.payload_bytes, num: true },
      { title: "", cell: r => action("Delete", "DELETE", "/ferrymq/mqtt/retained/" + r.topic.split("/").map(enc).join("/"), "deleted " + r.topic) }], retained, r => r.topic),
    el("h2", {}, "Bridges"), bridges.length ? table("bridges-table", [{ title: "bridge", cell: b => b.name },
      { title: "address", cell: b => b.address }, { title: "state", cell: b => b.state },
      { title: "sent", cell: b => fmt(b.sent), num: true }, { title: "received", cell: b => fmt(b.received), num: true },
      { title: "refused in", cell: b => fmt(b.refused_in), num: true }, { title: "refused out", cell: b => fmt(b.refused_out), num: true },
      { title: "warnings", cell: b => (b.warnings || []).map(w => el("div", { class: "error" }, w)) },
      { title: "last error", cell: b => b.reason || "" }], bridges, b => b.name)
      : el("p", { class: "muted", id: "no-bridges" }, "No [[bridge.mqtt]] is configured."));
}

async function admin() {
  const [users, vhosts, perms] = await Promise.all([api("GET", "/users"), api("GET", "/vhosts"), api("GET", "/permissions")]);
  const status = el("p", { id: "admin-status" });
  const addUser = el("form", { class: "card", id: "add-user", onsubmit: guard(async ev => {
    ev.preventDefault();
    const f = ev.target;
    await api("PUT", "/users/" + enc(f.name.value), { password: f.password.value, tags: f.tags.value });
    note(status, "user " + f.name.value + " saved", true); route();
  }) }, el("h2", {}, "Add or change a user"), el("label", {}, "name ", el("input", { name: "name", required: true })),
    el("label", {}, "password ", el("input", { name: "password", type: "password", required: true, autocomplete: "new-password" })),
    el("label", {}, "tags ", el("input", { name: "tags", placeholder: "monitoring" })), el("button", { type: "submit" }, "Save"));
  const addVhost = el("form", { class: "card", id: "add-vhost", onsubmit: guard(async ev => {
    ev.preventDefault();
    await api("PUT", "/vhosts/" + enc(ev.target.name.value), { description: ev.target.description.value });
    note(status, "vhost " + ev.target.name.value + " saved", true); route();
  }) }, el("h2", {}, "Add a virtual host"), el("label", {}, "name ", el("input", { name: "name", required: true })),
    el("label", {}, "description ", el("input", { name: "description" })), el("button", { type: "submit" }, "Save"));
  const addPermission = el("form", { class: "card", id: "add-permission", onsubmit: guard(async ev => {
    ev.preventDefault();
    const f = ev.target;
    await api("PUT", `/permissions/${enc(f.vhost.value)}/${enc(f.user.value)}`,
      { configure: f.configure.value, write: f.write.value, read: f.read.value });
    note(status, `permissions of ${f.user.value} in ${f.vhost.value} saved`, true); route();
  }) }, el("h2", {}, "Set a user's permissions in a virtual host"),
    el("label", {}, "user ", el("select", { name: "user", required: true }, users.map(u => el("option", {}, u.name)))),
    el("label", {}, "vhost ", el("select", { name: "vhost", required: true }, vhosts.map(v => el("option", {}, v.name)))),
    el("label", {}, "configure ", el("input", { name: "configure", value: ".*", size: 12 })),
    el("label", {}, "write ", el("input", { name: "write", value: ".*", size: 12 })),
    el("label", {}, "read ", el("input", { name: "read", value: ".*", size: 12 })),
    el("button", { type: "submit" }, "Save"),
    el("p", { class: "muted" }, "Regular expressions over exchange and queue names, as RabbitMQ's; enforced for AMQP, and for MQTT on the MQTT exchange, when auth.authorization is on."));
  const clear = p => el("button", { class: "danger", "data-clear": `${p.vhost}/${p.user}`, onclick: guard(async () => {
    await api("DELETE", `/permissions/${enc(p.vhost)}/${enc(p.user)}`);
    note(status, `permissions of ${p.user} in ${p.vhost} cleared`, true); route();
  }) }, "Clear");
  page("Users, virtual hosts and permissions", status,
    table("users-table", [{ title: "user", cell: u => u.name }, { title: "tags", cell: u => u.tags.join(", ") }], users, u => u.name), addUser,
    table("vhosts-table", [{ title: "virtual host", cell: v => v.name }, { title: "description", cell: v => v.description },
      { title: "messages", cell: v => fmt(v.messages), num: true }], vhosts, v => v.name), addVhost,
    table("permissions-table", [{ title: "user", cell: p => p.user }, { title: "vhost", cell: p => p.vhost },
      { title: "configure", cell: p => p.configure }, { title: "write", cell: p => p.write }, { title: "read", cell: p => p.read },
      { title: "", cell: clear }], perms, p => `${p.vhost}/${p.user}`), addPermission,
    el("p", { class: "muted" }, "With auth.authorization on, permissions apply to AMQP, MQTT and the management API alike."));
}

async function definitions() {
  const out = el("textarea", { id: "definitions-json", readonly: true });
  const link = el("a", { id: "definitions-download", hidden: true }, "Download definitions.json");
  const input = el("textarea", { id: "import-json", placeholder: "paste a RabbitMQ or FerryMQ definitions file" });
  const report = el("pre", { id: "import-report" });
  const exportButton = el("button", { id: "export-button", onclick: guard(async () => {
    const defs = await api("GET", "/definitions");
    const text = JSON.stringify(defs, null, 2);
    out.value = text;
    link.href = URL.createObjectURL(new Blob([text], { type: "application/json" }));
    link.download = "definitions.json";
    link.hidden = false;
  }) }, "Export");
  const importButton = el("button", { id: "import-button", onclick: guard(async () => {
    const r = await api("POST", "/definitions", input.value);
    report.textContent = JSON.stringify(r, null, 2);
  }) }, "Import");
  page("Definitions", el("div", { class: "card" }, el("h2", {}, "Export"), exportButton, " ", link, out),
    el("div", { class: "card" }, el("h2", {}, "Import"), input, importButton, report));
}

async function lookup() {
  const results = el("div", { id: "lookup-results" });
  const form = el("form", { class: "card", id: "lookup-form", onsubmit: guard(async ev => {
    ev.preventDefault();
    const found = await api("GET", "/ferrymq/messages?key=" + enc(ev.target.key.value) + "&limit=100");
    results.replaceChildren(found.length ? table("lookup-table", [{ title: "stored", cell: m => when(m.stored_at) },
      { title: "exchange", cell: m => m.exchange }, { title: "routing key", cell: m => m.routing_key },
      { title: "payload", cell: m => m.payload }, { title: "headers", cell: m => JSON.stringify(m.headers) },
      { title: "log position", cell: m => m.log_position, num: true }], found) : el("p", { class: "muted" }, "no message with that key"));
  }) }, el("label", {}, "key (message_id, x-key, MQTT key) ", el("input", { name: "key", required: true, size: 40 })),
    el("button", { type: "submit" }, "Look up"));
  page("Message lookup by key", form, results);
}

// ----- MQTT client: MQTT.js (vendor/mqtt.min.js) over the MQTT WebSocket listener -----------

/** Loads a script of this listener once (MQTT.js is only fetched when its page is opened). */
function script(src) {
  state.scripts[src] = state.scripts[src] || new Promise((resolve, reject) => {
    const tag = el("script", { src });
    tag.onload = resolve;
    tag.onerror = () => { delete state.scripts[src]; reject(new Error("cannot load " + src)); };
    document.head.append(tag);
  });
  return state.scripts[src];
}

/** The dashboard user's name and password: the Basic credentials the page keeps for the API. */
function credentials() {
  const text = decodeURIComponent(escape(atob((sessionStorage.getItem(AUTH_KEY) || "").replace(/^Basic /, ""))));
  const colon = text.indexOf(":");
  return { username: text.slice(0, colon), password: text.slice(colon + 1) };
}

/** A payload for a table cell: UTF-8 text (else hex), long ones cut. */
function shown(payload) {
  let text;
  try { text = new TextDecoder("utf-8", { fatal: true }).decode(payload); } catch (_) {
    text = "0x" + Array.from(payload.subarray(0, 500), b => b.toString(16).padStart(2, "0")).join("");
  }
  return text.length > 1000 ? `${text.slice(0, 1000)}… (${fmt(payload.length)} bytes)` : text;
}

function endMqtt() {
  if (state.mqtt) state.mqtt.end(true);
  state.mqtt = null;
}

async function websocket() {
  const o = await api("GET", "/overview");
  const secure = location.protocol === "https:";
  const listener = o.listeners.find(l => l.protocol === (secure ? "https/web-mqtt" : "http/web-mqtt"));
  if (!listener) {
    page("MQTT client", el("p", { class: "muted", id: "ws-none" },
      `No MQTT ${secure ? "WebSocket over TLS (mqtt.wss_listen)" : "WebSocket (mqtt.ws_listen)"} listener is configured.`));
    return;
  }
  await script("vendor/mqtt.min.js");
  const status = el("p", { id: "ws-status" }, "not connected");
  const subscriptions = el("ul", { id: "ws-subscriptions" });
  const received = el("tbody", {});
  const qos = (name, id) => el("select", { name, id }, [0, 1, 2].map(q => el("option", { value: q }, "QoS " + q)));
  const client = () => {
    if (!state.mqtt || !state.mqtt.connected) throw new Error("not connected");
    return state.mqtt;
  };
  const connect = el("form", { class: "card", id: "ws-connect-form", onsubmit: ev => {
    ev.preventDefault();
    endMqtt();
    subscriptions.replaceChildren();
    const f = ev.target;
    note(status, "connecting to " + f.url.value, true);
    // Native timers: MQTT.js's default keep-alive timer is a Web Worker made from a blob: URL,
    // which the dashboard's Content-Security-Policy does not allow.
    const c = mqtt.connect(f.url.value, Object.assign(credentials(), { protocolVersion: Number(f.version.value),
      clientId: "ferrymq-dashboard-" + Math.random().toString(16).slice(2, 10), reconnectPeriod: 0, connectTimeout: 10000,
      timerVariant: "native" }));
    state.mqtt = c;
    let failed = false, opened = false; // an error stays shown when the connection then closes
    c.on("connect", () => { opened = true; note(status, `connected to ${f.url.value} as ${c.options.clientId}`, true); });
    c.on("error", e => { failed = true; note(status, "error: " + e.message, false); });
    c.on("close", () => {
      if (state.mqtt === c && !failed) note(status, opened ? "disconnected" : `could not connect to ${f.url.value}`, false);
    });
    c.on("message", (topic, payload, packet) => {
      received.prepend(el("tr", {}, el("td", {}, topic), el("td", {}, shown(payload)),
        el("td", { class: "num" }, packet.qos), el("td", {}, packet.retain ? "yes" : "no"), el("td", {}, when(Date.now()))));
      while (received.children.length > 200) received.lastChild.remove();
    });
  } }, el("h2", {}, "Connection"),
    el("label", {}, "URL ", el("input", { name: "url", id: "ws-url", size: 40, required: true,
      value: `${secure ? "wss" : "ws"}://${location.hostname}:${listener.port}/mqtt` })),
    el("label", {}, "version ", el("select", { name: "version", id: "ws-version" },
      el("option", { value: 5 }, "MQTT 5.0"), el("option", { value: 4 }, "MQTT 3.1.1"))),
    el("button", { type: "submit", id: "ws-connect" }, "Connect"), " ",
    el("button", { type: "button", id: "ws-disconnect", onclick: () => { endMqtt(); note(status, "disconnected", true); } }, "Disconnect"),
    el("p", { class: "muted" }, "Logs in as the dashboard user; the path is the broker's mqtt.ws_path."));
  const subscribe = el("form", { class: "card", id: "ws-subscribe-form", onsubmit: guard(async ev => {
    ev.preventDefault();
    const f = ev.target, filter = f.filter.value;
    const [granted] = await client().subscribeAsync(filter, { qos: Number(f.qos.value) });
    if (granted.qos >= 0x80) return note(status, `subscription to ${filter} refused (reason code 0x${granted.qos.toString(16)})`, false);
    note(status, `subscribed to ${filter} (QoS ${granted.qos})`, true);
    const item = el("li", { "data-name": filter }, `${filter} (QoS ${granted.qos}) `, el("button", { type: "button", onclick: guard(async () => {
      await client().unsubscribeAsync(filter); item.remove(); note(status, "unsubscribed from " + filter, true);
    }) }, "Unsubscribe"));
    subscriptions.append(item);
  }) }, el("h2", {}, "Subscribe"),
    el("label", {}, "filter ", el("input", { name: "filter", id: "ws-filter", required: true, value: "#" })),
    el("label", {}, "QoS ", qos("qos", "ws-subscribe-qos")),
    el("button", { type: "submit", id: "ws-subscribe" }, "Subscribe"), subscriptions);
  const publish = el("form", { class: "card", id: "ws-publish-form", onsubmit: guard(async ev => {
    ev.preventDefault();
    const f = ev.target;
    await client().publishAsync(f.topic.value, f.payload.value, { qos: Number(f.qos.value), retain: f.retain.checked });
    note(status, "published to " + f.topic.value, true);
  }) }, el("h2", {}, "Publish"),
    el("label", {}, "topic ", el("input", { name: "topic", id: "ws-topic", required: true })),
    el("label", {}, "payload ", el("input", { name: "payload", id: "ws-payload", size: 40 })),
    el("label", {}, "QoS ", qos("qos", "ws-publish-qos")),
    el("label", {}, el("input", { name: "retain", id: "ws-retain", type: "checkbox" }), " retain"),
    el("button", { type: "submit", id: "ws-publish" }, "Publish"));
  page("MQTT client", status, connect, subscribe, publish, el("div", { class: "card" }, el("h2", {}, "Received messages (newest first)"),
    el("table", { id: "ws-messages" }, el("thead", {}, el("tr", {}, ["topic", "payload", "QoS", "retain", "received"].map(t => el("th", {}, t)))), received)));
}

// ----- routing and login -------------------------------------------------------------------

const routes = { overview, connections, queues, exchanges, mqtt, admin, definitions, lookup, websocket };

// One render at a time: a navigation or refresh that comes while a page is rendering runs once
// after it, so an older page's answer never lands over a newer page.
let rendering = null, renderAgain = false;

async function route() {
  if (rendering) { renderAgain = true; return rendering; }
  rendering = (async () => { do { renderAgain = false; await render(); } while (renderAgain); })();
  try { await rendering; } finally { rendering = null; }
}

// Renders the current page again shortly after an action, unless the user has moved on.
function refreshSoon() {
  const at = location.hash;
  setTimeout(() => { if (location.hash === at) route(); }, 300);
}

async function render() {
  if (!sessionStorage.getItem(AUTH_KEY)) return showLogin();
  const [name, ...rest] = (location.hash.replace(/^#/, "") || "overview").split("/");
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.getAttribute("href") === "#" + name);
  clearInterval(state.timer);
  endMqtt();
  const main = document.getElementById("main");
  delete main.dataset.ready;
  const show = name === "queue" ? () => queue(decodeURIComponent(rest[0]), decodeURIComponent(rest.slice(1).join("/")))
    : (routes[name] || overview);
  await guard(show)();
  main.dataset.ready = name;
  if (name === "overview" || !routes[name]) state.timer = setInterval(route, 5000);
}

function showLogin() {
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  const main = document.getElementById("main");
  if (!document.getElementById("login")) location.reload();
  main.querySelector("#username") && main.querySelector("#username").focus();
}

function logout() {
  sessionStorage.removeItem(AUTH_KEY);
  clearInterval(state.timer);
  endMqtt();
  location.hash = "";
  location.reload();
}

async function login(ev) {
  ev.preventDefault();
  const user = document.getElementById("username").value, pass = document.getElementById("password").value;
  const auth = "Basic " + btoa(unescape(encodeURIComponent(user + ":" + pass)));
  const resp = await fetch("api/whoami", { headers: { authorization: auth, "x-requested-with": "XMLHttpRequest" } });
  if (!resp.ok) {
    const body = await resp.json().catch(() => ({}));
    document.getElementById("login-error").textContent = "Login failed: " + (body.reason || resp.statusText);
    return;
  }
  sessionStorage.setItem(AUTH_KEY, auth);
  await start();
}

async function start() {
  const me = await api("GET", "/whoami");
  document.getElementById("who").textContent = `${me.name} (${me.tags.join(", ") || "no tags"})`;
  document.getElementById("nav").hidden = false;
  document.getElementById("logout").hidden = false;
  await route();
}

document.getElementById("login").addEventListener("submit", ev => { login(ev).catch(e => { document.getElementById("login-error").textContent = e.message; }); });
document.getElementById("logout").addEventListener("click", logout);
window.addEventListener("hashchange", () => { route(); });
if (sessionStorage.getItem(AUTH_KEY)) start().catch(() => logout());

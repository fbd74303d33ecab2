// sparkmq console: plain JavaScript over the console's /api (api/console/app.py).
// One page per hash route (#/cluster, #/topics, ...); each page renders into <main> and may register live
// refreshes, which stop when the page changes.  Charts are uPlot (bundled by build.py, no CDN).
"use strict";

// me: GET /api/session (whether ACL is on and who is signed in; never a secret).
const state = { timers: [], charts: [], range: 900, me: { acl_enabled: false, signed_in: false } };

// -- small helpers ------------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function api(path, opts = {}) {
  const init = { method: opts.method || "GET", headers: {} };
  if (opts.body !== undefined) {
    init.body = JSON.stringify(opts.body);
    init.headers["Content-Type"] = "application/json";
  }
  const response = await fetch("/api" + path, init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const err = new Error(`${data.code || response.status}: ${data.message || response.statusText}`);
    err.code = data.code;
    // The session ended (or ACL was turned on): back to the sign-in form.
    if (data.code === "AUTHENTICATION_FAILED" && path !== "/session") {
      state.me = { acl_enabled: true, signed_in: false };
      showUser();
    }
    throw err;
  }
  return data;
}

function flash(message, kind) {
  const box = document.getElementById("flash");
  box.textContent = message;
  box.className = kind === "info" ? "info" : "";
  box.hidden = !message;
}

function pad(n, w = 2) { return String(n).padStart(w, "0"); }
function fmtTime(ms) {
  if (!ms) return "";
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:` +
    `${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}
function fmtNum(n) { return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"); }
function fmtRate(n) { return n === null || n === undefined ? "—" : (n >= 100 ? n.toFixed(0) : n.toFixed(1)); }
function fmtBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
function localInput(ms) {  // value for <input type=datetime-local>
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}
function enc(s) { return encodeURIComponent(s); }

function table(columns, rows, opts = {}) {
  // columns: [{key, label, num, render(row) -> node|string, cls}]
  const head = el("tr", {}, columns.map(c => el("th", { class: [c.num ? "num" : "", c.cls || ""].join(" ") },
    c.label)));
  const body = rows.map(r => el("tr", opts.rowAttrs ? opts.rowAttrs(r) : {}, columns.map(c => el("td",
    { class: [c.num ? "num" : "", c.cls || ""].join(" ") },
    c.render ? c.render(r) : (c.num ? fmtNum(r[c.key]) : (r[c.key] ?? ""))))));
  const t = el("table", { "data-testid": opts.testid || null }, el("thead", {}, head), el("tbody", {}, body));
  if (!rows.length && opts.empty) t.querySelector("tbody").append(el("tr", {}, el("td",
    { colspan: columns.length, class: "muted" }, opts.empty)));
  return el("div", { class: "scroll" }, t);
}

function stat(label, value, testid) {
  return el("div", { class: "stat" }, el("div", { class: "v", "data-testid": testid || null }, value),
    el("div", { class: "k" }, label));
}

function pager(data, go) {
  const pages = Math.max(1, Math.ceil(data.total / data.size));
  return el("div", { class: "pager" },
    el("button", { onclick: () => go(data.page - 1), disabled: data.page <= 1, "aria-label": "previous page" }, "‹"),
    el("span", { "data-testid": "pager" }, `page ${data.page} of ${pages} · ${fmtNum(data.total)} in all`),
    el("button", { onclick: () => go(data.page + 1), disabled: data.page >= pages, "aria-label": "next page" }, "›"));
}

function debounce(fn, ms) {
  let t;
  return (...args) => { clearTimeout(t); t = setTimeout(() => fn(...args), ms); };
}

// A refresh that runs every `ms` while this page is shown (the dot in the header blinks on each).
function live(fn, ms) {
  const dot = document.getElementById("live");
  const tick = async () => {
    dot.classList.add("on");
    try { await fn(); } catch (e) { flash(e.message); } finally { setTimeout(() => dot.classList.remove("on"), 300); }
  };
  state.timers.push(setInterval(tick, ms));
}

function confirmModal(title, text, confirmWord, action) {
  // Resolves after `action` ran; with confirmWord the button is enabled once the user typed it.
  const modal = document.getElementById("modal");
  const input = confirmWord ? el("input", { "data-testid": "confirm-input", placeholder: confirmWord,
    oninput: () => { ok.disabled = input.value !== confirmWord; } }) : null;
  const ok = el("button", { class: "danger", "data-testid": "confirm-ok", disabled: !!confirmWord,
    onclick: async () => { modal.hidden = true; await action(); } }, "Confirm");
  const cancel = el("button", { onclick: () => { modal.hidden = true; } }, "Cancel");
  modal.replaceChildren(el("div", { class: "box", role: "dialog", "aria-label": title },
    el("h1", {}, title), el("p", {}, text),
    confirmWord ? el("p", { class: "muted" }, `Type `, el("b", {}, confirmWord), ` to confirm.`) : null,
    input, el("div", { class: "actions" }, cancel, ok)));
  modal.hidden = false;
  (input || ok).focus();
}

// -- charts (uPlot) -----------------------------------------------------------------------------
function lineChart(container, title, seriesDefs, data) {
  // data: [[t...], [v...], ...] in epoch seconds; seriesDefs: [{label, stroke, scale}]
  const width = Math.max(260, container.clientWidth - 8);
  const axes = [{}, { scale: seriesDefs[0].scale || "y", size: 60 }];
  if (seriesDefs.some(s => s.scale === "r")) axes.push({ scale: "r", side: 1, grid: { show: false }, size: 60 });
  const opts = {
    title, width, height: 220, axes,
    scales: { x: { time: true } },
    series: [{}, ...seriesDefs.map(s => ({ label: s.label, stroke: s.stroke, width: 2, scale: s.scale || "y",
      fill: s.fill || null, points: { show: false } }))],
  };
  const plot = new uPlot(opts, data, container);
  state.charts.push({ plot, container });
  return plot;
}

window.addEventListener("resize", debounce(() => {
  for (const { plot, container } of state.charts) plot.setSize({ width: Math.max(260, container.clientWidth - 8),
    height: 220 });
}, 150));

// Up to an hour the charts show the console's live samples; the longer ranges read the lake's per-minute
// report tables (topic_stats, group_stats) through the brokers.
const LIVE_RANGES = [[300, "last 5 min"], [900, "last 15 min"], [3600, "last hour"]];
const REPORT_RANGES = [[21600, "last 6 hours (reports)"], [86400, "last 24 hours (reports)"],
  [604800, "last 7 days (reports)"]];
const isReportRange = (s) => s > LIVE_RANGES[LIVE_RANGES.length - 1][0];

function rangePicker(onChange) {
  const select = el("select", { "data-testid": "range", onchange: () => { state.range = +select.value; onChange(); } },
    el("optgroup", { label: "live" }, LIVE_RANGES.map(([v, label]) =>
      el("option", { value: v, selected: v === state.range }, label))),
    el("optgroup", { label: "report tables (per minute)" }, REPORT_RANGES.map(([v, label]) =>
      el("option", { value: v, selected: v === state.range }, label))));
  return el("label", {}, "time range", select);
}

// A chart over the picked range: `fetch(range)` answers /api/history; live ranges redraw on every refresh,
// report ranges (a new point per minute at most) every 30 s.
function historyChart(container, title, seriesDefs, fetch, toColumns) {
  let plot = null;
  let fetched = 0;
  let shownRange = null;
  return async (force) => {
    const report = isReportRange(state.range);
    if (!force && report && shownRange === state.range && Date.now() - fetched < 30000) return;
    const h = await fetch(state.range);
    fetched = Date.now();
    shownRange = state.range;
    const data = toColumns(h);
    // The points drawn (tests and people can tell an empty chart from a flat one), and where they came from.
    container.dataset.points = String(data.slice(1).reduce((n, s) => n + s.filter(v => v !== null).length, 0));
    container.dataset.source = h.source || "live";
    if (plot) plot.setData(data); else plot = lineChart(container, title, seriesDefs, data);
    const note = container.querySelector(".chart-note") || container.appendChild(el("p", { class: "muted chart-note" }));
    note.textContent = report ? (data[0].length ? `from the report tables, one point per ${h.step_s / 60} min` +
      (h.truncated ? " (truncated: too many rows)" : "") : "no report rows in this range yet (the lake writes one per minute)") : "";
  };
}

function columns(points, ...more) {
  // [[t, v]...] (+ more series aligned on the first one's times) -> uPlot's columnar data
  const xs = points.map(p => p[0]);
  const out = [xs, points.map(p => p[1])];
  for (const series of more) {
    const byT = new Map(series.map(p => [p[0], p[1]]));
    out.push(xs.map(t => (byT.has(t) ? byT.get(t) : null)));
  }
  return out;
}

// -- pages --------------------------------------------------------------------------------------
const pages = {};

pages.cluster = async (main) => {
  const body = el("div");
  main.append(el("h1", {}, "Cluster"), body);
  const render = async () => {
    const data = await api("/cluster");
    const masters = data.brokers.filter(b => b.broker_id === 0);
    const write = masters.reduce((s, b) => s + (b.write_bytes_per_s || 0), 0);
    const lakeRows = Object.entries(data.lake.error ? {} : data.lake);
    body.replaceChildren(
      el("div", { class: "cards" },
        stat("brokers", data.brokers.length, "brokers-count"),
        stat("masters", masters.length),
        stat("topics (largest broker)", fmtNum(Math.max(0, ...data.brokers.map(b => b.topics || 0)))),
        stat("clients", fmtNum(data.brokers.reduce((s, b) => s + (b.clients || 0), 0))),
        stat("written / s (all masters)", fmtBytes(write) + "/s"),
        stat("name servers", data.namesrv_addrs.join(", "))),
      el("h2", {}, "Brokers"),
      table([
        { label: "cluster", key: "cluster" }, { label: "broker", key: "broker_name" },
        { label: "id", key: "broker_id", num: true },
        { label: "role", render: b => b.reachable ? el("span", { class: "pill" }, b.role) :
          el("span", { class: "pill bad" }, "unreachable") },
        { label: "address", render: b => el("a", { href: `http://${b.addr}/docs`, target: "_blank" }, b.addr) },
        { label: "version", key: "version", cls: "hide-phone" },
        { label: "stored", num: true, render: b => fmtBytes(b.stored_bytes) },
        { label: "disk used", render: diskText },
        { label: "write / s", num: true, render: b => b.write_bytes_per_s === null || b.write_bytes_per_s === undefined
          ? "—" : fmtBytes(b.write_bytes_per_s) + "/s" },
        { label: "topics", key: "topics", num: true }, { label: "clients", key: "clients", num: true },
        { label: "replication", render: replicationText },
        { label: "registered", render: b => b.live ? el("span", { class: "pill ok" }, "live") :
          el("span", { class: "pill bad" }, "not registered") },
      ], data.brokers, { testid: "brokers" }),
      el("h2", {}, "Lake"),
      table([{ label: "broker", render: r => r[0] }, { label: "state", render: r => lakeState(r[1].state) },
        { label: "jobs", render: r => Object.entries(r[1].jobs || {}).map(([n, j]) => `${n}: ${j.state}`).join(", ") }],
        lakeRows, { empty: data.lake.error ? data.lake.error.message : "no masters" }));
  };
  await render();
  live(render, 3000);
};

function diskText(b) {
  // The store's file system: a bar of the share used (as df counts it), what is left, and the watermark state
  // when it is not OK (expired or old segments deleted early; sends refused with DISK_FULL).
  const d = b.disk;
  if (!d) return "—";
  if (d.error) return el("span", { class: "bad", title: d.error }, "unreadable");
  const used = d.used_ratio !== undefined ? d.used_ratio : (d.total_bytes ? d.used_bytes / d.total_bytes : 0);
  const full = d.writable === false;
  const cls = full || used >= (d.warning_ratio || 0.9) ? "bad" : (used >= (d.max_used_ratio || 0.75) ? "warn" : "");
  const meter = el("span", { class: "disk", "data-testid": "disk", title: `${d.path}: ${fmtBytes(d.used_bytes)} of ` +
    `${fmtBytes(d.total_bytes)} used` }, el("span", { class: `meter ${cls}` }, el("i", { style: `width:${(100 * used).toFixed(0)}%` })),
  `${(100 * used).toFixed(0)}% · ${fmtBytes(d.free_bytes)} free`);
  if (!d.state || d.state === "OK") return meter;
  const state = full ? el("span", { class: "pill bad", "data-testid": "disk-state", title: `sends are refused with ` +
    `DISK_FULL until the disk falls below ${(100 * d.resume_ratio).toFixed(0)}%; reads go on` +
    (d.held_by ? `; early deletion is held by ${d.held_by}` : "") }, "sends refused")
    : el("span", { class: "pill warn", "data-testid": "disk-state", title: d.held_by ? `early deletion is held by ` +
      `${d.held_by}` : "" }, d.state === "CLEAN" ? "deleting expired early" : "deleting oldest early");
  return el("span", {}, meter, " ", state);
}

function replicationText(b) {
  const r = b.replication || {};
  if (!b.reachable) return "";
  if (r.term !== undefined) return `DLedger ${r.role || ""} term ${r.term}`;
  if (b.role === "SLAVE") return `${r.connected ? "connected" : "disconnected"}, ${fmtBytes(r.bytes_behind)} behind`;
  if (r.slaves && !Object.keys(r.slaves).length) return "no slave";
  if (r.slaves) return `${r.in_sync_slaves || 0}/${Object.keys(r.slaves).length} in sync, max ` +
    `${fmtBytes(r.max_bytes_behind)} behind`;
  return "—";
}

function lakeState(s) {
  const cls = s === "running" ? "ok" : (s === "disabled" ? "" : "warn");
  return el("span", { class: `pill ${cls}` }, s || "?");
}

// Topics: searchable, paginated, create and delete.
pages.topics = async (main, params) => {
  if (params.length) return topicDetail(main, decodeURIComponent(params[0]));
  const q = { q: "", page: 1, system: false };
  const list = el("div");
  const search = el("input", { type: "search", placeholder: "search topics", "data-testid": "topic-search",
    oninput: debounce(() => { q.q = search.value; q.page = 1; load().catch(e => flash(e.message)); }, 250) });
  const sys = el("input", { type: "checkbox", onchange: () => { q.system = sys.checked; q.page = 1; load().catch(e => flash(e.message)); } });
  const name = el("input", { placeholder: "new topic name", "data-testid": "topic-name", required: true });
  const reads = el("input", { type: "number", min: 1, value: 8, style: "width:90px" });
  const writes = el("input", { type: "number", min: 1, value: 8, style: "width:90px" });
  const perm = el("select", {}, [[6, "read-write"], [4, "read only"], [2, "write only"]].map(([v, l]) =>
    el("option", { value: v }, l)));
  const order = el("input", { type: "checkbox" });
  const create = el("button", { class: "primary", "data-testid": "topic-create", onclick: async () => {
    try {
      await api("/topics", { method: "POST", body: { topic: name.value.trim(), read_queue_nums: +reads.value,
        write_queue_nums: +writes.value, perm: +perm.value, order: order.checked } });
      flash(`topic ${name.value.trim()} created on every master; the list shows it once the brokers next ` +
        "register with the name servers", "info");
      name.value = "";
      await load();
    } catch (e) { flash(e.message); }
  } }, "Create");
  main.append(el("h1", {}, "Topics"),
    el("div", { class: "card" }, el("div", { class: "toolbar" },
      el("label", {}, "name", name), el("label", {}, "read queues", reads), el("label", {}, "write queues", writes),
      el("label", {}, "permission", perm), el("label", {}, "ordered", order), create)),
    el("div", { class: "toolbar" }, el("label", {}, "search", search), el("label", {}, "system topics", sys)),
    list);
  async function load() {
    const data = await api(`/topics?q=${enc(q.q)}&page=${q.page}&size=20&system=${q.system}`);
    // What the signed-in user's policy does not allow is disabled (the brokers would refuse it anyway).
    create.disabled = data.may_create === false;
    create.title = create.disabled ? "your access key may not create topics" : "";
    list.replaceChildren(table([
      { label: "topic", render: t => el("a", { href: `#/topics/${enc(t.topic)}` }, t.topic) },
      { label: "brokers", render: t => t.error ? el("span", { class: "bad" }, t.error.code) : t.brokers.join(", ") },
      { label: "read queues", key: "read_queues", num: true },
      { label: "write queues", key: "write_queues", num: true, cls: "hide-phone" },
      { label: "perm", render: t => (t.perm || []).join(", "), cls: "hide-phone" },
      { label: "", render: t => t.system ? "" : el("button", { class: "danger", "data-testid": `delete-${t.topic}`,
        disabled: t.may_delete === false, title: t.may_delete === false ? "your access key may not delete it" : null,
        onclick: () => confirmModal(`Delete topic ${t.topic}?`,
          "Its queues and messages are removed from every broker and name server.", t.topic, async () => {
            try {
              const r = await api(`/topics/${enc(t.topic)}`, { method: "DELETE" });
              const n = Object.values(r.brokers).filter(Boolean).length;
              flash(`topic ${t.topic} deleted from ${n} broker(s)`, "info");
              await load();
            } catch (e) { flash(e.message); }
          }) }, "Delete") },
    ], data.items, { testid: "topics", empty: "no topic matches" }), pager(data, p => { q.page = p; load().catch(e => flash(e.message)); }));
  }
  await load();
};

async function topicDetail(main, topic) {
  const body = el("div");
  const chart = el("div", { class: "chart card", "data-testid": "topic-chart" });
  main.append(el("h1", {}, `Topic ${topic}`), el("div", { class: "toolbar" },
    rangePicker(() => drawChart(true).catch(e => flash(e.message)))), chart, body);
  const drawChart = historyChart(chart, "messages stored / s", [{ label: "TPS", stroke: "#2f6fde" }],
    range => api(`/history?kind=topic&name=${enc(topic)}&range_s=${range}`), h => columns(h.tps));
  const render = async () => {
    const d = await api(`/topics/${enc(topic)}`);
    body.replaceChildren(el("div", { class: "cards" }, stat("messages kept", fmtNum(d.messages)),
      stat("queues", d.queues.length)),
      el("h2", {}, "Route"),
      table([{ label: "broker", key: "broker_name" }, { label: "master", key: "master_addr" },
        { label: "read", key: "read_queue_nums", num: true }, { label: "write", key: "write_queue_nums", num: true },
        { label: "perm", key: "perm_text" }], d.route),
      el("h2", {}, "Queues"),
      table([{ label: "broker", key: "broker_name" }, { label: "queue", key: "queue_id", num: true },
        { label: "min offset", key: "min_offset", num: true }, { label: "max offset", key: "max_offset", num: true },
        { label: "last stored", render: r => fmtTime(r.last_store_timestamp) }], d.queues, { testid: "topic-queues" }));
  };
  await Promise.all([render(), drawChart()]);
  live(() => Promise.all([render(), drawChart()]), 3000);
}

// Consumer groups.
pages.groups = async (main, params) => {
  if (params.length) return groupDetail(main, decodeURIComponent(params[0]));
  const q = { q: "", page: 1 };
  const list = el("div");
  const search = el("input", { type: "search", placeholder: "search groups", "data-testid": "group-search",
    oninput: debounce(() => { q.q = search.value; q.page = 1; load().catch(e => flash(e.message)); }, 250) });
  main.append(el("h1", {}, "Consumer groups"), el("div", { class: "toolbar" }, el("label", {}, "search", search)),
    list);
  async function load() {
    const data = await api(`/groups?q=${enc(q.q)}&page=${q.page}&size=20`);
    list.replaceChildren(table([
      { label: "group", render: g => el("a", { href: `#/groups/${enc(g.group)}` }, g.group) },
      { label: "members", key: "members", num: true },
      { label: "protocol", render: g => g.error ? el("span", { class: "bad" }, g.error.code) : (g.consume_type || "") },
      { label: "model", key: "message_model", cls: "hide-phone" },
      { label: "total lag", key: "total_lag", num: true },
    ], data.items, { testid: "groups", empty: "no group matches" }), pager(data, p => { q.page = p; load().catch(e => flash(e.message)); }));
  }
  await load();
  live(load, 5000);
};

async function groupDetail(main, group) {
  const summary = el("div");
  const chart = el("div", { class: "chart card", "data-testid": "group-chart" });
  const queues = el("div");
  const reset = el("div", { class: "card" });
  main.append(el("h1", {}, `Group ${group}`), summary,
    el("div", { class: "toolbar" }, rangePicker(() => drawChart(true).catch(e => flash(e.message)))), chart,
    el("h2", {}, "Lag per queue"), queues, el("h2", {}, "Reset offsets"), reset);
  let topics = [];
  const drawChart = historyChart(chart, "lag and consume rate",
    [{ label: "lag", stroke: "#c8382c", fill: "rgba(200,56,44,.08)" }, { label: "consumed / s", stroke: "#1f8a4c", scale: "r" }],
    range => api(`/history?kind=group&name=${enc(group)}&range_s=${range}`), h => columns(h.lag, h.tps));
  const render = async () => {
    const d = await api(`/groups/${enc(group)}`);
    const types = [...new Set(Object.values(d.brokers).map(b => b.consume_type).filter(Boolean))];
    // The group's own topics first, its %RETRY% topic last.
    topics = [...new Set([...d.subscriptions.map(s => s.topic), ...d.queues.map(q => q.topic)])]
      .sort((a, b) => (a.startsWith("%") - b.startsWith("%")) || a.localeCompare(b));
    summary.replaceChildren(el("div", { class: "cards" },
      stat("total lag", fmtNum(d.total_lag), "total-lag"), stat("members", d.members.length),
      stat("consumed / s", fmtRate(d.consume_per_s)), stat("protocol", types.join(", ") || "—")),
      el("h2", {}, "Members"),
      // Which member holds which queue: what each one reported after its last rebalance.
      table([{ label: "client id", key: "client_id" }, { label: "protocol", render: c => c.consume_type || "" },
        { label: "queues", num: true, render: c => c.holds_queues ? fmtNum(c.held_queues.length) : "—" },
        { label: "holds", render: c => c.holds_queues ? heldText(c.held_queues) :
          el("span", { class: "muted" }, "no queues: the broker hands it messages (POP)") }],
      d.clients, { testid: "group-members", empty: "no member online",
        rowAttrs: c => ({ "data-client": c.client_id }) }),
      el("h2", {}, "Subscriptions"),
      table([{ label: "topic", key: "topic" }, { label: "expression", render: s => s.expression ?? s.sub_string ?? "" },
        { label: "type", render: s => s.expression_type ?? s.type ?? "" }], d.subscriptions, { empty: "none" }));
    queues.replaceChildren(table([{ label: "topic", key: "topic" }, { label: "broker", key: "broker_name" },
      { label: "queue", key: "queue_id", num: true }, { label: "broker offset", key: "broker_offset", num: true },
      { label: "consumer offset", key: "consumer_offset", num: true }, { label: "lag", key: "lag", num: true },
      { label: "held by", render: q => q.held_by.length ? q.held_by.join(", ") : el("span", { class: "muted" }, "nobody") }],
    d.queues, { testid: "group-queues", empty: "no committed offsets",
      rowAttrs: q => ({ "data-queue": `${q.topic}@${q.broker_name}/${q.queue_id}` }) }));
    if (!reset.childElementCount) buildReset();
    for (const b of reset.querySelectorAll("button")) if (d.may_reset === false) b.disabled = true;
    reset.title = d.may_reset === false ? "your access key may not move this group's offsets" : "";
  };
  function buildReset() {
    const topic = el("select", { "data-testid": "reset-topic" }, topics.map(t => el("option", { value: t }, t)));
    const mode = el("select", { "data-testid": "reset-mode", onchange: () => { ts.parentElement.hidden = mode.value !== "timestamp"; } },
      [["earliest", "earliest (consume everything again)"], ["latest", "latest (skip the backlog)"],
        ["timestamp", "a point in time"], ["offsets", "exact offsets"]].map(([v, l]) => el("option", { value: v }, l)));
    const ts = el("input", { type: "datetime-local", value: localInput(Date.now() - 3600e3) });
    const preview = el("div");
    const apply = el("button", { class: "danger", disabled: true, "data-testid": "reset-apply" }, "Apply");
    let exact = {};
    const form = () => {
      const body = { topic: topic.value, mode: mode.value };
      if (mode.value === "timestamp") body.timestamp = new Date(ts.value).getTime();
      if (mode.value === "offsets") body.offsets = exact;
      return body;
    };
    const show = (r) => {
      preview.replaceChildren(el("p", { class: r.applied ? "ok" : "muted", "data-testid": "reset-result" },
        r.applied ? `offsets moved on ${Object.keys(r.queues).length} queue(s)` :
          (r.mode === "timestamp" ? "each queue moves to its first message at or after that time" :
            `${r.queues.filter(q => q.moves).length} queue(s) would move`)),
      table([{ label: "queue", key: "queue" }, { label: "current", key: "current", num: true },
        { label: "target", num: true, render: q => r.mode === "offsets" && !r.applied ? el("input", { type: "number",
          min: 0, value: q.target ?? q.current ?? 0, style: "width:110px", "data-queue": q.queue,
          oninput: (e) => { exact[q.queue] = +e.target.value; } }) : fmtNum(q.target) },
        { label: "range", render: q => `${fmtNum(q.min_offset)} – ${fmtNum(q.max_offset)}` },
        { label: "moves", num: true, render: q => q.moves === null ? "—" : (q.moves > 0 ? `+${fmtNum(q.moves)}` :
          fmtNum(q.moves)) }], r.queues, { testid: "reset-preview" }));
    };
    const previewBtn = el("button", { "data-testid": "reset-preview-btn", onclick: async () => {
      try {
        if (mode.value === "offsets" && !Object.keys(exact).length) {  // start from the current offsets
          const cur = await api(`/groups/${enc(group)}/reset`, { method: "POST",
            body: { topic: topic.value, mode: "latest" } });
          exact = Object.fromEntries(cur.queues.map(q => [q.queue, q.current ?? 0]));
        }
        show(await api(`/groups/${enc(group)}/reset`, { method: "POST", body: form() }));
        apply.disabled = false;
      } catch (e) { flash(e.message); }
    } }, "Preview");
    apply.onclick = () => confirmModal(`Reset ${group} on ${topic.value}?`,
      "Running consumers of the group jump to the new offsets at once.", null, async () => {
        try {
          show(await api(`/groups/${enc(group)}/reset`, { method: "POST", body: { ...form(), apply: true } }));
          apply.disabled = true;
          exact = {};
          flash(`offsets of ${group} on ${topic.value} reset`, "info");
          await render();
        } catch (e) { flash(e.message); }
      });
    const tsLabel = el("label", { hidden: true }, "time", ts);
    reset.replaceChildren(el("div", { class: "toolbar" }, el("label", {}, "topic", topic), el("label", {}, "to", mode),
      tsLabel, previewBtn, apply), preview);
    mode.onchange = () => { tsLabel.hidden = mode.value !== "timestamp"; exact = {}; apply.disabled = true; };
  }
  await Promise.all([render(), drawChart()]);
  live(() => Promise.all([render(), drawChart()]), 2000);
}

function heldText(held) {
  // "Orders 0-3 on broker-a, %RETRY%cg 0 on broker-a": a member's queues, grouped per topic and broker.
  const by = new Map();
  for (const q of held) {
    const k = `${q.topic} on ${q.broker_name}`;
    if (!by.has(k)) by.set(k, { topic: q.topic, broker: q.broker_name, ids: [] });
    by.get(k).ids.push(q.queue_id);
  }
  return [...by.values()].map(g => `${g.topic} ${g.ids.sort((a, b) => a - b).join(",")} on ${g.broker}`).join("; ");
}

// Messages: by id, by topic + key, by topic + time range.
pages.messages = async (main) => {
  const topic = el("input", { placeholder: "topic", "data-testid": "msg-topic" });
  const key = el("input", { placeholder: "key", "data-testid": "msg-key" });
  const id = el("input", { placeholder: "message id or offsetMsgId", "data-testid": "msg-id", size: 34 });
  const begin = el("input", { type: "datetime-local", value: localInput(Date.now() - 3600e3) });
  const end = el("input", { type: "datetime-local", value: localInput(Date.now() + 60e3) });
  const useTime = el("input", { type: "checkbox" });
  const results = el("div");
  const detail = el("div");
  const search = async () => {
    flash("");
    const params = new URLSearchParams();
    if (id.value.trim()) params.set("msg_id", id.value.trim());
    else {
      params.set("topic", topic.value.trim());
      if (key.value.trim()) params.set("key", key.value.trim());
      if (useTime.checked || !key.value.trim()) {
        params.set("begin", new Date(begin.value).getTime());
        params.set("end", new Date(end.value).getTime());
      }
    }
    try {
      const data = await api(`/messages?${params}`);
      detail.replaceChildren();
      results.replaceChildren(el("p", { class: "muted", "data-testid": "msg-count" }, `${data.messages.length} found`),
        table([{ label: "stored", render: m => fmtTime(m.store_timestamp) }, { label: "topic", key: "topic" },
          { label: "queue", render: m => `${m.broker_name}/${m.queue_id}@${m.queue_offset}`, cls: "hide-phone" },
          { label: "message id", render: m => el("a", { href: "javascript:void 0", "data-testid": "msg-row",
            onclick: () => showMessage(detail, m) }, m.msg_id) },
          { label: "keys", render: m => m.keys.join(" ") }, { label: "tags", key: "tags", cls: "hide-phone" },
          { label: "size", key: "body_size", num: true, cls: "hide-phone" }],
        data.messages, { testid: "messages", empty: "nothing found (new messages are indexed within seconds)" }));
      if (data.messages.length === 1) showMessage(detail, data.messages[0]);
    } catch (e) { flash(e.message); }
  };
  const go = el("button", { class: "primary", "data-testid": "msg-search", onclick: search }, "Search");
  for (const input of [topic, key, id]) input.addEventListener("keydown", e => { if (e.key === "Enter") search(); });
  main.append(el("h1", {}, "Messages"),
    el("div", { class: "card" }, el("div", { class: "toolbar" }, el("label", {}, "message id", id)),
      el("div", { class: "toolbar" }, el("label", {}, "topic", topic), el("label", {}, "key", key),
        el("label", {}, "from", begin), el("label", {}, "until", end), el("label", {}, "time range with key", useTime),
        go)),
    results, detail);
};

function decodeBody(b64) {
  const raw = atob(b64);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

function renderBody(bytes, format) {
  const text = new TextDecoder("utf-8").decode(bytes);
  if (format === "json") {
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch (e) { return `not JSON (${e.message})\n\n${text}`; }
  }
  if (format === "hex") {
    const lines = [];
    for (let i = 0; i < bytes.length; i += 16) {
      const row = [...bytes.slice(i, i + 16)];
      lines.push(i.toString(16).padStart(8, "0") + "  " + row.map(b => b.toString(16).padStart(2, "0")).join(" ")
        .padEnd(48) + "  " + row.map(b => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join(""));
    }
    return lines.join("\n");
  }
  return text;
}

function showMessage(container, m) {
  const bytes = decodeBody(m.body_base64);
  const pre = el("pre", { class: "body", "data-testid": "msg-body" });
  const seg = el("div", { class: "seg" });
  const pick = (format) => {
    pre.textContent = renderBody(bytes, format);
    for (const b of seg.children) b.classList.toggle("on", b.dataset.format === format);
  };
  for (const [f, label] of [["text", "Text"], ["json", "JSON"], ["hex", "Hex"]]) {
    seg.append(el("button", { "data-format": f, "data-testid": `body-${f}`, onclick: () => pick(f) }, label));
  }
  let first = "text";
  try { JSON.parse(new TextDecoder().decode(bytes)); first = "json"; } catch (e) { /* text */ }
  const fields = [["message id", m.msg_id], ["offsetMsgId", m.offset_msg_id], ["topic", m.topic],
    ["queue", `${m.broker_name}/${m.queue_id} @ ${m.queue_offset}`], ["tags", m.tags], ["keys", m.keys.join(" ")],
    ["born", `${fmtTime(m.born_timestamp)} on ${m.born_host}`], ["stored", `${fmtTime(m.store_timestamp)} on ${m.store_host}`],
    ["reconsumed", m.reconsume_times], ["size", `${m.body_size} bytes`]];
  container.replaceChildren(el("div", { class: "card", "data-testid": "msg-detail" },
    el("h2", {}, "Message ", el("a", { href: `#/trace/${enc(m.msg_id)}`, "data-testid": "msg-trace-link" }, "trace →")),
    table([{ label: "field", render: r => r[0] }, { label: "value", render: r => r[1] ?? "" }], fields),
    el("h2", {}, "Body ", seg), pre,
    el("h2", {}, "Properties"),
    table([{ label: "name", render: r => r[0] }, { label: "value", render: r => r[1] }],
      Object.entries(m.properties).sort(), { testid: "msg-properties" }),
    resendBox(m)));
  pick(first);
}

// Re-send (RocketMQ dashboard's "resend"): one group, and no other, consumes the message again.
function resendBox(m) {
  const group = el("input", { placeholder: "consumer group", "data-testid": "resend-group", list: "resend-groups" });
  const result = el("p", { "data-testid": "resend-result" });
  const send = async (g) => {
    try {
      // The offsetMsgId names this very copy on its broker: no index lookup, no ambiguity.
      const r = await api("/messages/resend", { method: "POST", body: { msg_id: m.offset_msg_id || m.msg_id, group: g } });
      result.textContent = `re-sent to ${r.group}: ${r.result.topic} queue ${r.result.queue_id} at offset ` +
        `${fmtNum(r.result.queue_offset)} (only ${r.group} consumes it)`;
      result.className = "ok";
    } catch (e) { result.textContent = ""; flash(e.message); }
  };
  const go = el("button", { "data-testid": "resend-go", onclick: () => {
    const g = group.value.trim();
    if (!g) { flash("pick the consumer group that should consume the message again"); return; }
    confirmModal(`Re-send to ${g}?`, `Group ${g}, and no other, consumes this message again: a copy goes to ` +
      `its retry topic with reconsume count 0.`, null, () => send(g));
  } }, "Re-send");
  return el("div", {}, el("h2", {}, "Re-send to a group"),
    el("div", { class: "toolbar" }, el("label", {}, "group", group), groupSuggestions("resend-groups"), go), result);
}

// A <datalist> of the group names (at most a page of them: typing narrows nothing server-side, it is a picker).
function groupSuggestions(id) {
  const list = el("datalist", { id });
  api("/group-names").then(d => list.replaceChildren(...d.names.map(g => el("option", { value: g })))).catch(() => {});
  return list;
}

// Trace: a message's path as a timeline.
pages.trace = async (main, params) => {
  const id = el("input", { placeholder: "message id", "data-testid": "trace-id", size: 34,
    value: params.length ? decodeURIComponent(params[0]) : "" });
  const out = el("div");
  const load = async () => {
    flash("");
    if (!id.value.trim()) return;
    try {
      const data = await api(`/trace/${enc(id.value.trim())}`);
      renderTimeline(out, data.events);
    } catch (e) { flash(e.message); }
  };
  id.addEventListener("keydown", e => { if (e.key === "Enter") { location.hash = `#/trace/${enc(id.value.trim())}`; } });
  main.append(el("h1", {}, "Trace"), el("div", { class: "toolbar" }, el("label", {}, "message id", id),
    el("button", { class: "primary", "data-testid": "trace-go",
      onclick: () => { location.hash = `#/trace/${enc(id.value.trim())}`; } }, "Show")), out);
  if (params.length) {
    await load();
    // The trace job writes events within seconds: keep looking while the path is not complete.
    live(async () => { if (!out.querySelector(".step.consume, .step.dlq")) await load(); }, 2000);
  }
};

function renderTimeline(out, events) {
  if (!events.length) {
    out.replaceChildren(el("p", { class: "muted", "data-testid": "trace-empty" },
      "no trace events yet (the trace job writes them within seconds; this page keeps looking)"));
    return;
  }
  const total = Math.max(1, events[events.length - 1].since_first_ms);
  const rows = events.map(e => {
    const left = (100 * e.since_first_ms) / total;
    const width = Math.max(1, (100 * (e.elapsed_ms || 0)) / total);
    const who = [e.group && `group ${e.group}`, e.client_id, e.broker && `broker ${e.broker}`,
      e.queue_id !== null && e.queue_id !== undefined && `queue ${e.queue_id}@${e.queue_offset}`,
      e.cost_ms !== null && e.cost_ms !== undefined && `took ${e.cost_ms} ms`, e.detail].filter(Boolean).join(" · ");
    return el("div", { class: `step ${e.event_type}`, "data-testid": "trace-step", "data-step": e.event_type },
      el("div", {}, el("div", { class: "name" }, e.event_type), el("div", { class: "muted" }, e.status)),
      el("div", {}, el("div", { class: "bar" }, el("i", { style: `left:${Math.max(0, Math.min(left - width, 99))}%;width:${width}%` })),
        el("div", { class: "muted" }, `${fmtTime(e.event_ts)} ${who}`)),
      el("div", { class: "ms" }, `+${fmtNum(e.elapsed_ms)} ms`, el("div", { class: "muted" }, `${fmtNum(e.since_first_ms)} ms`)));
  });
  out.replaceChildren(el("div", { class: "card timeline", "data-testid": "timeline" },
    el("p", { class: "muted" }, `${events.length} steps, ${fmtNum(total)} ms from first to last`), rows));
}

// Dead letters: browse a group's DLQ, select, re-drive in bulk.
pages.dlq = async (main, params) => {
  const group = el("input", { placeholder: "consumer group", "data-testid": "dlq-group", list: "dlq-groups",
    value: params.length ? decodeURIComponent(params[0]) : "" });
  const origin = el("input", { placeholder: "original topic (optional)", "data-testid": "dlq-topic" });
  const out = el("div");
  const result = el("p", { "data-testid": "dlq-result" });
  let shown = [];
  let mayRedrive = true;
  const selected = new Set();
  const load = async () => {
    flash("");
    if (!group.value.trim()) return;
    try {
      const qs = origin.value.trim() ? `?topic=${enc(origin.value.trim())}` : "";
      const data = await api(`/dlq/${enc(group.value.trim())}${qs}`);
      shown = data.messages;
      mayRedrive = data.may_redrive !== false;
      selected.clear();
      draw();
    } catch (e) {
      shown = [];
      draw();
      flash(e.message);
    }
  };
  const redrive = async (body, what) => {
    try {
      const r = await api(`/dlq/${enc(group.value.trim())}/redrive`, { method: "POST", body });
      result.textContent = `re-drove ${r.redriven} message(s) (${what})`;
      result.className = "ok";
    } catch (e) { flash(e.message); }
  };
  const draw = () => {
    const all = el("input", { type: "checkbox", "data-testid": "dlq-all", onchange: () => {
      for (const m of shown) (all.checked ? selected.add(m.msg_id) : selected.delete(m.msg_id));
      draw();
    } });
    all.checked = shown.length > 0 && selected.size === shown.length;
    out.replaceChildren(el("p", { class: "muted", "data-testid": "dlq-count" }, `${shown.length} dead letter(s)`),
      el("div", { class: "toolbar" },
        el("button", { class: "primary", disabled: !selected.size || !mayRedrive, "data-testid": "dlq-redrive-selected",
          onclick: () => confirmModal(`Re-drive ${selected.size} message(s)?`,
            "They are sent back to their original topics (the DLQ keeps its copies).", null,
            () => redrive({ msg_ids: [...selected] }, `${selected.size} selected`)) }, `Re-drive selected (${selected.size})`),
        el("button", { disabled: !shown.length || !mayRedrive, "data-testid": "dlq-redrive-all",
          onclick: () => confirmModal(`Re-drive every dead letter of ${group.value.trim()}?`,
            origin.value.trim() ? `Only those of topic ${origin.value.trim()}.` : "All of them, every topic.", null,
            () => redrive({ all: true, topic: origin.value.trim() || null }, "all")) }, "Re-drive all")),
      table([{ label: el("span", {}, all), render: m => el("input", { type: "checkbox", checked: selected.has(m.msg_id),
        onchange: (e) => { e.target.checked ? selected.add(m.msg_id) : selected.delete(m.msg_id); draw(); } }) },
      { label: "stored", render: m => fmtTime(m.store_timestamp) }, { label: "original topic", key: "origin_topic" },
      { label: "message id", render: m => el("a", { href: `#/trace/${enc(m.origin_msg_id || m.msg_id)}` }, m.msg_id) },
      { label: "attempts", key: "reconsume_times", num: true }, { label: "reason", key: "reason", cls: "hide-phone" },
      { label: "body", render: m => new TextDecoder().decode(decodeBody(m.body_base64)).slice(0, 60), cls: "hide-phone" }],
      shown, { testid: "dlq", empty: "no dead letters" }), result);
  };
  const show = el("button", { class: "primary", "data-testid": "dlq-load", onclick: load }, "Show");
  main.append(el("h1", {}, "Dead letters"), el("div", { class: "toolbar" }, el("label", {}, "group", group),
    groupSuggestions("dlq-groups"), el("label", {}, "original topic", origin), show), out);
  if (group.value) await load();
};

// What each kind of rule watches, for the rules table ("lag > 1,000 for 5 min").
const RULE_WATCHES = { lag: "lag", idle_group: "no progress while lag", dlq_growth: "dead letters / min" };

function ruleCondition(r) {
  if (!r.kind) return "";
  return `${RULE_WATCHES[r.kind] || r.kind} > ${fmtNum(r.threshold)} for ${r.for_minutes} min`;
}

// Alerts: the configured rules, then what they raised, firing and resolved.
pages.alerts = async (main) => {
  const out = el("div");
  main.append(el("h1", {}, "Alerts"), out);
  const severity = s => el("span", { class: `pill ${s === "critical" ? "bad" : (s === "warning" ? "warn" : "")}` }, s);
  const render = async () => {
    const data = await api("/alerts");
    const columns = [{ label: "severity", render: a => severity(a.severity) }, { label: "rule", key: "rule" },
      { label: "subject", key: "subject" }, { label: "value", key: "value", num: true },
      { label: "threshold", key: "threshold", num: true, cls: "hide-phone" },
      { label: "raised", render: a => fmtTime(Date.parse(a.raised_at)) }];
    const errors = Object.entries(data.rule_errors || {});
    out.replaceChildren(el("div", { class: "cards" },
      stat("firing", data.firing.length, "alerts-firing-count"), stat("resolved", data.resolved.length),
      stat("rules", data.rules.filter(r => r.configured).length, "alert-rules-count")),
    el("h2", {}, "Rules"),
    el("div", {}, errors.length ? el("p", { class: "bad", "data-testid": "alert-rule-errors" },
      errors.map(([b, e]) => `${b}: [alerts] does not parse (${e})`).join("; ")) : null),
    table([{ label: "rule", key: "rule" }, { label: "kind", key: "kind", cls: "hide-phone" },
      { label: "condition", render: ruleCondition }, { label: "severity", render: r => severity(r.severity) },
      { label: "applies to", cls: "hide-phone", render: r => [r.group && `group ${r.group}`, r.topic && `topic ${r.topic}`]
        .filter(Boolean).join(", ") || (r.configured ? "every group and topic" : "") },
      { label: "firing", key: "firing", num: true }, { label: "resolved", key: "resolved", num: true },
      { label: "last raised", render: r => fmtTime(Date.parse(r.last_raised_at)), cls: "hide-phone" },
      { label: "brokers", cls: "hide-phone", render: r => r.configured ? r.brokers.join(", ") :
        el("span", { class: "muted" }, "no longer configured") }],
    data.rules, { testid: "alert-rules", rowAttrs: r => ({ "data-rule": r.rule }),
      empty: "no rules: add [[alerts.rules]] to the brokers' config (their lakes evaluate them)" }),
    el("h2", {}, "Firing"),
    table([...columns, { label: "broker", key: "broker", cls: "hide-phone" },
      { label: "detail", key: "detail", cls: "hide-phone" }], data.firing,
    { testid: "alerts-firing", empty: "nothing is firing", rowAttrs: a => ({ "data-alert": a.alert_id }) }),
    el("h2", {}, "Resolved"),
    table([...columns, { label: "resolved", render: a => fmtTime(Date.parse(a.resolved_at)) }], data.resolved,
      { testid: "alerts-resolved", empty: "none resolved yet" }));
  };
  await render();
  live(render, 5000);
};

pages.lake = async (main) => {
  const out = el("div");
  main.append(el("h1", {}, "Lake"), out);
  const render = async () => {
    const data = await api("/lake");
    const rows = [];
    for (const [broker, lake] of Object.entries(data.brokers)) {
      const jobs = Object.entries(lake.jobs || {});
      if (!jobs.length) rows.push({ broker, lake: lake.state, job: "—" });
      for (const [job, j] of jobs) rows.push({ broker, lake: lake.state, job, ...j });
    }
    out.replaceChildren(table([{ label: "broker", key: "broker" }, { label: "lake", render: r => lakeState(r.lake) },
      { label: "job", key: "job" }, { label: "state", render: r => r.state ? lakeState(r.state) : "" },
      { label: "last batch", key: "last_batch_id", num: true },
      { label: "rows", num: true, render: r => fmtNum(r.rows_total ?? r.last_batch_rows) },
      { label: "restarts", key: "restarts", num: true },
      { label: "last error", render: r => r.last_error ? el("span", { class: "bad" }, r.last_error) : "" }],
    rows, { testid: "lake", empty: "no masters" }));
  };
  await render();
  live(render, 5000);
};

// Sign-in (ACL on): the keys go to the console's server, which keeps them for the session (HttpOnly cookie).
pages.signin = async (main) => {
  const ak = el("input", { placeholder: "access key", autocomplete: "username", "data-testid": "signin-access-key" });
  const sk = el("input", { type: "password", placeholder: "secret key", autocomplete: "current-password",
    "data-testid": "signin-secret-key" });
  const submit = async (e) => {
    e.preventDefault();
    flash("");
    try {
      state.me = await api("/session", { method: "POST", body: { access_key: ak.value.trim(), secret_key: sk.value } });
      sk.value = "";
      showUser();
      if (location.hash.startsWith("#/signin")) location.hash = "#/cluster"; else await route();
    } catch (err) { sk.value = ""; flash(err.message); }
  };
  main.append(el("h1", {}, "Sign in"), el("form", { class: "card signin", onsubmit: submit, "data-testid": "signin" },
    el("p", { class: "muted" }, "Access control is on: sign in with your access key. What you see and may do is " +
      "what the brokers allow this user."),
    el("label", {}, "access key", ak), el("label", {}, "secret key", sk),
    el("button", { class: "primary", type: "submit", "data-testid": "signin-submit" }, "Sign in")));
  ak.focus();
};

function showUser() {
  const box = document.getElementById("user");
  const me = state.me;
  box.hidden = !me.acl_enabled;
  if (!me.acl_enabled) return;
  // replaceChildren would write a null as the text "null": only what is there.
  box.replaceChildren(...[me.signed_in ? el("span", { "data-testid": "whoami" }, me.access_key,
    me.super_user ? el("span", { class: "pill" }, "super user") : null) : "signed out",
  me.signed_in ? el("button", { "data-testid": "signout", onclick: async () => {
    await api("/session", { method: "DELETE" }).catch(() => {});
    state.me = { acl_enabled: true, signed_in: false };
    showUser();
    await route();
  } }, "Sign out") : null].filter(Boolean));
}

// -- router -------------------------------------------------------------------------------------
async function route() {
  for (const t of state.timers) clearInterval(t);
  state.timers = [];
  for (const c of state.charts) c.plot.destroy();
  state.charts = [];
  flash("");
  const [name, ...params] = (location.hash.replace(/^#\/?/, "") || "cluster").split("/");
  let page = pages[name] ? name : "cluster";
  if (state.me.acl_enabled && !state.me.signed_in) page = "signin";  // the hash stays: shown after sign-in
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === page);
  const main = document.getElementById("main");
  main.replaceChildren();
  main.dataset.page = page;
  main.dataset.ready = "false";
  const started = performance.now();
  try {
    await pages[page](main, params.filter(Boolean));
  } catch (e) {
    if (state.me.acl_enabled && !state.me.signed_in && page !== "signin") return route();
    flash(e.message);
  } finally {
    main.dataset.ready = "true";  // tests and the page-load benchmark wait for this
    main.dataset.loadMs = String(Math.round(performance.now() - started));
  }
}

window.addEventListener("hashchange", route);
api("/session").then(me => { state.me = me; }).catch(e => flash(e.message)).finally(() => { showUser(); route(); });

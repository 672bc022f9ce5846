// The live dashboard: polls stats and privacy about once a second, keeps their history here (the
// server stays stateless) and draws it with uPlot. A missing field shows as "n/a".
"use strict";

const POLL_MS = 1000;
const KEEP = 3600;   // points of history kept (an hour at one poll a second)
const state = { polls: 0, t: [], rmse: [], kld: [], kldc: [], thr: [], eps: [], budget: [], rate: [],
                model: [], serving: [], skipped: {}, last: null };
window.dashboard = state;   // for the browser test and for curious users
const charts = {};
state.charts = charts;

const num = (x) => (typeof x === "number" && isFinite(x) ? x : null);
const fmt = (x, digits) => (num(x) === null ? "n/a"
  : x.toLocaleString("en", { maximumFractionDigits: digits }));
function bytes(x) {
  if (num(x) === null) return "n/a";
  const units = ["B", "kB", "MB", "GB"];
  let i = 0;
  for (; x >= 1000 && i < units.length - 1; i++) x /= 1000;
  return `${x.toFixed(i ? 1 : 0)} ${units[i]}`;
}
function show(id, value, text) {   // text for people, data-value for machines ("" = n/a)
  const el = document.getElementById(id);
  el.textContent = text;
  el.dataset.value = value === null || value === undefined ? "" : String(value);
}
// The operator's admin token, from the page's fragment (/#token=...: a fragment never reaches a
// server or its logs) or this tab's session. With it the page also reads GET /admin/privacy: in
// the DP modes the exact figures (monitor, counters) are operator state, kept off the public routes.
const TOKEN = (() => {
  const given = new URLSearchParams(location.hash.slice(1)).get("token");
  if (given) {
    sessionStorage.setItem("sketchrec-token", given);
    history.replaceState(null, "", location.pathname);   // out of the address bar
  }
  return sessionStorage.getItem("sketchrec-token");
})();
const AUTH = TOKEN ? { Authorization: `Bearer ${TOKEN}` } : {};
async function getJSON(path) {   // null on any failure: a field that moved or a route behind a token
  try {
    const r = await fetch(path, { cache: "no-store", headers: AUTH });
    return r.ok ? await r.json() : null;
  } catch (e) {
    return null;
  }
}

// --- charts ------------------------------------------------------------------------------------
const COLORS = ["#2f6fdf", "#e07b00", "#c0392b", "#1e9e6a", "#8e44ad", "#7f8c8d", "#d35400"];
function makeChart(id, labels, opts = {}) {
  const el = document.getElementById(id);
  const series = [{}].concat(labels.map((label, i) => ({
    label, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true,
    dash: (opts.dashed || []).includes(label) ? [6, 4] : undefined,
  })));
  if (charts[id]) charts[id].destroy();
  charts[id] = new uPlot({ width: el.clientWidth || 400, height: 200, series,
    scales: { y: opts.log ? { distr: 3 } : { range: opts.range } }, axes: [{}, { size: 60 }], legend: { live: false } },
  [[], ...labels.map(() => [])], el);
  charts[id].labels = labels;
}
function draw(id, columns) {
  if (charts[id]) charts[id].setData([state.t, ...columns]);
}
const fromZero = (u, min, max) => [0, max > 0 ? max * 1.1 : 1];

function buildCharts() {
  makeChart("c-rmse", ["RMSE"]);
  makeChart("c-kld", ["window", "cumulative", "alert threshold"],
            { range: fromZero, dashed: ["alert threshold"] });
  makeChart("c-eps", ["ε spent", "ε budget"], { range: fromZero, dashed: ["ε budget"] });
  makeChart("c-rate", ["ratings/s"], { range: fromZero });
  makeChart("c-skipped", Object.keys(state.skipped).length ? Object.keys(state.skipped) : ["none"],
            { range: fromZero });
  makeChart("c-mem", ["model", "serving"], { log: true });   // kB of sketch beside MB of serving
}

// --- polling -----------------------------------------------------------------------------------
function epsilonBudget(p) {
  return num(p.epsilon_budget) ?? num(p.budget_epsilon) ?? num(p.dp && p.dp.budget_epsilon);
}

function record(stats, privacy) {
  const now = Date.now() / 1000;
  const prev = state.last;
  const learned = num(stats.ratings_learned);
  // ratings/s from this page's own two last polls: other readers of /stats do not disturb it
  const rate = prev && learned !== null && num(stats.uptime_s) > prev.uptime
    ? (learned - prev.learned) / (stats.uptime_s - prev.uptime) : null;
  state.last = { learned, uptime: num(stats.uptime_s) };
  state.t.push(now);
  state.rmse.push(num(stats.prequential_rmse));
  state.kld.push(num(privacy.kld));
  state.kldc.push(num(privacy.kld_cumulative));
  state.thr.push(num(privacy.kld_alert_threshold));
  state.eps.push(num(privacy.epsilon));
  state.budget.push(epsilonBudget(privacy));
  state.rate.push(rate);
  state.model.push(num(stats.model_bytes) === null ? null : stats.model_bytes / 1e6);
  state.serving.push(num(stats.serving_bytes) === null ? null : stats.serving_bytes / 1e6);
  const skipped = stats.skipped || {};
  let rebuild = false;
  for (const reason of Object.keys(skipped)) {
    if (!(reason in state.skipped)) {
      state.skipped[reason] = state.t.slice(0, -1).map(() => 0);
      rebuild = true;
    }
  }
  for (const reason of Object.keys(state.skipped)) state.skipped[reason].push(num(skipped[reason]) ?? 0);
  if (state.t.length > KEEP) {
    for (const key of ["t", "rmse", "kld", "kldc", "thr", "eps", "budget", "rate", "model", "serving"]) {
      state[key].shift();
    }
    for (const column of Object.values(state.skipped)) column.shift();
  }
  return { rate, rebuild };
}

function render(stats, privacy, rate) {
  show("v-learned", num(stats.ratings_learned), fmt(stats.ratings_learned, 0));
  show("v-rate", rate, fmt(rate, 0));
  show("v-rmse", num(stats.prequential_rmse), fmt(stats.prequential_rmse, 4));
  show("v-kld", num(privacy.kld), fmt(privacy.kld, 4));
  show("v-kldc", num(privacy.kld_cumulative), fmt(privacy.kld_cumulative, 4));
  const threshold = num(privacy.kld_alert_threshold);
  document.getElementById("v-kld-alert").textContent = threshold === null ? "no alert threshold"
    : `alert above ${fmt(threshold, 4)}${privacy.kld_alert ? " — ALERT" : ""}`;
  document.getElementById("v-kld-alert").className = privacy.kld_alert ? "alert" : "";
  const eps = num(privacy.epsilon), budget = epsilonBudget(privacy);
  show("v-eps", eps, `${fmt(eps, 3)} / ${fmt(budget, 3)}`);
  document.getElementById("v-mode").textContent = [privacy.mode, privacy.proven_bound === true ? "proven"
    : privacy.proven_bound === false ? "not proven" : null, privacy.budget_exhausted ? "budget spent" : null]
    .filter(Boolean).join(" · ") || "n/a";
  show("v-mem", num(stats.model_bytes), bytes(stats.model_bytes));
  document.getElementById("v-serving").textContent = `serving ${bytes(stats.serving_bytes)}`;
  const skipped = stats.skipped || {};
  const total = Object.values(skipped).reduce((a, b) => a + (num(b) ?? 0), 0);
  show("v-skipped", stats.skipped ? total : null, stats.skipped ? fmt(total, 0) : "n/a");
  document.getElementById("v-reasons").textContent =
    Object.entries(skipped).map(([r, n]) => `${r}: ${fmt(n, 0)}`).join(", ");
  const uptime = num(stats.uptime_s);
  const mode = stats.state || (stats.read_only ? "read-only" : stats.paused ? "paused" : "learning");
  document.getElementById("status").innerHTML = `${mode} · up ${uptime === null ? "n/a"
    : new Date(uptime * 1000).toISOString().slice(11, 19)} · updated ${new Date().toLocaleTimeString()}` +
    (privacy.kld_alert ? ' · <span class="alert">KLD alert</span>' : "");
  const fallback = typeof privacy.fallback === "boolean";   // a DP model with its private fallback
  show("v-answers", fallback ? (privacy.fallback ? "baseline" : "factors") : null,
       fallback ? (privacy.fallback ? "private baseline" : "DP-SGD factors") : "the learner");
  document.getElementById("v-answers-why").textContent = fallback ? privacy.serving : "no fallback in this mode";
  const released = privacy.released || {};
  show("v-released", num(released.private_mean), fmt(released.private_mean, 3));
  document.getElementById("v-released-n").textContent = num(released.noisy_ratings) !== null
    ? `from ≈ ${fmt(released.noisy_ratings, 0)} ratings (a noisy count)` : fallback ? "no release yet"
    : "this mode releases no noised figures";
  const versus = stats.versus_private_mean || {};
  document.getElementById("versus").textContent = versus.worse ? `Warning: ${versus.note}` : "";
  document.getElementById("guarantee").textContent = privacy.guarantee ? `Guarantee: ${privacy.guarantee}` : "";
  document.getElementById("kld-note").textContent = privacy.kld_note ? `KLD: ${privacy.kld_note}` : "";
}

const HIDDEN_STATS = ["ratings_learned", "skipped", "prequential_rmse", "catalogue_items",
                      "serving_bytes", "throughput_per_s"];
const pick = (obj, keys) => Object.fromEntries(keys.filter((k) => obj && k in obj).map((k) => [k, obj[k]]));

async function poll() {
  let [stats, privacy, admin] = await Promise.all([getJSON("stats"), getJSON("privacy"),
    TOKEN ? getJSON("admin/privacy") : null]);
  if (admin && stats !== null) {   // the operator's exact figures fill what the release leaves out
    stats = { ...admin.stats, ...stats, ...pick(admin.stats, HIDDEN_STATS) };
    privacy = { ...(privacy || {}), ...(admin.monitor || {}) };
  }
  if (stats === null) {
    document.getElementById("status").textContent = "cannot reach /stats: retrying";
  } else {
    const { rate, rebuild } = record(stats, privacy || {});
    if (rebuild) buildCharts();
    render(stats, privacy || {}, rate);
    explain(stats, privacy || {});
    draw("c-rmse", [state.rmse]);
    draw("c-kld", [state.kld, state.kldc, state.thr]);
    draw("c-eps", [state.eps, state.budget]);
    draw("c-rate", [state.rate]);
    const reasons = Object.keys(state.skipped);
    draw("c-skipped", reasons.length ? reasons.map((r) => state.skipped[r]) : [state.t.map(() => 0)]);
    draw("c-mem", [state.model, state.serving]);
    state.polls += 1;
  }
  setTimeout(poll, POLL_MS);
}

// --- why a chart is empty: a line drawn over it, never a blank chart -------------------------
const OPERATOR = "exact figures are operator state in this privacy mode (the operator sees them " +
  "with the admin token: /#token=…)";
const blank = (column) => column.every((x) => x === null);
function reasons(stats, privacy) {
  const secret = (obj, key) => !(key in obj) && "operator_state" in obj;
  const monitor = "kld_cumulative" in privacy;
  const skipped = Object.values(state.skipped);
  return {
    "c-rmse": !blank(state.rmse) ? null : secret(stats, "prequential_rmse") ? OPERATOR
      : stats.read_only ? "a read-only service learns nothing: no prequential error"
      : !num(stats.ratings_learned) ? "no rating learned yet"
      : "this run measures no prequential error (a holdout replay reports its test RMSE at the end)",
    "c-kld": !blank(state.kld) ? null : typeof privacy.monitor === "string" && !monitor ? OPERATOR
      : monitor ? "the monitor has no full window of errors yet"
      : "no privacy monitor in this run (turned off, or a service started without one)",
    "c-eps": !blank(state.eps) ? null : privacy.mode === "non-private"
      ? "non-private mode: no ε is spent (a privacy mode, e.g. --dp-epsilon, accounts it)"
      : "no ε accounted yet",
    "c-rate": !blank(state.rate) ? null : secret(stats, "ratings_learned") ? OPERATOR
      : "needs two polls",
    "c-skipped": secret(stats, "skipped") ? OPERATOR
      : skipped.some((column) => column.some((x) => x)) ? null : "no rating set aside so far",
    "c-mem": !blank(state.model) ? null : secret(stats, "model_bytes") ? OPERATOR : "no memory figure",
  };
}
function explain(stats, privacy) {
  for (const [id, why] of Object.entries(reasons(stats, privacy))) {
    const el = document.getElementById(`r-${id}`);
    el.hidden = why === null;
    el.textContent = why || "";
  }
}

// --- try it ------------------------------------------------------------------------------------
// A ranked list as a table; the title column only when the service has titles (--items) for some
// of its items (an item the file does not name has none: its cell stays empty).
function ranked(items) {
  const titles = items.some((x) => typeof x.title === "string");
  const table = document.createElement("table");
  table.innerHTML = `<tr><th>#</th><th>item</th>${titles ? "<th>title</th>" : ""}<th>score</th></tr>`;
  items.forEach((x, i) => {
    const row = table.insertRow();
    const cells = [String(i + 1), String(x.item), ...(titles ? [x.title || ""] : []), x.score.toFixed(3)];
    cells.forEach((text) => { row.insertCell().textContent = text; });
  });
  return table;
}

// Ask ``route`` with ``params`` and show its ranked items under ``caption(body)``.
function tryIt(form, route, params, caption) {
  document.getElementById(form).addEventListener("submit", async (event) => {
    event.preventDefault();
    const out = document.getElementById("try-out");
    out.textContent = "…";
    try {
      const r = await fetch(`${route}?${new URLSearchParams(params())}`, { headers: AUTH });
      const body = await r.json();
      if (!r.ok) throw new Error(typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail));
      out.replaceChildren(caption(body), ranked(body.items));
    } catch (e) {
      out.textContent = `error: ${e.message}`;
    }
  });
}

const field = (id, fallback) => document.getElementById(id).value || fallback;
tryIt("try", "recommend", () => ({ user: field("try-user"), k: field("try-k", "10") }),
  (body) => `${body.items.length} items for user ${body.user} (source: ${body.source})`);
tryIt("similar", "similar", () => ({ item: field("similar-item"), k: field("similar-k", "10") }),
  (body) => `${body.items.length} items like ${body.item}${body.title ? ` (${body.title})` : ""}`);

window.addEventListener("resize", () => {
  for (const [id, chart] of Object.entries(charts)) {
    chart.setSize({ width: document.getElementById(id).clientWidth, height: 200 });
  }
});

buildCharts();
poll();

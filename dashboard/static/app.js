// tock dashboard: one page, hash routes, short polling of /api (no reloads, no CDN).
// Every value from the API reaches the DOM as text (el() below), never as HTML.
"use strict";

const STATES = ["scheduled", "retrying", "dispatched", "running", "succeeded", "dead",
                "cancelled"];
const FINAL = new Set(["succeeded", "dead", "cancelled"]);
// The handlers of demo/tasks.py: the Enqueue page's kind list and its help both read this.
const DEMO_KINDS = [["email", "succeeds"], ["flaky", "fails 60% of attempts"],
                    ["slow", "runs 6 s"],
                    ["sync", "runs 3 s; the demo producer allows one at a time per account"],
                    ["crash", "first attempt dies like a killed worker"],
                    ["report", "the demo-report schedule fires it every 15 s"]];
const OUTCOME_COLORS = {succeeded: "#2a9d5c", failed: "#d98b1c", timed_out: "#e0b040",
                        permanent: "#d1432f", no_handler: "#8e2a1d", lease_expired: "#b05ad1",
                        released: "#9aa1ad", cancelled: "#6b7280"};

let me = {role: "viewer", csrf_token: null};
let pollTimer = null;
let lastOk = 0;

// --- helpers -------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "className") node.setAttribute("class", v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(visible(String(child))));
  }
  return node;
}

// Bidirectional-text controls (U+202A-202E, U+2066-2069, U+200E/200F) in a payload, tenant or
// error would reorder what is shown around them, so that a value reads as another, and the
// invisible spaces (U+200B, U+2060, U+FEFF) would make two values look the same: they are
// shown as their escapes instead. (Joiners, U+200C/200D, shape scripts and emoji: kept.)
const HIDDEN_CHARACTERS = /[\u202A-\u202E\u2066-\u2069\u200E\u200F\u200B\u2060\uFEFF]/g;

function visible(text) {
  return text.replace(HIDDEN_CHARACTERS,
    c => `\\u${c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0")}`);
}

function badge(state, testid) {
  return el("span", {className: `badge s-${state}`, "data-testid": testid}, state);
}

function ago(iso, now) {
  if (!iso) return "–";
  const secs = ((now ? new Date(now) : new Date()) - new Date(iso)) / 1000;
  const text = human(Math.abs(secs));
  return secs >= 0 ? `${text} ago` : `in ${text}`;
}

function human(secs) {
  if (secs < 10) return `${secs.toFixed(1)} s`;
  if (secs < 90) return `${Math.round(secs)} s`;
  if (secs < 5400) return `${Math.round(secs / 60)} min`;
  if (secs < 172800) return `${(secs / 3600).toFixed(1)} h`;
  return `${(secs / 86400).toFixed(1)} d`;
}

// Every time on the page reads YYYY-MM-DD HH:MM:SS and names its zone, as the server's
// explanations do: UTC, or on a schedule's pages the schedule's own zone, with its offset
// (e.g. 2026-05-12 13:00:30 +01:00; the zone's name is in the heading).
const STAMP_FORMATS = new Map();
const UTC_NAMES = /^(Etc\/)?(UTC|UCT|GMT|Universal|Zulu)$/;
const BROWSER_ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";

function stampFormat(tz) {
  if (!STAMP_FORMATS.has(tz)) {
    STAMP_FORMATS.set(tz, new Intl.DateTimeFormat("en-US", {
      timeZone: tz, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit"}));
  }
  return STAMP_FORMATS.get(tz);
}

function stamp(iso, tz) {
  if (!iso) return "–";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  let zone = tz || "UTC", format;
  try { format = stampFormat(zone); }
  catch (e) { zone = "UTC"; format = stampFormat(zone); }  // a zone this browser lacks
  const p = Object.fromEntries(format.formatToParts(date).map(x => [x.type, x.value]));
  const text = `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second}`;
  if (UTC_NAMES.test(zone)) return `${text} UTC`;
  const wall = Date.UTC(+p.year, +p.month - 1, +p.day, +p.hour, +p.minute, +p.second);
  const minutes = Math.round((wall - Math.floor(date.getTime() / 1000) * 1000) / 60000);
  const pad = n => String(n).padStart(2, "0");
  const sign = minutes < 0 ? "-" : "+";
  return `${text} ${sign}${pad(Math.floor(Math.abs(minutes) / 60))}:${pad(Math.abs(minutes) % 60)}`;
}

function clock(date) {
  return stamp(date.toISOString()).slice(11);  // HH:MM:SS UTC
}

function toast(text, bad) {
  const t = document.getElementById("toast");
  t.textContent = text;
  t.className = bad ? "toast bad" : "toast";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 4000);
}

async function api(path, options) {
  const opts = Object.assign({method: "GET", headers: {}}, options || {});
  if (opts.body !== undefined) {
    if (!opts.raw) opts.body = JSON.stringify(opts.body);  // raw: JSON text already
    opts.headers["Content-Type"] = "application/json";
  }
  if (opts.method !== "GET" && me.csrf_token) opts.headers["X-CSRF-Token"] = me.csrf_token;
  let res;
  try { res = await fetch(path, opts); }
  catch (e) { throw apiError("the dashboard does not answer (network error, or its server is down)", 0); }
  if (res.status === 401) { location.href = "/login"; throw new Error("not logged in"); }
  let data = null;
  try { data = await res.json(); } catch (e) { data = null; }
  if (!res.ok) {
    let detail = data && data.detail;
    if (Array.isArray(detail)) detail = detail.map(d => `${d.loc.slice(1).join(".")}: ${d.msg}`).join("; ");
    throw apiError(detail || `HTTP ${res.status}`, res.status);
  }
  lastOk = Date.now();
  return data;
}

// An error of the API with its HTTP status (0: no answer at all).
function apiError(message, status) {
  const e = new Error(message);
  e.status = status;
  return e;
}

// A line above the page saying why it cannot show (fresh) data; null clears it.
function showProblem(text) {
  const p = document.getElementById("problem");
  p.hidden = !text;
  p.textContent = text || "";
}

let pollGeneration = 0;  // which page's loop is current: a tick of another one stops

function poll(fn, ms) {
  stopPolling();
  const generation = ++pollGeneration;
  const tick = async () => {
    try {
      await fn();
      // A tick still in flight when the page changed must neither clear the new page's
      // problem line nor start its old loop again.
      if (generation !== pollGeneration) return;
      showProblem(null);
    } catch (e) {
      if (generation !== pollGeneration) return;
      if (e.message === "not logged in") return;
      if (e.status >= 400 && e.status < 500) {
        // The server answered: what was asked for is not there (a job past its retention,
        // a deleted schedule) or not allowed. Say so; polling it again cannot help a 404.
        lastOk = Date.now();
        showLive(true);
        showProblem(e.message);
        if (e.status === 404) return;
      } else {
        showLive(false);
        const since = lastOk ? `; showing what was read at ${clock(new Date(lastOk))}` : "";
        showProblem(`Cannot refresh: ${e.message}${since}. Retrying…`);
      }
    }
    pollTimer = setTimeout(tick, ms);
  };
  tick();
}

function stopPolling() {
  if (pollTimer) clearTimeout(pollTimer);
  pollTimer = null;
}

let healthy = true;  // the last poll's answer; the 5 s check alone must not undo a failure

function showLive(ok) {
  if (ok !== undefined) healthy = ok;
  const live = document.getElementById("live");
  const fresh = healthy && Date.now() - lastOk < 10000;
  live.className = fresh ? "live" : "live stale";
  live.textContent = fresh ? `live · ${clock(new Date())}` : "reconnecting…";
}

function view(...children) {
  const v = document.getElementById("view");
  v.replaceChildren(...children);
  return v;
}

function canWrite() { return me.role === "operator"; }

// --- charts (inline SVG) -----------------------------------------------------------------------

function throughputChart(timeline) {
  const W = 600, H = 130, pad = 22;
  const totals = timeline.map(b => Object.values(b.outcomes).reduce((a, n) => a + n, 0));
  const max = Math.max(1, ...totals);
  const bw = (W - pad) / Math.max(timeline.length, 1);
  const svg = el("svg:svg", {className: "chart", viewBox: `0 0 ${W} ${H + 16}`,
                             preserveAspectRatio: "none", role: "img",
                             "aria-label": "finished attempts per 10 seconds"});
  svg.append(el("svg:text", {x: 0, y: 10}, String(max)), el("svg:text", {x: 0, y: H}, "0"));
  timeline.forEach((b, i) => {
    let y = H;
    for (const [outcome, n] of Object.entries(b.outcomes)) {
      const h = (n / max) * (H - 14);
      y -= h;
      svg.append(el("svg:rect", {x: pad + i * bw + 1, y, width: Math.max(bw - 2, 1), height: h,
                                 fill: OUTCOME_COLORS[outcome] || "#888"},
                    el("svg:title", {}, `${n} ${outcome}`)));
    }
  });
  svg.append(el("svg:text", {x: pad, y: H + 14}, "−10 min"),
             el("svg:text", {x: W - 30, y: H + 14}, "now"));
  return svg;
}

function latencyChart(timeline) {
  const W = 600, H = 130, pad = 30;
  const values = timeline.flatMap(b => [b.start_lag_p50, b.start_lag_p95]).filter(v => v !== null);
  const max = Math.max(0.01, ...values);
  const step = (W - pad - 8) / Math.max(timeline.length - 1, 1);
  const svg = el("svg:svg", {className: "chart", viewBox: `0 0 ${W} ${H + 16}`,
                             preserveAspectRatio: "none", role: "img",
                             "aria-label": "due-to-start latency"});
  svg.append(el("svg:text", {x: 0, y: 10}, `${max.toFixed(max < 1 ? 2 : 1)} s`),
             el("svg:text", {x: 0, y: H}, "0"));
  for (const [key, color] of [["start_lag_p95", "#d98b1c"], ["start_lag_p50", "#1f86d1"]]) {
    let d = "";
    timeline.forEach((b, i) => {
      if (b[key] === null) return;
      const x = pad + i * step, y = H - (b[key] / max) * (H - 14);
      d += `${d ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
      svg.append(el("svg:circle", {cx: x, cy: y, r: 2.5, fill: color},
                    el("svg:title", {}, `${key.endsWith("p95") ? "p95" : "p50"} ${b[key].toFixed(3)} s`)));
    });
    if (d) svg.append(el("svg:path", {d, fill: "none", stroke: color, "stroke-width": 2}));
  }
  svg.append(el("svg:text", {x: pad, y: H + 14}, "−10 min"),
             el("svg:text", {x: W - 30, y: H + 14}, "now"));
  return svg;
}

function legend(pairs) {
  return el("div", {className: "legend"},
            pairs.map(([label, color]) => {
              const i = el("i");
              i.style.setProperty("--c", color);
              return el("span", {}, i, label);
            }));
}

// --- overview ------------------------------------------------------------------------------------

function renderOverview() {
  const cards = el("div", {className: "cards"});
  const charts = el("div", {className: "grid"});
  const queues = el("div", {className: "panel"});
  const kinds = el("div", {className: "panel"});
  const workers = el("div", {className: "panel"});
  const tenantRows = el("div");
  const tenants = el("div", {className: "panel", "data-testid": "tenants-panel"},
                     el("h2", {}, "Tenants: fair share of each dispatch batch"),
                     weightForm(), tenantRows);
  const limitRows = el("div");
  const limits = el("div", {className: "panel", "data-testid": "limits-panel"},
                    el("h2", {}, "Limits: fleet-wide, applied at dispatch"),
                    limitForm(), limitRows);
  view(el("h1", {}, "Overview"), cards, charts, el("div", {className: "grid"}, queues, kinds),
       el("div", {className: "grid"}, tenants, limits), workers);
  poll(async () => {
    const o = await api("/api/stats/overview");
    // Counts past a bound are estimated, not counted: their states' figures show "≈".
    const approx = s => o.estimated.includes(s) ? "≈" : "";
    cards.replaceChildren(...STATES.map(s => el("a", {
      className: `card s-${s}`, href: `#/jobs?state=${s}`, "data-testid": `count-${s}`,
      title: approx(s) ? "estimated from statistics: past a bound, jobs are not counted" : ""},
      el("div", {className: "n"}, `${approx(s)}${o.totals[s] || 0}`),
      el("div", {className: "l"}, s))));
    charts.replaceChildren(
      el("div", {className: "panel"}, el("h2", {}, "Throughput: finished attempts / 10 s"),
         throughputChart(o.timeline),
         legend(Object.entries(OUTCOME_COLORS))),
      el("div", {className: "panel"}, el("h2", {}, "Latency: due → started (succeeded jobs)"),
         latencyChart(o.timeline), legend([["p50", "#1f86d1"], ["p95", "#d98b1c"]])));
    queues.replaceChildren(el("h2", {}, "Queues"), o.queues.length ? el("table", {},
      el("thead", {}, el("tr", {}, ["queue", "kind", "due", "in SQS", "running", "later",
                                     "oldest due"].map((h, i) => el("th", {className: i > 1 ? "num" : ""}, h)))),
      el("tbody", {}, o.queues.map(q => el("tr", {"data-testid": `queue-${q.queue}-${q.kind}`,
          title: q.estimated ? "≈: estimated from statistics (past 10,000 jobs)" : ""},
        el("td", {}, q.queue), el("td", {}, q.kind),
        ...[q.due, q.dispatched, q.running, q.future].map(n => el("td", {className: "num"},
          boundedCount(n, q.estimated))),
        el("td", {className: "num", "data-testid": "oldest-due"},
           q.depth ? human(q.oldest_due_age_seconds) : "–")))))
      : el("p", {className: "muted"}, "No unfinished work."));
    const kindNames = Object.keys(o.by_kind).sort();
    kinds.replaceChildren(el("h2", {}, "Jobs by kind"), kindNames.length ? el("table", {},
      el("thead", {}, el("tr", {}, el("th", {}, "kind"),
                         STATES.map(s => el("th", {className: "num"}, s)))),
      el("tbody", {}, kindNames.map(k => el("tr", {},
        el("td", {}, el("a", {href: `#/jobs?kind=${encodeURIComponent(k)}`}, k)),
        STATES.map(s => el("td", {className: "num"},
                           o.by_kind[k][s] ? `${approx(s)}${o.by_kind[k][s]}` : "")))))) :
      el("p", {className: "muted"}, "No jobs yet."));
    tenantRows.replaceChildren(tenantTable(o.tenants));
    limitRows.replaceChildren(limitTable(o.limits));
    workers.replaceChildren(el("h2", {}, "Workers"), workerTable(o.workers, o.now));
    showLive(true);
  }, 2000);
}

function tenantTable(list) {
  if (!list.length) return el("p", {className: "muted"}, "No tenant has unfinished work.");
  return el("table", {}, el("thead", {}, el("tr", {},
    ["tenant", "weight", "due", "in SQS", "running", "later", "oldest due"].map(
      (h, i) => el("th", {className: i ? "num" : ""}, h)))),
    el("tbody", {}, list.map(t => el("tr", {"data-testid": `tenant-${t.tenant ?? ""}`,
        title: t.estimated ? "≈: sampled (more than 10,000 jobs wait)" : ""},
      el("td", {}, t.tenant === null ? el("span", {className: "muted"}, "(no tenant)")
                                     : el("a", {href: `#/jobs?tenant=${encodeURIComponent(t.tenant)}`}, t.tenant)),
      el("td", {className: "num", "data-testid": "tenant-weight"}, t.weight),
      el("td", {className: "num"}, t.estimated ? `≈${t.due}` : t.due),
      el("td", {className: "num"}, t.dispatched), el("td", {className: "num"}, t.running),
      el("td", {className: "num"}, t.estimated ? `≈${t.future}` : t.future),
      el("td", {className: "num"}, t.due ? human(t.oldest_due_age_seconds) : "–")))));
}

function weightForm() {
  // Outside the polled table, so typing is not undone by the next refresh.
  if (!canWrite()) return el("p", {className: "muted"}, "Log in as operator to change weights.");
  const form = el("form", {className: "inline", "data-testid": "weight-form"},
    el("input", {name: "tenant", placeholder: "tenant (empty: no tenant)", size: 22}),
    el("input", {name: "weight", type: "number", min: 1, max: 1000, placeholder: "1..1000"}),
    el("button", {type: "submit"}, "Set weight"),
    el("button", {type: "button", className: "quiet", "data-testid": "weight-reset",
                  onclick: () => setWeight(form, true)}, "Reset to 1"));
  form.addEventListener("submit", e => { e.preventDefault(); setWeight(form, false); });
  return form;
}

async function setWeight(form, reset) {
  const data = new FormData(form);
  const tenant = data.get("tenant") || null;  // as typed: " acme" is not acme (refused)
  const typed = data.get("weight").trim();
  if (!reset && !typed) {  // Number("") is 0, which the server refuses as "below 1"
    toast("Give a weight from 1 to 1000 (or Reset to 1).", true);
    return;
  }
  const weight = reset ? null : Number(typed);
  try {
    const out = await api("/api/tenants/weight", {method: "PUT", body: {tenant, weight}});
    toast(`${out.tenant ?? "(no tenant)"}: weight ${out.weight}.`);
  } catch (e) { toast(e.message, true); }
}

function limitName(l) { return l.key === null ? "(no tenant)" : l.key; }

function limitRunning(l) {
  if (l.max_running === null) return "–";
  // Handlers still running for jobs that left their worker hold slots too.
  const lingering = l.lingering ? ` (${l.lingering} lingering)` : "";
  const keys = `${l.keys_at_limit} key${l.keys_at_limit === 1 ? "" : "s"} full`;
  if (l.scope === "kind_key") return `${l.in_flight} (${keys}) / ${l.max_running} per key${lingering}`;
  return `${l.in_flight} / ${l.max_running}${lingering}`;
}

function limitTable(list) {
  if (!list.length) return el("p", {className: "muted"}, "No limits: every kind and tenant dispatches freely.");
  return el("table", {}, el("thead", {}, el("tr", {},
    ["scope", "key", "running / max", "rate", "tokens", "waiting"].map(
      (h, i) => el("th", {className: i > 1 ? "num" : ""}, h)))),
    el("tbody", {}, list.map(l => el("tr", {"data-testid": `limit-${l.scope}-${l.key ?? ""}`},
      el("td", {}, l.scope), el("td", {}, limitName(l)),
      el("td", {className: "num", "data-testid": "limit-running"},
         limitRunning(l)),
      el("td", {className: "num"}, l.rate_per_second === null ? "–" : rateText(l.rate_per_second)),
      el("td", {className: "num"}, l.tokens === null ? "–" : `${l.tokens.toFixed(1)} / ${l.burst}`),
      el("td", {className: "num", "data-testid": "limit-waiting"},
         l.waiting_more ? `more than ${l.waiting}` : l.waiting)))));
}

function limitForm() {
  if (!canWrite()) return el("p", {className: "muted"}, "Log in as operator to change limits.");
  const form = el("form", {className: "inline", "data-testid": "limit-form"},
    el("select", {name: "scope"}, el("option", {value: "kind"}, "kind"),
       el("option", {value: "tenant"}, "tenant"),
       el("option", {value: "kind_key"}, "each key of kind")),
    el("input", {name: "key", placeholder: "kind or tenant (empty: no tenant)", size: 26}),
    el("input", {name: "max_running", type: "number", min: 0, placeholder: "max running"}),
    el("input", {name: "rate", type: "number", min: 0, step: "any", placeholder: "rate"}),
    el("input", {name: "per", type: "number", min: 0, step: "any", placeholder: "per s (1)"}),
    el("input", {name: "burst", type: "number", min: 1, step: 1,
                 placeholder: "burst (1 s worth)",
                 title: "tokens the bucket holds (default: a second's worth of the rate)"}),
    el("button", {type: "submit"}, "Set limit"),
    el("button", {type: "button", className: "quiet", "data-testid": "limit-remove",
                  onclick: () => removeLimit(form)}, "Remove"));
  form.addEventListener("submit", e => { e.preventDefault(); setLimit(form); });
  return form;
}

function limitTarget(form) {
  const data = new FormData(form);
  return {data, scope: data.get("scope"), key: data.get("key") || null};  // as typed
}

async function setLimit(form) {
  const {data, scope, key} = limitTarget(form);
  const body = {scope, key};
  for (const k of ["max_running", "rate", "per", "burst"]) {
    if (data.get(k) !== "") body[k] = Number(data.get(k));
  }
  try {
    const l = await api("/api/limits", {method: "PUT", body});
    // A set replaces the whole limit: say what the one it replaced had and this has not.
    const gone = l.dropped.length ? `; it no longer has ${l.dropped.join(" or ")} (give ` +
      "every part of a limit in one set)" : "";
    // Set all the same (its consumers may not be deployed yet), but a typo is likelier.
    const unknown = l.unknown_kind ? `; no consumer has announced a handler for kind ` +
      `${l.key} in the last 24 hours (a typo?)` : "";
    toast(`Limit set on ${l.scope} ${limitName(l)}${gone}${unknown}.`);
  } catch (e) { toast(e.message, true); }
}

async function removeLimit(form) {
  const {scope, key} = limitTarget(form);
  const query = new URLSearchParams({scope});
  if (key !== null) query.set("key", key);
  try {
    await api(`/api/limits?${query}`, {method: "DELETE"});  // 404 when there was none
    toast(`Limit removed from ${scope} ${key ?? "(no tenant)"}.`);
  } catch (e) { toast(e.message, true); }
}

// A (queue, kind) count: each range is counted up to COUNT_BOUND and estimated past it, so
// a figure at or under the bound is exact; one just past it is all the statistics (older
// than the backlog) could say.
const COUNT_BOUND = 10000;
function boundedCount(n, estimated) {
  if (!estimated || n <= COUNT_BOUND) return n;
  return n === COUNT_BOUND + 1 ? `>${COUNT_BOUND.toLocaleString("en")}` : `≈${n}`;
}

// A rate as people set it: 5/s, 30/min, 1/h (not 0.000278/s).
function rateText(perSecond) {
  for (const [unit, secs] of [["s", 1], ["min", 60], ["h", 3600]]) {
    if (perSecond * secs >= 1 || unit === "h") return `${+(perSecond * secs).toPrecision(3)}/${unit}`;
  }
}

// The snapshot's own age of the beat: a beat committed while the snapshot was read is
// newer than the snapshot's clock, and would read "in 0.2 s".
function beatAge(secs) {
  return secs < 0.05 ? "just now" : `${human(secs)} ago`;
}

function workerTable(list, now) {
  if (!list.length) return el("p", {className: "muted"}, "No consumer has reported in the last hour.");
  return el("table", {}, el("thead", {}, el("tr", {},
    ["worker", "status", "queues", "busy", "last heartbeat", "started"].map(h => el("th", {}, h)))),
    el("tbody", {}, list.map(w => el("tr", {"data-testid": "worker-row"},
      el("td", {}, w.id), el("td", {}, badge(w.status)), el("td", {}, w.queues.join(", ")),
      el("td", {}, `${w.in_flight} / ${w.concurrency}`), el("td", {}, beatAge(w.heartbeat_age_seconds)),
      el("td", {}, stamp(w.started_at))))));
}

// --- jobs list --------------------------------------------------------------------------------------

function parseQuery(q) {
  const params = new URLSearchParams(q || "");
  return {state: params.getAll("state"), kind: params.get("kind") || "",
          queue: params.get("queue") || "", tenant: params.get("tenant") || "",
          key: params.get("key") || "", created_after: params.get("created_after") || "",
          created_before: params.get("created_before") || ""};
}

function filterToParams(f) {
  const p = new URLSearchParams();
  for (const s of f.state) p.append("state", s);
  for (const k of ["kind", "queue", "tenant", "key", "created_after", "created_before"]) {
    if (f[k]) p.set(k, f[k]);
  }
  return p;
}

// The creation-time inputs are read and shown in UTC, like every time on the page.
function localToIso(value) {
  if (!value) return "";
  const d = new Date(`${value}Z`);
  return Number.isNaN(d.getTime()) ? "" : d.toISOString();
}

function isoToLocal(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? "" : d.toISOString().slice(0, 16);
}

function renderJobs(query) {
  const f = parseQuery(query);
  const form = el("form", {className: "filters", "data-testid": "filters"},
    el("div", {className: "states"}, STATES.map(s => el("label", {},
      el("input", {type: "checkbox", name: "state", value: s, checked: f.state.includes(s)}), s))),
    ...["kind", "queue", "tenant", "key"].map(k => el("label", {}, k,
      el("input", {name: k, value: f[k], size: 12}))),
    el("label", {}, "created after (UTC)", el("input", {type: "datetime-local", name: "created_after",
                                                 value: isoToLocal(f.created_after)})),
    el("label", {}, "created before (UTC)", el("input", {type: "datetime-local", name: "created_before",
                                                  value: isoToLocal(f.created_before)})),
    el("button", {type: "submit"}, "Filter"));
  // What the form shows now, applied or not.
  const typed = () => {
    const data = new FormData(form);
    return {state: data.getAll("state"), kind: data.get("kind").trim(),
            queue: data.get("queue").trim(), tenant: data.get("tenant"),  // tenant, key:
            key: data.get("key"),                                         // as typed
            created_after: localToIso(data.get("created_after")),
            created_before: localToIso(data.get("created_before"))};
  };
  form.addEventListener("submit", e => {
    e.preventDefault();
    location.hash = `#/jobs?${filterToParams(typed())}`;
  });
  // A bulk action acts on the filter the form shows, typed but not yet applied too (the
  // filter the list was drawn with could match far more), and the list follows it.
  const bulkOn = action => {
    const next = typed();
    if (filterToParams(next).toString() !== filterToParams(f).toString()) {
      location.hash = `#/jobs?${filterToParams(next)}`;
    }
    bulkAction(action, next, () => { if (!cursor) load(); });
  };
  const bulk = el("div", {className: "actions"},
    el("button", {type: "button", className: "quiet", "data-testid": "bulk-retry",
                  disabled: !canWrite(), onclick: () => bulkOn("retry")},
       "Retry matching…"),
    el("button", {type: "button", className: "quiet", "data-testid": "bulk-cancel",
                  disabled: !canWrite(), onclick: () => bulkOn("cancel")},
       "Cancel matching…"));
  const body = el("tbody");
  const pager = el("div", {className: "pager"});
  view(el("h1", {}, "Jobs"), el("div", {className: "panel"}, form, bulk),
       el("div", {className: "panel"}, el("table", {"data-testid": "jobs-table"},
         el("thead", {}, el("tr", {}, ["id", "kind", "queue", "state", "attempt", "run at",
                                        "created", "last error"].map(h => el("th", {}, h)))),
         body), pager));
  const cursors = [];
  let cursor = null;
  const load = async () => {
    const params = filterToParams(f);
    if (cursor) params.set("before_id", cursor);
    const page = await api(`/api/jobs?${params}`);
    body.replaceChildren(...page.jobs.map(j => el("tr", {"data-testid": `job-row-${j.id}`},
      el("td", {}, el("a", {href: `#/jobs/${j.id}`}, `#${j.id}`)), el("td", {}, j.kind),
      el("td", {}, j.queue), el("td", {}, badge(j.state, `job-state-${j.id}`)),
      el("td", {}, j.max_attempts ? `${j.attempt}/${j.max_attempts}` : j.attempt),
      el("td", {title: stamp(j.run_at)}, ago(j.run_at)),
      el("td", {title: stamp(j.created_at)}, ago(j.created_at)),
      el("td", {className: "error-text"}, (j.last_error || "").slice(0, 80)))));
    if (!page.jobs.length) body.append(el("tr", {}, el("td", {colspan: 8, className: "muted"}, "No jobs match.")));
    pager.replaceChildren(
      el("button", {type: "button", className: "quiet", disabled: !cursors.length,
                    onclick: () => { cursor = cursors.pop() || null; load(); }}, "← Newer"),
      el("span", {className: "muted"}, cursor ? `older than #${cursor}` : "newest first"),
      el("button", {type: "button", className: "quiet", disabled: !page.next_cursor,
                    onclick: () => { cursors.push(cursor); cursor = page.next_cursor; load(); }},
         "Older →"));
    showLive(true);
  };
  // The first page refreshes live; older pages stay put while being read.
  poll(async () => { if (!cursor) await load(); }, 3000);
}

async function bulkAction(action, f, done = () => {}) {
  const filter = {state: f.state, kind: f.kind || null, queue: f.queue || null,
                  tenant: f.tenant || null, key: f.key || null,
                  created_after: f.created_after || null, created_before: f.created_before || null};
  // The API wants "all": true for every job; from the page, a filter is the way to say which.
  if (!f.state.length && !Object.entries(filter).some(([k, v]) => k !== "state" && v)) {
    toast("Choose at least one filter (a state, kind, queue, tenant, key or creation time) " +
          "first.", true);
    return;
  }
  try {
    const plan = await api(`/api/jobs/bulk/${action}`, {method: "POST",
                                                         body: {filter, dry_run: true}});
    const verb = action === "retry" ? "Retry" : "Cancel";
    const shown = plan.more ? `more than ${plan.count.toLocaleString("en")}` : `${plan.count}`;
    const ok = await confirmDialog(`${verb} ${shown} job(s)?`,
      `${shown} job(s) match (${plan.description}${action === "retry"
        ? "; only dead and cancelled jobs are retried" : "; only unfinished jobs are cancelled"}).` +
      " Jobs created after this count are left alone.", plan.count > 0);
    if (!ok) return;
    const result = await api(`/api/jobs/bulk/${action}`, {method: "POST",
      body: {filter, dry_run: false, up_to_id: plan.up_to_id}});
    toast(`${action === "retry" ? "Retried" : "Cancelled"} ${result.count} job(s).`);
    done();
  } catch (e) {
    toast(e.message, true);
  }
}

function confirmDialog(title, text, allowed, keepLabel = "Keep them") {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-no").textContent = keepLabel;
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-yes").disabled = !allowed;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise(resolve => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), {once: true});
  });
}

// --- one job -----------------------------------------------------------------------------------------

function renderJob(id) {
  const head = el("h1", {}, `Job #${id}`);
  const body = el("div");
  view(head, body);
  const act = async (verb) => {
    if (verb === "cancel" && !await confirmDialog(`Cancel job #${id}?`,
        "It will not run again unless retried (a running handler is asked to stop).", true,
        "Keep it")) {
      return;
    }
    try {
      await api(`/api/jobs/${id}/${verb}`, {method: "POST"});
      toast(verb === "retry" ? `Job #${id} sent back to scheduled.` : `Job #${id} cancelled.`);
      await load();
    } catch (e) { toast(e.message, true); }
  };
  const load = async () => {
    const d = await api(`/api/jobs/${id}`);
    const j = d.job, x = d.explanation;
    head.replaceChildren(`Job #${j.id} · ${j.kind} `, badge(j.state, "job-state"));
    const explainBox = el("div", {className: `explain s-${j.state}`, "data-testid": "explanation"},
      el("div", {className: "summary"}, x.summary),
      x.details.length ? el("ul", {}, x.details.map(t => el("li", {}, t))) : null,
      x.next_step ? el("div", {className: "muted"}, `Next: ${x.next_step}`) : null);
    const actions = el("div", {className: "actions"},
      el("button", {type: "button", "data-testid": "retry-button",
                    disabled: !(canWrite() && x.can_retry), onclick: () => act("retry")}, "Retry"),
      el("button", {type: "button", className: "danger", "data-testid": "cancel-button",
                    disabled: !(canWrite() && x.can_cancel), onclick: () => act("cancel")},
         "Cancel"),
      canWrite() ? null : el("span", {className: "muted"}, "Read-only: log in as operator to act."));
    const fields = [["queue", j.queue], ["priority", j.priority],
      ["attempt", j.max_attempts ? `${j.attempt} of ${j.max_attempts}` : j.attempt],
      ["run at", `${stamp(j.run_at)} (${ago(j.run_at)})`], ["key", j.key], ["tenant", j.tenant],
      ["concurrency key", j.concurrency_key],
      ["timeout", j.timeout_seconds ? `${j.timeout_seconds} s` : null],
      // A finished job keeps its last owner in the row; that lease is over.
      ["lease", j.lease_owner && j.state === "running"
        ? `${j.lease_owner} until ${stamp(j.lease_expires_at)}` : null],
      ["dispatched", j.dispatched_at ? stamp(j.dispatched_at) : null],
      ["created", stamp(j.created_at)], ["finished", j.finished_at ? stamp(j.finished_at) : null],
      ["last error", j.last_error]].filter(([, v]) => v !== null && v !== undefined && v !== "");
    const timeline = el("ol", {className: "timeline", "data-testid": "attempts"},
      d.attempts.flatMap((a, i) => [
        // A retried job counts its attempts from 1 again: mark where each retry began.
        i > 0 && a.attempt <= d.attempts[i - 1].attempt
          ? el("li", {className: "retried muted", "data-testid": "retried"},
               "Retried: attempts count from 1 again") : null,
        el("li", {className: `s-${a.outcome}`},
        el("div", {}, el("strong", {}, `Attempt ${a.attempt} `), badge(a.outcome),
           ` on ${a.worker || "?"} · ${stamp(a.started_at)}`,
           a.started_at ? ` · ran ${human((new Date(a.finished_at) - new Date(a.started_at)) / 1000)}` : ""),
        a.error ? el("div", {className: "error-text"}, a.error) : null,
        a.traceback ? el("details", {}, el("summary", {}, "traceback"), el("pre", {}, a.traceback)) : null)]),
      j.state === "running" ? el("li", {className: "s-running"},
        el("strong", {}, `Attempt ${j.attempt} `), badge("running"),
        ` on ${j.lease_owner} since ${stamp(j.started_at)}`) : null);
    body.replaceChildren(explainBox, actions, el("div", {className: "grid"},
      el("div", {className: "panel"}, el("h2", {}, "Job"), el("dl", {className: "fields"},
        fields.map(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))])),
        el("h2", {}, "Payload"), el("pre", {"data-testid": "payload"}, j.payload_text)),
      el("div", {className: "panel"}, el("h2", {}, "Attempts"),
         d.attempts.length || j.state === "running" ? timeline
           : el("p", {className: "muted"}, "No attempt yet."))));
    showLive(true);
    return j.state;
  };
  poll(load, 1000);
}

// --- enqueue ----------------------------------------------------------------------------------------

function renderEnqueue() {
  const list = el("datalist", {id: "kinds"}, DEMO_KINDS.map(([k]) => el("option", {value: k})));
  const form = el("form", {className: "stack", "data-testid": "enqueue-form"},
    el("label", {}, "kind", el("input", {name: "kind", list: "kinds", value: "email", required: true})),
    el("label", {}, "delay (seconds)", el("input", {name: "delay", type: "number", min: 0, step: "any", value: 0})),
    el("label", {}, `or run at (${BROWSER_ZONE} time)`,
       el("input", {name: "at", type: "datetime-local", step: 1})),
    el("label", {}, "priority (0-9)", el("input", {name: "priority", type: "number", min: 0, max: 9, value: 0})),
    el("label", {}, "queue", el("input", {name: "queue", placeholder: "default"})),
    el("label", {}, "key (idempotency)", el("input", {name: "key"})),
    el("label", {}, "tenant (fair share, limits)", el("input", {name: "tenant"})),
    el("label", {}, "concurrency key (per-key limits)", el("input", {name: "concurrency_key"})),
    el("label", {}, "max attempts", el("input", {name: "max_attempts", type: "number", min: 1, max: 1000})),
    el("label", {}, "timeout (seconds)", el("input", {name: "timeout", type: "number", min: 0, step: "any"})),
    el("label", {className: "wide"}, "payload (JSON)", el("textarea", {name: "payload"}, '{"demo": true}')),
    el("div", {className: "wide"}, el("button", {type: "submit", disabled: !canWrite()}, "Enqueue"),
       canWrite() ? null : el("span", {className: "muted"}, " Read-only: log in as operator to enqueue.")),
    list);
  form.addEventListener("submit", async e => {
    e.preventDefault();
    const data = new FormData(form);
    const payload = data.get("payload").trim();
    try { if (payload) JSON.parse(payload); }
    catch (err) { toast(`payload is not JSON: ${err.message}`, true); return; }
    const fields = {kind: data.get("kind").trim(), priority: Number(data.get("priority") || 0)};
    const delay = Number(data.get("delay") || 0);
    // A time, read in this browser's zone, goes as UTC; a delay beside it too, for the
    // API to refuse the pair rather than the form to drop one of them unsaid.
    if (data.get("at")) {
      const at = new Date(data.get("at"));
      if (Number.isNaN(at.getTime())) { toast("run at is not a date and time", true); return; }
      fields.at = at.toISOString();
    }
    if (!data.get("at") || delay) fields.delay = delay;
    if (data.get("queue").trim()) fields.queue = data.get("queue").trim();
    if (data.get("key")) fields.key = data.get("key");  // as typed: keys are exact
    if (data.get("tenant")) fields.tenant = data.get("tenant");  // as typed: the API says what is wrong
    if (data.get("concurrency_key")) fields.concurrency_key = data.get("concurrency_key");
    if (data.get("max_attempts")) fields.max_attempts = Number(data.get("max_attempts"));
    if (data.get("timeout")) fields.timeout = Number(data.get("timeout"));
    // The payload goes as typed: parsed and written again by the browser, a number past
    // 2**53 would be rounded, 1e400 become null and a repeated key lose a value, unsaid.
    const body = `${JSON.stringify(fields).slice(0, -1)},"payload":${payload || "null"}}`;
    try {
      const job = await api("/api/jobs", {method: "POST", body, raw: true});
      toast(job.created ? `Enqueued job #${job.id}.` : `Key taken: showing existing job #${job.id}.`);
      location.hash = `#/jobs/${job.id}`;
    } catch (err) { toast(err.message, true); }
  });
  stopPolling();
  view(el("h1", {}, "Enqueue a job"), el("div", {className: "panel"},
    el("p", {className: "muted", "data-testid": "enqueue-help"},
       `Demo kinds (demo/tasks.py): ${DEMO_KINDS.map(([k, what]) => `${k} (${what})`).join(", ")}. ` +
       "Any other kind works too, if a consumer has a handler for it."), form));
}

// --- schedules ---------------------------------------------------------------------------------------

async function toggleSchedule(name, paused) {
  try {
    await api(`/api/schedules/${encodeURIComponent(name)}/${paused ? "resume" : "pause"}`,
              {method: "POST"});
    toast(`Schedule ${name} ${paused ? "resumed" : "paused"}.`);
  } catch (e) { toast(e.message, true); }
}

function scheduleButton(s, after) {
  return el("button", {type: "button", className: "quiet", disabled: !canWrite(),
                       "data-testid": `toggle-${s.name}`,
                       onclick: async () => { await toggleSchedule(s.name, s.paused); after(); }},
            s.paused ? "Resume" : "Pause");
}

function renderSchedules() {
  const body = el("div", {className: "panel"});
  view(el("h1", {}, "Recurring schedules"), body);
  const load = async () => {
    const list = await api("/api/schedules");
    body.replaceChildren(list.length ? el("table", {"data-testid": "schedules-table"},
      el("thead", {}, el("tr", {}, ["name", "when", "kind", "queue", "next fire", "status", ""]
        .map(h => el("th", {}, h)))),
      el("tbody", {}, list.map(s => el("tr", {"data-testid": `schedule-${s.name}`},
        el("td", {}, el("a", {href: `#/schedules/${encodeURIComponent(s.name)}`}, s.name)),
        el("td", {}, s.timing), el("td", {}, s.kind), el("td", {}, s.queue),
        el("td", {title: UTC_NAMES.test(s.tz) ? stamp(s.next_fire_at, s.tz)
                                             : `${stamp(s.next_fire_at, s.tz)} (${s.tz})`},
           s.paused ? "–" : ago(s.next_fire_at)),
        el("td", {}, badge(s.paused ? "paused" : "active")),
        el("td", {}, scheduleButton(s, load))))))
      : el("p", {className: "muted"}, "No recurring schedules. Define them in code with recurring(...)."));
    showLive(true);
  };
  poll(load, 3000);
}

function renderSchedule(name) {
  const head = el("h1", {}, `Schedule ${name}`);
  const body = el("div");
  view(head, body);
  const load = async () => {
    const d = await api(`/api/schedules/${encodeURIComponent(name)}`);
    const s = d.schedule;
    head.replaceChildren(`Schedule ${s.name} `, badge(s.paused ? "paused" : "active"));
    body.replaceChildren(
      el("div", {className: "actions"}, scheduleButton(s, load)),
      el("div", {className: "grid"},
        el("div", {className: "panel"}, el("h2", {}, "Definition"), el("dl", {className: "fields"},
          [["when", s.timing], ["kind", s.kind], ["queue", s.queue], ["priority", s.priority],
           ["misfire", s.misfire], ["overlap", s.overlap], ["payload", s.payload_text]]
            .map(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))]))),
        el("div", {className: "panel"}, el("h2", {}, `Next fire times (${s.tz})`),
          s.paused ? el("p", {className: "muted"}, "Paused: nothing fires until it is resumed.")
            : el("ol", {"data-testid": "next-fires"}, d.next_fires.map(f => el("li", {},
                el("span", {"data-testid": "fire-time", title: `${f.local} (${s.tz})`},
                   stamp(f.fire_at, s.tz)),
                ` (${ago(f.fire_at)})`, f.note ? ` · ${f.note}` : ""))))),
      el("div", {className: "grid"},
        el("div", {className: "panel"}, el("h2", {}, "Recent runs"), d.runs.length ? el("table", {"data-testid": "runs"},
          el("thead", {}, el("tr", {}, el("th", {}, "job"), el("th", {}, `slot (${s.tz})`),
                             el("th", {}, "state"))),
          el("tbody", {}, d.runs.map(r => el("tr", {},
            el("td", {}, el("a", {href: `#/jobs/${r.job_id}`}, `#${r.job_id}`)),
            el("td", {"data-testid": "run-slot", title: `run at ${stamp(r.run_at, s.tz)}`}, stamp(r.slot, s.tz)),
            el("td", {}, badge(r.state))))))
          : el("p", {className: "muted"}, "No runs yet.")),
        el("div", {className: "panel"}, el("h2", {}, "Slots that did not run"),
          d.skipped.length ? el("table", {},
            el("thead", {}, el("tr", {}, el("th", {}, "why"), el("th", {}, `slots (${s.tz})`),
                               el("th", {}, "count"), el("th", {}, ""))),
            el("tbody", {}, d.skipped.map(e => el("tr", {},
            el("td", {}, e.reason), el("td", {}, `${stamp(e.first_slot, s.tz)} – ${stamp(e.last_slot, s.tz)}`),
            el("td", {}, e.slot_count === null ? "many" : `${e.slot_count} slot(s)`),
            el("td", {className: "muted"}, e.detail || "")))))
          : el("p", {className: "muted"}, "None."))));
    showLive(true);
  };
  poll(load, 3000);
}

// --- routing ------------------------------------------------------------------------------------------

function route() {
  showProblem(null);
  const hash = location.hash.slice(1) || "/";
  const [path, query] = hash.split("?");
  let section = "overview";
  const m = path.match(/^\/jobs\/(\d+)$/);
  if (m) { section = "jobs"; renderJob(m[1]); }
  else if (path === "/jobs") { section = "jobs"; renderJobs(query); }
  else if (path === "/enqueue") { section = "enqueue"; renderEnqueue(); }
  else if (path === "/schedules") { section = "schedules"; renderSchedules(); }
  else if (path.startsWith("/schedules/")) {
    section = "schedules"; renderSchedule(decodeURIComponent(path.slice(11)));
  }
  else {
    renderOverview();
    // A link that leads nowhere (#/jobs/abc, a typo) says so rather than pass silently.
    if (path !== "/") toast(`No page at #${path}: showing the overview.`, true);
  }
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("active", a.dataset.nav === section);
  }
}

async function start() {
  me = await api("/api/me");
  document.getElementById("whoami").textContent = me.role;
  document.getElementById("whoami").dataset.testid = "role";
  document.getElementById("logout").addEventListener("click", () => {
    const form = el("form", {method: "post", action: "/logout"},
                    el("input", {type: "hidden", name: "csrf_token", value: me.csrf_token || ""}));
    document.body.append(form);
    form.submit();
  });
  window.addEventListener("hashchange", route);
  setInterval(() => showLive(), 5000);
  route();
}

document.addEventListener("DOMContentLoaded", start);

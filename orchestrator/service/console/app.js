// rayprof console: plain JavaScript, no build step, no third-party code.
// Every value from the API goes into the page through textContent or
// attributes, never innerHTML, so a target or op name cannot inject markup.
"use strict";

const TOKEN_KEY = "rayprof-token";
const PAGE_SIZE = 50;
const TARGET_POLL_MS = 2000;
const HISTORY = 60; // step-time samples kept per rank for the chart
const STATES_DONE = new Set(["DONE", "PARTIAL", "FAILED", "CANCELLED"]);
const PHASES = ["data", "forward", "backward", "optimizer", "comm", "memcpy", "sync", "other"];
const OPTIONS = ["record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"];
const SVG_NS = "http://www.w3.org/2000/svg";

const main = document.getElementById("main");
const statusLine = document.getElementById("status");
const history = new Map(); // "target/run/rank" -> [step time ms]
let generation = 0; // bumped on each navigation; stale loops stop

// ---- DOM helpers -------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function table(headers, rows) {
  const head = el("tr", {}, headers.map(([label, cls]) => el("th", { class: cls || null, scope: "col", text: label })));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, rows));
}

function td(value, cls) {
  return el("td", { class: cls || null }, value);
}

function say(message, isError) {
  statusLine.textContent = message || "";
  statusLine.className = isError ? "error" : "";
}

function fmtMs(v) {
  return v === null || v === undefined ? "–" : v.toFixed(2);
}

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

// ---- API ---------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, detail) { super(detail); this.status = status; this.code = code; }
}

async function api(path, init) {
  const headers = new Headers((init && init.headers) || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.set("Authorization", `Bearer ${token}`);
  const response = await fetch(path, { ...init, headers });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    if (response.status === 401) document.getElementById("token-input").focus();
    throw new ApiError(response.status, body.error || "http_error", body.detail || response.statusText);
  }
  return body;
}

function failed(err) {
  const hint = err.status === 401 ? " Type the service's token above." : "";
  say(`${err.code || "error"}: ${err.message}.${hint}`, true);
}

// ---- charts ------------------------------------------------------------------

// One polyline per series over a shared y range; series: [{values: [y], cls}], optional xs per series.
function lineChart(series, { width = 320, height = 90, label, unit = "" }) {
  const all = series.flatMap((s) => s.values);
  const chart = svg("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label });
  if (!all.length) return chart;
  const max = Math.max(...all) || 1;
  const pad = 14;
  for (const s of series) {
    const xs = s.xs || s.values.map((_, i) => i);
    const x0 = Math.min(...xs), span = Math.max(...xs) - x0 || 1;
    const points = s.values.map((v, i) => {
      const x = pad + ((xs[i] - x0) / span) * (width - 2 * pad);
      const y = height - pad - (v / max) * (height - 2 * pad);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    chart.append(svg("polyline", { points: points.join(" "), class: s.cls }));
  }
  chart.append(svg("line", { x1: pad, y1: height - pad, x2: width - pad, y2: height - pad, class: "axis" }));
  const top = svg("text", { x: 2, y: 10 });
  top.textContent = `${max.toFixed(1)}${unit}`;
  chart.append(top);
  return chart;
}

// ---- pages -------------------------------------------------------------------

// Two live runs (Ray jobs) may share a target name: a card, its form and its chart are the run's.
function runKey(t) {
  return `${t.name}/${t.run || ""}`;
}

function runLabel(t) {
  return t.run ? `${t.name} (run ${t.run})` : t.name;
}

function profileForm(target) {
  const id = (name) => `${runKey(target)}-${name}`;
  const checks = OPTIONS.map((o) =>
    el("span", {}, el("input", { type: "checkbox", id: id(o), name: o }), " ", el("label", { for: id(o), text: o })));
  const form = el("form", { class: "profile-form", "aria-label": `Profile ${runLabel(target)}` },
    el("fieldset", {},
      el("legend", { text: `Profile ${runLabel(target)}` }),
      el("div", { class: "row" },
        el("label", { for: id("steps"), text: "Steps" }),
        el("input", { type: "number", id: id("steps"), name: "steps", min: "1", value: "3", required: true }),
        el("label", { for: id("warmup"), text: "Warmup" }),
        el("input", { type: "number", id: id("warmup"), name: "warmup", min: "0", value: "0" }),
        el("label", { for: id("activities"), text: "Activities" }),
        el("select", { id: id("activities"), name: "activities" },
          el("option", { value: "", text: "default" }), el("option", { value: "cpu", text: "cpu" }),
          el("option", { value: "cpu,cuda", text: "cpu, cuda" })),
        el("span", {}, el("input", { type: "checkbox", id: id("queue"), name: "queue" }), " ",
          el("label", { for: id("queue"), text: "queue behind a running window" }))),
      el("div", { class: "row" }, checks),
      el("button", { type: "submit", text: `Profile ${target.name}` })));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    const body = { target: target.name, steps: Number(data.get("steps")), warmup: Number(data.get("warmup") || 0) };
    if (target.run) body.run = target.run;
    for (const o of [...OPTIONS, "queue"]) body[o] = data.get(o) === "on";
    if (data.get("activities")) body.activities = data.get("activities").split(",");
    try {
      const view = await api("v1/profiles", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      say(`Started ${view.id}.`);
      location.hash = `#/profiles/${encodeURIComponent(view.id)}`;
    } catch (err) { failed(err); }
  });
  return form;
}

function targetCard(t) {
  const rows = t.ranks.map((w) => {
    const ms = w.step_time_s === null ? null : w.step_time_s * 1000;
    const key = `${runKey(t)}/${w.info.world_rank}`;
    const samples = history.get(key) || [];
    if (ms !== null) { samples.push(ms); if (samples.length > HISTORY) samples.shift(); }
    history.set(key, samples);
    return el("tr", {}, td(w.info.world_rank), td(w.info.host, "l"), td(w.info.device, "l"), td(w.step),
      td(fmtMs(ms)), td(w.last_seen_s.toFixed(1)));
  });
  const series = t.ranks.map((w, i) => ({ values: history.get(`${runKey(t)}/${w.info.world_rank}`) || [], cls: `s${i % 8}` }));
  const legend = el("div", { class: "legend" }, t.ranks.map((w, i) => el("span", {}, el("span", { class: `sw k${i % 8}` }), `rank ${w.info.world_rank}`)));
  return el("section", { class: "card target", "data-target": t.name, "data-run": t.run || "", "data-key": runKey(t) },
    el("div", { class: "live" },
    el("h2", { text: t.name }),
    el("p", {}, t.run ? `run ${t.run} · ` : "", `world size ${t.world_size}`, t.active_profile ? ` · profiling now: ` : "",
      t.active_profile ? el("a", { href: `#/profiles/${encodeURIComponent(t.active_profile)}`, text: t.active_profile }) : ""),
    table([["rank"], ["host", "l"], ["device", "l"], ["step"], ["step ms"], ["last seen s"]], rows),
    el("p", { class: "muted", text: "Step time per rank (ms), latest samples:" }),
    lineChart(series, { label: `step time per rank of ${runLabel(t)}`, unit: " ms" }), legend),
    profileForm(t));
}

async function targetsPage(gen) {
  main.replaceChildren(el("h1", { text: "Targets" }), el("div", { id: "targets" }, el("p", { class: "muted", text: "Loading…" })));
  while (gen === generation) {
    try {
      const { targets } = await api("v1/targets");
      const box = document.getElementById("targets");
      if (!box || gen !== generation) return;
      if (!targets.length) box.replaceChildren(el("p", { text: "No live training run has an agent. Start a job with rayprof instrumentation." }));
      const keys = new Set(targets.map(runKey));
      for (const old of box.querySelectorAll("section.target")) if (!keys.has(old.dataset.key)) old.remove();
      for (const t of targets) {
        const card = targetCard(t);
        const old = box.querySelector(`section[data-key="${CSS.escape(runKey(t))}"]`);
        // Refresh the live part only: the form keeps what the user typed, and its focus.
        if (old) old.querySelector(".live").replaceWith(card.querySelector(".live"));
        else {
          box.querySelector(":scope > p")?.remove();
          box.append(card);
        }
      }
      say("");
    } catch (err) { failed(err); }
    await new Promise((r) => setTimeout(r, TARGET_POLL_MS));
  }
}

// A list item carries rank counts per state, not the ranks: "64 DONE", "60 DONE, 4 FAILED".
function rankCounts(states) {
  return Object.entries(states).map(([state, n]) => `${n} ${state}`).join(", ") || "–";
}

async function profilesPage(gen, params) {
  const offset = Math.max(0, Number(params.get("offset") || 0));
  main.replaceChildren(el("h1", { text: "Profiles" }), el("p", { class: "muted", text: "Loading…" }));
  try {
    const { profiles, total } = await api(`v1/profiles?limit=${PAGE_SIZE}&offset=${offset}`);
    if (gen !== generation) return;
    const rows = profiles.map((p) => el("tr", {},
      td(el("a", { href: `#/profiles/${encodeURIComponent(p.id)}`, text: p.id }), "l"), td(p.target, "l"),
      td(el("span", { class: `state state-${p.state}`, text: p.state }), "l"),
      td(p.steps), td(rankCounts(p.rank_states), "l"), td(new Date(p.created_at).toLocaleString(), "l")));
    const last = Math.min(offset + PAGE_SIZE, total);
    const pager = el("div", { class: "pager" },
      el("button", { type: "button", id: "prev-page", disabled: offset === 0, onclick: () => { location.hash = `#/profiles?offset=${Math.max(0, offset - PAGE_SIZE)}`; }, text: "Newer" }),
      el("span", { text: total ? `${offset + 1}–${last} of ${total}` : "no profiles yet" }),
      el("button", { type: "button", id: "next-page", disabled: last >= total, onclick: () => { location.hash = `#/profiles?offset=${offset + PAGE_SIZE}`; }, text: "Older" }));
    main.replaceChildren(el("h1", { text: "Profiles" }), pager,
      table([["id", "l"], ["target", "l"], ["state", "l"], ["steps"], ["ranks", "l"], ["created", "l"]], rows));
    say("");
  } catch (err) { failed(err); }
}

function rankTable(view) {
  const steps = view.stop_step !== null && view.start_step !== null ? view.stop_step - view.start_step : view.request.steps;
  const rows = view.ranks.map((r) => {
    const done = r.step_durations_ms.length;
    return el("tr", {}, td(r.rank), td(r.host || "", "l"),
      td(el("span", { class: `state state-${r.state}`, text: r.state }), "l"),
      td(el("progress", { max: String(steps), value: String(Math.min(done, steps)), "aria-label": `rank ${r.rank} steps captured` })),
      td(`${done}/${steps}`), td(fmtBytes(r.artifacts.reduce((n, a) => n + a.bytes, 0))), td(r.reason || "", "l"));
  });
  return table([["rank"], ["host", "l"], ["state", "l"], ["progress"], ["steps"], ["uploaded"], ["reason", "l"]], rows);
}

async function memoryCharts(id, links) {
  const ranks = [...new Set(links.artifacts.filter((a) => a.kind === "memory_timeline").map((a) => a.rank))];
  if (!ranks.length) return null;
  const box = el("section", {}, el("h2", { text: "Memory timeline" }),
    el("p", { class: "muted", text: "Allocated (solid) and reserved (dashed) bytes per device over the window." }));
  for (const rank of ranks) {
    const timeline = await api(`v1/profiles/${encodeURIComponent(id)}/memory/${rank}`);
    for (const [device, s] of Object.entries(timeline.devices)) {
      const series = [{ values: s.allocated_bytes.map((b) => b / 2 ** 20), xs: s.ts_us, cls: "s0" }];
      if (s.reserved_bytes.length) series.push({ values: s.reserved_bytes.map((b) => b / 2 ** 20), xs: s.ts_us, cls: "s1 reserved" });
      box.append(el("h3", { text: `rank ${rank} · ${device} · peak ${fmtBytes(s.peak_allocated_bytes)}` }),
        lineChart(series, { width: 640, height: 140, label: `memory of rank ${rank} on ${device}`, unit: " MiB" }));
    }
  }
  return box;
}

async function finishedParts(view) {
  const links = await api(`v1/profiles/${encodeURIComponent(view.id)}/links`);
  const parts = [];
  if (links.report) {
    parts.push(el("h2", { text: "Report" }),
      el("iframe", { class: "report", src: links.report, sandbox: "", title: `analysis report of ${view.id}` }),
      el("p", {}, el("a", { href: links.report, target: "_blank", rel: "noopener", text: "Open the report on its own" })));
  }
  const merged = links.artifacts.find((a) => a.kind === "merged_trace");
  if (merged) {
    parts.push(el("h2", { text: "Open in Perfetto" }),
      el("ol", {},
        el("li", {}, "Download ", el("a", { href: merged.url, download: "merged.trace.json.gz", text: "merged.trace.json.gz" }),
          ` (${fmtBytes(merged.bytes)}): every rank on one timeline, one process per rank.`),
        el("li", {}, "Open ", el("a", { href: "https://ui.perfetto.dev", target: "_blank", rel: "noopener", text: "ui.perfetto.dev" }),
          " and choose Open trace file (the file stays in your browser)."),
        el("li", { text: "Or, offline: tensorboard --logdir <downloaded folder>/traces with torch-tb-profiler." })));
  }
  const rows = links.artifacts.map((a) => el("tr", {}, td(a.kind, "l"), td(a.rank === null ? "" : a.rank),
    td(el("a", { href: a.url, download: a.key.split("/").pop(), text: a.key }), "l"), td(fmtBytes(a.bytes))));
  parts.push(el("h2", { text: "Artifacts" }), table([["kind", "l"], ["rank"], ["file", "l"], ["size"]], rows));
  if (links.expires_at) parts.push(el("p", { class: "muted", text: `Links are signed and work until ${new Date(links.expires_at * 1000).toLocaleTimeString()}.` }));
  const memory = await memoryCharts(view.id, links);
  if (memory) parts.push(memory);
  return parts;
}

async function profilePage(gen, id) {
  main.replaceChildren(el("h1", { text: `Profile ${id}` }), el("p", { class: "muted", text: "Loading…" }));
  let wait = 0;
  while (gen === generation) {
    let view;
    try {
      view = await api(`v1/profiles/${encodeURIComponent(id)}?wait_s=${wait}`);
    } catch (err) { failed(err); return; }
    if (gen !== generation) return;
    const head = el("p", {}, "target ", el("strong", { text: view.target }), " · state ",
      el("span", { class: `state state-${view.state}`, id: "profile-state", text: view.state }),
      view.start_step !== null ? ` · steps ${view.start_step}–${(view.stop_step || view.start_step + view.request.steps) - 1}` : "",
      view.reason ? ` · ${view.reason}` : "");
    const actions = STATES_DONE.has(view.state) ? null : el("button", {
      type: "button", text: "Cancel", onclick: async () => {
        try { await api(`v1/profiles/${encodeURIComponent(id)}`, { method: "DELETE" }); } catch (err) { failed(err); }
      },
    });
    main.replaceChildren(el("h1", { text: `Profile ${id}` }), head, actions || "", el("h2", { text: "Ranks" }), rankTable(view));
    if (STATES_DONE.has(view.state)) {
      if (view.manifest_uri) {
        try { main.append(...await finishedParts(view)); } catch (err) { failed(err); }
      }
      main.append(el("p", {}, el("a", { href: `#/compare?a=${encodeURIComponent(id)}`, text: "Compare with another profile" })));
      return;
    }
    wait = 10;
  }
}

// ---- routing -----------------------------------------------------------------

function route(initial) {
  generation += 1;
  const gen = generation;
  const [path, query] = (location.hash.slice(1) || "/targets").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  for (const name of ["targets", "profiles", "compare"]) {
    const link = document.getElementById(`nav-${name}`);
    if (parts[0] === name) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  say("");
  if (parts[0] === "profiles" && parts[1]) profilePage(gen, decodeURIComponent(parts[1]));
  else if (parts[0] === "profiles") profilesPage(gen, params);
  else if (parts[0] === "compare") comparePage(gen, params);
  else targetsPage(gen);
  // After a navigation, start the keyboard at the new page; on first load, at the top.
  if (initial !== true) main.focus();
}

document.getElementById("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = document.getElementById("token-input");
  if (input.value) sessionStorage.setItem(TOKEN_KEY, input.value);
  input.value = "";
  say("Token kept for this tab.");
  route(false);
});
document.getElementById("token-forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  say("Token forgotten.");
});
window.addEventListener("hashchange", () => route(false));
route(true);

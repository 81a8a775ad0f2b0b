// rayprof console: plain JavaScript, no build step, no third-party code.
// Every value from the API goes into the page through textContent or
// attributes, never innerHTML, so a target or op name cannot inject markup.
// This file holds the shared helpers and the router; it loads last (index.html), after the pages
// (targets.js, profile.js, stacks.js, watches.js, compare.js), which use its helpers when called.
"use strict";

const TOKEN_KEY = "rayprof-token";
const PAGE_SIZE = 50;
const TARGET_POLL_MS = 2000;
const STATES_DONE = new Set(["DONE", "PARTIAL", "FAILED", "CANCELLED"]);
const PHASES = ["data", "forward", "backward", "optimizer", "comm", "memcpy", "sync", "other"];
const OPTIONS = ["record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules", "memory_snapshot"];
const SVG_NS = "http://www.w3.org/2000/svg";

const main = document.getElementById("main");
const statusLine = document.getElementById("status");
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

// Seconds in words: 45 s, 12 min, 3.5 h.
function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 120) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 7200) return `${(s / 60).toFixed(0)} min`;
  return `${(s / 3600).toFixed(1)} h`;
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

// An artifact a signed link points at (a stacks bundle's JSON or text): the body as text.
async function apiText(url) {
  const headers = new Headers();
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.set("Authorization", `Bearer ${token}`);
  const response = await fetch(url, { headers });
  if (!response.ok) throw new ApiError(response.status, "http_error", response.statusText);
  return response.text();
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

// ---- routing -----------------------------------------------------------------

function route(initial) {
  generation += 1;
  const gen = generation;
  const [path, query] = (location.hash.slice(1) || "/targets").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  for (const name of ["targets", "profiles", "watches", "compare"]) {
    const link = document.getElementById(`nav-${name}`);
    const here = parts[0] === name || (name === "profiles" && parts[0] === "stacks");
    if (here) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  say("");
  if (parts[0] === "profiles" && parts[1]) profilePage(gen, decodeURIComponent(parts[1]));
  else if (parts[0] === "profiles") profilesPage(gen, params);
  else if (parts[0] === "stacks" && parts[1]) stacksPage(gen, decodeURIComponent(parts[1]));
  else if (parts[0] === "watches") watchesPage(gen, params);
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

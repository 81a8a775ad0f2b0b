// rayprof console: a run's step-time history (GET /v1/targets/{t}/history) as a chart, with the
// run's profiles, stacks bundles and watch firings marked where they happened. Uses app.js's helpers.
"use strict";

// From minutes to the run's whole life (the controller keeps at most 24 h; the API's MAX_HISTORY_SPAN_S).
const SPANS = [["5 min", 300], ["15 min", 900], ["1 h", 3600], ["6 h", 21600], ["whole run (up to 24 h)", 86400]];
const DEFAULT_SPAN_S = 900;
const MAX_LINES = 16; // ranks drawn one line each; larger runs draw the first ranks and the lagging ones

function historySpanSelect(id, onchange) {
  const select = el("select", { id, name: "span" },
    SPANS.map(([label, s]) => el("option", { value: String(s), selected: s === DEFAULT_SPAN_S, text: label })));
  select.addEventListener("change", onchange);
  return el("span", {}, el("label", { for: id, text: "History span" }), " ", select);
}

// The ranks to ask for: all of a small run; of a large one the first ranks and every lagging rank.
function historyRanks(t) {
  if (t.world_size <= MAX_LINES) return [];
  return [...new Set([...Array(MAX_LINES / 2).keys(), ...t.lagging_ranks])].slice(0, MAX_LINES);
}

// Profiles, stacks bundles and watch firings of this run, as {t (unix s), kind, label, href}.
async function historyMarks(t) {
  const [{ profiles }, { watches }] = await Promise.all([
    api(`v1/profiles?target=${encodeURIComponent(t.name)}&limit=200`), api("v1/watches")]);
  const marks = profiles.filter((p) => !t.run || !p.run || p.run === t.run).map((p) => ({
    t: Date.parse(p.created_at) / 1000, kind: p.kind === "stacks" ? "stacks" : "profile",
    label: `${p.kind === "stacks" ? "stacks" : "profile"} ${p.id}${p.trigger ? ` (${p.trigger.detail})` : ""}`, href: bundleHref(p),
  }));
  for (const w of watches.filter((x) => x.spec.target === t.name)) {
    for (const f of w.firings) {
      marks.push({ t: Date.parse(f.at) / 1000, kind: "firing", label: `watch ${w.id} fired: ${f.trigger.detail}${f.error ? ` (${f.error})` : ""}`,
        href: "#/watches" });
    }
  }
  return marks.sort((a, b) => a.t - b.t);
}

function historyChart(t, history, marks, spanS) {
  const width = 720, height = 160, pad = 30;
  const series = history.ranks.map((r) => r.t.map((x, i) => [x, r.step_time_s[i]]).filter(([, v]) => v !== null));
  const values = series.flat().map(([, v]) => v * 1000);
  const now = Date.now() / 1000;
  const times = series.flat().map(([x]) => x);
  // A fixed span ends now; the whole run spans the points kept.
  const x0 = spanS >= 86400 && times.length ? Math.min(...times) : now - spanS;
  const x1 = Math.max(now, ...times);
  const max = Math.max(...values, 0) || 1;
  const X = (x) => pad + ((x - x0) / (x1 - x0 || 1)) * (width - 2 * pad);
  const Y = (v) => height - pad + 10 - (v / max) * (height - pad - 10);
  const chart = svg("svg", { class: "chart history", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": `step time per rank of ${runLabel(t)} over ${SPANS.find(([, s]) => s === spanS)[0]}` });
  chart.append(svg("line", { x1: pad, y1: Y(0), x2: width - pad, y2: Y(0), class: "axis" }));
  for (const [label, x, anchor] of [[new Date(x0 * 1000).toLocaleTimeString(), pad, "start"], ["now", width - pad, "end"]]) {
    const text = svg("text", { x, y: height - 4, "text-anchor": anchor });
    text.textContent = label;
    chart.append(text);
  }
  const top = svg("text", { x: 2, y: 10 });
  top.textContent = `${max.toFixed(1)} ms`;
  chart.append(top);
  for (const m of marks.filter((m) => m.t >= x0 && m.t <= x1)) {
    const line = svg("line", { x1: X(m.t), x2: X(m.t), y1: 12, y2: Y(0), class: `mark mark-${m.kind}`, "data-kind": m.kind });
    const title = svg("title");
    title.textContent = m.label;
    line.append(title);
    chart.append(line);
  }
  history.ranks.forEach((r, i) => {
    const points = series[i].map(([x, v]) => `${X(x).toFixed(1)},${Y(v * 1000).toFixed(1)}`);
    const line = svg("polyline", { points: points.join(" "), class: `s${i % 8}`, "data-rank": r.rank });
    const title = svg("title");
    title.textContent = `rank ${r.rank}`;
    line.append(title);
    chart.append(line);
  });
  const legend = el("div", { class: "legend" },
    history.ranks.map((r, i) => el("span", {}, el("span", { class: `sw k${i % 8}` }), `rank ${r.rank}`)),
    el("span", {}, el("span", { class: "sw mark-profile" }), "profile"), el("span", {}, el("span", { class: "sw mark-stacks" }), "stacks"),
    el("span", {}, el("span", { class: "sw mark-firing" }), "watch firing"));
  const shown = marks.filter((m) => m.t >= x0 && m.t <= x1);
  const list = shown.length
    ? el("ul", { class: "marks", "aria-label": `marked on the chart of ${runLabel(t)}` },
      shown.map((m) => el("li", {}, `${new Date(m.t * 1000).toLocaleTimeString()} `, el("a", { href: m.href, text: m.label }))))
    : el("p", { class: "muted", text: "No profile, stacks or watch firing in this span." });
  const note = t.world_size > history.ranks.length
    ? el("p", { class: "muted", text: `Showing ${history.ranks.length} of ${t.world_size} ranks (the first ranks and the lagging ones).` }) : null;
  return el("div", { class: "history-chart" }, chart, legend, note, list);
}

// Fill box with the run's chart over the span its select holds.
async function drawHistory(t, box, select) {
  const spanS = Number(select.value);
  const params = new URLSearchParams({ span_s: String(spanS) });
  if (t.run) params.set("run", t.run);
  for (const r of historyRanks(t)) params.append("rank", String(r));
  const [history, marks] = await Promise.all([api(`v1/targets/${encodeURIComponent(t.name)}/history?${params}`), historyMarks(t)]);
  box.replaceChildren(historyChart(t, history, marks, spanS));
}

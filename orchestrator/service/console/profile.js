// rayprof console, the Profiles pages: the list (profiles and stacks bundles), one profile with its
// ranks, report, device-idle bars, artifacts and memory. Uses app.js's helpers when called.
"use strict";

// A list item carries rank counts per state, not the ranks: "64 DONE", "60 DONE, 4 FAILED".
function rankCounts(states) {
  return Object.entries(states).map(([state, n]) => `${n} ${state}`).join(", ") || "–";
}

// A stacks bundle is listed with the profiles but has a page of its own.
function bundleHref(p) {
  return `#/${p.kind === "stacks" ? "stacks" : "profiles"}/${encodeURIComponent(p.id)}`;
}

async function profilesPage(gen, params) {
  const offset = Math.max(0, Number(params.get("offset") || 0));
  main.replaceChildren(el("h1", { text: "Profiles" }), el("p", { class: "muted", text: "Loading…" }));
  try {
    const { profiles, total } = await api(`v1/profiles?limit=${PAGE_SIZE}&offset=${offset}`);
    if (gen !== generation) return;
    const rows = profiles.map((p) => el("tr", {},
      td(el("a", { href: bundleHref(p), text: p.id }), "l"), td(p.kind === "stacks" ? "stacks" : "profile", "l"), td(p.target, "l"),
      td(el("span", { class: `state state-${p.state}`, text: p.state }), "l"),
      td(p.steps), td(rankCounts(p.rank_states), "l"), td(new Date(p.created_at).toLocaleString(), "l")));
    const last = Math.min(offset + PAGE_SIZE, total);
    const pager = el("div", { class: "pager" },
      el("button", { type: "button", id: "prev-page", disabled: offset === 0, onclick: () => { location.hash = `#/profiles?offset=${Math.max(0, offset - PAGE_SIZE)}`; }, text: "Newer" }),
      el("span", { text: total ? `${offset + 1}–${last} of ${total}` : "no profiles yet" }),
      el("button", { type: "button", id: "next-page", disabled: last >= total, onclick: () => { location.hash = `#/profiles?offset=${offset + PAGE_SIZE}`; }, text: "Older" }));
    main.replaceChildren(el("h1", { text: "Profiles" }), pager,
      table([["id", "l"], ["kind", "l"], ["target", "l"], ["state", "l"], ["steps"], ["ranks", "l"], ["created", "l"]], rows));
    say("");
  } catch (err) { failed(err); }
}

function rankTable(view) {
  const steps = view.stop_step !== null && view.start_step !== null ? view.stop_step - view.start_step : (view.request ? view.request.steps : 0);
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

// The report is a static page (no script may run in it: the frame's sandbox and the report's CSP),
// same-origin so that the console can read its height and show all of it instead of a scrolled slice.
function reportFrame(src, id) {
  const frame = el("iframe", { class: "report", src, sandbox: "allow-same-origin", title: `analysis report of ${id}` });
  frame.addEventListener("load", () => {
    const doc = frame.contentDocument;
    if (!doc || !doc.body) return;
    const fit = () => { frame.style.height = `${doc.documentElement.scrollHeight + 4}px`; };
    fit();
    // Opening a rank's top operators (a <details>) makes the report taller.
    new ResizeObserver(fit).observe(doc.body);
  });
  return frame;
}

// Issue 24's device-idle attribution: per rank, the device's busy time then each idle cause, per step,
// in the report's colours (idle.css, made from orchestrator.analysis.report.IDLE_COLORS).
function idleBars(summary) {
  const ranks = ((summary && summary.ranks) || []).filter((r) => r.idle && r.gpu && r.mean_step_ms);
  if (!ranks.length) return null;
  const longest = Math.max(...ranks.map((r) => r.gpu.busy_ms_per_step + r.idle.idle_ms_per_step)) || 1;
  const width = 720, row = 24;
  const rows = ranks.map((r) => {
    const segments = [{ cause: "busy", label: "device busy", ms_per_step: r.gpu.busy_ms_per_step }, ...r.idle.causes];
    const words = segments.map((s) => `${s.label} ${fmtMs(s.ms_per_step)} ms`).join(", ");
    const bar = svg("svg", { class: "idle-bar", width, height: row - 6, role: "img", "aria-label": `rank ${r.rank} per step: ${words}` });
    let x = 0;
    for (const s of segments) {
      const w = (s.ms_per_step / longest) * width;
      if (w <= 0) continue;
      const rect = svg("rect", { x: x.toFixed(1), y: 0, width: w.toFixed(1), height: row - 6, class: `idle-${s.cause}`, "data-cause": s.cause });
      const title = svg("title");
      title.textContent = `rank ${r.rank}: ${s.label} ${fmtMs(s.ms_per_step)} ms per step`;
      rect.append(title);
      bar.append(rect);
      x += w;
    }
    const top = r.idle.causes[0];
    return el("tr", { "data-rank": r.rank }, td(`rank ${r.rank}`, "l"), td(bar, "l"), td(fmtMs(r.idle.idle_ms_per_step)),
      td(top ? `${top.label} (${fmtMs(top.ms_per_step)} ms)` : "–", "l"));
  });
  const used = new Set(["busy", ...ranks.flatMap((r) => r.idle.causes.map((c) => c.cause))]);
  const labels = new Map([["busy", "device busy"], ...ranks.flatMap((r) => r.idle.causes.map((c) => [c.cause, c.label]))]);
  const legend = el("div", { class: "legend" }, [...used].map((c) => el("span", {}, el("span", { class: `sw idle-${c}` }), labels.get(c))));
  return el("section", { id: "idle", "aria-labelledby": "idle-title" },
    el("h2", { id: "idle-title", text: "Why the device idles" }),
    el("p", { class: "muted", text: "Per step: device busy time, then each idle gap blamed on what the launching host thread was doing." }),
    legend, table([["rank", "l"], ["busy, then idle by cause", "l"], ["idle ms per step"], ["largest cause", "l"]], rows));
}

async function finishedParts(view) {
  const links = await api(`v1/profiles/${encodeURIComponent(view.id)}/links`);
  const parts = [];
  const idle = idleBars(view.manifest && view.manifest.summary);
  if (idle) parts.push(idle);
  if (links.report) {
    parts.push(el("h2", { text: "Report" }),
      reportFrame(links.report, view.id),
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
    if (view.kind === "stacks") { location.replace(`#/stacks/${encodeURIComponent(id)}`); return; }
    const head = el("p", {}, "target ", el("strong", { text: view.target }), " · state ",
      el("span", { class: `state state-${view.state}`, id: "profile-state", text: view.state }),
      view.start_step !== null ? ` · steps ${view.start_step}–${(view.stop_step || view.start_step + (view.request ? view.request.steps : 0)) - 1}` : "",
      view.reason ? ` · ${view.reason}` : "");
    const actions = STATES_DONE.has(view.state) ? null : el("button", {
      type: "button", text: "Cancel", onclick: async () => {
        try { await api(`v1/profiles/${encodeURIComponent(id)}`, { method: "DELETE" }); } catch (err) { failed(err); }
      },
    });
    // Issue 25's post-window check: a rank that stays slower after the window (the profiler may not have let go).
    const after = view.post_window ? el("p", { id: "post-window", class: view.post_window.verdict === "slower" ? "bad" : "muted" },
      `After the window: ${view.post_window.detail}`) : "";
    main.replaceChildren(el("h1", { text: `Profile ${id}` }), head, after, actions || "", el("h2", { text: "Ranks" }), rankTable(view));
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


// rayprof console, a stacks bundle's page: every rank's stacks grouped (ranks unlike the majority first),
// the flight recorder's verdict on collectives, and each rank's own frames (stacks/rank{R}.txt, read when
// opened). Uses app.js's helpers when called; values go in through textContent only.
"use strict";

function frameList(frames) {
  return el("ol", { class: "frames" }, frames.map((f) => el("li", {},
    el("code", { text: `${f.filename}:${f.line}` }), ` in ${f.function}`, f.library ? el("span", { class: "muted", text: " (library)" }) : "",
    f.code ? el("pre", { text: f.code }) : "")));
}

function stackGroup(g, index, alone) {
  const odd = !g.majority && !alone;
  return el("section", { class: `stack-group${odd ? " outlier" : ""}`, "aria-labelledby": `group-${index}` },
    el("h3", { id: `group-${index}` }, g.ranks_text, odd ? el("span", { class: "badge bad", text: " differs from the majority" }) : ""),
    el("p", {}, g.waiting ? "waits in " : "is in ", el("strong", { text: g.where })),
    g.activity ? el("p", { class: "activity" }, "doing: ", el("strong", { text: g.activity })) : "",
    el("details", { open: odd || alone }, el("summary", { text: `${g.frames.length} frames of the training thread, outermost first` }),
      frameList(g.frames)));
}

function flightRecorder(bundle) {
  let body;
  if (bundle.collectives.length) body = el("ul", {}, bundle.collectives.map((c) => el("li", { class: "bad", text: c })));
  else if (bundle.flight_recorder_note) body = el("p", { class: "muted", text: `Not available: ${bundle.flight_recorder_note}` });
  else body = el("p", { class: "good", text: "No collective that some ranks entered and others never joined." });
  return el("section", { id: "flight-recorder", "aria-labelledby": "fr-title" },
    el("h2", { id: "fr-title", text: "Collectives (torch flight recorder)" }), body);
}

// One rank's whole file, fetched the first time its details open.
function rankFrames(rank, link) {
  const pre = el("pre", { class: "rank-stacks" }, "Loading…");
  const box = el("details", { class: "rank", "data-rank": rank }, el("summary", { text: `rank ${rank}` }), pre);
  let loaded = false;
  box.addEventListener("toggle", async () => {
    if (!box.open || loaded) return;
    loaded = true;
    try { pre.textContent = await apiText(link.url); } catch (err) { pre.textContent = ""; failed(err); }
  });
  return box;
}

function renderBundle(view, bundle, links) {
  const out = [
    el("p", {}, "target ", el("strong", { text: bundle.target }), bundle.run ? ` · run ${bundle.run}` : "", " · state ",
      el("span", { class: `state state-${bundle.state}`, id: "stacks-state", text: bundle.state }),
      ` · taken ${new Date(bundle.taken_at).toLocaleString()}`),
  ];
  if (bundle.trigger) out.push(el("p", { class: "muted", text: `Taken by ${bundle.trigger.watch_id ? `watch ${bundle.trigger.watch_id}` : "the stall detector"}: ${bundle.trigger.detail}` }));
  out.push(el("p", { class: "claim", id: "stacks-summary", text: bundle.summary }));
  out.push(flightRecorder(bundle));
  out.push(el("h2", { text: "Where the ranks are" }), ...bundle.groups.map((g, i) => stackGroup(g, i, bundle.groups.length === 1)));
  if (bundle.missing.length) out.push(el("h2", { text: "Ranks that did not answer" }),
    el("ul", {}, bundle.missing.map((m) => el("li", { text: `rank ${m.rank}: ${m.reason}` }))));
  for (const note of [...bundle.truncated.map((t) => `rank ${t.rank}: ${t.note}`), ...bundle.native_notes]) {
    out.push(el("p", { class: "muted", text: note }));
  }
  // Each rank's file, in the groups' order: outliers first.
  const files = new Map(links.artifacts.filter((a) => a.kind === "stacks").map((a) => [a.rank, a]));
  const order = [...bundle.groups.flatMap((g) => g.ranks), ...[...files.keys()].sort((a, b) => a - b)];
  const ranks = [...new Set(order)].filter((r) => files.has(r));
  out.push(el("h2", { text: "Each rank's threads" }),
    el("p", { class: "muted", text: "Every thread of each rank, outermost frame first; open a rank to read it." }),
    ...ranks.map((r) => rankFrames(r, files.get(r))));
  return out;
}

async function stacksPage(gen, id) {
  const title = el("h1", { text: `Stacks ${id}` });
  main.replaceChildren(title, el("p", { class: "muted", text: "Loading…" }));
  let wait = 0;
  while (gen === generation) {
    let view;
    try { view = await api(`v1/profiles/${encodeURIComponent(id)}?wait_s=${wait}`); } catch (err) { failed(err); return; }
    if (gen !== generation) return;
    if (!STATES_DONE.has(view.state)) { wait = 10; continue; }
    if (!view.manifest_uri) { main.replaceChildren(title, el("p", { text: `${view.state}: ${view.reason || "nothing was stored"}` })); return; }
    try {
      const links = await api(`v1/profiles/${encodeURIComponent(id)}/links`);
      const summary = links.artifacts.find((a) => a.kind === "stacks_summary");
      if (!summary) throw new ApiError(404, "not_found", `${id} holds no stacks.json`);
      const bundle = JSON.parse(await apiText(summary.url));
      if (gen !== generation) return;
      main.replaceChildren(title, ...renderBundle(view, bundle, links));
      say("");
    } catch (err) { failed(err); }
    return;
  }
}

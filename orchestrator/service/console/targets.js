// rayprof console, the Targets page: each live run's state (running or STALLED), its ranks and how far
// the lagging ones are behind, its step-time history, a form to profile it and a button to take stacks.
// Uses app.js's helpers (and history.js's chart) when called.
"use strict";

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
          el("option", { value: "cpu,cuda", text: "cpu, cuda" }), el("option", { value: "cpu,xpu", text: "cpu, xpu" })),
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

function stateLine(t) {
  if (t.health === "STALLED") {
    return el("p", { class: "health stalled", role: "alert" }, el("strong", { text: "STALLED" }),
      `: no rank advanced for ${fmtSeconds(t.stalled_s)}`,
      t.stall_threshold_s ? ` (threshold ${fmtSeconds(t.stall_threshold_s)})` : "",
      t.stall_stacks ? el("span", {}, " · stacks taken then: ", el("a", { href: `#/stacks/${encodeURIComponent(t.stall_stacks)}`, text: t.stall_stacks })) : "",
      t.stall_verdict ? el("span", { class: "stall-verdict", text: ` · they show: ${t.stall_verdict}` }) : "");
  }
  return el("p", { class: "health running" }, el("strong", { text: "running" }),
    t.median_step_time_s ? ` · median step ${fmtMs(t.median_step_time_s * 1000)} ms` : "");
}

function lagLine(t) {
  if (!t.lagging_ranks.length) return el("p", { class: "lag muted", text: "No rank lags behind." });
  const behind = new Map(t.ranks.map((w) => [w.info.world_rank, w.steps_behind]));
  const words = t.lagging_ranks.map((r) => `rank ${r} (${behind.get(r) ?? "?"} steps behind)`).join(", ");
  return el("p", { class: "lag bad", role: "status" }, el("strong", { text: "Lagging: " }), words);
}

function targetCard(t) {
  const lagging = new Set(t.lagging_ranks);
  const rows = t.ranks.map((w) => {
    const ms = w.step_time_s === null ? null : w.step_time_s * 1000;
    const rank = w.info.world_rank;
    return el("tr", { class: lagging.has(rank) ? "lagging" : null, "data-rank": rank }, td(rank), td(w.info.host, "l"),
      td(w.info.device, "l"), td(w.step), td(w.steps_behind ?? "–", lagging.has(rank) ? "bad" : null), td(fmtMs(ms)),
      td(w.last_seen_s.toFixed(1)));
  });
  const live = el("div", { class: "live" },
    el("h2", { text: t.name }),
    el("p", {}, t.run ? `run ${t.run} · ` : "", `world size ${t.world_size}`, t.active_profile ? " · profiling now: " : "",
      t.active_profile ? el("a", { href: `#/profiles/${encodeURIComponent(t.active_profile)}`, text: t.active_profile }) : ""),
    stateLine(t), lagLine(t),
    table([["rank"], ["host", "l"], ["device", "l"], ["step"], ["steps behind"], ["step ms"], ["last seen s"]], rows));
  const chartBox = el("div", { class: "history-box", "aria-live": "off" }, el("p", { class: "muted", text: "Loading the history…" }));
  const select = historySpanSelect(`${runKey(t)}-span`, () => refreshHistory(chartBox).catch(failed));
  const history = el("section", { class: "history", "aria-label": `Step-time history of ${runLabel(t)}` },
    el("div", { class: "row" }, el("h3", { text: "Step time per rank (ms)" }), select), chartBox);
  return el("section", { class: "card target", "data-target": t.name, "data-run": t.run || "", "data-key": runKey(t) },
    live, profileForm(t), el("div", { class: "row actions" }, stacksButton(t)), history);
}

// The card keeps the run it shows (card.target) and its span select; the poll and the select redraw the chart.
async function refreshHistory(box) {
  const card = box.closest("section.target");
  await drawHistory(card.target, box, card.querySelector("select[name=span]"));
}

function stacksButton(t) {
  const button = el("button", { type: "button", class: "take-stacks", text: `Take stacks of ${t.name}` });
  button.addEventListener("click", async () => {
    button.disabled = true;
    say(`Taking every rank's stacks of ${runLabel(t)}…`);
    try {
      const bundle = await api(`v1/targets/${encodeURIComponent(t.name)}/stacks`, {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(t.run ? { run: t.run } : {}) });
      say(`Took ${bundle.id}.`);
      location.hash = `#/stacks/${encodeURIComponent(bundle.id)}`;
    } catch (err) { failed(err); } finally { button.disabled = false; }
  });
  return button;
}

async function targetsPage(gen) {
  main.replaceChildren(el("h1", { text: "Targets" }), el("div", { id: "targets" }, el("p", { class: "muted", text: "Loading…" })));
  while (gen === generation) {
    try {
      const { targets, note } = await api("v1/targets");
      const box = document.getElementById("targets");
      if (!box || gen !== generation) return;
      if (!targets.length) box.replaceChildren(el("p", { text: note }));
      const keys = new Set(targets.map(runKey));
      for (const old of box.querySelectorAll("section.target")) if (!keys.has(old.dataset.key)) old.remove();
      for (const t of targets) {
        let card = box.querySelector(`section[data-key="${CSS.escape(runKey(t))}"]`);
        // Refresh the live part only: the form and the span select keep what the user chose, and their focus.
        if (card) card.querySelector(".live").replaceWith(targetCard(t).querySelector(".live"));
        else {
          box.querySelector(":scope > p")?.remove();
          card = targetCard(t);
          box.append(card);
        }
        card.target = t;
      }
      await Promise.all([...box.querySelectorAll(".history-box")].map(refreshHistory));
      say("");
    } catch (err) { failed(err); }
    await new Promise((r) => setTimeout(r, TARGET_POLL_MS));
  }
}

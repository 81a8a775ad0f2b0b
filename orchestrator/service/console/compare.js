// rayprof console, the Compare page: two finished profiles side by side, from GET /v1/profiles/{a}/diff/{b}.
// Loaded before app.js, whose helpers (el, table, td, api, fmtMs, say, failed) and page state (main,
// generation) it uses when called; values go into the page through textContent, never innerHTML.
"use strict";

function changeRow(label, c) {
  const spread = (d) => (d ? `${fmtMs(d.median_ms)} [${fmtMs(d.q1_ms)}–${fmtMs(d.q3_ms)}]` : "–");
  const words = { decreased: "shrank", increased: "grew", unchanged: "no change", too_few_steps: "too few steps" };
  return el("tr", {}, td(label, "l"), td(spread(c.a)), td(spread(c.b)), td(fmtMs(c.delta_ms)),
    td(c.delta_fraction === null ? "–" : `${(c.delta_fraction * 100).toFixed(0)}%`),
    td(c.p_value === null ? "–" : c.p_value.toFixed(3)), td(words[c.verdict], `l ${c.verdict}`));
}

const CHANGE_HEAD = [["", "l"], ["A median [IQR] ms"], ["B median [IQR] ms"], ["Δ ms"], ["Δ %"], ["p"], ["verdict", "l"]];

function renderDiff(d) {
  const out = [el("h2", { text: `${d.a.label} → ${d.b.label}` })];
  if (!d.comparable) out.push(el("div", { class: "warn", role: "alert" }, el("strong", { text: "Not comparable; no change is claimed." }), el("ul", {}, d.not_comparable.map((r) => el("li", { text: r })))));
  else if (d.claims.length) out.push(...d.claims.map((c) => el("div", { class: "claim", text: c })));
  else out.push(el("p", { text: "No change claimed: the differences are within the steps' own spread." }));
  out.push(table(CHANGE_HEAD, [changeRow("step time", d.step_time), ...d.phases.map((p) => changeRow(p.phase, p.change))]));
  if (d.ranks.length > 1) out.push(el("h3", { text: "Per rank" }), table(CHANGE_HEAD, d.ranks.map((r) => changeRow(`rank ${r.rank}`, r.step_time))));
  for (const [title, ops] of [["Operators (self CPU ms per step)", d.ops], ["GPU kernels (ms per step)", d.kernels]]) {
    out.push(el("h3", { text: title }));
    if (!ops.length) { out.push(el("p", { class: "muted", text: "No change above 1% of the step." })); continue; }
    out.push(table([["name", "l"], ["status", "l"], ["A"], ["B"], ["Δ"]], ops.map((o) => el("tr", {}, td(o.name.slice(0, 120), "l"),
      td(o.bound ? { added: "entered top list", removed: "left top list" }[o.status] : o.status, "l"), td(fmtMs(o.a_ms_per_step)),
      td(fmtMs(o.b_ms_per_step)), td(`${o.bound ? "≤ " : ""}${fmtMs(o.delta_ms_per_step)}`)))));
  }
  const list = (fs) => (fs.length ? el("ul", {}, fs.map((f) => el("li", { text: f.title }))) : el("p", { class: "muted", text: "none" }));
  out.push(el("h3", { text: "Findings resolved" }), list(d.findings.resolved), el("h3", { text: "Findings new" }), list(d.findings.new));
  out.push(...d.notes.map((n) => el("p", { class: "muted", text: n })), el("p", { class: "muted", text: d.method }));
  return el("section", { id: "diff" }, out);
}

async function comparePage(gen, params) {
  main.replaceChildren(el("h1", { text: "Compare two profiles" }), el("p", { class: "muted", text: "Loading…" }));
  let profiles = [];
  try {
    ({ profiles } = await api("v1/profiles?state=DONE&limit=200"));
  } catch (err) { failed(err); return; }
  if (gen !== generation) return;
  const options = (selected) => profiles.map((p) => el("option", { value: p.id, selected: p.id === selected, text: `${p.id} (${p.target}, ${p.steps} steps)` }));
  const result = el("div", { id: "diff-result", "aria-live": "polite" });
  const form = el("form", { id: "compare-form" },
    el("div", { class: "row" },
      el("label", { for: "compare-a", text: "Before (A)" }), el("select", { id: "compare-a", name: "a", required: true }, options(params.get("a"))),
      el("label", { for: "compare-b", text: "After (B)" }), el("select", { id: "compare-b", name: "b", required: true }, options(params.get("b"))),
      el("button", { type: "submit", id: "compare-run", text: "Compare" })));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const a = form.elements.a.value, b = form.elements.b.value;
    result.replaceChildren(el("p", { class: "muted", text: "Comparing…" }));
    try {
      const d = await api(`v1/profiles/${encodeURIComponent(a)}/diff/${encodeURIComponent(b)}`);
      result.replaceChildren(renderDiff(d));
      say("");
    } catch (err) { result.replaceChildren(); failed(err); }
  });
  main.replaceChildren(el("h1", { text: "Compare two profiles" }),
    profiles.length < 2 ? el("p", { text: "Two finished (DONE) profiles are needed." }) : form, result);
}

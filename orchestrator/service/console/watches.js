// rayprof console, the Watches page: create a watch (the choices of `rayprof watch`), list every watch
// with its state and firings, delete one. Uses app.js's helpers when called.
"use strict";

// The conditions a watch can wait for: one radio each, with the field it needs (POST /v1/watches).
// A new kind of watch (a schedule, say) is one more entry here plus its words in watchWhen; a field
// whose key ends in _s is read as a duration (30s, 10m, 1h).
const CONDITIONS = [
  { key: "slower_than", label: "median step time over its baseline by", field: { type: "number", min: "1.01", step: "0.01", value: "1.3", unit: "x" } },
  { key: "rank_lag", label: "a rank this many steps behind the leader", field: { type: "number", min: "1", step: "1", value: "10", unit: "steps" } },
  { key: "stalled", label: "no rank advances (STALLED)", field: null },
  { key: "every_s", label: "on a schedule, every", field: { type: "text", value: "30m", size: "6", unit: "a duration like 30m" } },
  { key: "oom", label: "a rank runs out of CUDA memory (every rank records the allocator's history; stacks and memory snapshots)", field: null },
];
const UNITS = { "": 1, s: 1, m: 60, h: 3600 };

// `30`, `30s`, `10m`, `1h` -> seconds, as the CLI reads them; NaN when it is none of those.
function parseDuration(text) {
  const m = /^\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*$/.exec(text);
  return m ? Number(m[1]) * UNITS[m[2]] : NaN;
}

// A watch in words, as `rayprof watches` says it.
function watchWhen(spec) {
  if (spec.every_s !== null && spec.every_s !== undefined) return `every ${fmtSeconds(spec.every_s)}`;
  if (spec.slower_than !== null) return `median step time over ${spec.slower_than}x its ${spec.baseline_s}s baseline`;
  if (spec.rank_lag !== null) return `a rank ${spec.rank_lag}+ steps behind the leader`;
  if (spec.oom) return "a rank runs out of CUDA memory";
  return "no rank advancing (STALLED)";
}

function watchWords(spec) {
  const then = spec.oom ? "take every rank's stacks and memory snapshot"
    : spec.action === "stacks" ? "take every rank's stacks" : `profile ${spec.profile_steps} steps on ${spec.ranks} ranks`;
  const when = spec.every_s !== null && spec.every_s !== undefined ? watchWhen(spec)
    : spec.oom ? `when ${watchWhen(spec)}` : `when ${watchWhen(spec)} for ${spec.for_s}s`;
  return `${when}, ${then}; cooldown ${spec.cooldown_s}s, at most ${spec.max_per_hour}/hour`;
}

function field(id, label, attrs) {
  return el("span", {}, el("label", { for: id, text: label }), " ", el("input", { id, name: id.replace("watch-", ""), ...attrs }));
}

function watchForm(targets, onCreated) {
  const conditions = CONDITIONS.map((c, i) => el("div", { class: "row" },
    el("input", { type: "radio", name: "condition", id: `watch-when-${c.key}`, value: c.key, checked: i === 0 }),
    el("label", { for: `watch-when-${c.key}`, text: c.label }),
    c.field ? el("input", { type: c.field.type, id: `watch-${c.key}`, name: c.key, min: c.field.min, step: c.field.step,
      size: c.field.size, value: c.field.value, "aria-label": `${c.label} (${c.field.unit})` }) : ""));
  const form = el("form", { id: "watch-form", "aria-label": "Create a watch" },
    el("fieldset", {}, el("legend", { text: "Watch a target" }),
      el("div", { class: "row" },
        field("watch-target", "Target", { type: "text", list: "watch-targets", required: true, value: targets[0] || "", pattern: "[A-Za-z0-9][A-Za-z0-9._=\\-]*" }),
        el("datalist", { id: "watch-targets" }, targets.map((t) => el("option", { value: t })))),
      el("fieldset", { class: "when" }, el("legend", { text: "When" }), conditions),
      el("div", { class: "row" },
        field("watch-for", "holds for", { type: "text", value: "30s", size: "6", required: true }),
        field("watch-baseline", "baseline window", { type: "text", value: "5m", size: "6", required: true })),
      el("fieldset", { class: "then" }, el("legend", { text: "Then" }),
        el("div", { class: "row" },
          el("input", { type: "radio", name: "action", id: "watch-then-profile", value: "profile", checked: true }),
          el("label", { for: "watch-then-profile", text: "profile" }),
          el("input", { type: "number", id: "watch-steps", name: "profile_steps", min: "1", value: "5", "aria-label": "steps to profile" }),
          el("span", { text: "steps on" }),
          el("select", { id: "watch-ranks", name: "ranks", "aria-label": "which ranks to profile" },
            el("option", { value: "all", text: "all ranks" }), el("option", { value: "lagging", text: "the lagging ranks + 2 healthy (rank lag only)" }))),
        el("div", { class: "row" },
          el("input", { type: "radio", name: "action", id: "watch-then-stacks", value: "stacks" }),
          el("label", { for: "watch-then-stacks", text: "take every rank's stacks" }))),
      el("div", { class: "row" },
        field("watch-cooldown", "cooldown", { type: "text", value: "10m", size: "6", required: true }),
        field("watch-max", "at most per hour", { type: "number", min: "1", max: "60", value: "4", required: true })),
      el("button", { type: "submit", id: "watch-create", text: "Create watch" })));
  // A stalled run takes no steps to profile, nor does a rank out of memory: stacks is the action that
  // can work (the CLI's default too; an oom watch takes nothing else).
  form.addEventListener("change", (ev) => {
    if (ev.target.name === "condition" && (ev.target.value === "stalled" || ev.target.value === "oom")) {
      form.querySelector("#watch-then-stacks").checked = true;
    }
  });
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    const condition = data.get("condition");
    const body = {
      target: data.get("target").trim(), action: data.get("action"), profile_steps: Number(data.get("profile_steps")),
      ranks: data.get("ranks"), for_s: parseDuration(data.get("for")), baseline_s: parseDuration(data.get("baseline")),
      cooldown_s: parseDuration(data.get("cooldown")), max_per_hour: Number(data.get("max")),
    };
    // A schedule has no condition to hold or baseline to fill (the API refuses them with one).
    if (condition === "every_s") { delete body.for_s; delete body.baseline_s; }
    // A condition's field is a number, or a duration when its key ends in _s (as a schedule's would).
    if (condition === "stalled" || condition === "oom") body[condition] = true;
    else body[condition] = condition.endsWith("_s") ? parseDuration(data.get(condition)) : Number(data.get(condition));
    const bad = ["for_s", "baseline_s", "cooldown_s", "every_s"].filter((k) => Number.isNaN(body[k]));
    if (bad.length) { say(`${bad.join(", ")}: give a duration like 30s, 10m or 1h.`, true); return; }
    try {
      const status = await api("v1/watches", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      say(`Created ${status.id}: ${watchWords(status.spec)}.`);
      onCreated();
    } catch (err) { failed(err); }
  });
  return form;
}

function firingsList(w) {
  if (!w.firings.length) return "none";
  return el("details", {}, el("summary", { text: `${w.firings.length}` }),
    el("ul", {}, w.firings.slice().reverse().map((f) => el("li", {}, `${new Date(f.at).toLocaleString()}: ${f.trigger.detail} `,
      f.profile_id ? el("a", { href: `#/${f.profile_id.startsWith("stk-") ? "stacks" : "profiles"}/${encodeURIComponent(f.profile_id)}`, text: f.profile_id }) : "",
      f.error ? el("span", { class: "bad", text: ` failed: ${f.error}` }) : ""))));
}

function watchRows(watches, onDeleted) {
  return watches.map((w) => el("tr", { "data-watch": w.id },
    td(w.id, "l"), td(w.spec.target, "l"),
    td(el("span", {}, watchWords(w.spec), w.note ? el("span", { class: "muted", text: ` (${w.note})` }) : "",
      w.paused ? el("span", { class: "bad", text: ` PAUSED: ${w.paused}` }) : "",
      w.next_at ? el("span", { class: "muted next-at", text: ` next ${new Date(w.next_at).toLocaleString()}` }) : ""), "l"),
    td(el("span", { class: `state watch-${w.state}`, text: w.state }), "l"),
    td(w.baseline === null ? "–" : `${fmtMs(w.baseline * 1000)} ms`), td(w.observed === null ? "–" : String(Number(w.observed.toPrecision(4)))),
    td(w.holding_s === null ? "–" : fmtSeconds(w.holding_s)), td(firingsList(w), "l"),
    td(el("button", { type: "button", class: "delete-watch", "aria-label": `Delete watch ${w.id}`, text: "Delete", onclick: async () => {
      try { await api(`v1/watches/${encodeURIComponent(w.id)}`, { method: "DELETE" }); say(`Deleted ${w.id}.`); onDeleted(); } catch (err) { failed(err); }
    } }))));
}

async function watchesPage(gen) {
  main.replaceChildren(el("h1", { text: "Watches" }), el("p", { class: "muted", text: "Loading…" }));
  const list = el("section", { id: "watch-list", "aria-labelledby": "watch-list-title" });
  const load = async () => {
    try {
      const { watches } = await api("v1/watches");
      if (gen !== generation) return;
      list.replaceChildren(el("div", { class: "row" }, el("h2", { id: "watch-list-title", text: `Watches (${watches.length})` }),
        el("button", { type: "button", id: "watch-refresh", text: "Refresh", onclick: load })),
      watches.length ? table([["id", "l"], ["target", "l"], ["what", "l"], ["state", "l"], ["baseline"], ["observed"], ["holding"], ["firings", "l"], [""]],
        watchRows(watches, load)) : el("p", { text: "No watches." }));
    } catch (err) { failed(err); }
  };
  let targets = [];
  try { targets = [...new Set((await api("v1/targets")).targets.map((t) => t.name))]; } catch (err) { failed(err); }
  if (gen !== generation) return;
  main.replaceChildren(el("h1", { text: "Watches" }), watchForm(targets, load), list);
  await load();
}

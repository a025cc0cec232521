// One memory block: its content, its history with authors, a diff between any two versions, a
// rollback to one and an undo of the agent's own latest edit (each after a confirmation).
import { add, clear, el, errorText, json, route, table, when } from "../dom.js";

const MAX_DIFF_LINES = 2000; // lines of each version compared (a longer block's rest is not)

// The lines removed and added between two texts (longest common subsequence), in order.
export function lineDiff(before, after) {
  const a = before.split("\n").slice(0, MAX_DIFF_LINES);
  const b = after.split("\n").slice(0, MAX_DIFF_LINES);
  const common = Array.from({ length: a.length + 1 }, () => new Uint16Array(b.length + 1));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      common[i][j] = a[i] === b[j] ? common[i + 1][j + 1] + 1 : Math.max(common[i + 1][j], common[i][j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) out.push([" ", a[i++], j++]);
    else if (j < b.length && (i >= a.length || common[i][j + 1] >= common[i + 1][j])) out.push(["+", b[j++]]);
    else out.push(["-", a[i++]]);
  }
  return out;
}

export async function blockView(main, api, agent, label, owner = undefined) {
  const base = `v1/agents/${encodeURIComponent(agent)}/blocks/${encodeURIComponent(label)}`;
  const whose = owner ? `?owner=${encodeURIComponent(owner)}` : ""; // the row clicked (own or shared)
  const at = (path) => `${base}${path}${whose}`;
  const [view, history] = await Promise.all([api.get(at("")), api.get(at("/history"))]);
  const versions = history.versions || [];
  const pick = (id, chosen) => el("select", { id }, versions.map((v) => {
    const option = el("option", { value: String(v.version) }, `v${v.version} · ${v.author} · ${v.op}`);
    option.selected = v.version === chosen;
    return option;
  }));
  const from = pick("from", Math.max(history.oldest_viewable || 1, history.head - 1));
  const to = pick("to", history.head);
  const diff = el("pre", { id: "diff", class: "diff" });
  const result = el("div", { id: "result" });

  async function showDiff() {
    clear(diff);
    const [a, b] = await Promise.all([api.get(at(`/versions/${from.value}`)), api.get(at(`/versions/${to.value}`))]);
    const [before, after] = [String(a.content), String(b.content)];
    for (const [mark, text] of lineDiff(before, after)) {
      add(diff, el("span", { class: mark === "+" ? "added" : mark === "-" ? "removed" : "same" }, `${mark} ${text}\n`));
    }
    const longest = Math.max(before.split("\n").length, after.split("\n").length);
    if (longest > MAX_DIFF_LINES) {
      add(diff, el("span", { class: "removed", id: "diff-cut" }, `(only the first ${MAX_DIFF_LINES} of ${longest} lines are compared)\n`));
    }
  }

  const rollback = el("button", { type: "button", id: "rollback", class: "needs-write", onclick: async () => {
    if (rollback.disabled || !window.confirm(`Roll ${label} back to version ${from.value}? (a new version with its content)`)) return;
    rollback.disabled = true;
    clear(result);
    try {
      add(result, el("pre", { id: "rollback-report" }, json(await api.post(at("/rollback"), { version: Number(from.value) }))));
    } catch (error) {
      add(result, errorText(error));
    } finally {
      rollback.disabled = false;
    }
  } }, "Roll back to the left version");
  const undo = el("button", { type: "button", class: "quiet needs-write", id: "undo-edit", onclick: async () => {
    if (undo.disabled || !window.confirm(`Undo the latest edit ${agent} made to ${label}? (edits by others are kept)`)) return;
    undo.disabled = true;
    clear(result);
    try {
      add(result, el("pre", { id: "undo-edit-report" }, json(await api.post(at("/undo"), {}))));
    } catch (error) {
      add(result, errorText(error));
    } finally {
      undo.disabled = false;
    }
  } }, `Undo ${agent}'s latest edit`);
  add(main, el("h1", {}, `Block ${label}`), el("p", {}, el("a", { href: route("agents", agent) }, `of ${agent}`), ` · version ${view.version}`),
    el("pre", { id: "content" }, String(view.content)),
    el("h2", {}, "History"),
    table(["version", "author", "via", "edit", "message", "when", "chars"],
      versions.map((v) => [String(v.version), v.author, v.via, v.op, v.message || "", when(v.timestamp), String(v.chars_delta)])),
    el("h2", {}, "Compare"), el("div", { class: "pair" }, from, to, el("button", { type: "button", id: "compare", onclick: () => showDiff().catch((e) => add(diff, errorText(e))) }, "Diff")),
    diff, el("div", { class: "pair" }, rollback, undo), result);
  await showDiff();
  return null;
}

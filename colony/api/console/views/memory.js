// An agent's memory: its scopes and the dataflow between them (the MemoryMap, drawn and listed), and recall with
// filters (text, scopes, a tag, mode, minimum relevance), each result with its scores.
import { add, clear, el, errorText, route, table, when } from "../dom.js";

function scopeName(id) {
  return String(id).split(":").slice(-2).join(":");
}

const SVG = "http://www.w3.org/2000/svg";
const BOX_W = 190;
const BOX_H = 46;
const GAP_X = 70;
const GAP_Y = 22;
const MAX_NODES = 60; // scopes drawn (the table lists them all)

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text; // as text, never markup
  return node;
}

// The MemoryMap drawn: a box per scope (type, entries), an arrow per dataflow edge, scopes in
// columns by how many hops of dataflow lead to them (working memory first, long-term last).
export function memoryGraph(scopes, edges) {
  const ids = scopes.map((s) => s.scope_id).slice(0, MAX_NODES);
  const known = new Set(ids);
  const flows = edges.filter(([a, b]) => known.has(a) && known.has(b) && a !== b);
  const depth = Object.fromEntries(ids.map((id) => [id, 0]));
  for (let round = 0; round < ids.length; round++) { // longest path, bounded (a cycle stops growing)
    let moved = false;
    for (const [a, b] of flows) {
      if (depth[b] < depth[a] + 1 && depth[a] + 1 < ids.length) { depth[b] = depth[a] + 1; moved = true; }
    }
    if (!moved) break;
  }
  const columns = [];
  for (const id of ids) (columns[depth[id]] ||= []).push(id);
  const where = {};
  columns.forEach((column, x) => column.forEach((id, y) => { where[id] = { x: 10 + x * (BOX_W + GAP_X), y: 10 + y * (BOX_H + GAP_Y) }; }));
  const width = 20 + columns.length * (BOX_W + GAP_X) - GAP_X;
  const height = 20 + Math.max(1, ...columns.map((c) => c.length)) * (BOX_H + GAP_Y) - GAP_Y;
  const root = svg("svg", { class: "graph", id: "memory-graph", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "memory scopes and their dataflow" });
  for (const [a, b] of flows) {
    const from = where[a];
    const to = where[b];
    const [x1, y1, x2, y2] = [from.x + BOX_W, from.y + BOX_H / 2, to.x, to.y + BOX_H / 2];
    const backwards = x2 <= x1;
    const bend = backwards ? Math.max(40, Math.abs(y2 - y1) / 2) : (x2 - x1) / 2;
    root.append(svg("path", { class: "edge", d: backwards ? `M${x1},${y1} C${x1 + bend},${y1 - bend} ${x2 - bend},${y2 - bend} ${x2},${y2}`
      : `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}` }));
    root.append(svg("polygon", { class: "arrow", points: `${x2},${y2} ${x2 - 8},${y2 - 4} ${x2 - 8},${y2 + 4}` }));
  }
  const byId = Object.fromEntries(scopes.map((s) => [s.scope_id, s]));
  for (const id of ids) {
    const s = byId[id];
    const at = where[id];
    const group = svg("g", { class: "scope-node", "data-scope": s.scope_type });
    group.append(svg("title", {}, String(id)));
    group.append(svg("rect", { class: "scope", x: at.x, y: at.y, width: BOX_W, height: BOX_H, rx: 5 }));
    group.append(svg("text", { x: at.x + 8, y: at.y + 18 }, String(s.scope_type).slice(0, 28)));
    group.append(svg("text", { x: at.x + 8, y: at.y + 36 }, `${s.entry_count} entries${s.pending_ingestion ? `, ${s.pending_ingestion} to flow` : ""}`));
    root.append(group);
  }
  return root;
}

export async function memoryView(main, api, id) {
  const base = `v1/agents/${encodeURIComponent(id)}/memory`;
  const map = await api.get(base);
  const scopes = Object.values(map.scopes || {});
  const edges = map.dataflow_edges || [];
  add(main, el("h1", {}, `Memory of ${id}`), el("p", {}, el("a", { href: route("agents", id) }, "the agent"),
    ` · ${map.total_entries} entries, ${map.total_pending_ingestion} waiting to flow on`));
  add(main, el("h2", {}, "Scopes"), scopes.length ? table(["scope", "type", "purpose", "entries", "cap", "TTL", "pending", "tags"],
    scopes.map((s) => [scopeName(s.scope_id), s.scope_type, s.purpose || "", String(s.entry_count), s.max_entries ?? "", s.ttl_seconds ?? "",
      String(s.pending_ingestion), (s.available_tags || []).slice(0, 12).join(", ")])) : el("p", { class: "muted" }, "This agent keeps no memory."));
  if (scopes.length) add(main, el("h2", {}, "Map"), memoryGraph(scopes, edges));
  add(main, el("h2", {}, "Dataflow"), edges.length ? el("ul", { id: "dataflow" }, edges.map(([from, to]) => el("li", {}, `${scopeName(from)} → ${scopeName(to)}`)))
    : el("p", { class: "muted" }, "No dataflow between scopes."));

  const text = el("input", { id: "query", placeholder: "what to look for (empty: newest and most important)" });
  const scope = el("select", { id: "scope" }, el("option", { value: "" }, "every scope"), scopes.map((s) => el("option", { value: s.scope_type }, s.scope_type)));
  const tag = el("input", { id: "tag", placeholder: "a tag the entries carry" });
  const mode = el("select", { id: "mode" }, ["hybrid", "vector", "keyword"].map((m) => el("option", { value: m }, m)));
  const minimum = el("input", { id: "min", type: "number", min: "0", max: "1", step: "0.05", value: "0" });
  const found = el("div", { id: "recalled" });
  const ask = el("button", { type: "submit" }, "Recall");
  add(main, el("h2", {}, "Recall"), el("form", { class: "card", id: "recall", onsubmit: async (event) => {
    event.preventDefault();
    if (ask.disabled) return;
    ask.disabled = true; // one recall at a time
    clear(found);
    const body = { mode: mode.value, min_relevance: Number(minimum.value) || 0, max_results: 20 };
    if (text.value.trim()) body.query = text.value.trim();
    if (scope.value) body.scopes = [scope.value];
    if (tag.value.trim()) body.tag_filter = { all_of: [tag.value.trim()] };
    try {
      const result = await api.post(`${base}/query`, body);
      const entries = result.entries || [];
      add(found, entries.length ? table(["relevance", "scores", "content", "scope", "tags", "created"],
        entries.map((r) => [r.relevance.toFixed(3), Object.entries(r.scores || {}).map(([k, v]) => `${k} ${Number(v).toFixed(2)}`).join(", "),
          el("pre", {}, String(r.entry.content)), scopeName(r.entry.scope_id), (r.entry.tags || []).join(", "), when(r.entry.created_at)]))
        : el("p", { class: "muted" }, "Nothing recalled."));
    } catch (error) {
      add(found, errorText(error));
    } finally {
      ask.disabled = false;
    }
  } }, el("label", { for: "query" }, "Text"), text, el("label", { for: "scope" }, "Scope"), scope, el("label", { for: "tag" }, "Tag"), tag,
  el("label", { for: "mode" }, "Mode"), mode, el("label", { for: "min" }, "Minimum relevance"), minimum, ask), found);
  return null;
}

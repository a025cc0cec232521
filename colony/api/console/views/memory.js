// An agent's memory: its scopes and the dataflow between them (the MemoryMap), and recall with
// filters (text, scopes, a tag, mode, minimum relevance), each result with its scores.
import { add, clear, el, errorText, route, table, when } from "../dom.js";

function scopeName(id) {
  return String(id).split(":").slice(-2).join(":");
}

export async function memoryView(main, api, id) {
  const base = `v1/agents/${encodeURIComponent(id)}/memory`;
  const map = await api.get(base);
  const scopes = Object.values(map.scopes || {});
  add(main, el("h1", {}, `Memory of ${id}`), el("p", {}, el("a", { href: route("agents", id) }, "the agent"),
    ` · ${map.total_entries} entries, ${map.total_pending_ingestion} waiting to flow on`));
  add(main, el("h2", {}, "Scopes"), scopes.length ? table(["scope", "type", "purpose", "entries", "cap", "TTL", "pending", "tags"],
    scopes.map((s) => [scopeName(s.scope_id), s.scope_type, s.purpose || "", String(s.entry_count), s.max_entries ?? "", s.ttl_seconds ?? "",
      String(s.pending_ingestion), (s.available_tags || []).slice(0, 12).join(", ")])) : el("p", { class: "muted" }, "This agent keeps no memory."));
  const edges = map.dataflow_edges || [];
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

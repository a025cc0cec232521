// One agent: its record, its blocks, its checkpoints with undo (after a confirmation; the report
// of effects not undone is shown).
import { add, clear, el, errorText, json, route, table, when } from "../dom.js";

const MAX_BLOCKS = 50;

export async function agentView(main, api, id) {
  const agent = await api.get(`v1/agents/${encodeURIComponent(id)}`);
  const result = el("div", { id: "result" });
  add(main, el("h1", {}, `Agent ${agent.agent_id}`),
    table(["role", "type", "state", "replica", "created", "updated"],
      [[agent.role || "", agent.agent_type, agent.state, agent.replica || "", when(agent.created_at), when(agent.updated_at)]]));
  const blocks = el("div", { id: "blocks" });
  const checkpoints = el("div", { id: "checkpoints" });
  add(main, el("p", {}, el("a", { href: route("agents", agent.agent_id, "memory"), id: "memory-link" }, "Memory: scopes, dataflow, recall")),
    el("h2", {}, "Memory blocks"), blocks, el("h2", {}, "Checkpoints"), checkpoints, result);
  try {
    const list = (await api.get(`v1/agents/${encodeURIComponent(id)}/blocks`)).slice(0, MAX_BLOCKS);
    const views = await Promise.all(list.map((b) => {
      const owner = b.owner && !b.colony ? `?owner=${encodeURIComponent(b.owner)}` : "";
      return api.get(`v1/agents/${encodeURIComponent(id)}/blocks/${encodeURIComponent(b.label)}${owner}`).catch((error) => ({ content: `(${error.message})` }));
    }));
    add(blocks, list.length ? table(["label", "owner", "access", "content"],
      list.map((b, n) => [el("a", { href: b.colony || !b.owner ? route("blocks", id, b.label) : route("blocks", id, b.label, b.owner) }, b.label), b.owner, b.access, el("pre", { class: "block" }, String(views[n].content ?? ""))]))
      : el("p", { class: "muted" }, "No blocks."));
  } catch (error) {
    add(blocks, errorText(error));
  }
  try {
    const held = await api.get(`v1/agents/${encodeURIComponent(id)}/checkpoints`);
    const list = Array.isArray(held) ? held : held.checkpoints || [];
    const undo = el("button", { type: "button", id: "undo", onclick: async () => {
      if (undo.disabled || !window.confirm(`Undo the last step of ${agent.agent_id}? Effects outside the agent are not undone.`)) return;
      undo.disabled = true; // one undo per confirmation
      clear(result);
      try {
        const report = await api.post(`v1/agents/${encodeURIComponent(id)}/undo`);
        add(result, el("h2", {}, "Undone"), el("pre", { id: "undo-report" }, json(report)));
      } catch (error) {
        add(result, errorText(error));
      } finally {
        undo.disabled = false;
      }
    } }, "Undo last step");
    add(checkpoints, list.length ? table(["step", "taken", "run", "run status", "agent state"],
      list.map((c) => [String(c.step), when(c.at), c.request_id ? el("a", { href: route("runs", c.request_id) }, c.request_id) : c.run_id,
        c.run_status || "", c.lifecycle]))
      : el("p", { class: "muted" }, "No checkpoints."), list.length > 1 ? undo : null);
  } catch (error) {
    add(checkpoints, errorText(error));
  }
  add(main, el("p", {}, el("a", { href: route("run") }, "Start a run")));
  return null;
}

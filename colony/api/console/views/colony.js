// The colony at a glance: replicas (engine, agents, pages held), agents by state, the resumption
// queue (in the order the monitor resumes), the agents themselves; refreshed every few seconds.
import { add, clear, el, route, table, when } from "../dom.js";
import { refreshEvery } from "../poll.js";

const REFRESH_MS = 3000;
const SHOWN = 500; // agents listed (the filter narrows them; the counts cover all)
const QUEUED = 100; // agents of the resumption queue listed, from its head

export async function colonyView(main, api) {
  const counts = el("div", { class: "chips", id: "states" });
  const replicas = el("div", { id: "replicas" });
  const pages = el("div", { id: "pages" });
  const waiting = el("div", { id: "waiting" });
  const filter = el("input", { type: "search", id: "filter", placeholder: "filter agents by id or role" });
  const agents = el("div", { id: "agents" });
  add(main, el("h1", {}, "Colony"), el("h2", {}, "Agents by state"), counts, el("h2", {}, "Replicas"), replicas,
    el("h2", {}, "Pages on replicas"), pages, el("h2", {}, "Resumption queue"), waiting, el("h2", {}, "Agents"), filter, agents);
  let records = [];

  function renderAgents() {
    const wanted = filter.value.trim().toLowerCase();
    const shown = records.filter((a) => !wanted || a.agent_id.toLowerCase().includes(wanted) || String(a.role || "").toLowerCase().includes(wanted));
    add(clear(agents), 
      table(["agent", "role", "type", "state", "replica", "updated"],
        shown.slice(0, SHOWN).map((a) => [el("a", { href: route("agents", a.agent_id) }, a.agent_id), a.role || "", a.agent_type, a.state, a.replica || "", when(a.updated_at)])),
      shown.length > SHOWN ? el("p", { class: "muted" }, `${shown.length - SHOWN} more; filter to find them`) : null,
    );
  }

  async function refresh() {
    const [agentList, replicaList, pageList, queue] = await Promise.all([api.get("v1/agents"), api.get("v1/replicas"), api.get("v1/vcm/pages"),
      api.get(`v1/colony/resumption?limit=${QUEUED}`)]);
    records = agentList;
    const byState = {};
    for (const a of records) byState[a.state] = (byState[a.state] || 0) + 1;
    add(clear(counts), ...Object.entries(byState).sort().map(([state, n]) => el("span", {}, `${state}: ${n}`)),
      el("span", {}, `all: ${records.length}`));
    const of = (n, most) => `${n ?? ""}${typeof most === "number" ? ` of ${most}` : ""}`;
    add(clear(replicas), table(["replica", "engine", "agents", "pages resident (KV slots)", "swapped", "faults", "updated"],
      replicaList.map((r) => [r.replica_id, r.engine, of(r.agents, r.max_agents), of((r.pages || {}).resident, (r.pages || {}).slots),
        (r.pages || {}).swapped ?? "", (r.pages || {}).faults ?? "", when(r.updated_at)])));
    const held = pageList.filter((p) => (p.resident_on || []).length || (p.swapped_on || []).length).slice(0, SHOWN);
    add(clear(pages), held.length ? table(["page", "files", "tokens", "resident on", "swapped on"],
      held.map((p) => [p.page_id, (p.files || []).map((f) => `${f.path}:${f.start_line}-${f.end_line}`).slice(0, 4).join(", "), String(p.tokens),
        (p.resident_on || []).join(", "), (p.swapped_on || []).join(", ")]))
      : el("p", { class: "muted" }, `${pageList.length} page(s) mapped, none held by a replica now.`));
    const onDemand = Math.max(0, (byState.suspended || 0) - queue.total);
    add(clear(waiting), queue.agents.length ? table(["#", "agent", "priority", "waits for", "suspended", "pages"],
      queue.agents.map((q) => [String(q.position), el("a", { href: route("agents", q.agent_id) }, q.agent_id), String(q.priority), q.waits,
        when(q.suspended_at), `${q.pages.join(", ")}${q.page_bound ? " (bound)" : ""}`]))
      : el("p", { class: "muted" }, "No agent waits for a condition."),
    queue.truncated ? el("p", { class: "muted" }, `The first ${queue.agents.length} of ${queue.total}.`) : null,
    queue.complete === false ? el("p", { class: "error" }, "More agents are queued than one reading orders: this order may not be the monitor's.") : null,
    onDemand ? el("p", { class: "muted", id: "on-demand" }, `${onDemand} more suspended to make room (idle sessions): resumed when asked for.`) : null);
    renderAgents();
  }

  filter.addEventListener("input", renderAgents);
  await refresh();
  return refreshEvery(main, refresh, REFRESH_MS);
}

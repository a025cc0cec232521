// One agent: its record, what it is built with (profile: class, policy, capabilities, actions
// with their declared effects), its runs, its blocks, its checkpoints with undo and restore (after
// a confirmation; the report of effects not undone is shown) and an export download.
import { add, clear, el, errorText, json, route, table, when } from "../dom.js";

const MAX_BLOCKS = 50;
const MAX_RUNS = 50;

function profileSection(held) {
  const rows = [["type", held.agent_type || "(not recorded)"], ["role", held.role || ""], ["priority", String(held.priority)]];
  if (held.parent_id) rows.push(["started by", el("a", { href: route("agents", held.parent_id) }, held.parent_id)]);
  if (held.bound_page_count) rows.push(["bound pages", `${held.bound_pages.join(", ")}${held.bound_page_count > held.bound_pages.length ? ` (+${held.bound_page_count - held.bound_pages.length})` : ""}`]);
  const profile = held.profile;
  if (!profile) {
    return [table(["", ""], rows), el("p", { class: "muted" }, "Its profile was not recorded (an agent created before profiles were kept).")];
  }
  const r = profile.resources || {};
  rows.push(["class", profile.agent_class], ["action policy", profile.action_policy || "(none)"],
    ["resources", `${r.cpu} CPU, ${r.memory_mb} MB, ${r.max_tokens} tokens`], ["capabilities", el("div", {}, profile.capabilities.map((c) => el("div", {}, c)))]);
  const actions = profile.actions.map((a) => [a.name, a.capability, a.planned ? "planner" : "code only", a.effects.join(", "), a.description]);
  return [table(["", ""], rows), el("h2", {}, "Actions"),
    actions.length ? table(["action", "capability", "called by", "effects", "description"], actions) : el("p", { class: "muted" }, "No actions."),
    profile.more_actions ? el("p", { class: "muted" }, `${profile.more_actions} more actions not listed`) : null];
}

// A button that asks first, then calls `act` and shows its report. The buttons sharing `lock`
// (undo and every restore) are disabled while any one of their calls is in flight: one change of
// the agent's checkpoints at a time.
function confirmed(id, text, question, act, result, lock) {
  const button = el("button", { type: "button", class: "quiet needs-admin", id, onclick: async () => {
    if (lock.busy || !window.confirm(question())) return;
    lock.busy = true;
    for (const b of lock.buttons) b.disabled = true;
    clear(result);
    try {
      await act();
    } catch (error) {
      add(result, errorText(error));
    } finally {
      lock.busy = false;
      for (const b of lock.buttons) b.disabled = false;
    }
  } }, text);
  lock.buttons.push(button);
  return button;
}

async function exportAgent(api, id, result) {
  const document_ = await api.get(`v1/agents/${encodeURIComponent(id)}/export`);
  const blob = new Blob([JSON.stringify(document_, null, 2)], { type: "application/json" });
  const link = document.createElement("a"); // not `el`: its href is a blob of this page, not a route
  link.href = URL.createObjectURL(blob);
  link.download = `${id}.colony-agent.json`;
  link.id = "export-link";
  link.textContent = `${link.download} (${blob.size} bytes)`;
  add(result, el("p", {}, "Exported: ", link));
  link.click();
  setTimeout(() => { // the document is let go of after a minute (it may be 64 MiB)
    URL.revokeObjectURL(link.href);
    link.removeAttribute("href");
  }, 60_000);
}

export async function agentView(main, api, id) {
  const path = `v1/agents/${encodeURIComponent(id)}`;
  const agent = await api.get(path);
  const result = el("div", { id: "result" });
  add(main, el("h1", {}, `Agent ${agent.agent_id}`),
    table(["role", "type", "state", "replica", "waits for", "created", "updated"],
      [[agent.role || "", agent.agent_type, agent.state, agent.replica || "", agent.waits || "", when(agent.created_at), when(agent.updated_at)]]));
  const profile = el("div", { id: "profile" });
  const runs = el("div", { id: "runs" });
  const blocks = el("div", { id: "blocks" });
  const checkpoints = el("div", { id: "checkpoints" });
  const exporting = el("div", { id: "export" });
  add(main, el("p", {}, el("a", { href: route("agents", agent.agent_id, "memory"), id: "memory-link" }, "Memory: scopes, dataflow, recall")),
    el("h2", {}, "Built with"), profile, el("h2", {}, "Runs"), runs, el("h2", {}, "Memory blocks"), blocks,
    el("h2", {}, "Checkpoints"), checkpoints, result, el("h2", {}, "Export"), exporting);
  const [held, listed, blockList, kept] = await Promise.allSettled([
    api.get(`${path}/profile`), api.get(`v1/runs?agent=${encodeURIComponent(id)}&limit=${MAX_RUNS}`),
    api.get(`${path}/blocks`), api.get(`${path}/checkpoints`)]);
  add(profile, held.status === "fulfilled" ? profileSection(held.value) : errorText(held.reason));
  if (listed.status === "fulfilled") {
    const list = listed.value.runs;
    add(runs, list.length ? table(["run", "status", "submitted", "updated", "error"],
      list.map((r) => [el("a", { href: route("runs", r.run_id) }, r.run_id), r.status, when(r.created_at), when(r.updated_at), r.error || ""]))
      : el("p", { class: "muted" }, "No runs submitted over HTTP are kept."),
    listed.value.total > list.length ? el("p", { class: "muted" }, `The newest ${list.length} of ${listed.value.total} kept.`) : null,
    listed.value.truncated ? el("p", { class: "muted" }, "More runs are kept than one listing compares: these are the newest among those compared, newer ones may be missing.") : null,
    listed.value.unreadable ? el("p", { class: "error" }, `${listed.value.unreadable} run record(s) could not be read.`) : null);
  } else add(runs, errorText(listed.reason));
  if (blockList.status === "fulfilled") {
    const list = blockList.value.slice(0, MAX_BLOCKS);
    const views = await Promise.all(list.map((b) => {
      const owner = b.owner && !b.colony ? `?owner=${encodeURIComponent(b.owner)}` : "";
      return api.get(`${path}/blocks/${encodeURIComponent(b.label)}${owner}`).catch((error) => ({ content: `(${error.message})` }));
    }));
    add(blocks, list.length ? table(["label", "owner", "access", "content"],
      list.map((b, n) => [el("a", { href: b.colony || !b.owner ? route("blocks", id, b.label) : route("blocks", id, b.label, b.owner) }, b.label), b.owner, b.access, el("pre", { class: "block" }, String(views[n].content ?? ""))]))
      : el("p", { class: "muted" }, "No blocks."));
  } else add(blocks, errorText(blockList.reason));
  if (kept.status === "fulfilled") {
    const list = Array.isArray(kept.value) ? kept.value : kept.value.checkpoints || [];
    const report = (title, reportId) => async (outcome) => add(result, el("h2", {}, title), el("pre", { id: reportId }, json(await outcome)));
    const lock = { busy: false, buttons: [] };
    const undo = confirmed("undo", "Undo last step", () => `Undo the last step of ${agent.agent_id}? Effects outside the agent are not undone.`,
      () => report("Undone", "undo-report")(api.post(`${path}/undo`)), result, lock);
    const mode = el("select", { id: "restore-mode" }, el("option", { value: "reexecute" }, "re-execute later steps"), el("option", { value: "replay" }, "replay recorded results"));
    const restore = (c, n) => confirmed(`restore-${n}`, "Restore", () => `Restore ${agent.agent_id} to step ${c.step}${c.request_id ? ` of run ${c.request_id}` : ""} (${mode.value})? Later steps are discarded; effects outside the agent are not undone.`,
      () => report(`Restored to step ${c.step}`, "restore-report")(api.post(`${path}/checkpoints/${c.step}/restore`, { mode: mode.value, run_id: c.run_id || null })), result, lock);
    add(checkpoints, list.length ? table(["step", "taken", "run", "run status", "agent state", "effects", ""],
      list.map((c, n) => [String(c.step), when(c.at), c.request_id ? el("a", { href: route("runs", c.request_id) }, c.request_id) : c.run_id,
        c.run_status || "", c.lifecycle, (c.effects || []).join(", "), restore(c, n)]))
      : el("p", { class: "muted" }, "No checkpoints."), list.length ? el("div", { class: "pair needs-admin" }, el("label", { for: "restore-mode" }, "Restore mode"), mode) : null,
    list.length > 1 ? undo : null);
  } else add(checkpoints, errorText(kept.reason));
  const exported = el("div", { id: "export-result" });
  const exportButton = el("button", { type: "button", id: "export-button", class: "needs-admin", onclick: async () => {
    if (exportButton.disabled) return;
    exportButton.disabled = true;
    clear(exported);
    try {
      await exportAgent(api, id, exported);
    } catch (error) {
      add(exported, errorText(error));
    } finally {
      exportButton.disabled = false;
    }
  } }, "Export");
  add(exporting, el("p", { class: "muted" }, "Its persisted state as one JSON document (POST /v1/agents/ID/import takes it back, here or on another colony)."),
    exportButton, exported);
  add(main, el("p", { class: "needs-run" }, el("a", { href: route("run") }, "Start a run")));
  return null;
}

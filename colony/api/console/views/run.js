// A run: its state, its events streaming live (tokens, steps, restarts), the tree of the runs
// it started. And a form that starts one.
import { add, clear, el, errorText, json, route, when } from "../dom.js";

const MAX_EVENTS = 2000; // lines kept on the page

function node(n) {
  return el("li", {}, `${n.agent} · ${n.request_id} · ${n.status}`, n.ended_at ? ` · ended ${when(n.ended_at)}` : "",
    n.children && n.children.length ? el("ul", {}, n.children.map(node)) : null);
}

function line(event) {
  const data = event.data || {};
  if (event.event_type === "token") return null; // shown in the answer as it grows
  const what = event.event_type === "step" ? `step ${data.step}: ${data.name || ""} ${data.action && data.action.success === false ? "failed" : "ok"}`
    : `${event.event_type} ${json(data).slice(0, 400)}`;
  return el("li", {}, what);
}

export async function runView(main, api, id) {
  const view = await api.get(`v1/runs/${encodeURIComponent(id)}`);
  const status = el("p", { id: "status" }, `${view.agent} · ${view.status}`);
  const answer = el("pre", { id: "answer" });
  const streamed = document.createTextNode(""); // tokens appended in place (not the whole text again each time)
  answer.append(streamed);
  const events = el("ul", { class: "events", id: "events" });
  const tree = el("div", { class: "tree", id: "tree" });
  const output = el("pre", { id: "output" });
  add(main, el("h1", {}, `Run ${id}`), status, el("h2", {}, "Answer as it streams"), answer, el("h2", {}, "Events"), events,
    el("h2", {}, "Output"), output, el("h2", {}, "Runs it started"), tree);
  const stop = new AbortController();

  async function finish() {
    const done = await api.get(`v1/runs/${encodeURIComponent(id)}`);
    status.textContent = `${done.agent} · ${done.status}${done.error ? ` · ${done.error}` : ""}`;
    output.textContent = done.output === undefined ? "" : json(done.output);
    const held = await api.get(`v1/runs/${encodeURIComponent(id)}/tree`);
    add(clear(tree), el("ul", {}, node(held.root)));
  }

  api.events(`v1/runs/${encodeURIComponent(id)}/events`, (event) => {
    if (event.event_type === "token") streamed.appendData(String((event.data || {}).text || ""));
    const item = line(event);
    if (item) {
      add(events, item);
      while (events.childElementCount > MAX_EVENTS) events.firstChild.remove();
    }
  }, stop.signal).then(finish).catch((error) => {
    if (!stop.signal.aborted) add(main, errorText(error));
  });
  return () => stop.abort();
}

export async function submitView(main, api) {
  const agent = el("input", { id: "agent", value: "echo", required: true });
  const input = el("textarea", { id: "input" }, '{"message": "hello"}');
  const problem = el("div");
  const start = el("button", { type: "submit" }, "Start");
  add(main, el("h1", {}, "Start a run"), el("form", { class: "card", id: "submit", onsubmit: async (event) => {
    event.preventDefault();
    clear(problem);
    let body;
    try {
      body = input.value.trim() ? JSON.parse(input.value) : null;
    } catch (error) {
      add(problem, errorText(`The input is not JSON: ${error.message}`));
      return;
    }
    start.disabled = true; // one run per click
    try {
      const run = await api.post("v1/runs", { agent: agent.value.trim(), input: body });
      window.location.hash = route("runs", run.run_id);
    } catch (error) {
      add(problem, errorText(error));
    } finally {
      start.disabled = false;
    }
  } }, el("label", { for: "agent" }, "Agent"), agent, el("label", { for: "input" }, "Input (JSON)"), input,
  start, problem));
  return null;
}

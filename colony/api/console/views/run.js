// A run: its state, its events streaming live (tokens, steps, restarts), each step's timing (where
// its time went: model calls, actions, waits), each step's prompt when the run asked for it, and
// the tree of the runs it started with their agents' replicas and pages. And a form that starts one.
import { add, clear, el, errorText, json, route, table, when } from "../dom.js";

const MAX_EVENTS = 2000; // lines kept on the page
const MAX_ROWS = 1000; // steps and prompts shown

function node(n) {
  const where = [n.replica ? `on ${n.replica}` : "", n.pages && n.pages.length ? `pages ${n.pages.join(", ")}` : ""].filter(Boolean).join(" · ");
  return el("li", {}, el("a", { href: route("agents", n.agent) }, n.agent), ` · ${n.request_id} · ${n.status}`,
    n.ended_at ? ` · ended ${when(n.ended_at)}` : "", where ? ` · ${where}` : "", n.error ? el("span", { class: "error" }, ` · ${n.error}`) : null,
    n.children && n.children.length ? el("ul", {}, n.children.map(node)) : null);
}

function line(event) {
  const data = event.data || {};
  if (event.event_type === "token" || event.event_type === "prompt") return null; // shown apart
  const what = event.event_type === "step" ? `step ${data.step}: ${data.name || ""} ${data.action && data.action.success === false ? "failed" : "ok"}`
    : `${event.event_type} ${json(data).slice(0, 400)}`;
  return el("li", {}, what);
}

function ms(value) {
  return typeof value === "number" && isFinite(value) ? `${value.toFixed(value < 10 ? 1 : 0)} ms` : "";
}

// One row of the timing table: the step's time and what it went to, summed by kind.
function stepRow(data) {
  const spans = Array.isArray(data.spans) ? data.spans : [];
  const sum = (kind) => spans.filter((s) => s.kind === kind).reduce((total, s) => total + (Number(s.ms) || 0), 0);
  const calls = spans.filter((s) => s.kind === "action").map((s) => `${s.name} ${ms(s.ms)}${s.ok === false ? " failed" : ""}${s.blocked ? " blocked" : ""}`);
  const models = spans.filter((s) => s.kind === "model");
  return [String(data.step), String(data.name || ""), ms(data.ms), models.length ? `${models.length} call(s), ${ms(sum("model"))}` : "",
    calls.join(", "), sum("wait") ? ms(sum("wait")) : ""];
}

export async function runView(main, api, id) {
  const view = await api.get(`v1/runs/${encodeURIComponent(id)}`);
  const status = el("p", { id: "status" }, `${view.agent} · ${view.status}`);
  const answer = el("pre", { id: "answer" });
  const streamed = document.createTextNode(""); // tokens appended in place (not the whole text again each time)
  answer.append(streamed);
  const events = el("ul", { class: "events", id: "events" });
  const steps = el("tbody");
  const timing = el("table", { id: "steps" }, el("thead", {}, el("tr", {}, ["step", "name", "took", "model", "actions", "waited"].map((h) => el("th", {}, h)))), steps);
  const prompts = el("div", { id: "prompts" }, el("p", { class: "muted" }, "None: start a run with “Show each step's prompt” to see them."));
  let promptCount = 0;
  const tree = el("div", { class: "tree", id: "tree" });
  const output = el("pre", { id: "output" });
  add(main, el("h1", {}, `Run ${id}`), status, el("h2", {}, "Answer as it streams"), answer, el("h2", {}, "Steps"), timing,
    el("h2", {}, "Prompts"), prompts, el("h2", {}, "Events"), events, el("h2", {}, "Output"), output, el("h2", {}, "Runs it started"), tree);
  const stop = new AbortController();

  async function finish() {
    const done = await api.get(`v1/runs/${encodeURIComponent(id)}`);
    status.textContent = `${done.agent} · ${done.status}${done.error ? ` · ${done.error}` : ""}`;
    output.textContent = done.output === undefined ? "" : json(done.output);
    const held = await api.get(`v1/runs/${encodeURIComponent(id)}/tree`);
    add(clear(tree), el("ul", {}, node(held.root)));
  }

  api.events(`v1/runs/${encodeURIComponent(id)}/events`, (event) => {
    const data = event.data || {};
    if (event.event_type === "token") streamed.appendData(String(data.text || ""));
    if (event.event_type === "step" && steps.childElementCount < MAX_ROWS) add(steps, el("tr", {}, stepRow(data).map((c) => el("td", {}, c))));
    if (event.event_type === "prompt" && promptCount < MAX_ROWS) {
      if (promptCount++ === 0) clear(prompts);
      const budget = typeof data.tokens === "number" ? ` · ${data.tokens} tokens${data.budget ? ` of ${data.budget}` : ""}` : "";
      const step = Number.isInteger(data.step) ? data.step + 1 : "?"; // planned before step N (step events count from 1)
      add(prompts, el("details", { class: "prompt" }, el("summary", {}, `step ${step}${budget}`), el("pre", {}, String(data.text || ""))));
    }
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
  const showPrompts = el("input", { type: "checkbox", id: "emit-prompt", class: "check" });
  const problem = el("div");
  const start = el("button", { type: "submit" }, "Start");
  add(main, el("h1", {}, "Start a run"), el("form", { class: "card needs-run", id: "submit", onsubmit: async (event) => {
    event.preventDefault();
    clear(problem);
    let body;
    try {
      body = input.value.trim() ? JSON.parse(input.value) : null;
    } catch (error) {
      add(problem, errorText(`The input is not JSON: ${error.message}`));
      return;
    }
    if (showPrompts.checked) {
      if (body === null || typeof body !== "object" || Array.isArray(body)) body = { task: typeof body === "string" ? body : JSON.stringify(body) };
      body = { ...body, emit_prompt: true }; // as `colony run --show-prompt`: the planner's prompt of each step
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
  el("label", { for: "emit-prompt", class: "inline" }, showPrompts, " Show each step's prompt (planning agents: assistant, research, your own)"),
  start, problem));
  return null;
}

// The colony as the metrics-only token sees it (read-only): the API opens nothing but /metrics to
// that token, so this view reads the Prometheus exposition there: agents by state, each replica's
// agents, pages and engine counts, runs and HTTP requests. Refreshed every few seconds; no button
// changes anything.
import { add, clear, el, table } from "../dom.js";
import { refreshEvery } from "../poll.js";

const REFRESH_MS = 5000;
const MAX_LINES = 200000; // exposition lines read at most
const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

// Samples of the exposition: [{name, labels, value}], comments and malformed lines skipped.
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n").slice(0, MAX_LINES)) {
    if (!line || line.startsWith("#")) continue;
    const match = SAMPLE.exec(line);
    if (!match) continue;
    const value = Number(match[3]);
    if (!isFinite(value)) continue;
    const labels = {};
    for (const [, name, raw] of (match[2] || "").matchAll(LABEL)) labels[name] = raw.replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    samples.push({ name: match[1], labels, value });
  }
  return samples;
}

// The sum of a family's samples by one label (the `process` label and any other summed over).
export function sumBy(samples, name, label) {
  const out = {};
  for (const s of samples) {
    if (s.name !== name) continue;
    const key = label ? s.labels[label] ?? "" : "";
    out[key] = (out[key] || 0) + s.value;
  }
  return out;
}

function count(value) {
  return value === undefined ? "" : Number.isInteger(value) ? String(value) : value.toFixed(1);
}

function render(parts, samples) {
  const agents = sumBy(samples, "colony_agents", "state");
  add(clear(parts.states), ...Object.entries(agents).sort().map(([state, n]) => el("span", {}, `${state}: ${count(n)}`)));
  const per = (name) => sumBy(samples, name, "replica");
  const hosted = per("colony_replica_agents");
  const resident = per("colony_replica_resident_pages");
  const requests = per("colony_replica_inference_requests_total");
  const completion = {};
  const faults = {};
  for (const s of samples) {
    if (s.name === "colony_replica_inference_tokens_total" && s.labels.kind === "completion") completion[s.labels.replica] = (completion[s.labels.replica] || 0) + s.value;
    if (s.name === "colony_replica_page_ops_total" && s.labels.op === "faults") faults[s.labels.replica] = (faults[s.labels.replica] || 0) + s.value;
  }
  const replicas = [...new Set([...Object.keys(hosted), ...Object.keys(resident), ...Object.keys(requests)])].sort();
  add(clear(parts.replicas), replicas.length ? table(["replica", "agents", "pages resident", "page faults", "engine requests", "tokens generated"],
    replicas.map((r) => [r, count(hosted[r]), count(resident[r]), count(faults[r]), count(requests[r]), count(completion[r])]))
    : el("p", { class: "muted" }, "No replica heartbeats."));
  // the cluster's families: one series per process, summed here (a process's series ends with it)
  const submitted = sumBy(samples, "colony_cluster_runs_submitted_total", "agent");
  const ended = sumBy(samples, "colony_cluster_runs_completed_total", "status");
  add(clear(parts.runs), table(["", ""], [
    ["submitted", Object.entries(submitted).sort().map(([k, v]) => `${k}: ${count(v)}`).join(", ")],
    ["ended", Object.entries(ended).sort().map(([k, v]) => `${k}: ${count(v)}`).join(", ")]]));
  const codes = sumBy(samples, "colony_cluster_http_requests_total", "code");
  add(clear(parts.http), el("div", { class: "chips" }, Object.entries(codes).sort().map(([code, n]) => el("span", {}, `${code}: ${count(n)}`))));
}

export async function metricsView(main, api) {
  const parts = {
    states: el("div", { class: "chips", id: "states" }),
    replicas: el("div", { id: "replicas" }),
    runs: el("div", { id: "runs" }),
    http: el("div", { id: "http" }),
  };
  add(main, el("h1", {}, "Colony (metrics)"),
    el("p", { class: "readonly", id: "read-only" }, "Read-only: this is the metrics-only token, which opens /metrics and nothing else. Log in with the API token to see agents, runs, memory and to act."),
    el("h2", {}, "Agents by state"), parts.states, el("h2", {}, "Replicas"), parts.replicas, el("h2", {}, "Runs (counted by the processes alive in the last 15 minutes)"), parts.runs,
    el("h2", {}, "HTTP requests by status"), parts.http);
  render(parts, parseMetrics(await api.text("metrics")));
  return refreshEvery(main, async () => render(parts, parseMetrics(await api.text("metrics"))), REFRESH_MS);
}

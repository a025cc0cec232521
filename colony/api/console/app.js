// The console: a login form, then views chosen by the URL's hash (#/, #/agents/ID, #/runs/ID,
// #/run, ...); with the metrics-only token, one read-only view built from /metrics. No build
// step, no library: plain modules the API serves from the package.
import { Api, forgetToken, savedMode, savedToken, saveToken } from "./api.js";
import { add, clear, el, errorText } from "./dom.js";
import { agentView } from "./views/agent.js";
import { blockView } from "./views/block.js";
import { colonyView } from "./views/colony.js";
import { memoryView } from "./views/memory.js";
import { metricsView } from "./views/metrics.js";
import { runView, submitView } from "./views/run.js";
import { newSessionView, sessionView } from "./views/session.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const logout = document.getElementById("logout");
let leaving = null; // what the current view stops when another replaces it (timers, streams)
let navigation = 0; // which showing is the current one (a slower, older one is dropped)

function stopView() {
  if (leaving) leaving();
  leaving = null;
}

function login(message) {
  navigation += 1; // a view still loading is dropped when it arrives
  stopView();
  logout.hidden = true;
  clear(nav);
  const input = el("input", { type: "password", id: "token", autocomplete: "off", required: true });
  const form = el(
    "form",
    {
      class: "card",
      id: "login",
      onsubmit: async (event) => {
        event.preventDefault();
        const api = new Api(input.value.trim());
        let mode = "api";
        try {
          await api.get("v1/token"); // what the token may do: every API token may ask
        } catch (error) {
          if (error.status !== 401) return login(String(error.message));
          try {
            await api.text("metrics"); // the metrics-only token opens this and nothing else
            mode = "metrics";
          } catch (_) {
            return login("That token is not accepted here.");
          }
        }
        saveToken(api.token, mode);
        show();
      },
    },
    el("h1", {}, "Log in"),
    el("p", { class: "muted" }, "The API token (`colony status` prints it), or the metrics-only token for a read-only view. It is kept in this tab only."),
    el("label", { for: "token" }, "Token"),
    input,
    el("button", { type: "submit" }, "Log in"),
    message ? el("p", { class: "error" }, message) : null,
  );
  add(clear(main), form);
  input.focus();
}

async function show() {
  const token = savedToken();
  if (!token) return login();
  const api = new Api(token);
  const mine = ++navigation;
  stopView();
  logout.hidden = false;
  const readOnly = savedMode() === "metrics";
  let who = null;
  if (!readOnly) {
    try {
      who = await api.get("v1/token");
    } catch (error) {
      if (mine !== navigation) return;
      if (error.status === 401) return unauthorized();
    }
    if (mine !== navigation) return;
  }
  // what the token may not do: the buttons that need it are hidden (the API refuses them anyway)
  const verbs = new Set(who ? (who.verbs.includes("admin") ? ["read", "run", "write", "admin"] : who.verbs) : []);
  for (const verb of ["run", "write", "admin"]) document.body.classList.toggle(`no-${verb}`, !readOnly && !!who && !verbs.has(verb));
  add(clear(nav), el("a", { href: "#/" }, readOnly ? "Colony (metrics, read-only)" : "Colony"),
    readOnly ? null : [el("a", { href: "#/run", class: "needs-run" }, "Start a run"), el("a", { href: "#/sessions" }, "Chat")],
    who ? el("span", { class: "muted", id: "who" }, `token ${who.token_id} · tenant ${who.tenant} · ${who.verbs.join(", ")}${who.agents ? ` · agents ${who.agents.join(", ")}` : ""}`) : null);
  const view = el("div", { class: "view" }); // this showing's own container: a stale view fills a detached one
  add(clear(main), view);
  let stop = null;
  try {
    const [, kind, ...rest] = window.location.hash.replace(/^#/, "").split("/");
    const parts = rest.map((part) => decodeURIComponent(part));
    if (parts.some((part) => part === "." || part === "..")) throw new Error("no such page");
    const [id, more, owner] = parts;
    if (readOnly) stop = await metricsView(view, api); // every page: the token opens nothing else
    else if (kind === "agents" && id && more === "memory") stop = await memoryView(view, api, id);
    else if (kind === "agents" && id) stop = await agentView(view, api, id);
    else if (kind === "runs" && id) stop = await runView(view, api, id);
    else if (kind === "blocks" && id && more) stop = await blockView(view, api, id, more, owner);
    else if (kind === "sessions" && id) stop = await sessionView(view, api, id);
    else if (kind === "sessions") stop = await newSessionView(view, api);
    else if (kind === "run") stop = await submitView(view, api);
    else stop = await colonyView(view, api);
  } catch (error) {
    if (mine !== navigation) return;
    if (error.status === 401) return unauthorized();
    add(view, errorText(error));
  }
  if (mine !== navigation) {
    if (stop) stop(); // another page was asked for meanwhile: this one's work stops now
    return;
  }
  leaving = stop;
}

function unauthorized() {
  forgetToken();
  login("The token was refused; log in again.");
}

logout.addEventListener("click", () => {
  forgetToken();
  login();
});
window.addEventListener("colony:unauthorized", unauthorized); // a view's background call got 401
window.addEventListener("hashchange", show);
show();

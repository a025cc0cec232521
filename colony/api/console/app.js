// The console: a login form, then views chosen by the URL's hash (#/, #/agents/ID, #/runs/ID,
// #/run). No build step, no library: plain modules the API serves from the package.
import { Api, forgetToken, savedToken, saveToken } from "./api.js";
import { add, clear, el, errorText } from "./dom.js";
import { agentView } from "./views/agent.js";
import { blockView } from "./views/block.js";
import { colonyView } from "./views/colony.js";
import { memoryView } from "./views/memory.js";
import { runView, submitView } from "./views/run.js";
import { newSessionView, sessionView } from "./views/session.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const logout = document.getElementById("logout");
let leaving = null; // what the current view stops when another replaces it (timers, streams)

function login(message) {
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
        try {
          await api.get("v1/agents?state=running"); // a cheap call the token must open
        } catch (error) {
          login(error.status === 401 ? "That token is not accepted here." : String(error.message));
          return;
        }
        saveToken(api.token);
        show();
      },
    },
    el("h1", {}, "Log in"),
    el("p", { class: "muted" }, "The API token (`colony status` prints it). It is kept in this tab only."),
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
  logout.hidden = false;
  add(clear(nav), el("a", { href: "#/" }, "Colony"), el("a", { href: "#/run" }, "Start a run"), el("a", { href: "#/sessions" }, "Chat"));
  if (leaving) leaving();
  leaving = null;
  const [, kind, ...rest] = window.location.hash.replace(/^#/, "").split("/");
  const id = rest.length ? decodeURIComponent(rest[0]) : null;
  clear(main);
  try {
    if (kind === "agents" && id && rest[1] === "memory") leaving = await memoryView(main, api, id);
    else if (kind === "agents" && id) leaving = await agentView(main, api, id);
    else if (kind === "runs" && id) leaving = await runView(main, api, id);
    else if (kind === "blocks" && id && rest.length === 2) leaving = await blockView(main, api, id, decodeURIComponent(rest[1]));
    else if (kind === "sessions" && id) leaving = await sessionView(main, api, id);
    else if (kind === "sessions") leaving = await newSessionView(main, api);
    else if (kind === "run") leaving = await submitView(main, api);
    else leaving = await colonyView(main, api);
  } catch (error) {
    if (error.status === 401) {
      forgetToken();
      return login("The token was refused; log in again.");
    }
    add(main, errorText(error));
  }
}

logout.addEventListener("click", () => {
  forgetToken();
  login();
});
window.addEventListener("hashchange", show);
show();

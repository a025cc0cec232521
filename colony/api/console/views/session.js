// Chat sessions: start one, talk in it (the reply's tokens stream in), see the active branch's
// messages and the whole conversation tree, go back to a message (revert) or branch from it
// (fork), each after a confirmation, and switch branches.
import { add, clear, el, errorText, route } from "../dom.js";

export async function newSessionView(main, api) {
  const problem = el("div");
  add(main, el("h1", {}, "Chat"), el("p", { class: "muted" }, "A session keeps its conversation as a tree: you can go back and branch."),
    el("button", { type: "button", id: "new-session", class: "needs-run", onclick: async (event) => {
      event.target.disabled = true; // one session per click
      try {
        const made = await api.post("v1/sessions", {});
        window.location.hash = route("sessions", made.session_id);
      } catch (error) {
        add(clear(problem), errorText(error));
      } finally {
        event.target.disabled = false;
      }
    } }, "New chat"), problem);
  return null;
}

const MAX_TREE = 2000; // messages of the tree drawn
const SNIPPET = 160; // characters of a message shown in the tree

// The whole conversation as a tree: a run of single replies stays in one list; where a message
// has more than one continuation (a fork, a revert and a new turn), each continuation is a list
// below it. Leaves say which branch ends there.
export function conversationTree(all, onBranch, branches) {
  const children = new Map();
  const ids = new Set(all.map((m) => m.id));
  const roots = [];
  for (const m of all) {
    if (m.parent_id && ids.has(m.parent_id)) {
      if (!children.has(m.parent_id)) children.set(m.parent_id, []);
      children.get(m.parent_id).push(m);
    } else roots.push(m);
  }
  const leaves = new Map();
  for (const b of branches) if (b.leaf_id) leaves.set(b.leaf_id, [...(leaves.get(b.leaf_id) || []), b.name]);
  const item = (m) => {
    const text = String(m.content);
    const names = leaves.get(m.id);
    return el("span", { class: onBranch.has(m.id) ? "tree-node on-branch" : "tree-node", "data-id": m.id },
      el("span", { class: "role" }, `${m.role}: `), text.length > SNIPPET ? `${text.slice(0, SNIPPET)}…` : text,
      names ? el("span", { class: "muted" }, ` ← ${names.join(", ")}`) : null);
  };
  const chain = (start) => { // iterative along single replies: a long chat does not nest deeply
    const list = el("ul", {});
    let m = start;
    for (;;) {
      const next = children.get(m.id) || [];
      const entry = el("li", {}, item(m));
      list.append(entry);
      if (next.length !== 1) {
        if (next.length > 1) entry.append(...next.map(chain));
        return list;
      }
      m = next[0];
    }
  };
  return all.length ? el("div", {}, roots.map(chain)) : el("p", { class: "muted" }, "No messages yet.");
}

export async function sessionView(main, api, id) {
  const base = `v1/sessions/${encodeURIComponent(id)}`;
  const branches = el("div", { id: "branches" });
  const messages = el("div", { id: "messages" });
  const reply = el("pre", { id: "reply" });
  const text = el("input", { id: "message", placeholder: "Your message", autocomplete: "off" });
  const problem = el("div");
  const send = el("button", { type: "submit" }, "Send");
  const stop = new AbortController();
  const tree = el("div", { id: "conversation-tree", class: "tree" });
  add(main, el("h1", {}, `Chat ${id}`), branches, messages, reply,
    el("form", { class: "card needs-run", id: "chat", onsubmit: async (event) => {
      event.preventDefault();
      const message = text.value.trim();
      if (!message || send.disabled) return;
      send.disabled = true; // one turn at a time
      clear(problem);
      clear(reply);
      const streamed = document.createTextNode("");
      reply.append(streamed);
      try {
        await api.events(`${base}/messages`, (e) => {
          if (e.event_type === "token") streamed.appendData(String((e.data || {}).text || ""));
          if (e.event_type === "error") add(problem, errorText(JSON.stringify(e.data)));
        }, stop.signal, { message });
        text.value = ""; // kept when the turn was refused, to send again
        await render();
      } catch (error) {
        add(problem, errorText(error));
      } finally {
        send.disabled = false;
      }
    } }, el("label", { for: "message" }, "Message"), text, send), problem, el("h2", {}, "Conversation tree"),
    el("p", { class: "muted" }, "Every message kept, branches and reverted ones included; the active branch's in bold."), tree);

  // A change of the tree (switch, revert), then the page again; a refusal is shown, and the page
  // shows the tree as it is (a failed switch does not leave the other branch selected).
  let busy = false; // one change of the tree at a time (a second click waits for the first to end)
  async function act(change) {
    if (busy) return;
    busy = true;
    for (const b of main.querySelectorAll("button.revert, button.fork, #branch")) b.disabled = true;
    clear(problem);
    try {
      await change();
    } catch (error) {
      add(problem, errorText(error));
    } finally {
      busy = false;
    }
    await render().catch((error) => add(problem, errorText(error)));
  }

  async function render() {
    const [head, listed, everything] = await Promise.all([api.get(base), api.get(`${base}/messages`), api.get(`${base}/messages?all=true&limit=${MAX_TREE}`)]);
    const onBranch = new Set((listed.messages || []).map((m) => m.id));
    add(clear(tree), conversationTree(everything.messages || [], onBranch, head.branches || []),
      everything.total > (everything.messages || []).length ? el("p", { class: "muted" }, `The first ${everything.messages.length} of ${everything.total} messages.`) : null);
    const choose = el("select", { id: "branch" }, (head.branches || []).map((b) => {
      const option = el("option", { value: b.name }, `${b.name} (${b.length} messages)`);
      option.selected = b.name === head.active;
      return option;
    }));
    choose.addEventListener("change", () => act(() => api.post(`${base}/switch`, { branch: choose.value })));
    add(clear(branches), el("p", {}, "Branch: ", choose));
    add(clear(messages), (listed.messages || []).map((m) => el("div", { class: `message ${m.role}` },
      el("span", { class: "role" }, m.role), el("p", { class: "text" }, m.content),
      el("button", { type: "button", class: "quiet revert needs-run", "data-id": m.id, onclick: async () => {
        if (busy || !window.confirm("Go back to this message? Later messages stay in the tree, off the active branch.")) return;
        clear(reply);
        await act(() => api.post(`${base}/revert`, { message_id: m.id }));
      } }, "Go back here"),
      el("button", { type: "button", class: "quiet fork needs-run", "data-id": m.id, onclick: async () => {
        if (busy || !window.confirm("Start a new branch from this message? The current branch keeps its messages.")) return;
        clear(reply);
        await act(() => api.post(`${base}/fork`, { message_id: m.id }));
      } }, "Branch from here"))));
  }

  await render();
  return () => stop.abort();
}

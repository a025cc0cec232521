// Chat sessions: start one, talk in it (the reply's tokens stream in), see the active branch's
// messages, go back to a message (revert, after a confirmation) and switch branches.
import { add, clear, el, errorText, route } from "../dom.js";

export async function newSessionView(main, api) {
  const problem = el("div");
  add(main, el("h1", {}, "Chat"), el("p", { class: "muted" }, "A session keeps its conversation as a tree: you can go back and branch."),
    el("button", { type: "button", id: "new-session", onclick: async (event) => {
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

export async function sessionView(main, api, id) {
  const base = `v1/sessions/${encodeURIComponent(id)}`;
  const branches = el("div", { id: "branches" });
  const messages = el("div", { id: "messages" });
  const reply = el("pre", { id: "reply" });
  const text = el("input", { id: "message", placeholder: "Your message", autocomplete: "off" });
  const problem = el("div");
  const send = el("button", { type: "submit" }, "Send");
  const stop = new AbortController();
  add(main, el("h1", {}, `Chat ${id}`), branches, messages, reply,
    el("form", { class: "card", id: "chat", onsubmit: async (event) => {
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
    } }, el("label", { for: "message" }, "Message"), text, send), problem);

  // A change of the tree (switch, revert), then the page again; a refusal is shown, and the page
  // shows the tree as it is (a failed switch does not leave the other branch selected).
  async function act(change) {
    clear(problem);
    try {
      await change();
    } catch (error) {
      add(problem, errorText(error));
    }
    await render().catch((error) => add(problem, errorText(error)));
  }

  async function render() {
    const [head, listed] = await Promise.all([api.get(base), api.get(`${base}/messages`)]);
    const choose = el("select", { id: "branch" }, (head.branches || []).map((b) => {
      const option = el("option", { value: b.name }, `${b.name} (${b.length} messages)`);
      option.selected = b.name === head.active;
      return option;
    }));
    choose.addEventListener("change", () => act(() => api.post(`${base}/switch`, { branch: choose.value })));
    add(clear(branches), el("p", {}, "Branch: ", choose));
    add(clear(messages), (listed.messages || []).map((m) => el("div", { class: `message ${m.role}` },
      el("span", { class: "role" }, m.role), el("p", { class: "text" }, m.content),
      el("button", { type: "button", class: "quiet revert", "data-id": m.id, onclick: async () => {
        if (!window.confirm("Go back to this message? Later messages stay in the tree, off the active branch.")) return;
        clear(reply);
        await act(() => api.post(`${base}/revert`, { message_id: m.id }));
      } }, "Go back here"))));
  }

  await render();
  return () => stop.abort();
}

// A view's refresh loop: `refresh` again every `ms` after the previous one ended (never
// overlapping); a failed one is said at the top of the view and retried; a 401 (the token was
// rotated or revoked) returns to the login form. Returns the function that stops it.
import { el } from "./dom.js";

export function refreshEvery(main, refresh, ms) {
  let timer = null;
  let stopped = false;
  const stale = el("p", { class: "error", id: "stale" });
  const tick = async () => {
    try {
      await refresh();
      stale.remove();
    } catch (error) {
      if (error.status === 401) {
        window.dispatchEvent(new Event("colony:unauthorized"));
        return;
      }
      stale.textContent = `Not refreshed: ${error.message} (retrying)`;
      main.prepend(stale);
    }
    if (!stopped) timer = setTimeout(tick, ms); // the next one after this one, never overlapping
  };
  timer = setTimeout(tick, ms);
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

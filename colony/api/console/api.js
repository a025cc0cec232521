// The console's client of the Colony HTTP API: the same routes and token as every other client.
// The token lives in this tab's sessionStorage only (never a URL, never a cookie); every request
// sends it as `Authorization: Bearer`. Paths are relative to the console (`../v1/...`), so a
// console served under a prefix (`/colony/ui/`) reaches the API under the same prefix.

const KEY = "colony.token";
const MODE = "colony.mode"; // "api" (the API token) or "metrics" (the metrics-only token: read-only)

export function savedToken() {
  return sessionStorage.getItem(KEY);
}

export function savedMode() {
  return sessionStorage.getItem(MODE) === "metrics" ? "metrics" : "api";
}

export function saveToken(token, mode = "api") {
  sessionStorage.setItem(KEY, token);
  sessionStorage.setItem(MODE, mode);
}

export function forgetToken() {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(MODE);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(`${status}: ${message}`);
    this.status = status;
  }
}

function url(path) {
  return new URL("../" + path.replace(/^\//, ""), window.location.href).toString();
}

async function failure(response) {
  let message = response.statusText;
  try {
    const body = await response.json();
    message = (body && body.error && body.error.message) || (body && body.detail && JSON.stringify(body.detail)) || message;
  } catch (_) {
    /* not JSON */
  }
  return new ApiError(response.status, String(message).slice(0, 2000));
}

export class Api {
  constructor(token) {
    this.token = token;
  }

  headers(extra = {}) {
    return { Authorization: `Bearer ${this.token}`, ...extra };
  }

  async get(path) {
    const response = await fetch(url(path), { headers: this.headers() });
    if (!response.ok) throw await failure(response);
    return response.json();
  }

  // A text body (the Prometheus exposition of /metrics), at most `limit` characters kept.
  async text(path, limit = 8_000_000) {
    const response = await fetch(url(path), { headers: this.headers() });
    if (!response.ok) throw await failure(response);
    return (await response.text()).slice(0, limit);
  }

  // A state-changing call: JSON body and an Idempotency-Key, as every Colony client sends (this
  // one does not retry by itself; the views disable their button while a call is in flight).
  async post(path, body = undefined) {
    const response = await fetch(url(path), {
      method: "POST",
      headers: this.headers({ "Content-Type": "application/json", "Idempotency-Key": crypto.randomUUID() }),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!response.ok) throw await failure(response);
    return response.json();
  }

  // Events as they come (Server-Sent Events read through fetch, which can send the token;
  // EventSource cannot): calls `onEvent(event)` for each until the stream ends or `signal`
  // aborts. With `body`, a POST (a session turn).
  async events(path, onEvent, signal, body = undefined) {
    const init = { headers: this.headers({ Accept: "text/event-stream" }), signal };
    if (body !== undefined) {
      init.method = "POST";
      init.headers = this.headers({ Accept: "text/event-stream", "Content-Type": "application/json", "Idempotency-Key": crypto.randomUUID() });
      init.body = JSON.stringify(body);
    }
    const response = await fetch(url(path), init);
    if (!response.ok) throw await failure(response);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffered += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n"); // any line ending
      let end;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        const block = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        const data = block
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).trimStart())
          .join("\n");
        if (!data) continue;
        try {
          onEvent(JSON.parse(data));
        } catch (_) {
          /* a line that is not JSON: skipped */
        }
      }
    }
  }
}

// Building the page from data. Every value that comes from the API (agents' ids, model output,
// memory, blocks) goes in as text: `el` sets textContent and never parses HTML, and attributes
// are set one by one (nothing is parsed as HTML, no inline handlers; the CSP forbids inline scripts).

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "onclick" || name === "onsubmit" || name === "oninput") {
      node.addEventListener(name.slice(2), value);
    } else if (name === "href") {
      node.setAttribute("href", safeHref(String(value)));
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Only links inside the console (its hash routes): a value from the API never becomes a
// `javascript:` or off-site URL.
export function safeHref(value) {
  return value.startsWith("#/") ? value : "#/";
}

export function route(...parts) {
  return "#/" + parts.map((p) => encodeURIComponent(String(p))).join("/");
}

// Append children, skipping absent ones (the DOM's own `append` would show `null` as text).
export function add(node, ...children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export function table(headers, rows) {
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c))))),
  );
}

export function when(seconds) {
  if (typeof seconds !== "number" || !isFinite(seconds)) return "";
  return new Date(seconds * 1000).toLocaleString();
}

export function json(value) {
  return JSON.stringify(value, null, 2);
}

export function errorText(error) {
  return el("p", { class: "error" }, String(error && error.message ? error.message : error));
}

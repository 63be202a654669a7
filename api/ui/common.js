// Shared by the server-rendered pages (api/routes/ui.py inlines it): the API key kept in
// localStorage, escaping, number formatting and the authorised JSON fetch.
const KEY_NAME = "servetune-api-key";
const $ = (id) => document.getElementById(id);
function esc(s) { return String(s).replace(/[&<>"']/g, (c) => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c])); }
function fmt(x, d = 2) { return x === null || x === undefined ? "–" : Number(x).toLocaleString(undefined, {maximumFractionDigits: d}); }
function key() { return localStorage.getItem(KEY_NAME); }

async function api(path) {
  const res = await fetch(path, {headers: {"Authorization": "Bearer " + key()}});
  const body = await res.json().catch(() => ({}));
  if (res.status === 401) { localStorage.removeItem(KEY_NAME); askKey(body.detail); throw new Error("unauthorized"); }
  if (!res.ok) { const err = new Error(body.detail || res.statusText); err.status = res.status; throw err; }
  return body;
}

function askKey(why) {
  $("key-form").classList.remove("hidden");
  if (why) $("error").textContent = why;
}

// The key form: a key entered is kept and `onKey` runs; "forget key" drops it and reloads.
function wireKeyForm(onKey) {
  $("key-entry").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = $("key-input").value.trim();
    if (v) { localStorage.setItem(KEY_NAME, v); $("error").textContent = ""; onKey(); }
  });
  $("forget-key").addEventListener("click", () => { localStorage.removeItem(KEY_NAME); location.reload(); });
}

// The sample browser of a megaeval HTML page: filters (run, task, length, depth, right or wrong) kept in the
// address's #fragment, samples of the same document side by side, one card per run.
window.addEventListener("error", (e) => { document.body.dataset.error = String(e.message); });
(function () {
  "use strict";
  const FIELDS = ["run", "task", "length", "depth", "result"];
  const PAGE = 200; // document groups drawn at a time
  // rows of the fields' values, the run as its index: a page of 15,000 samples stays a few MB
  const raw = JSON.parse(document.getElementById("samples-data").textContent);
  const data = {
    runs: raw.runs,
    omitted: raw.omitted || 0,
    samples: raw.samples.map((row) => {
      const s = {};
      raw.fields.forEach((f, i) => { s[f] = row[i]; });
      s.run = raw.runs[s.run];
      return s;
    }),
  };
  const root = document.getElementById("samples");
  if (!root) { document.body.dataset.ready = "1"; return; }
  const count = document.getElementById("sample-count");
  const list = document.getElementById("sample-list");
  const more = document.getElementById("sample-more");
  const selects = {};
  let shown = PAGE;

  function text(tag, cls, value) {
    const el = document.createElement(tag);
    if (cls) el.className = cls;
    el.textContent = value;
    return el;
  }

  function verdict(s) {
    if (s.correct === true) return "right";
    if (s.correct === false) return "wrong";
    return "unscored";
  }

  function options(field) {
    const values = new Set();
    for (const s of data.samples) {
      const v = field === "result" ? verdict(s) : s[field];
      if (v !== null && v !== undefined) values.add(String(v));
    }
    const sorted = Array.from(values);
    sorted.sort((a, b) => (isNaN(a) || isNaN(b) ? a.localeCompare(b) : Number(a) - Number(b)));
    return sorted;
  }

  function readHash() {
    const state = {};
    for (const part of window.location.hash.replace(/^#/, "").split("&")) {
      const [key, value] = part.split("=");
      if (FIELDS.includes(key)) state[key] = decodeURIComponent(value || "");
    }
    return state;
  }

  function writeHash() {
    const parts = FIELDS.filter((f) => selects[f] && selects[f].value).map(
      (f) => f + "=" + encodeURIComponent(selects[f].value));
    history.replaceState(null, "", parts.length ? "#" + parts.join("&") : window.location.pathname);
  }

  function matches(s) {
    for (const f of FIELDS) {
      const want = selects[f] ? selects[f].value : "";
      if (!want) continue;
      const have = f === "result" ? verdict(s) : String(s[f]);
      if (have !== want) return false;
    }
    return true;
  }

  function card(s) {
    const el = document.createElement("div");
    el.className = "card " + verdict(s);
    el.dataset.run = s.run;
    el.dataset.result = verdict(s);
    el.appendChild(text("div", "run", s.run));
    const score = s.score === null || s.score === undefined ? "" : " (score " + Number(s.score).toPrecision(4) + ")";
    el.appendChild(text("div", "verdict", verdict(s) + score));
    const tail = s.prompt_tail === s.prompt_head ? "" : s.prompt_tail; // a short prompt is all head
    const parts = [["prompt head", s.prompt_head], ["prompt tail", tail], ["prediction", s.prediction],
      ["references", s.references], ["detail", s.detail]];
    for (const [name, value] of parts) {
      if (!value) continue;
      el.appendChild(text("div", "field", name));
      el.appendChild(text("pre", "", value));
    }
    return el;
  }

  function draw() {
    writeHash();
    const groups = new Map();
    let visible = 0;
    for (const s of data.samples) {
      if (!matches(s)) continue;
      visible += 1;
      const key = JSON.stringify([s.task, s.id]);
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(s);
    }
    list.replaceChildren();
    let drawn = 0;
    for (const samples of groups.values()) {
      if (drawn >= shown) break;
      drawn += 1;
      const group = document.createElement("div");
      group.className = "group";
      const first = samples[0];
      const task = first.task, id = first.id;
      const where = [first.length != null ? "length " + first.length : "", first.depth != null ? "depth " + first.depth + "%" : ""]
        .filter(Boolean).join(", ");
      group.appendChild(text("div", "group-title", task + " · " + id + (where ? " · " + where : "")));
      const cards = document.createElement("div");
      cards.className = "cards";
      samples.sort((a, b) => data.runs.indexOf(a.run) - data.runs.indexOf(b.run));
      for (const s of samples) cards.appendChild(card(s));
      group.appendChild(cards);
      list.appendChild(group);
    }
    count.textContent = visible + " samples in " + groups.size + " documents" +
      (groups.size > drawn ? " (first " + drawn + " shown)" : "") +
      (data.omitted ? "; " + data.omitted + " more samples left out of this page to keep it small (the same " +
        "documents of each task in every run are kept)" : "");
    count.dataset.samples = String(visible);
    more.hidden = groups.size <= drawn;
  }

  const filters = document.getElementById("filters");
  const initial = readHash();
  for (const field of FIELDS) {
    const values = options(field);
    if (values.length === 0) continue;
    const label = text("label", "", field);
    const select = document.createElement("select");
    select.name = field;
    select.appendChild(new Option("all", ""));
    for (const v of values) select.appendChild(new Option(v, v));
    if (initial[field] && values.includes(initial[field])) select.value = initial[field];
    select.addEventListener("change", () => { shown = PAGE; draw(); });
    label.appendChild(select);
    filters.appendChild(label);
    selects[field] = select;
  }
  more.addEventListener("click", () => { shown += PAGE; draw(); });
  window.addEventListener("hashchange", () => {
    const state = readHash();
    for (const f of Object.keys(selects)) selects[f].value = state[f] || "";
    draw();
  });
  draw();
  document.body.dataset.ready = "1";
})();

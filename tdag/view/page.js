// tdag's program page: frames for the controllers and each TDAG, module scopes as groups
// that open on a click, nodes coloured by their share of the flops or bytes. No libraries,
// no network: the program is the JSON in <script id="program"> (written by tdag/view/page.py).
"use strict";
const errors = [];
window.addEventListener("error", (e) => errors.push(String(e.message)));

const DATA = JSON.parse(document.getElementById("program").textContent);
const STR = DATA.strings;
const SVG_NS = "http://www.w3.org/2000/svg";
const BOX_W = 150, BOX_H = 34, GAP_X = 16, GAP_Y = 28, PAD = 10, HEAD = 22, ROW_MAX = 12;
const OPEN_AT_START = 60;  // groups open at start while this many boxes show, no more
const view = document.getElementById("view"), canvas = document.getElementById("canvas");
const state = { colour: "flops", zoom: 1, selected: null, matches: [], match: -1 };

// -- the model: per TDAG, the scope tree, and the edges between the boxes of each group ----

function prepare(g, gi) {
  const n = g.nodes.name.length, count = g.scopes.parent.length, parent = g.scopes.parent;
  Object.assign(g, { index: gi, n, depth: new Int32Array(count), kids: [], own: [],
                     expanded: new Uint8Array(count), edges: [], users: [], at: new Map() });
  for (let s = 0; s < count; s++) {
    g.kids.push([]); g.own.push([]); g.edges.push(new Map());
    if (parent[s] >= 0) { g.depth[s] = g.depth[parent[s]] + 1; g.kids[parent[s]].push(s); }
  }
  g.expanded[0] = 1;
  g.sum = { flops: new Float64Array(count), bytes: new Float64Array(count),
            memory: new Float64Array(count) };
  g.count = new Int32Array(count);
  g.first = new Int32Array(count).fill(n);
  for (let i = 0; i < n; i++) {
    g.own[g.nodes.scope[i]].push(i);
    g.users.push([]);
    for (let s = g.nodes.scope[i]; s >= 0; s = parent[s]) {  // a group holds its subtree
      g.sum.flops[s] += g.nodes.flops[i];
      g.sum.bytes[s] += nodeBytes(g, i);
      g.sum.memory[s] += liveBytes(g, i);
      g.count[s] += 1;
      g.first[s] = Math.min(g.first[s], i);
    }
  }
  for (let v = 0; v < n; v++) {
    for (const u of g.nodes.in[v]) { g.users[u].push(v); addEdge(g, u, v); }
  }
}

function nodeBytes(g, i) { return g.nodes.bytes_read[i] + g.nodes.bytes_written[i]; }
// the bytes of a tensor live at the memory peak (0 where the page has no memory report)
function liveBytes(g, i) { return g.nodes.live ? g.nodes.live[i] : 0; }
function isPeak(g, i) { return !!DATA.memory && DATA.memory.at && DATA.memory.at[0] === g.index &&
                                DATA.memory.at[1] === i; }

function lowestCommon(g, a, b) {
  const parent = g.scopes.parent;
  while (g.depth[a] > g.depth[b]) a = parent[a];
  while (g.depth[b] > g.depth[a]) b = parent[b];
  while (a !== b) { a = parent[a]; b = parent[b]; }
  return a;
}

// the box in `group` that holds node i: the node itself, or the child scope it lies in
// (a box is a number: a node's index, or n + a scope's index)
function boxUnder(g, i, group) {
  let s = g.nodes.scope[i];
  if (s === group) return i;
  while (g.scopes.parent[s] !== group) s = g.scopes.parent[s];
  return g.n + s;
}

// an edge u -> v is drawn once, between the two boxes of the deepest group holding both
function addEdge(g, u, v) {
  const group = lowestCommon(g, g.nodes.scope[u], g.nodes.scope[v]);
  const a = boxUnder(g, u, group), b = boxUnder(g, v, group);
  if (a !== b) g.edges[group].set(a + "," + b, [a, b]);
}

function scopePath(g, s) {
  const parts = [];
  for (; s > 0; s = g.scopes.parent[s]) parts.unshift(g.scopes.label[s]);
  return parts.join(".");
}

function boxesOf(g, s) { return g.kids[s].map((c) => g.n + c).concat(g.own[s]); }

// -- layout: boxes in layers (longest path from the group's sources), a group's own layout
// inside its box when it is open -----------------------------------------------------------

function layout(g, s) {
  const boxes = boxesOf(g, s);
  const order = (k) => (k >= g.n ? g.first[k - g.n] : k);  // definition order
  boxes.sort((a, b) => order(a) - order(b));
  const preds = new Map(boxes.map((k) => [k, []]));
  const edges = [...g.edges[s].values()];
  for (const [a, b] of edges) preds.get(b).push(a);
  const rank = layers(boxes, preds);
  const byRank = [];
  for (const k of boxes) (byRank[rank.get(k)] ||= []).push(k);
  const pos = new Map();
  let y = 0, width = 0;
  for (const layer of byRank) {
    if (!layer) continue;
    const centre = (k) => {  // under its predecessors, as far as they are placed
      const placed = preds.get(k).filter((p) => pos.has(p));
      return placed.length ? placed.reduce((t, p) => t + pos.get(p).cx, 0) / placed.length
                           : Infinity;
    };
    layer.sort((a, b) => (centre(a) - centre(b)) || (order(a) - order(b)));
    for (let i = 0; i < layer.length; i += ROW_MAX) {  // a wide layer wraps
      let x = 0, height = 0;
      for (const k of layer.slice(i, i + ROW_MAX)) {
        const size = boxSize(g, k);
        pos.set(k, { x, y, w: size.w, h: size.h, cx: x + size.w / 2 });
        x += size.w + GAP_X;
        height = Math.max(height, size.h);
      }
      width = Math.max(width, x - GAP_X);
      y += height + GAP_Y;
    }
  }
  g.layouts[s] = { w: width, h: Math.max(0, y - GAP_Y), pos, edges };
  return g.layouts[s];
}

// each box's layer: one below its lowest predecessor (longest path from the sources);
// where boxes wait on each other in a cycle (two groups feeding each other), the one defined
// first goes ahead and the edge back to it is left out of the layering, not of the drawing
function layers(boxes, preds) {
  const waiting = new Map(boxes.map((k) => [k, preds.get(k).length]));
  const succs = new Map(boxes.map((k) => [k, []]));
  for (const k of boxes) for (const p of preds.get(k)) succs.get(p).push(k);
  const rank = new Map(), ready = boxes.filter((k) => waiting.get(k) === 0);
  while (rank.size < boxes.length) {
    if (!ready.length) ready.push(boxes.find((k) => !rank.has(k)));  // boxes are in order
    const k = ready.shift();
    if (rank.has(k)) continue;
    let r = 0;
    for (const p of preds.get(k)) if (rank.has(p)) r = Math.max(r, rank.get(p) + 1);
    rank.set(k, r);
    for (const s of succs.get(k)) {
      waiting.set(s, waiting.get(s) - 1);
      if (waiting.get(s) === 0 && !rank.has(s)) ready.push(s);
    }
  }
  return rank;
}

function boxSize(g, k) {
  if (k < g.n || !g.expanded[k - g.n]) return { w: BOX_W, h: BOX_H };
  const inner = layout(g, k - g.n);
  const label = 8 * g.scopes.label[k - g.n].length + 40;
  return { w: Math.max(inner.w, label) + 2 * PAD, h: inner.h + HEAD + 2 * PAD };
}

// -- drawing -------------------------------------------------------------------------------

function el(tag, attrs, parent, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}

function share(value) {
  const total = DATA.total[state.colour];
  return total > 0 ? value / total : 0;
}

// pale for a ten-thousandth of the total or less, deep red for all of it (log scale)
function colour(part) {
  if (!(part > 0)) return ["#ececec", "#222"];
  const t = Math.min(1, Math.max(0, (Math.log10(part) + 4) / 4));
  const mix = (a, b) => Math.round(a + (b - a) * t);
  return [`rgb(${mix(255, 179)},${mix(247, 0)},${mix(214, 0)})`, t > 0.55 ? "#fff" : "#222"];
}

function short(text, room) { return text.length > room ? text.slice(0, room - 1) + "…" : text; }

function drawBox(g, k, x, y, p, parent, edgeLayer) {
  const isNode = k < g.n, s = k - g.n;
  const selected = state.selected && state.selected.g === g.index &&
    (isNode ? state.selected.node === k : state.selected.scope === s);
  if (!isNode && g.expanded[s]) {
    const box = el("g", { class: "item group open" + (selected ? " selected" : ""),
                          "data-g": g.index, "data-scope": s }, parent);
    el("rect", { x, y, width: p.w, height: p.h, rx: 6 }, box);
    const head = el("g", { class: "head", "data-g": g.index, "data-scope": s }, box);
    el("rect", { x, y, width: p.w, height: HEAD, fill: "transparent" }, head);
    el("text", { x: x + 6, y: y + 15, class: "label" }, head, "▾ " + g.scopes.label[s]);
    drawGroup(g, s, x + PAD, y + HEAD + PAD, box, edgeLayer);
    return;
  }
  const value = !isNode ? g.sum[state.colour][s] : state.colour === "flops" ? g.nodes.flops[k]
    : state.colour === "bytes" ? nodeBytes(g, k) : liveBytes(g, k);
  const [fill, ink] = colour(share(value));
  const peak = isNode && state.colour === "memory" && isPeak(g, k);
  const cls = (isNode ? "item node" : "item group collapsed") + (peak ? " peak" : "");
  const box = el("g", { class: cls + (selected ? " selected" : ""), "data-g": g.index,
                        [isNode ? "data-node" : "data-scope"]: isNode ? k : s }, parent);
  el("rect", { x, y, width: p.w, height: p.h, rx: isNode ? 3 : 6, fill }, box);
  const top = isNode ? STR[g.nodes.op[k]] : "▸ " + g.scopes.label[s];
  const bottom = isNode ? "%" + g.nodes.name[k] + " " + STR[g.nodes.type[k]]
                        : g.count[s] + " tensors";
  el("text", { x: x + 6, y: y + 14, class: "label", fill: ink }, box, short(top, 22));
  el("text", { x: x + 6, y: y + 28, fill: ink }, box, short(bottom, 24));
  if (isNode) g.at.set(k, { x, y });
}

function drawGroup(g, s, ox, oy, parent, edgeLayer) {
  const lay = g.layouts[s];
  for (const [a, b] of lay.edges) {
    const p = lay.pos.get(a), q = lay.pos.get(b);
    const x1 = ox + p.cx, y1 = oy + p.y + p.h, x2 = ox + q.cx, y2 = oy + q.y;
    const bend = Math.max(12, Math.abs(y2 - y1) / 2);
    el("path", { class: "edge", d: `M${x1},${y1} C${x1},${y1 + bend} ${x2},${y2 - bend} ${x2},${y2}` },
       edgeLayer);
  }
  for (const [k, p] of lay.pos) drawBox(g, k, ox + p.x, oy + p.y, p, parent, edgeLayer);
}

// the controllers, one line each as the printer writes them, nested blocks indented;
// returns where the list ends and how wide it is
function drawSteps(steps, x, y, parent) {
  let width = 0;
  for (const step of steps) {
    const w = Math.max(260, 7 * step.head.length + 16);
    const box = el("g", { class: "step", "data-step-graph": step.graph ?? "" }, parent);
    el("rect", { x, y, width: w, height: 24, rx: 4 }, box);
    el("text", { x: x + 8, y: y + 16 }, box, step.head);
    width = Math.max(width, x + w);
    y += 30;
    for (const [name, inner] of step.blocks || []) {
      el("text", { x: x + 16, y: y + 12, class: "label" }, parent, name);
      const end = drawSteps(inner, x + 32, y + 18, parent);
      y = end.y;
      width = Math.max(width, end.width);
    }
  }
  return { y, width };
}

function render() {
  canvas.replaceChildren();
  const root = el("g", { transform: `scale(${state.zoom})` }, canvas);
  const frames = el("g", {}, root);  // first, so that frames lie under what they hold
  const frame = (title, y, width, height) => {
    el("rect", { class: "frame", x: 10, y, width, height, rx: 8 }, frames);
    el("text", { x: 20, y: y + 18, class: "label" }, frames, title);
  };
  const steps = drawSteps(DATA.program, 24, 40, el("g", {}, root));
  frame("program: controllers (a click on a call shows its tdag)", 10,
        Math.max(400, steps.width + 10), steps.y - 6);
  let y = steps.y + 24, width = steps.width + 30;
  for (const g of DATA.graphs) {
    g.layouts = {};
    g.at = new Map();
    const lay = layout(g, 0);
    const w = Math.max(lay.w + 40, 400), h = lay.h + 60;
    g.frameY = y;
    frame(`tdag ${g.name}: ${g.n} tensors, ${fmt(g.sum.flops[0])} flops, ` +
          `${fmt(g.sum.bytes[0])} bytes`, y, w, h);
    const edgeLayer = el("g", {}, root), boxLayer = el("g", {}, root);
    drawGroup(g, 0, 30, y + 40, boxLayer, edgeLayer);
    y += h + 24;
    width = Math.max(width, w + 20);
  }
  canvas.setAttribute("width", width * state.zoom);
  canvas.setAttribute("height", y * state.zoom);
}

function fmt(v) {
  if (v >= 1e12) return (v / 1e12).toFixed(2) + " T";
  if (v >= 1e9) return (v / 1e9).toFixed(2) + " G";
  if (v >= 1e6) return (v / 1e6).toFixed(2) + " M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + " k";
  return String(v);
}

// -- the side panel ------------------------------------------------------------------------

function panel(title, rows) {
  const p = document.getElementById("panel");
  p.replaceChildren();
  const h = document.createElement("h3");
  h.textContent = title;
  const dl = document.createElement("dl");
  for (const [term, value] of rows) {
    const dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = term;
    if (value instanceof Node) dd.appendChild(value); else dd.textContent = value;
    dl.append(dt, dd);
  }
  p.append(h, dl);
}

function links(g, nodes) {
  const span = document.createElement("span");
  for (const i of nodes.slice(0, 40)) {
    const a = document.createElement("a");
    a.textContent = "%" + g.nodes.name[i] + " ";
    a.onclick = () => reveal(g, i);
    span.appendChild(a);
  }
  if (nodes.length > 40) span.append(`… ${nodes.length - 40} more`);
  return span;
}

function percent(v) { return (100 * share(v)).toFixed(2) + " % of the program"; }
function memoryPercent(v) { return (100 * v / DATA.memory.peak).toFixed(2) + " % of the peak"; }

function showNode(g, i) {
  const type = STR[g.nodes.type[i]];
  const flops = g.nodes.flops[i], bytes = nodeBytes(g, i);
  panel("%" + g.nodes.name[i], [
    ["op", STR[g.nodes.op[i]]], ["type", type],
    ["shape", type.slice(type.indexOf("["))], ["dtype", type.slice(0, type.indexOf("["))],
    ["scope", scopePath(g, g.nodes.scope[i]) || "(top)"], ["tdag", g.name],
    ["provenance", STR[g.nodes.prov[i]] || `(${STR[g.nodes.op[i]]}: given, not computed)`],
    ["flops", `${flops.toLocaleString()} (${percent(flops)})`],
    ["matmul flops", g.nodes.matmul_flops[i].toLocaleString()],
    ["bytes read + written", `${bytes.toLocaleString()} (${percent(bytes)})`],
    ["bytes fused", g.nodes.fused_bytes[i].toLocaleString()],
    ...(DATA.memory ? [["live at the memory peak", liveBytes(g, i) ?
      `${liveBytes(g, i).toLocaleString()} bytes (${memoryPercent(liveBytes(g, i))})` : "no"]]
      : []),
    ...(isPeak(g, i) ? [["memory peak", `${DATA.memory.peak.toLocaleString()} bytes, ` +
                                        "reached right after this node"]] : []),
    ["inputs", links(g, g.nodes.in[i])], ["users", links(g, g.users[i])]]);
}

function showScope(g, s) {
  panel(scopePath(g, s) || "(top)", [
    ["tdag", g.name], ["tensors", String(g.count[s])],
    ["flops", `${g.sum.flops[s].toLocaleString()} (${percent(g.sum.flops[s])})`],
    ["bytes read + written", `${g.sum.bytes[s].toLocaleString()} (${percent(g.sum.bytes[s])})`],
    ["", g.expanded[s] ? "open: click its header to close" : "closed: click to open"]]);
}

// -- interaction ---------------------------------------------------------------------------

canvas.addEventListener("click", (event) => {
  const target = event.target.closest("[data-g], .step");
  if (!target) return;
  if (target.classList.contains("step")) {
    const gi = target.getAttribute("data-step-graph");
    if (gi !== "") view.scrollTo(0, DATA.graphs[+gi].frameY * state.zoom);
    return;
  }
  const g = DATA.graphs[+target.dataset.g];
  if (target.dataset.node !== undefined) {
    state.selected = { g: g.index, node: +target.dataset.node };
    showNode(g, +target.dataset.node);
  } else {
    const s = +target.dataset.scope;
    if (target.classList.contains("collapsed")) g.expanded[s] = 1;
    else if (target.classList.contains("head") && s !== 0) g.expanded[s] = 0;
    state.selected = { g: g.index, scope: s };
    showScope(g, s);
  }
  render();
});

// open every group holding node i, select it and scroll to it
function reveal(g, i) {
  for (let s = g.nodes.scope[i]; s >= 0; s = g.scopes.parent[s]) g.expanded[s] = 1;
  state.selected = { g: g.index, node: i };
  showNode(g, i);
  render();
  const at = g.at.get(i);
  if (at) view.scrollTo(at.x * state.zoom - view.clientWidth / 2,
                        at.y * state.zoom - view.clientHeight / 2);
}

function search(query) {
  const q = query.trim().toLowerCase().replace(/^%/, "");
  const found = document.getElementById("found");
  if (!q) { found.textContent = ""; return; }
  if (q !== state.query) {
    state.query = q;
    state.matches = [];
    state.match = -1;
    for (const g of DATA.graphs) {
      const exact = [], partial = [];
      for (let i = 0; i < g.n; i++) {
        if (g.nodes.name[i].toLowerCase() === q) { exact.push([g, i]); continue; }
        const text = [g.nodes.name[i], STR[g.nodes.op[i]], scopePath(g, g.nodes.scope[i]),
                      STR[g.nodes.prov[i]]].join(" ").toLowerCase();
        if (text.includes(q)) partial.push([g, i]);
      }
      state.matches.push(...exact, ...partial);
    }
  }
  if (!state.matches.length) { found.textContent = "no match"; return; }
  state.match = (state.match + 1) % state.matches.length;  // Enter again: the next match
  found.textContent = `${state.match + 1} of ${state.matches.length}`;
  reveal(...state.matches[state.match]);
}

document.getElementById("search").addEventListener("keydown", (e) => {
  if (e.key === "Enter") search(e.target.value);
});
document.getElementById("colour").addEventListener("change", (e) => {
  state.colour = e.target.value;
  const at = DATA.memory && DATA.memory.at;
  if (state.colour === "memory" && at) reveal(DATA.graphs[at[0]], at[1]);  // the peak shows
  else render();
});
document.getElementById("zoomin").onclick = () => { state.zoom *= 1.25; render(); };
document.getElementById("zoomout").onclick = () => { state.zoom /= 1.25; render(); };

// at start, groups open costliest first (the layers before the embedding's details) while
// the page stays small enough to read at once
function openAtStart(g) {
  let shown = boxesOf(g, 0).length;
  const queue = [...g.kids[0]];
  while (queue.length) {
    queue.sort((a, b) => g.sum.flops[a] - g.sum.flops[b] || g.count[a] - g.count[b]);
    const s = queue.pop();
    const more = boxesOf(g, s).length - 1;
    if (shown + more > OPEN_AT_START) continue;
    g.expanded[s] = 1;
    shown += more;
    queue.push(...g.kids[s]);
  }
}

// #selftest (the browser test): open a closed group by a click, search a deep node, and
// write what happened into <pre id="selftest"> for `chromium --dump-dom` to read
function selftest() {
  const shown = () => canvas.querySelectorAll(".item").length;
  const result = { tensors: DATA.graphs.reduce((t, g) => t + g.n, 0), shownAtStart: shown(),
                   frames: canvas.querySelectorAll(".frame").length,
                   controllers: canvas.querySelectorAll(".step").length };
  const closed = canvas.querySelector(".group.collapsed");
  if (closed) {
    const gi = closed.dataset.g, s = closed.dataset.scope;
    closed.dispatchEvent(new MouseEvent("click", { bubbles: true }));
    result.expand = { scope: scopePath(DATA.graphs[+gi], +s), shownAfter: shown(),
      open: !!canvas.querySelector(`.group.open[data-g="${gi}"][data-scope="${s}"]`) };
  }
  const fills = () => [...canvas.querySelectorAll(".item > rect[fill]")]
    .map((r) => r.getAttribute("fill")).join();
  const byFlops = fills(), select = document.getElementById("colour");
  select.value = "bytes";
  select.dispatchEvent(new Event("change"));
  result.colour = { changed: fills() !== byFlops };
  if (DATA.memory) {  // the memory colouring opens the peak's group and outlines the node
    select.value = "memory";
    select.dispatchEvent(new Event("change"));
    const peak = canvas.querySelector(".node.peak");
    result.memory = { peak: !!peak, node: peak ? peak.dataset.node : null,
                      changed: fills() !== byFlops };
  }
  select.value = "flops";
  select.dispatchEvent(new Event("change"));
  const g = DATA.graphs[0];
  let deepest = 0;
  for (let i = 0; i < g.n; i++) {
    if (g.depth[g.nodes.scope[i]] > g.depth[g.nodes.scope[deepest]]) deepest = i;
  }
  const input = document.getElementById("search");
  input.value = "%" + g.nodes.name[deepest];
  input.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter" }));
  const hit = canvas.querySelector(`.node.selected[data-g="0"][data-node="${deepest}"]`);
  result.search = { name: g.nodes.name[deepest], scope: scopePath(g, g.nodes.scope[deepest]),
                    found: !!hit,
                    panel: document.getElementById("panel").textContent.includes(
                      "%" + g.nodes.name[deepest]) };
  result.errors = errors;
  const out = document.getElementById("selftest");
  out.textContent = JSON.stringify(result);
  out.hidden = false;
}

try {
  document.getElementById("title").textContent = DATA.title;
  const sizes = Object.entries(DATA.sizes).map(([k, v]) => `${k}=${v}`).join(", ");
  const peak = DATA.memory ? `memory peak ${fmt(DATA.memory.peak)} bytes after ` +
                             `${DATA.memory.label}` : "";
  document.getElementById("sizes").textContent =
    [sizes ? `sizes: ${sizes}` : "", peak].filter(Boolean).join("; ");
  DATA.graphs.forEach(prepare);
  DATA.graphs.forEach(openAtStart);
  render();
} catch (e) {
  errors.push(String(e && e.stack || e));
}
if (location.hash === "#selftest") selftest();
else if (location.hash.startsWith("#find=")) {  // a link to a node: graph.html#find=%42
  const query = decodeURIComponent(location.hash.slice("#find=".length));
  document.getElementById("search").value = query;
  search(query);
}

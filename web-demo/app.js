// The page: drawing pad, classes and their examples, the loss curve, the budget slider and the plan.
// All training happens in worker.js; this file only draws and passes messages.
import { toInput, paintInput } from "./preprocess.js";

const COLORS = ["#5b4bff", "#f0507a", "#12a594", "#f59e0b", "#3b82f6", "#a855f7"];
const NAMES = ["A", "B", "C", "D", "E", "F"];
const MAX_CLASSES = COLORS.length;
/** Training steps per press of "Train". */
const STEPS = 200;

const $ = (id) => document.getElementById(id);
const kib = (b) => (b >= 1 << 20 ? `${(b / (1 << 20)).toFixed(2)} MiB` : `${(b / 1024).toFixed(1)} KiB`);

/** What the page knows; `window.demo` exposes it to the tests. */
const state = {
  classes: [], // {name, color, samples: Float32Array[]}
  selected: -1,
  trainedClasses: [], // names of the classes of the trained head
  losses: [],
  ready: false,
  training: false,
  drawSeq: 0,
  predSeq: 0,
  budget: Infinity,
  plans: [], // every plan the worker reported: {budgetBytes, allocatedBytes, arenaBytes, ...}
  lastTrain: null,
  errors: [],
  memoryBytes: 0,
};
window.demo = state;

// ?backend=cpu | webgpu | auto (default auto: WebGPU where the browser has it).
const backendParam = new URLSearchParams(location.search).get("backend") ?? "auto";
const worker = new Worker(new URL(`./worker.js?backend=${encodeURIComponent(backendParam)}`, import.meta.url), {
  type: "module",
});

// ---------------------------------------------------------------- drawing pad
const pad = $("pad");
const dpr = Math.max(1, window.devicePixelRatio || 1);
pad.width = 280 * dpr;
pad.height = 280 * dpr;
const pctx = pad.getContext("2d", { willReadFrequently: true });
pctx.scale(dpr, dpr);
pctx.lineCap = "round";
pctx.lineJoin = "round";
pctx.lineWidth = 18;
pctx.strokeStyle = "#1c1e2b";
let drawing = false;
let last = null;
let inked = false;

function pos(e) {
  const r = pad.getBoundingClientRect();
  return { x: e.clientX - r.left, y: e.clientY - r.top };
}
pad.addEventListener("pointerdown", (e) => {
  drawing = true;
  last = pos(e);
  pad.setPointerCapture?.(e.pointerId);
  pctx.beginPath();
  pctx.arc(last.x, last.y, pctx.lineWidth / 2, 0, Math.PI * 2);
  pctx.fillStyle = pctx.strokeStyle;
  pctx.fill();
  inked = true;
  $("pad-hint").classList.add("hidden");
});
pad.addEventListener("pointermove", (e) => {
  if (!drawing) return;
  const p = pos(e);
  pctx.beginPath();
  pctx.moveTo(last.x, last.y);
  pctx.lineTo(p.x, p.y);
  pctx.stroke();
  last = p;
});
const endStroke = () => {
  if (!drawing) return;
  drawing = false;
  state.drawSeq++;
  updateButtons();
  predict();
};
pad.addEventListener("pointerup", endStroke);
pad.addEventListener("pointerleave", endStroke);

function clearPad() {
  pctx.clearRect(0, 0, pad.width, pad.height);
  inked = false;
  state.drawSeq++;
  $("pad-hint").classList.remove("hidden");
  showPrediction(null);
  updateButtons();
}
$("clear").onclick = clearPad;

// ---------------------------------------------------------------- classes
function renderClasses() {
  const list = $("class-list");
  list.textContent = "";
  if (!state.classes.length) {
    const d = document.createElement("div");
    d.className = "empty muted small";
    d.textContent = "No symbols yet — press “New class”.";
    list.append(d);
  }
  state.classes.forEach((c, i) => {
    const card = document.createElement("div");
    card.className = "class-card" + (i === state.selected ? " selected" : "");
    card.style.setProperty("--c", c.color);
    card.dataset.index = i;
    card.onclick = () => {
      state.selected = i;
      renderClasses();
    };
    const dot = document.createElement("span");
    dot.className = "dot";
    const label = document.createElement("div");
    label.innerHTML = `<div class="class-name">Symbol ${c.name}</div><div class="class-count">${c.samples.length} example${c.samples.length === 1 ? "" : "s"}</div>`;
    const thumbs = document.createElement("div");
    thumbs.className = "thumbs";
    for (const s of c.samples) {
      const t = document.createElement("canvas");
      t.width = t.height = 32;
      paintInput(t, s, c.color);
      thumbs.append(t);
    }
    card.append(dot, label, thumbs);
    list.append(card);
  });
  updateButtons();
}

$("new-class").onclick = () => {
  if (state.classes.length >= MAX_CLASSES) return;
  const i = state.classes.length;
  state.classes.push({ name: NAMES[i], color: COLORS[i], samples: [] });
  state.selected = i;
  renderClasses();
};

$("add").onclick = () => {
  const c = state.classes[state.selected];
  const x = inked && toInput(pad);
  if (!c || !x) return;
  c.samples.push(x.input);
  clearPad();
  renderClasses();
};

function updateButtons() {
  const c = state.classes[state.selected];
  $("add").disabled = !c || !inked;
  $("add").textContent = c ? `Add to Symbol ${c.name}` : "Add example";
  $("new-class").disabled = state.classes.length >= MAX_CLASSES;
  const withSamples = state.classes.filter((k) => k.samples.length > 0).length;
  $("train").disabled =
    !state.ready || state.training || state.classes.length < 2 || withSamples < state.classes.length;
}

function status(text, kind = "", st = "") {
  const s = $("status");
  s.textContent = text;
  s.className = "status " + (kind || "muted");
  if (st) s.dataset.state = st;
}

// ---------------------------------------------------------------- training
$("train").onclick = () => {
  const samples = [];
  state.classes.forEach((c, label) => c.samples.forEach((input) => samples.push({ input, label })));
  state.training = true;
  state.losses = [];
  state.trainedClasses = state.classes.map((c) => c.name);
  drawLoss();
  status(`Training on ${samples.length} examples…`, "", "training");
  updateButtons();
  worker.postMessage({ type: "train", samples, classes: state.classes.length, steps: STEPS });
};

// ---------------------------------------------------------------- prediction
function predict() {
  if (!state.trainedClasses.length || state.training || !inked) return;
  const x = toInput(pad);
  if (!x) return;
  worker.postMessage({ type: "predict", id: state.drawSeq, input: x.input });
}

function showPrediction(probs, id) {
  const box = $("pred");
  const body = $("pred-body");
  if (!probs) {
    box.dataset.class = "-1";
    body.className = "pred-body muted";
    body.textContent = state.trainedClasses.length
      ? "Draw a symbol to see what the model thinks it is."
      : "Train, then draw a symbol to see what the model thinks it is.";
    return;
  }
  let top = 0;
  probs.forEach((p, i) => (top = p > probs[top] ? i : top));
  body.className = "pred-body";
  body.textContent = "";
  const head = document.createElement("div");
  head.className = "pred-top";
  head.innerHTML = `<span class="dot" style="--c:${COLORS[top]}"></span>Symbol ${state.trainedClasses[top]}`;
  body.append(head);
  probs.forEach((p, i) => {
    const row = document.createElement("div");
    row.className = "bar-row";
    row.style.setProperty("--c", COLORS[i]);
    row.innerHTML = `<span>Symbol ${state.trainedClasses[i]}</span><div class="bar"><div style="width:${(p * 100).toFixed(1)}%"></div></div><span class="pct">${(p * 100).toFixed(0)}%</span>`;
    body.append(row);
  });
  box.dataset.class = String(top);
  box.dataset.seq = String(id);
  state.predSeq = id;
}

// ---------------------------------------------------------------- loss curve
function drawLoss() {
  const c = $("loss");
  const w = c.clientWidth || 420;
  const h = c.clientHeight || 220;
  c.width = w * dpr;
  c.height = h * dpr;
  const g = c.getContext("2d");
  g.scale(dpr, dpr);
  const L = { l: 40, r: 12, t: 10, b: 26 };
  const pw = w - L.l - L.r;
  const ph = h - L.t - L.b;
  const ys = state.losses;
  const ymax = Math.max(0.5, ...ys.slice(0, 5)) * 1.05;
  const xmax = Math.max(STEPS, ys.length);
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#6b7088";
  g.strokeStyle = "#eceef5";
  g.lineWidth = 1;
  for (let k = 0; k <= 4; k++) {
    const y = L.t + ph - (ph * k) / 4;
    g.beginPath();
    g.moveTo(L.l, y);
    g.lineTo(L.l + pw, y);
    g.stroke();
    g.textAlign = "right";
    g.fillText(((ymax * k) / 4).toFixed(2), L.l - 6, y + 4);
  }
  g.textAlign = "center";
  for (let k = 0; k <= 4; k++) g.fillText(String(Math.round((xmax * k) / 4)), L.l + (pw * k) / 4, h - 8);
  if (!ys.length) {
    g.fillStyle = "#b8bccd";
    g.font = "13px system-ui, sans-serif";
    g.fillText("the loss appears here while training", L.l + pw / 2, L.t + ph / 2);
    return;
  }
  const X = (i) => L.l + (pw * (i + 1)) / xmax;
  const Y = (v) => L.t + ph - (ph * Math.min(v, ymax)) / ymax;
  const grad = g.createLinearGradient(0, L.t, 0, L.t + ph);
  grad.addColorStop(0, "rgba(91,75,255,0.28)");
  grad.addColorStop(1, "rgba(91,75,255,0.0)");
  g.beginPath();
  g.moveTo(X(0), L.t + ph);
  ys.forEach((v, i) => g.lineTo(X(i), Y(v)));
  g.lineTo(X(ys.length - 1), L.t + ph);
  g.closePath();
  g.fillStyle = grad;
  g.fill();
  g.beginPath();
  ys.forEach((v, i) => (i ? g.lineTo(X(i), Y(v)) : g.moveTo(X(i), Y(v))));
  g.strokeStyle = "#5b4bff";
  g.lineWidth = 2.2;
  g.stroke();
}

// ---------------------------------------------------------------- memory
const slider = $("budget");
let budgetTimer = 0;
slider.addEventListener("input", () => {
  showBudget(Number(slider.value));
  cancelAnimationFrame(budgetTimer);
  budgetTimer = requestAnimationFrame(() => sendBudget(Number(slider.value)));
});

function sendBudget(bytes) {
  state.budget = bytes;
  worker.postMessage({ type: "budget", bytes });
}

function showBudget(bytes) {
  $("budget-label").textContent = kib(bytes);
}

function showPlan(plan, memoryBytes) {
  if (!plan) return;
  state.plans.push({ ...plan, at: performance.now() });
  const budget = Number.isFinite(plan.budgetBytes) ? plan.budgetBytes : Number(slider.max);
  $("arena-fill").style.width = `${Math.min(100, (100 * plan.allocatedBytes) / budget)}%`;
  $("arena-lb").style.left = `${Math.min(100, (100 * plan.lowerBound) / budget)}%`;
  $("arena-text").textContent = `arena ${kib(plan.allocatedBytes)} of ${kib(budget)} budget`;
  $("policy").textContent = plan.policy;
  $("micro").textContent =
    plan.microBatches > 1 ? `${plan.microBatch} × ${plan.microBatches}` : String(plan.microBatch);
  $("recomputes").textContent = String(plan.recomputes);
  if (memoryBytes) {
    state.memoryBytes = memoryBytes;
    $("wasm-mem").textContent = kib(memoryBytes);
  }
}

// ---------------------------------------------------------------- worker messages
worker.onmessage = ({ data: m }) => {
  switch (m.type) {
    case "ready": {
      state.ready = true;
      state.minBudget = m.minBudget;
      state.plainBytes = m.plainBytes;
      // From the smallest feasible budget to a little above the unconstrained plan.
      slider.min = String(Math.ceil(m.minBudget / 256) * 256);
      slider.max = String(Math.ceil((m.plainBytes * 1.25) / 256) * 256);
      slider.value = slider.max;
      slider.disabled = false;
      showBudget(Number(slider.value));
      sendBudget(Number(slider.value));
      state.backend = m.backend;
      const where =
        m.backend.backend === "webgpu"
          ? `training on WebGPU (${m.backend.adapter})`
          : `training on the CPU (${m.backend.reason})`;
      status(`Ready · backbone loaded (${m.loadedTensors} tensors) · ${where}.`, "ok", "ready");
      updateButtons();
      break;
    }
    case "plan":
      showPlan(m.plan, m.memoryBytes);
      break;
    case "progress":
      state.losses.push(...m.losses);
      drawLoss();
      showPlan(m.plan, m.memoryBytes);
      $("steps").textContent = `${m.step} / ${m.steps}`;
      $("step-ms").textContent = `${m.stepMs.toFixed(2)} ms`;
      $("last-loss").textContent = m.losses[m.losses.length - 1].toFixed(3);
      break;
    case "trained":
      state.training = false;
      state.lastTrain = { trainMs: m.trainMs, steps: m.steps, stepMs: m.stepMs };
      showPlan(m.plan, m.memoryBytes);
      $("train-ms").textContent = `${(m.trainMs / 1000).toFixed(2)} s`;
      $("step-ms").textContent = `${m.stepMs.toFixed(2)} ms`;
      status(
        `Trained ${m.steps} steps in ${(m.trainMs / 1000).toFixed(2)} s ` +
          `${state.backend?.backend === "webgpu" ? "on WebGPU" : "on the CPU"}. Draw a symbol to test it.`,
        "ok",
        "trained",
      );
      updateButtons();
      showPrediction(null);
      predict();
      break;
    case "prediction":
      if (m.id === state.drawSeq) showPrediction(m.probs, m.id);
      break;
    case "error":
      state.errors.push(m);
      state.training = false;
      if (m.plan) showPlan(m.plan);
      status(
        m.neededBytes ? `${m.message} (at least ${kib(m.neededBytes)})` : m.message,
        "error",
        "error",
      );
      updateButtons();
      break;
  }
};

renderClasses();
drawLoss();

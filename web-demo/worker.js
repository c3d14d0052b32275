// The training side of the demo, in a Web Worker so the page stays responsive. It owns the frugal
// Trainer (wasm): the frozen digits backbone plus a fresh head with one output per symbol.
//
// Messages in:  {type: "train", samples: [{input, label}], classes, steps, budget}
//               {type: "predict", id, input}
//               {type: "budget", bytes}
// Messages out: {type: "ready", plan, minBudget, plainBytes, memoryBytes}
//               {type: "progress", losses, step, steps, stepMs, plan, memoryBytes}
//               {type: "trained", trainMs, steps, stepMs, plan, memoryBytes}
//               {type: "prediction", id, probs}
//               {type: "plan", plan, memoryBytes} | {type: "error", message, neededBytes?, plan?}
// Where steps run: ?backend=cpu | webgpu | auto (the page's query, passed on in this worker's URL;
// default auto). WebGPU needs the second module (frugal_wasm_webgpu.js) and a browser with WebGPU; its
// `Trainer.create` is async and `trainSteps` returns a Promise, so everything here awaits both.
const BACKEND = new URL(self.location.href).searchParams.get("backend") ?? "auto";
let Trainer;
/** Why the CPU when WebGPU was asked for or allowed (before the module says). */
let fallback = null;

/** Steps between two progress messages (and two chances to take a new budget). */
const CHUNK = 10;
/** Samples per step: every step trains on all examples (at most this many). */
const MAX_BATCH = 32;

let wasm;
let model;
let backbone;
let trainer = null;
let budget = Infinity;
let classes = 2;
let batch = 8;

const post = (m) => self.postMessage(m);
const memoryBytes = () => wasm.memory.buffer.byteLength;

function errorMessage(e) {
  return {
    type: "error",
    message: String(e?.message ?? e),
    name: e?.name,
    neededBytes: typeof e?.neededBytes === "number" ? e.neededBytes : undefined,
    plan: trainer?.planInfo(),
  };
}

/** A trainer with a fresh head of `k` classes, at `b` samples per step, under the current budget. */
async function fresh(k, b) {
  trainer?.free();
  trainer = null;
  const backend = fallback ? "cpu" : BACKEND;
  trainer = await Trainer.create(model, backbone, { classes: k, batch: b, budget, seed: 1, backend });
  classes = k;
  batch = b;
  return trainer;
}

/** Where the trainer runs and why. */
function backendInfo() {
  const info = trainer.backendInfo;
  return fallback ? { ...info, reason: fallback } : info;
}

/** The smallest budget any plan reaches for `k` classes at `b` samples per step (planning only: CPU). */
async function minBudget(k, b) {
  try {
    const t = await Trainer.create(model, backbone, { classes: k, batch: b, budget: 0, backend: "cpu" });
    t.free();
    return 0;
  } catch (e) {
    return e.neededBytes ?? 0;
  }
}

/** Arena bytes of the plain (unconstrained) plan. */
async function plainBytes(k, b) {
  const t = await Trainer.create(model, backbone, { classes: k, batch: b, backend: "cpu" });
  const n = t.planInfo().allocatedBytes;
  t.free();
  return n;
}

async function start() {
  const [m, w] = await Promise.all([
    fetch("transfer.frgm").then((r) => r.arrayBuffer()),
    fetch("digits-backbone.safetensors").then((r) => r.arrayBuffer()),
  ]);
  model = new Uint8Array(m);
  backbone = new Uint8Array(w);
  const gpu = BACKEND !== "cpu" && typeof navigator !== "undefined" && "gpu" in navigator;
  if (BACKEND !== "cpu" && !gpu) fallback = "this browser has no WebGPU (navigator.gpu is missing)";
  const name = gpu ? "frugal_wasm_webgpu" : "frugal_wasm";
  const mod = await import(`./${name}.js`);
  wasm = await mod.default({ module_or_path: `${name}_bg.wasm` });
  Trainer = mod.Trainer;
  await fresh(classes, batch);
  post({
    type: "ready",
    plan: trainer.planInfo(),
    // Every class count the page allows (up to 6) fits from here up.
    minBudget: await minBudget(6, MAX_BATCH),
    plainBytes: await plainBytes(6, MAX_BATCH),
    memoryBytes: memoryBytes(),
    loadedTensors: trainer.loadedTensors,
    backend: backendInfo(),
  });
}

const yieldToEvents = () => new Promise((ok) => setTimeout(ok, 0));

let training = false;
/** A budget that arrived during a chunk of steps (a WebGPU chunk is awaited; the trainer is busy). */
let pendingBudget = null;
let trainerBusy = false;

async function train({ samples, classes: k, steps }) {
  training = true;
  try {
    const b = Math.min(MAX_BATCH, Math.max(1, samples.length));
    const t = await fresh(k, b);
    for (const s of samples) t.addSample(s.input, s.label);
    let trainMs = 0;
    let done = 0;
    while (done < steps) {
      const n = Math.min(CHUNK, steps - done);
      const t0 = performance.now();
      trainerBusy = true;
      let losses;
      try {
        losses = await trainer.trainSteps(n);
      } finally {
        trainerBusy = false;
      }
      const ms = performance.now() - t0;
      trainMs += ms;
      done += n;
      post({
        type: "progress",
        losses,
        step: done,
        steps,
        stepMs: ms / n,
        plan: trainer.planInfo(),
        memoryBytes: memoryBytes(),
      });
      // Let budget changes in: the next chunk runs on the re-planned arena.
      await yieldToEvents();
      if (pendingBudget !== null) {
        const b = pendingBudget;
        pendingBudget = null;
        setBudget(b);
      }
    }
    post({
      type: "trained",
      trainMs,
      steps: done,
      stepMs: trainMs / done,
      plan: trainer.planInfo(),
      memoryBytes: memoryBytes(),
    });
  } finally {
    training = false;
  }
}

function setBudget(bytes) {
  budget = bytes;
  if (training && trainerBusy) {
    pendingBudget = bytes;
    return;
  }
  try {
    trainer.setBudget(bytes);
    post({ type: "plan", plan: trainer.planInfo(), memoryBytes: memoryBytes(), budget: bytes });
  } catch (e) {
    // The trainer keeps its previous plan; a later train() plans for the new budget again.
    post(errorMessage(e));
  }
}

const ready = start().catch((e) => post(errorMessage(e)));

self.onmessage = async ({ data }) => {
  await ready;
  try {
    switch (data.type) {
      case "train":
        if (!training) await train(data);
        break;
      case "predict":
        post({ type: "prediction", id: data.id, probs: trainer.predict(data.input) });
        break;
      case "budget":
        setBudget(data.bytes);
        break;
    }
  } catch (e) {
    post(errorMessage(e));
  }
};

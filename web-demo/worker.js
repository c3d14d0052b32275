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
import init, { Trainer } from "./frugal_wasm.js";

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
function fresh(k, b) {
  trainer?.free();
  trainer = null;
  trainer = Trainer.create(model, backbone, { classes: k, batch: b, budget, seed: 1 });
  classes = k;
  batch = b;
  return trainer;
}

/** The smallest budget any plan reaches for `k` classes at `b` samples per step. */
function minBudget(k, b) {
  try {
    const t = Trainer.create(model, backbone, { classes: k, batch: b, budget: 0 });
    t.free();
    return 0;
  } catch (e) {
    return e.neededBytes ?? 0;
  }
}

/** Arena bytes of the plain (unconstrained) plan. */
function plainBytes(k, b) {
  const t = Trainer.create(model, backbone, { classes: k, batch: b });
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
  wasm = await init({ module_or_path: "frugal_wasm_bg.wasm" });
  fresh(classes, batch);
  post({
    type: "ready",
    plan: trainer.planInfo(),
    // Every class count the page allows (up to 6) fits from here up.
    minBudget: minBudget(6, MAX_BATCH),
    plainBytes: plainBytes(6, MAX_BATCH),
    memoryBytes: memoryBytes(),
    loadedTensors: trainer.loadedTensors,
  });
}

const yieldToEvents = () => new Promise((ok) => setTimeout(ok, 0));

let training = false;

async function train({ samples, classes: k, steps }) {
  training = true;
  try {
    const b = Math.min(MAX_BATCH, Math.max(1, samples.length));
    const t = fresh(k, b);
    for (const s of samples) t.addSample(s.input, s.label);
    let trainMs = 0;
    let done = 0;
    while (done < steps) {
      const n = Math.min(CHUNK, steps - done);
      const t0 = performance.now();
      const losses = trainer.trainSteps(n);
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

// The training side of "learn my phrases", in a Web Worker. It owns the frugal Trainer of the sequence
// module (frugal_wasm_seq.js): the pretrained character transformer (frozen) with LoRA adapters.
//
// Messages in:  {type: "learn", text, steps} | {type: "suggest", id, context, k}
//               {type: "evaluate", id, text} | {type: "budget", bytes}
// Messages out: {type: "ready", plan, tokens, minBudget, plainBytes}
//               {type: "progress", step, steps, loss} | {type: "learned", trainMs, steps, losses, plan}
//               {type: "suggestions", id, list} | {type: "evaluated", id, loss}
//               {type: "plan", plan} | {type: "error", id?, name, message, neededBytes?, plan?}
import init, { Trainer } from "./frugal_wasm_seq.js";

/** Windows of the user's text per step. */
const BATCH = 8;
/** Steps between two progress messages (and two chances to take a new budget). */
const CHUNK = 10;

let trainer = null;
const post = (m) => self.postMessage(m);
const tokens = (text) => Uint32Array.from(new TextEncoder().encode(text));

function errorMessage(e, id) {
  return {
    type: "error",
    id,
    name: e?.name,
    message: String(e?.message ?? e),
    neededBytes: typeof e?.neededBytes === "number" ? e.neededBytes : undefined,
    plan: trainer?.planInfo(),
  };
}

async function start() {
  await init({ module_or_path: "./frugal_wasm_seq_bg.wasm" });
  const get = async (p) => new Uint8Array(await (await fetch(p)).arrayBuffer());
  const [model, base] = await Promise.all([get("char-gpt-small-lora.frgm"), get("char-gpt-small.safetensors")]);
  trainer = Trainer.create(model, base, { batch: BATCH, seed: 1 });
  const plainBytes = trainer.planInfo().allocatedBytes;
  // The smallest feasible budget, from the error a zero budget gives.
  let minBudget = plainBytes;
  try {
    trainer.setBudget(0);
  } catch (e) {
    if (typeof e.neededBytes === "number") minBudget = e.neededBytes;
  }
  trainer.setBudget(Infinity);
  post({ type: "ready", plan: trainer.planInfo(), tokens: trainer.tokens, minBudget, plainBytes });
}

async function learn({ text, steps }) {
  trainer.clearSamples();
  trainer.addTokens(tokens(text));
  const losses = [];
  const t0 = performance.now();
  for (let done = 0; done < steps; ) {
    const n = Math.min(CHUNK, steps - done);
    losses.push(...trainer.trainSteps(n));
    done += n;
    post({ type: "progress", step: done, steps, loss: losses[losses.length - 1] });
    // Let a budget message in between chunks.
    await new Promise((r) => setTimeout(r, 0));
  }
  post({ type: "learned", trainMs: performance.now() - t0, steps, losses, plan: trainer.planInfo() });
}

const ready = start().catch((e) => post(errorMessage(e)));

self.onmessage = async ({ data: m }) => {
  await ready;
  try {
    switch (m.type) {
      case "learn":
        await learn(m);
        break;
      case "suggest": {
        const list = m.context.length ? trainer.suggest(tokens(m.context), m.k) : [];
        post({ type: "suggestions", id: m.id, list });
        break;
      }
      case "evaluate":
        post({ type: "evaluated", id: m.id, loss: trainer.evaluateTokens(tokens(m.text)) });
        break;
      case "budget":
        trainer.setBudget(m.bytes);
        post({ type: "plan", plan: trainer.planInfo() });
        break;
    }
  } catch (e) {
    post(errorMessage(e, m.id));
  }
};

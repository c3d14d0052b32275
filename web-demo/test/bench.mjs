// The browser half of `cargo xtask web --bench`: ms/step of the digits CNN (examples/digits-cnn.frgm,
// batch 32, seed 1, the bundled training digits in file order) in headless Chromium (each round's
// ms/step and the best), and the wasm memory of a fresh module training under budgets. Prints
// `key=value` and `memory …` lines that the xtask reads; the native half is timed in the xtask's own
// process.
import { PAGE_HELPERS, start } from "./browser.mjs";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
};
const rounds = arg("--rounds", 7);
const steps = arg("--steps", 40);

const { srv, context } = await start();
let code = 0;
try {
  const page = await context.newPage();
  await page.goto(srv.url + "/index.html");
  await page.addScriptTag({ content: PAGE_HELPERS });
  const speed = await page.evaluate(
    async ({ rounds, steps }) => {
      const { Trainer } = await frugalTest.module();
      const model = await frugalTest.bytes("/fixtures/digits-cnn.frgm");
      const { n, x, y } = await frugalTest.digits();
      const t = Trainer.create(model, new Uint8Array(), { batch: 32, seed: 1 });
      for (let i = 0; i < n; i++) t.addSample(x.subarray(i * 64, i * 64 + 64), y[i]);
      // Warm-up: at least 10 steps and 2 s. V8 first runs wasm with its baseline compiler (Liftoff) and
      // recompiles hot functions with the optimising one (TurboFan) on background threads; on a busy
      // machine that takes a while, and 10 steps alone timed the baseline code (2× slower).
      const w0 = performance.now();
      do t.trainSteps(10);
      while (performance.now() - w0 < 2000);
      const ms = [];
      for (let r = 0; r < rounds; r++) {
        const t0 = performance.now();
        t.trainSteps(steps);
        ms.push((performance.now() - t0) / steps);
      }
      return { ms, best: Math.min(...ms), plan: t.planInfo(), simd: WebAssembly.validate(new Uint8Array([
        // A module whose one function returns a v128 constant: valid only where simd128 is supported.
        0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 22, 1, 20, 0, 253, 12,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11,
      ])) };
    },
    { rounds, steps },
  );
  console.log(`wasm_ms_per_step=${speed.best}`);
  for (const ms of speed.ms) console.log(`wasm_round ms=${ms}`);
  console.log(`simd128_supported=${speed.simd}`);
  // Wasm memory of a fresh module (its own linear memory) training the demo's head under a budget:
  // the arena's own size (plain plan) and the smallest feasible budget.
  const mem = await page.evaluate(async () => {
    const out = [];
    const model = await frugalTest.bytes("/transfer.frgm");
    const weights = await frugalTest.bytes("/digits-backbone.safetensors");
    const { x, y } = await frugalTest.digits();
    const probe = (await frugalTest.module()).Trainer;
    const plain = probe.create(model, weights, { classes: 4, batch: 16 }).planInfo().allocatedBytes;
    let smallest = 0;
    try {
      probe.create(model, weights, { classes: 4, batch: 16, budget: 0 });
    } catch (e) {
      smallest = e.neededBytes;
    }
    for (const budget of [plain, smallest]) {
      const { Trainer, memory } = await frugalTest.module();
      const t = Trainer.create(model, weights, { classes: 4, batch: 16, budget });
      for (let i = 0; i < 16; i++) t.addSample(x.subarray(i * 64, i * 64 + 64), y[i] % 4);
      t.trainSteps(50);
      out.push({ budget, alloc: t.planInfo().allocatedBytes, bytes: memory.buffer.byteLength });
    }
    return out;
  });
  for (const m of mem) console.log(`memory ${m.budget} ${m.alloc} ${m.bytes}`);
} catch (e) {
  console.error(e);
  code = 1;
} finally {
  await context.close();
  srv.server.close();
}
process.exit(code);

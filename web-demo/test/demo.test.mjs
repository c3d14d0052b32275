// The browser test of frugal (issue 5), run by `cargo xtask web --test` after the build:
//
// 1. The demo: draws 4 examples of each of SYMBOLS new symbols with synthetic mouse events (random
//    jitter), trains in the Web Worker, draws held-out examples generated here and asserts ≥ 90% are
//    recognised; moves the budget slider before and during training and asserts the plan's arena never
//    exceeds the budget; asserts no request left 127.0.0.1 and none at all after the page loaded;
//    saves a screenshot (web-demo/test-results/demo.png).
// 2. The JS API's errors through the real JS glue (wrong lengths, NaN, bad labels, corrupt bytes).
// 3. Cross-target equality: the reference run of tests/cross_target.rs through frugal-wasm in
//    Chromium gives tests/golden/cross_target_mlp.json's losses within 1e-5 relative.
// 4. Wasm memory: a fresh module training under a budget stays within budget + 1 MiB.
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { DEMO, PAGE_HELPERS, start } from "./browser.mjs";

const SYMBOLS = Number(process.env.SYMBOLS ?? 3);
// The demo's backend: BACKEND=cpu (default) or webgpu (Chromium with --enable-unsafe-webgpu: Dawn on
// SwiftShader, a GPU emulated on the CPU — slow, so its time bound is only a sanity bound).
const BACKEND = process.env.BACKEND ?? "cpu";
const TRAIN_MS_LIMIT = BACKEND === "webgpu" ? 120_000 : 3000;
const TRAIN_PER_SYMBOL = 4;
const HELD_OUT_PER_SYMBOL = 6;

// ------------------------------------------------------------------ synthetic symbols
/** Deterministic PRNG (mulberry32). */
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const circle = (cx, cy, r, from = 0, to = Math.PI * 2, n = 28) =>
  Array.from({ length: n + 1 }, (_, i) => {
    const t = from + ((to - from) * i) / n;
    return [cx + r * Math.cos(t), cy + r * Math.sin(t)];
  });

/** Strokes of each symbol in unit coordinates ([0,1]², y down). */
const SHAPES = [
  // O: a circle
  [circle(0.5, 0.5, 0.34)],
  // X: two diagonals
  [
    [[0.2, 0.18], [0.8, 0.82]],
    [[0.8, 0.18], [0.2, 0.82]],
  ],
  // a triangle (Δ)
  [[[0.5, 0.15], [0.85, 0.82], [0.15, 0.82], [0.5, 0.15]]],
  // Z
  [[[0.2, 0.2], [0.8, 0.2], [0.2, 0.8], [0.8, 0.8]]],
];

/** One drawing of symbol `k`: scaled, rotated, shifted and shaken a little. */
function jittered(k, r) {
  const s = 0.85 + 0.25 * r();
  const rot = ((r() - 0.5) * 16 * Math.PI) / 180;
  const dx = (r() - 0.5) * 0.12;
  const dy = (r() - 0.5) * 0.12;
  return SHAPES[k].map((stroke) =>
    stroke.map(([x, y]) => {
      const u = (x - 0.5) * s;
      const v = (y - 0.5) * s;
      return [
        0.5 + dx + u * Math.cos(rot) - v * Math.sin(rot) + (r() - 0.5) * 0.02,
        0.5 + dy + u * Math.sin(rot) + v * Math.cos(rot) + (r() - 0.5) * 0.02,
      ];
    }),
  );
}

async function draw(page, strokes) {
  const box = await page.locator("#pad").boundingBox();
  const at = ([x, y]) => [box.x + 30 + x * (box.width - 60), box.y + 30 + y * (box.height - 60)];
  for (const stroke of strokes) {
    const [x0, y0] = at(stroke[0]);
    await page.mouse.move(x0, y0);
    await page.mouse.down();
    for (const p of stroke.slice(1)) {
      const [x, y] = at(p);
      await page.mouse.move(x, y, { steps: 4 });
    }
    await page.mouse.up();
  }
}

/** Clicks the slider at `frac` of its width (a real input event) and returns the value it took. */
async function slide(page, frac) {
  const box = await page.locator("#budget").boundingBox();
  await page.mouse.click(box.x + 8 + frac * (box.width - 16), box.y + box.height / 2);
  const v = Number(await page.locator("#budget").inputValue());
  // Wait until the worker has re-planned for it.
  await page
    .waitForFunction((b) => window.demo.plans.some((p) => p.budgetBytes === b), v, { timeout: 20_000 })
    .catch(async (e) => {
      const d = await page.evaluate(() => ({ plans: window.demo.plans, errors: window.demo.errors }));
      throw new Error(`no plan for budget ${v}: ${JSON.stringify(d)}`, { cause: e });
    });
  return v;
}

// ------------------------------------------------------------------ the run
const { srv, context } = await start(BACKEND === "webgpu" ? ["--enable-unsafe-webgpu"] : []);
let failed = false;
try {
  const page = await context.newPage();
  const requests = [];
  context.on("request", (r) => requests.push({ url: r.url(), at: Date.now() }));
  page.on("console", (m) => m.type() === "error" && console.error("page:", m.text()));
  page.on("pageerror", (e) => console.error("page error:", e));

  await page.goto(srv.url + "/?backend=" + BACKEND);
  await page.waitForFunction(() => window.demo?.ready === true, null, { timeout: 60_000 });
  const backend = await page.evaluate(() => window.demo.backend);
  console.log(`demo backend: ${JSON.stringify(backend)}`);
  assert.equal(backend.backend, BACKEND, `the demo trains on ${BACKEND}: ${JSON.stringify(backend)}`);
  const loaded = { requests: requests.length, server: srv.requests.length };
  console.log(`demo ready: ${loaded.server} requests while loading`);

  // Symbols with 4 jittered examples each.
  const r = rng(20261122);
  for (let k = 0; k < SYMBOLS; k++) {
    await page.click("#new-class");
    for (let j = 0; j < TRAIN_PER_SYMBOL; j++) {
      await draw(page, jittered(k, r));
      await page.click("#add");
    }
  }
  const counts = await page.evaluate(() => window.demo.classes.map((c) => c.samples.length));
  assert.deepEqual(counts, Array(SYMBOLS).fill(TRAIN_PER_SYMBOL));

  // A budget well below the unconstrained plan before training, the smallest during, then a middle one.
  const budgets = [await slide(page, 0.3)];
  await page.click("#train");
  await page.waitForFunction(() => window.demo.losses.length >= 20);
  budgets.push(await slide(page, 0));
  await page.waitForFunction(() => window.demo.losses.length >= 100 || !window.demo.training);
  budgets.push(await slide(page, 0.6));
  await page.waitForFunction(() => document.querySelector("#status").dataset.state === "trained", null, {
    timeout: TRAIN_MS_LIMIT + 60_000,
  });
  const demo = await page.evaluate(() => ({
    lastTrain: window.demo.lastTrain,
    losses: window.demo.losses,
    plans: window.demo.plans,
    errors: window.demo.errors,
    min: Number(document.querySelector("#budget").min),
    max: Number(document.querySelector("#budget").max),
  }));
  assert.deepEqual(demo.errors, [], "the worker reported errors");
  const { trainMs, steps, stepMs } = demo.lastTrain;
  const first = demo.losses.slice(0, 5).reduce((a, b) => a + b) / 5;
  const last = demo.losses.slice(-5).reduce((a, b) => a + b) / 5;
  console.log(
    `trained ${SYMBOLS} symbols × ${TRAIN_PER_SYMBOL} examples: ${steps} steps in ${trainMs.toFixed(0)} ms ` +
      `(${stepMs.toFixed(3)} ms/step); loss ${first.toFixed(3)} → ${last.toFixed(3)}`,
  );
  assert.ok(last < 0.5 * first, `the loss falls: ${first} → ${last}`);
  assert.ok(trainMs <= TRAIN_MS_LIMIT, `training took ${trainMs} ms (bound ${TRAIN_MS_LIMIT} ms on ${BACKEND})`);

  // The arena never exceeds the budget; every slider position was planned; the smallest budget needed
  // a policy other than the plain plan (so re-planning really happened).
  for (const p of demo.plans) {
    assert.ok(p.allocatedBytes <= p.budgetBytes, `arena ${p.allocatedBytes} > budget ${p.budgetBytes}`);
    assert.ok(p.arenaBytes >= p.lowerBound, `arena below its lower bound: ${JSON.stringify(p)}`);
  }
  for (const b of budgets) {
    assert.ok(b >= demo.min && b <= demo.max);
    assert.ok(demo.plans.some((p) => p.budgetBytes === b), `no plan for budget ${b}`);
  }
  const atMin = demo.plans.filter((p) => p.budgetBytes === budgets[1]);
  assert.ok(atMin.some((p) => p.policy !== "plain"), `smallest budget: ${JSON.stringify(atMin)}`);
  const planned = demo.plans.filter((p) => Number.isFinite(p.budgetBytes)).length;
  console.log(
    `budgets ${budgets.map((b) => (b / 1024).toFixed(1) + " KiB").join(", ")}: ${planned} plans, ` +
      `all within budget; at the smallest: ${atMin[atMin.length - 1].policy}, micro-batch ` +
      `${atMin[atMin.length - 1].microBatch}, ${atMin[atMin.length - 1].recomputes} recomputes`,
  );

  // Held-out drawings, generated here with another seed.
  const held = rng(7);
  let correct = 0;
  const confusion = [];
  for (let k = 0; k < SYMBOLS; k++) {
    for (let j = 0; j < HELD_OUT_PER_SYMBOL; j++) {
      await page.click("#clear");
      await draw(page, jittered(k, held));
      await page.waitForFunction(
        () => document.querySelector("#pred").dataset.seq === String(window.demo.drawSeq),
      );
      const got = Number(await page.locator("#pred").getAttribute("data-class"));
      confusion.push([k, got]);
      if (got === k) correct++;
    }
  }
  const total = SYMBOLS * HELD_OUT_PER_SYMBOL;
  console.log(`held-out: ${correct}/${total} recognised (${((100 * correct) / total).toFixed(0)}%)`);
  assert.ok(correct >= 0.9 * total, `only ${correct}/${total} recognised: ${JSON.stringify(confusion)}`);

  // Leave a drawing of the first symbol with its prediction on screen for the screenshot.
  await page.click("#clear");
  await draw(page, jittered(0, held));
  await page.waitForFunction(() => document.querySelector("#pred").dataset.seq === String(window.demo.drawSeq));
  mkdirSync(join(DEMO, "test-results"), { recursive: true });
  const shot = join(DEMO, BACKEND === "cpu" ? "test-results/demo.png" : `test-results/demo-${BACKEND}.png`);
  await page.screenshot({ path: shot, fullPage: true });
  console.log(`screenshot: ${shot}`);

  // Nothing left 127.0.0.1; nothing at all was requested after the page had loaded.
  const origin = new URL(srv.url).origin;
  const foreign = requests.filter((q) => !q.url.startsWith(origin + "/") && !q.url.startsWith("data:"));
  assert.deepEqual(foreign, [], "requests left 127.0.0.1");
  assert.equal(requests.length, loaded.requests, `requests after load: ${JSON.stringify(requests.slice(loaded.requests))}`);
  assert.equal(srv.requests.length, loaded.server, `server saw requests after load: ${srv.requests.slice(loaded.server)}`);
  console.log(`network: ${requests.length} requests, all to ${origin}, none after load`);

  // ---------------------------------------------------------------- the JS API through its glue
  await page.addScriptTag({ content: PAGE_HELPERS });
  const errors = await page.evaluate(async () => {
    const { Trainer } = await frugalTest.module();
    const model = await frugalTest.bytes("/transfer.frgm");
    const weights = await frugalTest.bytes("/digits-backbone.safetensors");
    const caught = (f) => {
      try {
        f();
        return null;
      } catch (e) {
        return { isError: e instanceof Error, name: e.name, message: e.message, neededBytes: e.neededBytes };
      }
    };
    const t = Trainer.create(model, weights, { classes: 2, batch: 8 });
    const bad = model.slice();
    bad[20] ^= 0xff;
    const out = {
      shortInput: caught(() => t.addSample(new Float32Array(63), 0)),
      nanInput: caught(() => t.addSample(new Float32Array(64).fill(NaN), 0)),
      nanLabel: caught(() => t.addSample(new Float32Array(64), NaN)),
      unknownLabel: caught(() => t.addSample(new Float32Array(64), 5)),
      noSamples: caught(() => t.trainSteps(3)),
      negativeSteps: caught(() => t.trainSteps(-1)),
      corruptModel: caught(() => Trainer.create(bad, weights)),
      corruptWeights: caught(() => Trainer.create(model, weights.slice(0, 100))),
      unknownOption: caught(() => Trainer.create(model, weights, { bacth: 3 })),
      badPolicy: caught(() => Trainer.create(model, weights, { policy: "fast" })),
      tinyBudget: caught(() => t.setBudget(1000)),
      nanBudget: caught(() => t.setBudget(NaN)),
    };
    // The module still works after all of these.
    t.addSample(new Float32Array(64).fill(0.5), 1);
    out.stillWorks = Array.from(t.trainSteps(2)).every(Number.isFinite);
    out.planInfo = t.planInfo();
    return out;
  });
  for (const [k, e] of Object.entries(errors)) {
    if (k === "stillWorks" || k === "planInfo") continue;
    assert.ok(e && e.isError && e.message.length > 10, `${k}: expected an Error, got ${JSON.stringify(e)}`);
  }
  assert.equal(errors.tinyBudget.name, "BudgetError");
  assert.ok(errors.tinyBudget.neededBytes > 1000 && errors.tinyBudget.message.includes(String(errors.tinyBudget.neededBytes)));
  assert.match(errors.unknownLabel.message, /label/);
  assert.match(errors.shortInput.message, /63 values/);
  assert.ok(errors.stillWorks, "the module works after the errors");
  assert.equal(errors.planInfo.budgetBytes, Infinity, "a rejected budget keeps the old plan");
  console.log(`JS API errors: ${Object.keys(errors).length - 2} bad calls threw Errors; the module kept working`);

  // ---------------------------------------------------------------- cross-target equality
  const cross = await page.evaluate(async () => {
    const { Trainer } = await frugalTest.module();
    const model = await frugalTest.bytes("/fixtures/digits-mlp.frgm");
    const { x, y } = await frugalTest.digits();
    const golden = await (await fetch("/fixtures/cross_target_mlp.json")).json();
    const t = Trainer.create(model, new Uint8Array(), { batch: 32, seed: 1 });
    for (let i = 0; i < golden.steps * golden.batch; i++) t.addSample(x.subarray(i * 64, i * 64 + 64), y[i]);
    return { plan: t.planInfo(), losses: Array.from(t.trainSteps(golden.steps)), golden: golden.losses };
  });
  assert.equal(cross.plan.policy, "plain");
  assert.equal(cross.losses.length, 20);
  let worst = 0;
  cross.losses.forEach((l, i) => {
    const rel = Math.abs(l - cross.golden[i]) / Math.abs(cross.golden[i]);
    worst = Math.max(worst, rel);
    // Same f32 maths; only the SIMD path's summation order may differ from the native reference.
    assert.ok(rel <= 1e-5, `step ${i}: Chromium ${l} vs golden ${cross.golden[i]}`);
  });
  console.log(`cross-target: 20 losses in Chromium match the golden (worst relative difference ${worst.toExponential(2)})`);

  // ---------------------------------------------------------------- wasm memory vs budget
  const mem = await page.evaluate(async () => {
    const { Trainer, memory } = await frugalTest.module();
    const model = await frugalTest.bytes("/transfer.frgm");
    const weights = await frugalTest.bytes("/digits-backbone.safetensors");
    const budget = 256 * 1024;
    const t = Trainer.create(model, weights, { classes: 4, batch: 16, budget });
    const { x, y } = await frugalTest.digits();
    for (let i = 0; i < 16; i++) t.addSample(x.subarray(i * 64, i * 64 + 64), y[i] % 4);
    t.trainSteps(50);
    return { budget, plan: t.planInfo(), bytes: memory.buffer.byteLength };
  });
  console.log(
    `wasm memory: ${(mem.bytes / 1024).toFixed(0)} KiB with a ${(mem.budget / 1024).toFixed(0)} KiB budget ` +
      `(arena ${(mem.plan.allocatedBytes / 1024).toFixed(1)} KiB)`,
  );
  assert.ok(mem.plan.allocatedBytes <= mem.budget);
  assert.ok(mem.bytes <= mem.budget + (1 << 20), `wasm memory ${mem.bytes} > budget + 1 MiB`);
  console.log("\nweb-demo: all browser checks passed");
} catch (e) {
  failed = true;
  console.error(e);
} finally {
  await context.close();
  srv.server.close();
}
process.exit(failed ? 1 : 0);

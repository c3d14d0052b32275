// The browser test of "learn my phrases" (issue 17), run by `cargo xtask web --test` after the build:
//
// 1. The page loads the sequence module (frugal_wasm_seq), the pretrained character transformer and its
//    LoRA model in its Web Worker; the held-out perplexity of the model on more of the user's text
//    (web-demo/phrases/user-heldout.txt, sentences not in the training text) is measured through the
//    page's worker, the page fine-tunes on its user text (web-demo/phrases/user-text.txt) with the
//    "Learn my phrases" button, and the held-out perplexity must fall by at least 20 % (issue 17's
//    target); the fine-tune's in-browser time is printed (target ≤ 10 s).
// 2. The suggestions after "I'll push the fi" move to the user's phrase: "x" ("fix", which the Genesis
//    model gives under 3 %) becomes at least 5 times as likely and at least 10 % likely once the page
//    has learned (it is first after the default 120 steps; the ranking moves with the step count).
// 3. The budget slider: at the smallest feasible budget the plan fits it (re-planned, not plain).
// 4. The sequence JS API's errors through the real JS glue: bad token ids, too-short texts, bad `k`,
//    a classifier model, random calls — every one an Error with a name, none a trap; the trainer works
//    afterwards. Screenshot: web-demo/test-results/phrases.png.
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { DEMO, start } from "./browser.mjs";

const STEPS = Number(process.env.PHRASE_STEPS ?? 120);
// A sanity bound only (CI machines are shared); the target, 10 s, is reported.
const TRAIN_MS_LIMIT = 60_000;

const { srv, context } = await start();
let failed = false;
try {
  const page = await context.newPage();
  page.on("pageerror", (e) => console.error("page error:", e));
  await page.goto(`${srv.url}/phrases.html`);
  page.on("console", (m) => m.type() === "error" && console.error("page console:", m.text()));
  await page.waitForFunction(() => ["ready", "error"].includes(document.querySelector("#status").dataset.state), null, {
    timeout: 120_000,
  });
  const st = await page.evaluate(() => document.querySelector("#status").textContent);
  assert.equal(await page.evaluate(() => document.querySelector("#status").dataset.state), "ready", st);
  await page.waitForFunction(() => document.querySelector("#text").value.length > 0);
  const heldout = await (await fetch(`${srv.url}/fixtures/user-heldout.txt`)).text();
  const ppl = async () => Math.exp(await page.evaluate((t) => window.phrases.evaluate(t), heldout));
  const topAfter = (ctx) => page.evaluate((c) => window.phrases.suggest(c, 3), ctx);
  const pX = async () =>
    (await page.evaluate(() => window.phrases.suggest("I'll push the fi", 256))).find((s) => s.token === 120).probability;

  // ---------------------------------------------------------------- fine-tune
  const before = await ppl();
  const sugBefore = await topAfter("I'll push the fi");
  const xBefore = await pX();
  await page.fill("#steps", String(STEPS));
  const learned = page.evaluate(
    () =>
      new Promise((resolve) => {
        const el = document.querySelector("#train-ms");
        new MutationObserver(() => el.dataset.ms && resolve(Number(el.dataset.ms))).observe(el, {
          attributes: true,
        });
      }),
  );
  await page.click("#learn");
  const trainMs = await learned;
  const after = await ppl();
  const sugAfter = await topAfter("I'll push the fi");
  const xAfter = await pX();
  const show = (l) => l.map((s) => `${JSON.stringify(String.fromCharCode(s.token))} ${(100 * s.probability).toFixed(0)}%`).join(", ");
  console.log(
    `fine-tune: ${STEPS} LoRA steps in ${(trainMs / 1000).toFixed(2)} s in Chromium (target ≤ 10 s); ` +
      `held-out perplexity ${before.toFixed(2)} → ${after.toFixed(2)} (${(100 * (1 - after / before)).toFixed(0)} % lower)`,
  );
  console.log(
    `suggestions after "I'll push the fi": before [${show(sugBefore)}], after [${show(sugAfter)}]; ` +
      `P("x") ${(100 * xBefore).toFixed(1)} % → ${(100 * xAfter).toFixed(1)} %`,
  );
  assert.ok(after <= 0.8 * before, `held-out perplexity ${before} → ${after}: less than 20 % lower`);
  assert.ok(xAfter >= 0.1 && xAfter >= 5 * xBefore, `P("x") ${xBefore} → ${xAfter}`);
  assert.ok(trainMs <= TRAIN_MS_LIMIT, `fine-tune took ${trainMs} ms`);

  // Typing shows the suggestions as chips.
  await page.fill("#typing", "see you at stand");
  await page.waitForFunction(() => {
    const b = document.querySelector("#suggestions");
    return b.dataset.done === b.dataset.seq && b.querySelectorAll(".chip").length === 5;
  });

  // ---------------------------------------------------------------- budget slider
  const plan = await page.evaluate(async () => {
    const s = document.querySelector("#budget");
    s.value = s.min;
    s.dispatchEvent(new Event("input"));
    const el = document.querySelector("#arena");
    const want = Number(s.min);
    for (let i = 0; i < 200; i++) {
      await new Promise((r) => setTimeout(r, 50));
      const bytes = Number(el.dataset.bytes);
      if (el.textContent.includes(`of ${(want / 1024).toFixed(0)} KiB`)) {
        return { bytes, budget: want, policy: document.querySelector("#policy").textContent, max: Number(s.max) };
      }
    }
    return null;
  });
  assert.ok(plan, "the slider's smallest budget was not planned");
  assert.ok(plan.bytes <= plan.budget, `arena ${plan.bytes} > budget ${plan.budget}`);
  assert.notEqual(plan.policy, "plain", `smallest budget ${plan.budget}: ${plan.policy}`);
  console.log(
    `budget: smallest ${(plan.budget / 1024).toFixed(0)} KiB → arena ${(plan.bytes / 1024).toFixed(0)} KiB (${plan.policy}); ` +
      `slider up to ${(plan.max / 1024).toFixed(0)} KiB`,
  );
  // The model still learns under it (a few steps, re-planned).
  await page.evaluate(() => window.phrases.learn(5));

  const shotDir = join(DEMO, "test-results");
  mkdirSync(shotDir, { recursive: true });
  await page.screenshot({ path: join(shotDir, "phrases.png"), fullPage: true });

  // ---------------------------------------------------------------- the sequence JS API's errors
  const errors = await page.evaluate(async () => {
    const m = await import("/frugal_wasm_seq.js?instance=" + Math.random());
    await m.default({ module_or_path: "/frugal_wasm_seq_bg.wasm" });
    const get = async (p) => new Uint8Array(await (await fetch(p)).arrayBuffer());
    const t = m.Trainer.create(await get("/char-gpt-small-lora.frgm"), await get("/char-gpt-small.safetensors"), { batch: 4 });
    const out = {};
    const tryIt = (k, f) => {
      try {
        f();
        out[k] = null;
      } catch (e) {
        out[k] = { isError: e instanceof Error, name: e.name, message: e.message };
      }
    };
    const ids = (n, v = 104) => new Uint32Array(n).fill(v);
    tryIt("idTooBig", () => t.addTokens(ids(40, 256)));
    tryIt("tooShort", () => t.addTokens(ids(5)));
    tryIt("stride0", () => t.addTokens(ids(40), 0));
    tryIt("strideNaN", () => t.addTokens(ids(40), NaN));
    tryIt("evalShort", () => t.evaluateTokens(ids(3)));
    tryIt("suggestEmpty", () => t.suggest(new Uint32Array(0), 3));
    tryIt("suggestK0", () => t.suggest(ids(3), 0));
    tryIt("suggestK1000", () => t.suggest(ids(3), 1000));
    tryIt("addSample", () => t.addSample(new Float32Array(32), 0));
    tryIt("noSamples", () => t.trainSteps(1));
    const mlp = m.Trainer.create(await get("/fixtures/digits-mlp.frgm"), new Uint8Array(0), {});
    tryIt("classifierTokens", () => mlp.addTokens(ids(100)));
    // Random calls (a fixed seed): every one returns or throws an Error, never traps.
    let a = 7;
    const rnd = () => ((a = (Math.imul(a, 1103515245) + 12345) >>> 0) / 4294967296);
    let thrown = 0;
    for (let i = 0; i < 300; i++) {
      const n = Math.floor(rnd() * 80);
      const arr = Uint32Array.from({ length: n }, () => (rnd() < 0.9 ? Math.floor(rnd() * 256) : Math.floor(rnd() * 4e9)));
      const r = rnd();
      try {
        if (r < 0.3) t.addTokens(arr, rnd() < 0.5 ? undefined : Math.floor(rnd() * 40) - 2);
        else if (r < 0.5) t.evaluateTokens(arr);
        else if (r < 0.75) t.suggest(arr, Math.floor(rnd() * 300) - 10);
        else if (r < 0.85) t.trainSteps(Math.floor(rnd() * 3));
        else if (r < 0.95) t.setBudget(rnd() < 0.5 ? Infinity : Math.floor(rnd() * 4e6));
        else t.clearSamples();
      } catch (e) {
        if (!(e instanceof Error) || !e.name || !e.message) throw new Error(`not an Error: ${e}`);
        thrown++;
      }
    }
    t.setBudget(Infinity);
    t.addTokens(ids(64));
    const losses = t.trainSteps(2);
    out.afterwards = Array.from(losses).every(Number.isFinite) && t.suggest(ids(3), 2).length === 2;
    out.randomThrown = thrown;
    return out;
  });
  for (const [k, v] of Object.entries(errors)) {
    if (k === "afterwards" || k === "randomThrown") continue;
    assert.ok(v && v.isError && v.name && v.message, `${k}: ${JSON.stringify(v)}`);
  }
  assert.equal(errors.idTooBig.name, "ArgumentError");
  assert.match(errors.idTooBig.message, /token 0 is 256/);
  assert.match(errors.classifierTokens.message, /not a sequence model/);
  assert.ok(errors.afterwards, "the trainer works after the errors");
  console.log(
    `sequence JS API: ${Object.keys(errors).length - 2} bad calls threw Errors, 300 random calls ` +
      `(${errors.randomThrown} threw Errors), no trap; the trainer kept working`,
  );
  console.log("\nlearn my phrases: all browser checks passed");
} catch (e) {
  failed = true;
  console.error(e);
} finally {
  await context.close();
  srv.server.close();
}
process.exit(failed ? 1 : 0);

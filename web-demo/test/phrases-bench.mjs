// The "learn my phrases" half of `cargo xtask web --bench` (issue 17: the fine-tune in the browser in
// ≤ 10 s): the demo page itself (web-demo/phrases.html, its Web Worker and the frugal_wasm_seq module)
// in headless Chromium, as a user runs it — the page's fixed user text (web-demo/phrases/user-text.txt),
// the "Learn my phrases" button with the steps of the demo and its test (120 LoRA steps, batch 8,
// seed 1) — timed by the page (the worker's clock around its training calls). Each round is a fresh
// page (module, model and weights loaded again, the base model's LoRA adapters at their start), so
// every round trains the same steps from the same state. Held-out perplexity (on
// web-demo/phrases/user-heldout.txt) before and after, measured through the page's worker. Prints
// `key=value` lines that the xtask reads.
import { start } from "./browser.mjs";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
};
const rounds = arg("--rounds", 3);
const steps = arg("--steps", 120);

const { srv, context } = await start();
let code = 0;
try {
  const heldout = await (await fetch(`${srv.url}/fixtures/user-heldout.txt`)).text();
  for (let r = 0; r < rounds; r++) {
    const page = await context.newPage();
    page.on("pageerror", (e) => console.error("page error:", e));
    await page.goto(`${srv.url}/phrases.html`);
    await page.waitForFunction(() => ["ready", "error"].includes(document.querySelector("#status").dataset.state), null, {
      timeout: 120_000,
    });
    const state = await page.evaluate(() => document.querySelector("#status").dataset.state);
    if (state !== "ready") throw new Error(`the page did not load: ${await page.evaluate(() => document.querySelector("#status").textContent)}`);
    await page.waitForFunction(() => document.querySelector("#text").value.length > 0);
    const ppl = async () => Math.exp(await page.evaluate((t) => window.phrases.evaluate(t), heldout));
    const before = await ppl();
    await page.fill("#steps", String(steps));
    const learned = page.evaluate(
      () =>
        new Promise((resolve) => {
          const el = document.querySelector("#train-ms");
          new MutationObserver(() => el.dataset.ms && resolve(Number(el.dataset.ms))).observe(el, { attributes: true });
        }),
    );
    await page.click("#learn");
    const ms = await learned;
    const after = await ppl();
    const done = await page.evaluate(() => parseInt(document.querySelector("#done-steps").textContent, 10));
    console.log(`phrases_round seconds=${ms / 1000} steps=${done} before=${before} after=${after}`);
    await page.close();
  }
} catch (e) {
  console.error(e);
  code = 1;
} finally {
  await context.close();
  srv.server.close();
}
process.exit(code);

// Compares builds of the CPU module in one sitting, in Node (V8, as in Chromium, without a browser):
// ms/step of the digits CNN as `cargo xtask web --bench` trains it (examples/digits-cnn.frgm, batch 32,
// seed 1, the bundled digits in file order), each build warmed up (≥ 10 steps and ≥ 3 s) and then
// rounds of 40 steps alternating between the builds, so a busy machine slows them alike. Prints the
// median [min–max] ms/step per build.
//
//   node web-demo/test/compare-builds.mjs [--rounds N] DIR...
//
// Each DIR holds a build's `frugal_wasm.js` and `frugal_wasm_bg.wasm` (wasm-bindgen --target web), e.g.
// copies of web-demo/dist/ made by `cargo xtask web --size` under two settings.
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const REPO = join(dirname(fileURLToPath(import.meta.url)), "../..");

const args = process.argv.slice(2);
const at = args.indexOf("--rounds");
const rounds = at >= 0 ? Number(args.splice(at, 2)[1]) : 25;
const dirs = args.map((d) => resolve(d));
if (dirs.length === 0) throw new Error("usage: compare-builds.mjs [--rounds N] DIR...");
const steps = 40;
const img = readFileSync(join(REPO, "data/digits/digits-train-images.idx"));
const lab = readFileSync(join(REPO, "data/digits/digits-train-labels.idx"));
const n = img.readUInt32BE(4);
const x = new Float32Array(n * 64);
for (let i = 0; i < n * 64; i++) x[i] = img[16 + i] / 16;
const y = lab.subarray(8, 8 + n);
const model = new Uint8Array(readFileSync(join(REPO, "examples/digits-cnn.frgm")));
const trainers = [];
for (const [i, d] of dirs.entries()) {
  // A query string per build: each is its own module instance.
  const m = await import(`${pathToFileURL(join(d, "frugal_wasm.js")).href}?build=${i}`);
  m.initSync({ module: readFileSync(join(d, "frugal_wasm_bg.wasm")) });
  const t = m.Trainer.create(model, new Uint8Array(), { batch: 32, seed: 1 });
  for (let j = 0; j < n; j++) t.addSample(x.subarray(j * 64, j * 64 + 64), y[j]);
  const w0 = performance.now();
  do t.trainSteps(10);
  while (performance.now() - w0 < 3000);
  trainers.push(t);
}
const ms = dirs.map(() => []);
for (let r = 0; r < rounds; r++)
  for (const [i, t] of trainers.entries()) {
    const t0 = performance.now();
    t.trainSteps(steps);
    ms[i].push((performance.now() - t0) / steps);
  }
for (const [i, d] of dirs.entries()) {
  const v = [...ms[i]].sort((a, b) => a - b);
  const f = (z) => z.toFixed(4);
  console.log(`${d}: ${f(v[v.length >> 1])} [${f(v[0])}–${f(v[v.length - 1])}] ms/step (${rounds} rounds of ${steps} steps)`);
}

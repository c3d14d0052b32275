// Shared by the Playwright test and the benchmark: the local server (the built demo plus test
// fixtures from the repository) and headless Chromium (Debian's, never a downloaded build).
import { chromium } from "playwright-core";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { serve } from "../serve.mjs";

export const DEMO = join(dirname(fileURLToPath(import.meta.url)), "..");
export const REPO = join(DEMO, "..");

/** URL path → repository file, served beside the demo for tests only. */
export const FIXTURES = {
  "/fixtures/digits-mlp.frgm": join(REPO, "examples/digits-mlp.frgm"),
  "/fixtures/digits-cnn.frgm": join(REPO, "examples/digits-cnn.frgm"),
  "/fixtures/train-images.idx": join(REPO, "data/digits/digits-train-images.idx"),
  "/fixtures/train-labels.idx": join(REPO, "data/digits/digits-train-labels.idx"),
  "/fixtures/cross_target_mlp.json": join(REPO, "tests/golden/cross_target_mlp.json"),
  "/fixtures/user-heldout.txt": join(DEMO, "phrases/user-heldout.txt"),
};

/** Flags for headless Chromium without a GPU (see TOOLCHAIN.md). */
export const CHROMIUM_ARGS = [
  "--no-sandbox",
  "--disable-gpu-sandbox",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-quic",
  "--disable-default-apps",
  "--disable-extensions",
];

/** `extraArgs`: e.g. `--enable-unsafe-webgpu` (WebGPU on SwiftShader, see TOOLCHAIN.md). */
export async function start(extraArgs = []) {
  const srv = await serve({ root: join(DEMO, "dist"), fixtures: FIXTURES });
  const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "frugal-chromium-")), {
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: [...CHROMIUM_ARGS, ...extraArgs],
    viewport: { width: 1280, height: 860 },
    deviceScaleFactor: 1,
  });
  return { srv, context: browser };
}

/**
 * In the page: loads a fresh instance of the built module (not the demo worker's) and returns
 * helpers as a string-free closure is impossible across evaluate — so callers pass functions that
 * `import("/frugal_wasm.js")` themselves. This parses the bundled digits IDX files (pixels 0..16 → /16).
 */
export const PAGE_HELPERS = `
  globalThis.frugalTest = {
    async module() {
      const m = await import("/frugal_wasm.js?instance=" + Math.random());
      const exports = await m.default({ module_or_path: "/frugal_wasm_bg.wasm" });
      return { Trainer: m.Trainer, memory: exports.memory };
    },
    async bytes(path) {
      return new Uint8Array(await (await fetch(path)).arrayBuffer());
    },
    async digits() {
      const img = await this.bytes("/fixtures/train-images.idx");
      const lab = await this.bytes("/fixtures/train-labels.idx");
      const dv = new DataView(img.buffer);
      if (dv.getUint32(0) !== 0x803) throw new Error("images: bad IDX magic");
      const n = dv.getUint32(4);
      const x = new Float32Array(n * 64);
      for (let i = 0; i < n * 64; i++) x[i] = img[16 + i] / 16;
      return { n, x, y: lab.subarray(8, 8 + n) };
    },
  };
`;

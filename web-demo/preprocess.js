// A drawing → the digits models' input (1×8×8 in [0, 1]), the way the bundled UCI digits were made
// (data/digits/README.md): the symbol is size-normalised and centred in a 32×32 bitmap, which is cut
// into 4×4 blocks; each input is the count of "on" pixels in its block divided by 16.

/** Side of the normalised bitmap. */
export const BITMAP = 32;
/** Side of the model input. */
export const SIDE = 8;

/**
 * Ink bounding box of an RGBA image (ink = alpha above a threshold), or null when blank.
 * @param {ImageData} img
 */
export function inkBox(img) {
  const { width: w, height: h, data } = img;
  let x0 = w, y0 = h, x1 = -1, y1 = -1;
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      if (data[(y * w + x) * 4 + 3] > 40) {
        if (x < x0) x0 = x;
        if (x > x1) x1 = x;
        if (y < y0) y0 = y;
        if (y > y1) y1 = y;
      }
    }
  }
  return x1 < 0 ? null : { x: x0, y: y0, w: x1 - x0 + 1, h: y1 - y0 + 1 };
}

/**
 * The 64 model inputs for the ink on `canvas` (strokes drawn with alpha on a transparent canvas), or
 * null when nothing is drawn. Also returns the 32×32 bitmap for previews.
 * @param {HTMLCanvasElement} canvas
 */
export function toInput(canvas) {
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  const box = inkBox(ctx.getImageData(0, 0, canvas.width, canvas.height));
  if (!box) return null;
  // Fit the longer side of the box to the bitmap, keep the aspect ratio, centre it.
  const scale = BITMAP / Math.max(box.w, box.h);
  const dw = box.w * scale, dh = box.h * scale;
  const small = document.createElement("canvas");
  small.width = small.height = BITMAP;
  const sctx = small.getContext("2d", { willReadFrequently: true });
  sctx.imageSmoothingEnabled = true;
  sctx.imageSmoothingQuality = "high";
  sctx.drawImage(canvas, box.x, box.y, box.w, box.h, (BITMAP - dw) / 2, (BITMAP - dh) / 2, dw, dh);
  const px = sctx.getImageData(0, 0, BITMAP, BITMAP).data;
  const bits = new Uint8Array(BITMAP * BITMAP);
  for (let i = 0; i < bits.length; i++) bits[i] = px[i * 4 + 3] > 100 ? 1 : 0;
  const input = new Float32Array(SIDE * SIDE);
  const block = BITMAP / SIDE;
  for (let by = 0; by < SIDE; by++) {
    for (let bx = 0; bx < SIDE; bx++) {
      let on = 0;
      for (let y = 0; y < block; y++) {
        for (let x = 0; x < block; x++) on += bits[(by * block + y) * BITMAP + bx * block + x];
      }
      input[by * SIDE + bx] = on / (block * block);
    }
  }
  return { input, bits };
}

/**
 * Paints an 8×8 input onto a small canvas (previews of examples).
 * @param {HTMLCanvasElement} canvas
 * @param {Float32Array} input
 * @param {string} color CSS colour of full pixels
 */
export function paintInput(canvas, input, color) {
  const ctx = canvas.getContext("2d");
  const cell = canvas.width / SIDE;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.fillStyle = color;
  for (let i = 0; i < SIDE * SIDE; i++) {
    if (input[i] <= 0) continue;
    ctx.globalAlpha = 0.15 + 0.85 * input[i];
    ctx.fillRect((i % SIDE) * cell, Math.floor(i / SIDE) * cell, cell, cell);
  }
  ctx.globalAlpha = 1;
}

// "Learn my phrases": the user's text, the fine-tune in a Web Worker (phrases-worker.js), next-character
// suggestions while typing, and the budget slider. `window.phrases` exposes the worker's calls to the
// page's test (web-demo/test/phrases.test.mjs).
const $ = (id) => document.getElementById(id);
const worker = new Worker("phrases-worker.js", { type: "module" });
const kib = (b) => (Number.isFinite(b) ? `${(b / 1024).toFixed(0)} KiB` : "no limit");

let nextId = 1;
const pending = new Map();
/** Sends `m` with a fresh id; resolves with the worker's answer carrying that id. */
function ask(m) {
  const id = nextId++;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject });
    worker.postMessage({ ...m, id });
  });
}

let learning = null;
const status = (text, state) => {
  $("status").textContent = text;
  $("status").dataset.state = state;
};

function showPlan(plan) {
  $("arena").textContent = `${kib(plan.allocatedBytes)} of ${kib(plan.budgetBytes)}`;
  $("arena").dataset.bytes = plan.allocatedBytes;
  $("policy").textContent = plan.policy;
  $("micro").textContent = `${plan.microBatch} × ${plan.microBatches}`;
  $("recomputes").textContent = plan.recomputes;
}

async function suggest() {
  const box = $("suggestions");
  const seq = Number(box.dataset.seq) + 1;
  box.dataset.seq = seq;
  const r = await ask({ type: "suggest", context: $("typing").value, k: 5 });
  if (Number(box.dataset.seq) !== seq) return;
  box.replaceChildren(
    ...r.list.map(({ token, probability }) => {
      const b = document.createElement("button");
      b.className = "chip";
      const ch = String.fromCharCode(token);
      b.textContent = ch === " " ? "␣" : ch === "\n" ? "⏎" : ch;
      b.title = `${(100 * probability).toFixed(1)} %`;
      b.dataset.token = token;
      b.onclick = () => {
        $("typing").value += ch;
        suggest();
      };
      return b;
    }),
  );
  box.dataset.done = seq;
}

worker.onmessage = ({ data: m }) => {
  if (m.id && pending.has(m.id)) {
    const p = pending.get(m.id);
    pending.delete(m.id);
    if (m.type === "error") p.reject(Object.assign(new Error(m.message), { name: m.name }));
    else p.resolve(m);
    return;
  }
  switch (m.type) {
    case "ready": {
      const s = $("budget");
      s.min = m.minBudget;
      s.max = Math.ceil((m.plainBytes * 1.25) / 1024) * 1024;
      s.value = s.max;
      s.disabled = false;
      $("budget-label").textContent = kib(Number(s.value));
      $("learn").disabled = false;
      showPlan(m.plan);
      status(`Ready: ${m.tokens} characters of context.`, "ready");
      break;
    }
    case "progress":
      $("done-steps").textContent = `${m.step} / ${m.steps}`;
      $("last-loss").textContent = m.loss.toFixed(3);
      break;
    case "learned":
      $("train-ms").textContent = `${(m.trainMs / 1000).toFixed(2)} s`;
      $("train-ms").dataset.ms = m.trainMs;
      showPlan(m.plan);
      status(`Learned in ${(m.trainMs / 1000).toFixed(1)} s.`, "trained");
      learning?.resolve(m);
      learning = null;
      $("learn").disabled = false;
      suggest();
      break;
    case "plan":
      showPlan(m.plan);
      break;
    case "error":
      status(m.message, "error");
      if (m.plan) showPlan(m.plan);
      learning?.reject(new Error(m.message));
      learning = null;
      $("learn").disabled = false;
      break;
  }
};

/** Fine-tunes on the textarea's text for `steps` steps; resolves with the worker's "learned" message. */
function learn(steps = Number($("steps").value)) {
  $("learn").disabled = true;
  status("Learning…", "training");
  return new Promise((resolve, reject) => {
    learning = { resolve, reject };
    worker.postMessage({ type: "learn", text: $("text").value, steps });
  });
}

$("learn").onclick = () => learn().catch(() => {});
$("typing").oninput = suggest;
$("typing").onkeydown = (e) => {
  const first = $("suggestions").querySelector(".chip");
  if (e.key === "Tab" && first) {
    e.preventDefault();
    first.click();
  }
};
$("budget").oninput = () => {
  const bytes = Number($("budget").value);
  $("budget-label").textContent = kib(bytes);
  worker.postMessage({ type: "budget", bytes });
};

fetch("phrases/user-text.txt")
  .then((r) => r.text())
  .then((t) => {
    if (!$("text").value) $("text").value = t;
  });

window.phrases = {
  learn,
  /** Mean cross-entropy per character (nats) of the current model on `text`. */
  evaluate: async (text) => (await ask({ type: "evaluate", text })).loss,
  /** The `k` most likely next characters after `context`: [{token, probability}]. */
  suggest: async (context, k = 5) => (await ask({ type: "suggest", context, k })).list,
};

// A tiny static file server for the built demo (`web-demo/dist/`), bound to 127.0.0.1 only.
//
//   node web-demo/serve.mjs [--port 8080] [--root web-demo/dist]
//
// The tests import `serve()` and add `fixtures`: extra URL paths mapped to files of the repository
// (the digits data, models, golden losses), so nothing but this server is ever contacted.
import { createServer } from "node:http";
import { readFile, stat } from "node:fs/promises";
import { extname, join, normalize, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".json": "application/json",
  ".wasm": "application/wasm",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ts": "text/plain; charset=utf-8",
};

/**
 * Serves `root` on 127.0.0.1:`port` (0 = any free port). `fixtures` maps URL paths (e.g.
 * "/fixtures/digits.idx") to absolute file paths. Resolves to { server, url, requests } where
 * `requests` lists every path asked for.
 */
export function serve({ root, port = 0, fixtures = {}, quiet = true }) {
  const base = resolve(root);
  const requests = [];
  const server = createServer(async (req, res) => {
    const path = decodeURIComponent(new URL(req.url, "http://127.0.0.1").pathname);
    requests.push(path);
    let file = fixtures[path];
    if (!file) {
      const rel = normalize(path === "/" ? "/index.html" : path).replace(/^([/\\])+/, "");
      file = join(base, rel);
      if (file !== base && !file.startsWith(base + sep)) {
        res.writeHead(403).end("forbidden");
        return;
      }
    }
    try {
      const s = await stat(file);
      if (!s.isFile()) throw new Error("not a file");
      const body = await readFile(file);
      res.writeHead(200, {
        "content-type": TYPES[extname(file)] ?? "application/octet-stream",
        "cache-control": "no-store",
      });
      res.end(body);
      if (!quiet) console.log(`200 ${path}`);
    } catch {
      res.writeHead(404, { "content-type": "text/plain" }).end(`not found: ${path}`);
      if (!quiet) console.log(`404 ${path}`);
    }
  });
  return new Promise((ok, fail) => {
    server.once("error", fail);
    server.listen(port, "127.0.0.1", () => {
      const { port: p } = server.address();
      ok({ server, url: `http://127.0.0.1:${p}`, requests });
    });
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  const opt = (name, dflt) => {
    const i = args.indexOf(name);
    return i >= 0 && args[i + 1] ? args[i + 1] : dflt;
  };
  const here = fileURLToPath(new URL(".", import.meta.url));
  const root = opt("--root", join(here, "dist"));
  const port = Number(opt("--port", "8080"));
  const { url } = await serve({ root, port, quiet: false });
  console.log(`frugal web demo: ${url}/  (serving ${root}; Ctrl-C stops)`);
}

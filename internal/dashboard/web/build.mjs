// Builds the dashboard (preact) and the GraphiQL page (react) into the folder given as --out:
// index.html, graphiql.html, ui/<name>-<hash>.{js,css} (content-hashed names, so the server
// can let browsers keep them for a year), and source.sha256, the hash of the sources they were
// built from, which internal/dashboard's tests compare with the sources in the tree.
// Run by scripts/build-dashboard.sh in a copy of this folder whose node_modules it installed.
import { createHash } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import * as esbuild from 'esbuild';

const here = import.meta.dirname;
const outFlag = process.argv.indexOf('--out');
if (outFlag < 0 || !process.argv[outFlag + 1]) throw new Error('usage: node build.mjs --out DIR');
const out = process.argv[outFlag + 1];

// The files the build reads (node_modules comes from package-lock.json), in a fixed order.
export function sourceFiles(root) {
  const files = ['build.mjs', 'package.json', 'package-lock.json', 'tsconfig.json'];
  const walk = (dir) => {
    for (const name of readdirSync(join(root, dir)).sort()) {
      const rel = `${dir}/${name}`;
      if (statSync(join(root, rel)).isDirectory()) walk(rel);
      else files.push(rel);
    }
  };
  walk('src');
  return files.sort();
}

// sourceHash: sha256 over every source file as "path\0size\0bytes" (internal/dashboard's
// TestDistFresh computes the same in Go).
function sourceHash(root) {
  const h = createHash('sha256');
  for (const f of sourceFiles(root)) {
    const b = readFileSync(join(root, f));
    h.update(`${f}\0${b.length}\0`);
    h.update(b);
  }
  return h.digest('hex');
}

const common = {
  bundle: true,
  minify: true,
  format: 'esm',
  target: ['es2022', 'chrome110', 'firefox115', 'safari16'],
  outdir: join(out, 'ui'),
  entryNames: '[name]-[hash]',
  assetNames: '[name]-[hash]',
  legalComments: 'eof',
  metafile: true,
  logLevel: 'warning',
  define: { 'process.env.NODE_ENV': '"production"' },
  absWorkingDir: here,
};

rmSync(out, { recursive: true, force: true });
mkdirSync(join(out, 'ui'), { recursive: true });
const builds = [
  await esbuild.build({ ...common, entryPoints: { app: 'src/dashboard/main.tsx' }, jsx: 'automatic', jsxImportSource: 'preact' }),
  await esbuild.build({ ...common, entryPoints: { graphiql: 'src/graphiql/main.tsx' }, jsx: 'automatic', jsxImportSource: 'react' }),
];

// names maps "app.js" to "app-HASH.js", for the pages.
const names = {};
for (const b of builds) {
  for (const file of Object.keys(b.metafile.outputs)) {
    const name = basename(file);
    const m = /^(.+)-[A-Z0-9]+(\.[a-z0-9]+)$/.exec(name);
    if (m) names[m[1] + m[2]] = name;
  }
}
const page = (template, dest) => {
  const html = readFileSync(join(here, template), 'utf8').replace(/\{\{([a-z.]+)\}\}/g, (_, k) => {
    if (!names[k]) throw new Error(`${template}: no built file for ${k}`);
    return names[k];
  });
  writeFileSync(join(out, dest), html);
};
page('src/dashboard/index.html', 'index.html');
page('src/graphiql/index.html', 'graphiql.html');
writeFileSync(join(out, 'source.sha256'), sourceHash(here) + '\n');
for (const [k, v] of Object.entries(names).sort()) {
  console.log(`${k} → ui/${v} (${statSync(join(out, 'ui', v)).size} bytes)`);
}

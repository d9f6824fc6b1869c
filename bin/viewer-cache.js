#!/usr/bin/env node
// The published CLI runs the compiled server (`npm run build` writes dist/).
await import('../dist/server/main.js');

// The house's walls, as rules dependency-cruiser checks on every `npm test`
// (test/unit/architecture.test.ts runs them, and proves each one reports a violation planted in
// a scratch tree). `npm run deps` prints the violations; `npm run deps -- -T dot` the graph.
//
// The floors, bottom up (each imports only floors beneath it):
//   src/*.ts    the vocabulary: job, errors, logger, durations, events, embed viewer, results
//   util/       small shared helpers
//   connector/  the seams: datatable:// references, the connector, the fingerprint contract
//   pg/         Postgres plumbing that knows no table of ours (clients, SQLSTATEs, migrations)
//   executor/, datatable/, stores/, embed/  (executor/ and datatable/ never meet but through
//               connector/) — and cache/ over stores/, never the other way
//   queue/      jobs on workers (BullMQ): over executor/ and pg/, under index.ts
//   audit/      the policy lints: reads a data table's system catalogs through pg, under index.ts
//   index.ts    the public entry, and server/ above it, through it alone
// Inside datatable/, rooms in the same spirit, under the front door (datatable/*.ts):
//   catalog/ ← access/ ← logins/ ← identity/, admin/
// Inside server/, the reference server's rooms, top down (main.ts and index.ts above them all):
//   cli/ → start/ → http/, demo/ → agents/, apps/ → credentials/, recipients/ → process/
//   cli/ → audit/ (runs your apps as each viewer, beside start/) → demo/, apps/ → …
// and the agent process (agents/agent_worker.ts, agents/proxy_client.ts) loads of the server
// only the wire protocol (agents/agent_protocol.ts), never the routes or the dispatch.

/** A datatable room may import these rooms (and itself); nothing else of datatable/. */
const ROOMS_BENEATH = {
  catalog: [],
  access: ['catalog'],
  logins: ['access', 'catalog'],
  identity: ['logins', 'access', 'catalog'],
  admin: ['logins', 'access', 'catalog'],
};

/** A server room may import these rooms (and itself); nothing else of server/. */
const SERVER_ROOMS_BENEATH = {
  process: [],
  credentials: ['process'],
  recipients: ['process'],
  agents: ['credentials', 'recipients', 'process'],
  apps: ['credentials', 'recipients', 'process'],
  http: ['agents', 'apps', 'credentials', 'recipients', 'process'],
  demo: ['agents', 'apps', 'credentials', 'recipients', 'process'],
  start: ['http', 'demo', 'agents', 'apps', 'credentials', 'recipients', 'process'],
  audit: ['demo', 'agents', 'apps', 'credentials', 'recipients', 'process'],
  cli: ['start', 'audit', 'http', 'demo', 'agents', 'apps', 'credentials', 'recipients', 'process'],
};

const roomRules = Object.entries(ROOMS_BENEATH).map(([room, beneath]) => ({
  name: `datatable-${room}-layer`,
  comment: `datatable/${room}/ imports only ${beneath.length === 0 ? 'itself (it is the floor)' : `itself and ${beneath.join(', ')}`} of datatable/: no arrow runs back up`,
  severity: 'error',
  from: { path: `^src/datatable/${room}/` },
  to: {
    path: '^src/datatable/[^/]+/',
    pathNot: `^src/datatable/(${[room, ...beneath].join('|')})/`,
  },
}));

const serverRoomRules = Object.entries(SERVER_ROOMS_BENEATH).map(([room, beneath]) => ({
  name: `server-${room}-room`,
  comment: `server/${room}/ imports only ${beneath.length === 0 ? 'itself (it is the floor)' : `itself and ${beneath.join(', ')}`} of server/: no arrow runs back up`,
  severity: 'error',
  from: { path: `^src/server/${room}/` },
  to: {
    path: '^src/server/[^/]+/',
    pathNot: `^src/server/(${[room, ...beneath].join('|')})/`,
  },
}));

/** @type {import('dependency-cruiser').IConfiguration} */
export default {
  forbidden: [
    {
      name: 'no-circular',
      comment: 'No module reaches itself through its imports (type-only imports count too).',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
    {
      name: 'no-orphans',
      comment: 'A module nothing imports and that imports nothing is dead or forgotten.',
      severity: 'error',
      // Plain-Node fixtures (test/fixtures/*.mjs) are spawned as processes by tests, not imported.
      from: {
        orphan: true,
        pathNot: ['\\.d\\.ts$', '\\.test\\.ts$', '^test/fixtures/[^/]+\\.mjs$'],
      },
      to: {},
    },
    {
      name: 'vocabulary-imports-no-folder',
      comment:
        'src/*.ts (job, errors, logger, duration, events, …) is the vocabulary every folder shares: it imports none of them.',
      severity: 'error',
      from: { path: '^src/[^/]+\\.ts$', pathNot: '^src/index\\.ts$' },
      to: { path: '^src/[^/]+/' },
    },
    {
      name: 'executor-not-datatable',
      comment: 'The executor and the data tables are siblings that meet only through connector/.',
      severity: 'error',
      from: { path: '^src/executor/' },
      to: { path: '^src/datatable/' },
    },
    {
      name: 'datatable-not-executor',
      comment: 'The executor and the data tables are siblings that meet only through connector/.',
      severity: 'error',
      from: { path: '^src/datatable/' },
      to: { path: '^src/executor/' },
    },
    {
      name: 'seams-import-neither-side',
      comment: 'connector/ (the seams) and util/ sit beneath both sides and import neither.',
      severity: 'error',
      from: { path: '^src/(connector|util)/' },
      to: { path: '^src/(executor|datatable|cache|stores|embed|server)/|^src/index\\.ts$' },
    },
    {
      name: 'datatable-not-cache-or-stores',
      comment:
        'The data tables hand the cache a fingerprint through connector/, and know nothing of the cache or its stores.',
      severity: 'error',
      from: { path: '^src/datatable/' },
      to: { path: '^src/(cache|stores)/' },
    },
    {
      name: 'stores-not-cache',
      comment:
        'A store moves bytes: the entry header it may read lives beside it (stores/entry_header.ts), written by the cache.',
      severity: 'error',
      from: { path: '^src/stores/' },
      to: { path: '^src/cache/' },
    },
    {
      name: 'library-not-server',
      comment: 'The library knows nothing of the reference server built on it.',
      severity: 'error',
      from: { path: '^src/', pathNot: '^src/server/' },
      to: { path: '^src/server/' },
    },
    {
      name: 'server-only-through-index',
      comment: 'The reference server uses the library as any adopter would: through src/index.ts.',
      severity: 'error',
      from: { path: '^src/server/' },
      to: { path: '^src/', pathNot: '^src/(server/|index\\.ts$)' },
    },
    {
      name: 'datatable-rooms-not-front-door',
      comment:
        'The front door (datatable/*.ts) hands work down to the rooms; no room reaches back to it.',
      severity: 'error',
      from: { path: '^src/datatable/[^/]+/' },
      to: { path: '^src/datatable/[^/]+\\.ts$' },
    },
    ...roomRules,
    {
      name: 'pg-floor',
      comment: 'pg/ is the floor beneath the data tables and the queue: it knows no room above it.',
      severity: 'error',
      from: { path: '^src/pg/' },
      to: { path: '^src/', pathNot: '^src/pg/' },
    },
    ...serverRoomRules,
    {
      name: 'server-rooms-not-entries',
      comment:
        "The server's rooms are under its entries (main.ts, index.ts): no room imports an entry of server/.",
      severity: 'error',
      from: { path: '^src/server/[^/]+/' },
      to: { path: '^src/server/[^/]+\\.ts$' },
    },
    {
      name: 'agent-process-loads-only-the-protocol',
      comment:
        "The process on an agent's machine loads of the server only the wire protocol (agents/agent_protocol.ts) and the one back-off rule (process/poll_backoff.ts, no imports): never the routes, the dispatch or the credentials.",
      severity: 'error',
      from: { path: '^src/server/agents/(agent_worker|proxy_client)\\.ts$' },
      to: {
        path: '^src/server/',
        pathNot: '^src/server/(agents/(agent_protocol|proxy_client)|process/poll_backoff)\\.ts$',
      },
    },
    {
      name: 'queue-own-room',
      comment:
        'queue/ (jobs on workers) builds on the executor, the vocabulary and the migration runner; only index.ts imports it.',
      severity: 'error',
      from: { path: '^src/', pathNot: '^src/(queue/|index\\.ts$)' },
      to: { path: '^src/queue/' },
    },
    {
      name: 'queue-imports',
      comment:
        'queue/ reaches the executor through its contract and Postgres through pg/: not the cache, stores, embed or the data tables.',
      severity: 'error',
      from: { path: '^src/queue/' },
      to: { path: '^src/(cache|stores|embed|connector|datatable)/' },
    },
    {
      name: 'audit-own-room',
      comment:
        'audit/ (the policy lints) reads system catalogs with pg and knows the catalog only by the shape it asks; only index.ts imports it.',
      severity: 'error',
      from: { path: '^src/', pathNot: '^src/(audit/|index\\.ts$)' },
      to: { path: '^src/audit/' },
    },
    {
      name: 'audit-imports',
      comment:
        'audit/ imports the vocabulary, util/ and pg/ at most: it lints rules, it never runs, caches or resolves a viewer.',
      severity: 'error',
      from: { path: '^src/audit/' },
      to: { path: '^src/[^/]+/', pathNot: '^src/(audit|pg|util)/' },
    },
    {
      name: 'src-not-tests-or-benches',
      comment: 'The library never imports its tests or benchmarks.',
      severity: 'error',
      from: { path: '^src/' },
      to: { path: '^(test|bench)/' },
    },
    {
      name: 'tests-not-benches',
      comment: 'Benchmarks may reuse test helpers; tests never depend on a benchmark.',
      severity: 'error',
      from: { path: '^test/' },
      to: { path: '^bench/' },
    },
  ],
  options: {
    includeOnly: '^(src|test|bench)/',
    doNotFollow: { path: 'node_modules' },
    // `import type` is an arrow too: a type-only cycle is still a cycle to read through.
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'types', 'node', 'default'],
      extensions: ['.ts', '.js', '.mjs'],
    },
    reporterOptions: {
      dot: {
        collapsePattern: '^(src/datatable/[^/]+|src/server/[^/]+|src/[^/]+|test/[^/]+|bench)/',
      },
    },
  },
};

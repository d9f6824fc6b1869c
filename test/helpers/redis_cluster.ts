import { type ChildProcess, execFile, spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Cluster, Redis } from 'ioredis';
import { freePort } from './free_port.js';

const run = promisify(execFile);

/** A private 3-master Redis Cluster started from the machine's `redis-server`. */
export interface RedisClusterHandle {
  readonly nodes: Array<{ host: string; port: number }>;
  /** A connected ioredis Cluster client (closed by stop()). */
  readonly client: Cluster;
  /** Kills master `index` (SIGKILL); its slots stay uncovered until it is started again. */
  stopNode(index: number): Promise<void>;
  /** Starts master `index` again on its port, from its nodes file: it rejoins with its slots. */
  startNode(index: number): Promise<void>;
  /** Resolves once every running master says `cluster_state:ok`. */
  waitForOk(): Promise<void>;
  stop(): Promise<void>;
}

function requireBinary(name: string): string {
  const found = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
  const path = found.stdout.trim();
  if (found.status !== 0 || path === '') {
    // Fail loudly: the cluster tests never skip.
    throw new Error(
      `${name} is not installed or not on PATH: the Redis Cluster tests need the real binary ` +
        '(apt-get install redis-server). They do not skip.',
    );
  }
  return path;
}

async function startNode(dir: string, port: number, busPort: number): Promise<ChildProcess> {
  const server = spawn(
    requireBinary('redis-server'),
    [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--cluster-enabled',
      'yes',
      '--cluster-port',
      String(busPort),
      '--cluster-config-file',
      join(dir, `nodes-${port}.conf`),
      '--cluster-node-timeout',
      '2000',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      dir,
      '--daemonize',
      'no',
      '--protected-mode',
      'no',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let output = '';
  // Ready when it says so on stdout: an event, not a timer.
  await new Promise<void>((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes('Ready to accept connections')) {
        server.stdout!.off('data', onData);
        resolve();
      }
    };
    server.stdout!.on('data', onData);
    server.stderr!.on('data', (chunk: Buffer) => {
      output += chunk.toString();
    });
    server.once('exit', (code) =>
      reject(new Error(`redis-server on port ${port} exited (${code}) before ready:\n${output}`)),
    );
    server.once('error', reject);
  });
  server.stdout!.resume();
  return server;
}

async function clusterStateOk(port: number): Promise<boolean> {
  const client = new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 0 });
  client.on('error', () => {});
  try {
    await client.connect();
    const info = (await client.call('CLUSTER', 'INFO')) as string;
    return info.includes('cluster_state:ok');
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
}

/** Starts three masters, joins them with `redis-cli --cluster create`, waits for state ok. */
export async function startRedisCluster(): Promise<RedisClusterHandle> {
  const cli = requireBinary('redis-cli');
  const dir = await mkdtemp(join(tmpdir(), 'vc-redis-cluster-'));
  const processes: ChildProcess[] = [];
  const kill = async (child: ChildProcess) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, 'exit');
    child.kill('SIGKILL');
    await exited;
  };
  const stopProcesses = async () => {
    await Promise.all(processes.map(kill));
    await rm(dir, { recursive: true, force: true });
  };
  try {
    const nodes: Array<{ host: string; port: number }> = [];
    const busPorts: number[] = [];
    const used = new Set<number>();
    const port = async () => {
      // freePort only says the port was free a moment ago: never hand out the same one twice
      for (;;) {
        const candidate = await freePort();
        if (!used.has(candidate)) {
          used.add(candidate);
          return candidate;
        }
      }
    };
    for (let i = 0; i < 3; i++) {
      const clientPort = await port();
      const busPort = await port();
      processes.push(await startNode(dir, clientPort, busPort));
      nodes.push({ host: '127.0.0.1', port: clientPort });
      busPorts.push(busPort);
    }
    await run(
      cli,
      [
        '--cluster',
        'create',
        ...nodes.map((node) => `${node.host}:${node.port}`),
        '--cluster-replicas',
        '0',
        '--cluster-yes',
      ],
      { timeout: 30_000 },
    );
    // Slot assignments spread by gossip: poll each node's view until all agree the cluster is
    // up. This waits on an external process; there is no event to subscribe to.
    const waitForOk = async () => {
      const deadline = Date.now() + 20_000;
      for (;;) {
        const states = await Promise.all(nodes.map((node) => clusterStateOk(node.port)));
        if (states.every(Boolean)) return;
        if (Date.now() > deadline) throw new Error('Redis Cluster did not reach cluster_state:ok');
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    };
    await waitForOk();
    const client = new Cluster(nodes, { redisOptions: { maxRetriesPerRequest: 1 } });
    client.on('error', () => {});
    await once(client, 'ready');
    return {
      nodes,
      client,
      async stopNode(index) {
        await kill(processes[index]!);
      },
      async startNode(index) {
        processes[index] = await startNode(dir, nodes[index]!.port, busPorts[index]!);
      },
      waitForOk,
      async stop() {
        await client.quit().catch(() => client.disconnect());
        await stopProcesses();
      },
    };
  } catch (err) {
    await stopProcesses();
    throw err;
  }
}

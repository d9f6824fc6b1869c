import { type Logger, pino } from 'pino';

/** A pino logger writing JSON lines to memory, for counting and inspecting log output. */
export function captureLogger(): { logger: Logger; lines: () => Array<Record<string, unknown>> } {
  const raw: string[] = [];
  // A plain object with write() is a synchronous pino destination: lines are there on return.
  const logger = pino({ level: 'debug' }, { write: (line: string) => void raw.push(line) });
  return {
    logger,
    lines: () => raw.map((line) => JSON.parse(line) as Record<string, unknown>),
  };
}

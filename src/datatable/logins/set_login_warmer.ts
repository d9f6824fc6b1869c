import { type Logger, silentLogger } from '../../logger.js';
import { CLOSE_WAIT_MS, settleWithin } from '../../util/settle_within.js';
import type { CatalogState } from '../catalog/catalog_state.js';
import { wantedSetLogins } from './login_gc.js';
import type { LoginLeaser } from './login_leaser.js';

/**
 * Prepares set logins when the catalog shows a new combination of roles (someone joined a
 * group), so that the viewer's first run finds the login made, proven and a connection warm,
 * instead of paying for all of it on their request. Only combinations that appear after start
 * are prepared: at start every process would otherwise redo the whole catalog at once. Runs one
 * pass at a time; a refresh during a pass asks for one more.
 */
export class SetLoginWarmer {
  readonly #leaser: LoginLeaser;
  readonly #logger: Logger;
  #seen: Set<string> | null = null;
  #running = false;
  #next: CatalogState | null = null;
  #closed = false;
  /** The pass under way, if any (it never rejects). */
  #draining: Promise<void> = Promise.resolve();

  constructor(leaser: LoginLeaser, logger: Logger = silentLogger) {
    this.#leaser = leaser;
    this.#logger = logger;
  }

  /** A new catalog state was loaded. */
  refreshed(state: CatalogState): void {
    if (this.#closed) return;
    this.#next = state;
    if (!this.#running)
      this.#draining = this.#drain().catch((err: unknown) => {
        this.#logger.debug({ err: (err as Error).message }, 'preparing set logins stopped');
      });
  }

  /**
   * Stops preparing, and resolves once a login being prepared is done (on open pools), or after
   * `CLOSE_WAIT_MS` when it hangs.
   */
  async close(): Promise<void> {
    this.#closed = true;
    await settleWithin(new Set([this.#draining]), CLOSE_WAIT_MS);
  }

  async #drain(): Promise<void> {
    this.#running = true;
    try {
      while (this.#next !== null && !this.#closed) {
        const state = this.#next;
        this.#next = null;
        const wanted = await wantedSetLogins(state, (ws, email) => state.principals(ws, email));
        if (this.#seen === null) {
          this.#seen = new Set(wanted.keys());
          continue;
        }
        for (const [login, { oids, database }] of wanted) {
          if (this.#seen.has(login) || this.#closed) continue;
          this.#seen.add(login);
          await this.#leaser.prepareAhead(oids, database).catch((err: unknown) => {
            // Nothing lost: the viewer's first run prepares it as before.
            this.#seen?.delete(login);
            this.#logger.debug(
              { login, err: (err as Error).message },
              'set login not prepared ahead',
            );
          });
        }
      }
    } finally {
      this.#running = false;
    }
  }
}

/**
 * The apps the reference server serves: who published each (its jobs run as them), whether
 * anonymous visitors may use it, and which runnables it may run. The routes read them; the demo
 * (and any other source of apps) only writes them, so nothing here knows of HTTP.
 */

/** An app: who published it (jobs run as them), whether anonymous visitors may use it. */
export interface AppDefinition {
  readonly publisher: string;
  readonly public: boolean;
  readonly runnables: readonly string[];
}

/** The apps served, by name. */
export type Apps = Readonly<Record<string, AppDefinition>>;

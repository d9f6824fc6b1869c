import { InvalidJobError } from './errors.js';

/**
 * A verified embed viewer: what the host signed, never the token itself. It holds no roles of
 * its own; it resolves only to roles whose tenants name embed viewers (`embed:*`, `embed:APP`).
 */
export interface EmbedViewer {
  /** The app the assertion's audience names. */
  readonly app: string;
  /** Signed attributes (`customer_id`, …) that policies read with `viewer_attribute(name)`. */
  readonly attributes: Readonly<Record<string, string>>;
  /** The email the host asserted, or `null`; never resolved as `user:EMAIL`. */
  readonly email: string | null;
}

/** Attribute names: SQL-friendly words, so a policy can name them without quoting. */
export const EMBED_ATTRIBUTE_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;
/** App names (as the reference server's routes accept them). */
export const EMBED_APP_RE = /^[a-z0-9][a-z0-9_-]{0,62}$/;
/** Bounds of an embed viewer's attributes: how many, and how long each value may be. */
export const MAX_EMBED_ATTRIBUTES = 32;
export const MAX_EMBED_ATTRIBUTE_LENGTH = 1024;

const frozenEmbeds = new WeakSet<EmbedViewer>();

/**
 * An embed viewer checked (app, attribute names and string values, email) and frozen with its
 * attributes in sorted order. Returns the same object when it already went through here.
 * @throws {InvalidJobError}
 */
export function canonicalEmbedViewer(viewer: unknown): EmbedViewer {
  if (frozenEmbeds.has(viewer as EmbedViewer)) return viewer as EmbedViewer;
  if (viewer === null || typeof viewer !== 'object') {
    throw new InvalidJobError('an embed viewer is required');
  }
  const { app, attributes, email } = viewer as Record<string, unknown>;
  if (typeof app !== 'string' || !EMBED_APP_RE.test(app)) {
    throw new InvalidJobError('an embed viewer must name its app');
  }
  if (email !== null && (typeof email !== 'string' || email.length === 0)) {
    throw new InvalidJobError('an embed viewer has a non-empty email or null');
  }
  if (
    attributes === null ||
    typeof attributes !== 'object' ||
    Array.isArray(attributes) ||
    (Object.getPrototypeOf(attributes) !== Object.prototype &&
      Object.getPrototypeOf(attributes) !== null)
  ) {
    throw new InvalidJobError('an embed viewer carries its attributes as an object');
  }
  const names = Object.keys(attributes).sort();
  if (names.length > MAX_EMBED_ATTRIBUTES) {
    throw new InvalidJobError(`an embed viewer has at most ${MAX_EMBED_ATTRIBUTES} attributes`);
  }
  const sorted: Record<string, string> = {};
  for (const name of names) {
    const value = (attributes as Record<string, unknown>)[name];
    // `__proto__` would be dropped by the assignment below: two viewers would read as one.
    if (!EMBED_ATTRIBUTE_NAME_RE.test(name) || name === '__proto__') {
      throw new InvalidJobError('an embed attribute name is a word of letters, digits and _');
    }
    if (typeof value !== 'string' || value.length > MAX_EMBED_ATTRIBUTE_LENGTH) {
      throw new InvalidJobError(
        `embed attribute values are strings of at most ${MAX_EMBED_ATTRIBUTE_LENGTH} characters`,
      );
    }
    sorted[name] = value;
  }
  const canonical: EmbedViewer = Object.freeze({
    app,
    attributes: Object.freeze(sorted),
    email: email as string | null,
  });
  frozenEmbeds.add(canonical);
  return canonical;
}

/**
 * The run's embed viewer, checked and frozen, or `undefined` when it has none. A run is seen by a
 * signed-in viewer or by an embed viewer, never by both: this is the one place that refuses a
 * job carrying both (the cache key, the authorization and a child's origin all ask here).
 * @throws {InvalidJobError}
 */
export function embedViewerOf(perms: {
  readonly endUserEmail: string | null;
  readonly embed?: EmbedViewer | undefined;
}): EmbedViewer | undefined {
  const { embed } = perms;
  if (embed === undefined) return undefined;
  if (perms.endUserEmail !== null) {
    throw new InvalidJobError('a job cannot have both a signed-in viewer and an embed viewer');
  }
  return canonicalEmbedViewer(embed);
}

/**
 * JSON schemas of every route's params and body, validated by Fastify (Ajv) before a handler
 * runs, with type coercion off: `{"path": 1}` or `{"path": ["x"]}` is a 400, never a string.
 */

import { WORKSPACE_PATTERN } from '../../index.js';

/** A workspace id, as the library accepts it (cache keys, catalog). */
export { WORKSPACE_PATTERN, WORKSPACE_RE } from '../../index.js';

/** App and webhook names: lower-case words joined by `-` or `_`. */
const NAME_PATTERN = '^[a-z0-9][a-z0-9_-]{0,62}$';
/** The longest path segment the router accepts; longer is a 414. */
export const MAX_PARAM_LENGTH = 128;

const workspace = { type: 'string', pattern: WORKSPACE_PATTERN } as const;
const name = { type: 'string', pattern: NAME_PATTERN } as const;

const params = <P extends Record<string, unknown>>(properties: P) =>
  ({
    type: 'object',
    required: Object.keys(properties),
    additionalProperties: false,
    properties,
  }) as const;

export const workspaceParams = params({ workspace });
export const appParams = params({ workspace, app: name });
export const hookParams = params({ workspace, hook: name });

/** An embed link's query: its token, if not in the Authorization header; nothing else. */
export const embedQuery = {
  type: 'object',
  additionalProperties: false,
  properties: { token: { type: 'string', minLength: 1, maxLength: 8192 } },
} as const;

export const runBody = {
  type: 'object',
  required: ['path'],
  additionalProperties: false,
  properties: {
    path: { type: 'string', minLength: 1, maxLength: 256 },
    args: { type: 'object' },
  },
} as const;

/** Most recipients one per-recipient request may name. */
export const MAX_RECIPIENTS = 1000;

/** A per-recipient run: an app's runnable, and either a list of emails or a group. */
export const perRecipientBody = {
  type: 'object',
  required: ['path'],
  additionalProperties: false,
  properties: {
    path: runBody.properties.path,
    args: runBody.properties.args,
    recipients: {
      type: 'array',
      minItems: 1,
      maxItems: MAX_RECIPIENTS,
      items: { type: 'string', minLength: 3, maxLength: 320, pattern: '^[^\\s@]+@[^\\s@]+$' },
    },
    group: { type: 'string', minLength: 1, maxLength: 320, pattern: '^[^\\s\\p{C}]+$' },
  },
  oneOf: [{ required: ['recipients'] }, { required: ['group'] }],
} as const;

export type PerRecipientBody = RunBody &
  ({ recipients: string[]; group?: undefined } | { group: string; recipients?: undefined });

/** A webhook's payload: any JSON object, passed to the runnable as its args. */
export const hookBody = { type: 'object' } as const;

export interface RunBody {
  path: string;
  args?: Record<string, unknown>;
}

/** Ajv options: no coercion, no silent removal of unknown fields, no defaults filled in. */
export const ajvOptions = {
  coerceTypes: false,
  removeAdditional: false,
  useDefaults: false,
  allErrors: false,
} as const;

import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { CachedExecutor, Datatables, Executor, RunOrigin } from '../../index.js';
import type { Apps } from '../apps/apps.js';
import { explainRun } from '../apps/explain_run.js';
import type { TokenIdentity } from '../credentials/tokens.js';
import { HttpError } from './http_errors.js';
import { appParams } from './http_schemas.js';

export interface ExplainRouteDeps {
  readonly executor: Executor;
  readonly cache: CachedExecutor;
  readonly datatables: Datatables;
  readonly apps: Apps;
  readonly authenticate: (request: FastifyRequest, workspace: string) => Promise<TokenIdentity>;
  readonly isWorkspaceAdmin: (workspace: string, email: string) => Promise<boolean>;
}

interface ExplainBody {
  path: string;
  args?: Record<string, unknown>;
  viewer:
    | { email: string }
    | { embed: { attributes: Record<string, string> } }
    | { anonymous: true };
}

const explainBody = {
  type: 'object',
  additionalProperties: false,
  required: ['path', 'viewer'],
  properties: {
    path: { type: 'string', minLength: 1, maxLength: 512 },
    args: { type: 'object' },
    viewer: {
      oneOf: [
        {
          type: 'object',
          additionalProperties: false,
          required: ['email'],
          properties: { email: { type: 'string', minLength: 3, maxLength: 254 } },
        },
        {
          type: 'object',
          additionalProperties: false,
          required: ['embed'],
          properties: {
            embed: {
              type: 'object',
              additionalProperties: false,
              properties: {
                attributes: { type: 'object', additionalProperties: { type: 'string' } },
              },
            },
          },
        },
        {
          type: 'object',
          additionalProperties: false,
          required: ['anonymous'],
          properties: { anonymous: { const: true } },
        },
      ],
    },
  },
} as const;

/**
 * `POST /api/w/:workspace/apps/:app/explain` — for a workspace admin only (the answer says who
 * holds which role): why a run of the app's runnable for the viewer in the body would hit or
 * miss, and as whom it would read (apps/explain_run.ts). Anyone else is refused `403
 * E_FORBIDDEN` before the body is read. Runs nothing; never a row, password or token.
 */
export function registerExplainRoute(app: FastifyInstance, deps: ExplainRouteDeps): void {
  app.post<{ Params: { workspace: string; app: string }; Body: ExplainBody }>(
    '/api/w/:workspace/apps/:app/explain',
    {
      schema: { params: appParams, body: explainBody },
      config: { caching: 'per-caller' },
      preValidation: async (request) => {
        const { workspace } = request.params;
        const identity = await deps.authenticate(request, workspace);
        if (!(await deps.isWorkspaceAdmin(workspace, identity.email)))
          throw new HttpError(403, 'E_FORBIDDEN', 'explain is for workspace admins');
      },
    },
    async (request) => {
      const { workspace, app: appName } = request.params;
      const { viewer } = request.body;
      const origin: RunOrigin =
        'email' in viewer
          ? { kind: 'app', session: { email: viewer.email } }
          : 'embed' in viewer
            ? {
                kind: 'embed',
                viewer: { app: appName, attributes: viewer.embed.attributes ?? {}, email: null },
              }
            : { kind: 'app', session: null };
      const definition = Object.hasOwn(deps.apps, appName) ? deps.apps[appName] : undefined;
      if (definition === undefined || !definition.runnables.includes(request.body.path))
        throw new HttpError(404, 'E_UNKNOWN_RUNNABLE', 'this app has no such runnable');
      return explainRun(deps, {
        workspace,
        app: appName,
        path: request.body.path,
        args: request.body.args ?? {},
        origin,
      });
    },
  );
}

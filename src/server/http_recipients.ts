import type {
  FastifyBaseLogger,
  FastifyInstance,
  FastifyRequest,
  RawReplyDefaultExpression,
  RawRequestDefaultExpression,
  RawServerDefault,
} from 'fastify';
import {
  appParams,
  type PerRecipientBody,
  perRecipientBody,
  workspaceParams,
} from './http_schemas.js';
import type { Outbox } from './outbox.js';
import type { PerRecipientRuns } from './per_recipient_runs.js';
import type { TokenIdentity } from './tokens.js';

export interface RecipientRouteDeps {
  readonly perRecipient: PerRecipientRuns;
  readonly outbox: Outbox;
  /** The route table's bearer-token check (401/403 unless a token of this workspace). */
  readonly authenticate: (request: FastifyRequest, workspace: string) => Promise<TokenIdentity>;
  /** The app's definition, or a 404 when it is unknown or lacks the runnable. */
  readonly appRunnable: (app: string, path: string) => { readonly publisher: string };
}

/**
 * Per-recipient runs and each recipient's outbox. Kept apart from the run routes (their hot
 * path): neither route serves a cached result to its caller.
 *
 * - `POST /api/w/:workspace/apps/:app/runs/per-recipient` — any token holder of the workspace
 *   may start one, for a runnable of the app; every run runs as the app's publisher with one
 *   recipient as its viewer. The answer is counts and outcome codes, never a row.
 * - `GET /api/w/:workspace/outbox` — the calling token's user's own deliveries, newest first.
 */
export function registerRecipientRoutes(
  app: FastifyInstance<
    RawServerDefault,
    RawRequestDefaultExpression,
    RawReplyDefaultExpression,
    FastifyBaseLogger
  >,
  deps: RecipientRouteDeps,
): void {
  app.post<{ Params: { workspace: string; app: string }; Body: PerRecipientBody }>(
    '/api/w/:workspace/apps/:app/runs/per-recipient',
    { schema: { params: appParams, body: perRecipientBody } },
    async (request) => {
      const { workspace, app: appName } = request.params;
      const identity = await deps.authenticate(request, workspace);
      const { path, args, recipients, group } = request.body;
      const definition = deps.appRunnable(appName, path);
      return deps.perRecipient.run({
        workspace,
        path,
        ...(args === undefined ? {} : { args }),
        runAs: definition.publisher,
        recipients: recipients !== undefined ? { emails: recipients } : { group: group! },
        // A scoped key narrows the batch's runs like it narrows an app run: never wider.
        ...(identity.roleScope === undefined ? {} : { roleScope: identity.roleScope }),
      });
    },
  );

  app.get<{ Params: { workspace: string } }>(
    '/api/w/:workspace/outbox',
    { schema: { params: workspaceParams } },
    async (request) => {
      const { workspace } = request.params;
      const identity = await deps.authenticate(request, workspace);
      return { items: await deps.outbox.list(workspace, identity.email) };
    },
  );
}

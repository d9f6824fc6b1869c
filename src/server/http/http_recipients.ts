import type {
  FastifyBaseLogger,
  FastifyInstance,
  FastifyRequest,
  RawReplyDefaultExpression,
  RawRequestDefaultExpression,
  RawServerDefault,
} from 'fastify';
import type { TokenIdentity } from '../credentials/tokens.js';
import type { Outbox } from '../recipients/outbox.js';
import type { PerRecipientRuns } from '../recipients/per_recipient_runs.js';
import { HttpError } from './http_errors.js';
import {
  appParams,
  type PerRecipientBody,
  perRecipientBody,
  workspaceParams,
} from './http_schemas.js';

export interface RecipientRouteDeps {
  readonly perRecipient: PerRecipientRuns;
  readonly outbox: Outbox;
  /** The route table's bearer-token check (401/403 unless a token of this workspace). */
  readonly authenticate: (request: FastifyRequest, workspace: string) => Promise<TokenIdentity>;
  /** The app's publisher, or a 404 when there is no such app. */
  readonly appPublisher: (app: string) => string;
  /** The app's definition, or a 404 when it is unknown or lacks the runnable. */
  readonly appRunnable: (app: string, path: string) => { readonly publisher: string };
  /** Whether `email` is a workspace admin (catalog membership kind `admin`). */
  readonly isWorkspaceAdmin: (workspace: string, email: string) => Promise<boolean>;
}

/** Who may not start a batch is told only this, before anything about the batch is read. */
export const FANOUT_FORBIDDEN = 'E_FANOUT_FORBIDDEN';

/**
 * Per-recipient runs and each recipient's outbox. Kept apart from the run routes (their hot
 * path): neither route serves a cached result to its caller.
 *
 * - `POST /api/w/:workspace/apps/:app/runs/per-recipient` — only the app's publisher or a
 *   workspace admin may start one (the app's schedules start theirs in process), for a runnable
 *   of the app; every run runs as the app's publisher with one recipient as its viewer. The
 *   answer is counts and outcome codes, never a row — and the outcome codes say who may see
 *   what, which is why anyone else is refused: `403 E_FANOUT_FORBIDDEN`, decided before the
 *   body is validated or the list read, so the refusal is the same whatever they sent.
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
  /** Each batch request's starter, once the preValidation hook has let them through. */
  const starters = new WeakMap<FastifyRequest, TokenIdentity>();
  app.post<{ Params: { workspace: string; app: string }; Body: PerRecipientBody }>(
    '/api/w/:workspace/apps/:app/runs/per-recipient',
    {
      schema: { params: appParams, body: perRecipientBody },
      config: { caching: 'per-caller' },
      // Before validation: who may fan out is decided on the token and the app alone. (The
      // params are not validated yet here; they are only compared and looked up, never used.)
      preValidation: async (request) => {
        const { workspace, app: appName } = request.params;
        const identity = await deps.authenticate(request, workspace);
        const publisher = deps.appPublisher(appName);
        if (
          identity.email !== publisher &&
          !(await deps.isWorkspaceAdmin(workspace, identity.email))
        ) {
          throw new HttpError(
            403,
            FANOUT_FORBIDDEN,
            "only the app's publisher or a workspace admin may start a per-recipient run",
          );
        }
        starters.set(request, identity);
      },
    },
    async (request) => {
      const { workspace, app: appName } = request.params;
      const identity = starters.get(request)!;
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
    { schema: { params: workspaceParams }, config: { caching: 'per-caller' } },
    async (request) => {
      const { workspace } = request.params;
      const identity = await deps.authenticate(request, workspace);
      return { items: await deps.outbox.list(workspace, identity.email) };
    },
  );
}

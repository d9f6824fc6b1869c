import type { DatatableAccess } from '../connector/datatable_ref.js';
import type { CatalogEvents } from './catalog/catalog_snapshot.js';
import type { LoginEvents } from './logins/role_set_protocol.js';

/**
 * Events of the data-table layer: the front door's own, and those its rooms emit (the catalog's,
 * the logins'). Payloads never carry emails, passwords or args; `access` is the request's kind
 * (`viewer`, `narrowed`, `role`, `default`), never the role names it carried.
 */
export interface DatatablesEvents extends CatalogEvents, LoginEvents {
  /** Roles and login resolved for a connection request. */
  'datatable:resolved': { ms: number; access: DatatableAccess['kind'] };
  /** A pooled connection was lent (`ms` includes opening one if the pool had none idle). */
  'datatable:connected': { ms: number; access: DatatableAccess['kind'] };
  /** A connection request was refused or failed. `code` is the error code. */
  'datatable:refused': { code: string; access: DatatableAccess['kind'] };
}

import type { CatalogEvents } from './catalog/catalog_snapshot.js';
import type { LoginEvents } from './logins/role_set_protocol.js';

/**
 * Events of the data-table layer: the front door's own, and those its rooms emit (the catalog's,
 * the logins'). Payloads never carry emails, passwords or args.
 */
export interface DatatablesEvents extends CatalogEvents, LoginEvents {
  /** Roles and login resolved for a connection request. */
  'datatable:resolved': { ms: number; access: 'viewer' | 'role' | 'default' };
  /** A pooled connection was lent (`ms` includes opening one if the pool had none idle). */
  'datatable:connected': { ms: number; access: 'viewer' | 'role' | 'default' };
  /** A connection request was refused or failed. `code` is the error code. */
  'datatable:refused': { code: string; access: 'viewer' | 'role' | 'default' };
}

/** Events of the data-table layer. Payloads never carry emails, passwords or args. */
export interface DatatablesEvents {
  /** Roles and login resolved for a connection request. */
  'datatable:resolved': { ms: number; access: 'viewer' | 'role' | 'default' };
  /** A pooled connection was lent (`ms` includes opening one if the pool had none idle). */
  'datatable:connected': { ms: number; access: 'viewer' | 'role' | 'default' };
  /** A connection request was refused or failed. `code` is the error code. */
  'datatable:refused': { code: string; access: 'viewer' | 'role' | 'default' };
  'login:created': { ms: number };
  'login:taken-back': { ms: number };
  'login:retired': { login: string };
  /** The catalog was reloaded into memory. */
  'catalog:refreshed': { generation: number };
  /** The LISTEN connection went down or came back. */
  'catalog:listener': { up: boolean };
}

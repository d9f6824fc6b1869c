export type { DatatablesLint, LintCatalog } from './audit/lint_datatables.js';
export { lintDatatables } from './audit/lint_datatables.js';
export type { PolicyFinding, PolicyLint, PolicyLintInput } from './audit/policy_lints.js';
export { lintPolicies, readsViewerIdentity } from './audit/policy_lints.js';
export { cachedResultPath } from './cache/cache_key.js';
export type { ResultCacheStats } from './cache/cache_report.js';
export type { CachedExecutor, EntryPeek } from './cache/result_cache.js';
export { withResultCache } from './cache/result_cache.js';
export type { RawResultCacheOptions, RawSealOptions } from './cache/result_cache_options.js';
export type {
  CopyBound,
  DatatableClient,
  DatatableConnector,
  DatatableLease,
  DatatableQueryResult,
} from './connector/datatable_connector.js';
export type { DatatableAccess, DatatableRef } from './connector/datatable_ref.js';
export {
  accessFromRoleName,
  accessToRoleName,
  DATATABLE_VIEWER_ROLE,
  datatableRefOf,
  formatDatatableRef,
  parseDatatableRef,
  validateRoleName,
} from './connector/datatable_ref.js';
export type {
  FingerprintFn,
  FingerprintTracking,
  SettledFingerprint,
} from './connector/fingerprint.js';
export { withDatatableClient } from './connector/with_datatable_client.js';
export type {
  CatalogAdmin,
  CatalogChange,
  DatatableInfo,
  RoleInfo,
} from './datatable/admin/catalog_admin.js';
export type { Directory, MembershipKind, Principals } from './datatable/catalog/directory.js';
export type { GoverningTableInfo } from './datatable/catalog/governing.js';
export { LATEST_CATALOG_VERSION, migrateCatalog } from './datatable/catalog/migrations.js';
export type { Datatables, RawDatatablesOptions } from './datatable/datatables.js';
export { createDatatables } from './datatable/datatables.js';
export type { DatatablesEvents } from './datatable/datatables_events.js';
export type { JobExplanation } from './datatable/datatables_explain.js';
export type { SetLoginInfo } from './datatable/logins/login_gc.js';
export type { ByteSize, Duration } from './duration.js';
export type {
  EmbedAlgorithm,
  EmbedKey,
  EmbedKeySource,
  EmbedVerifier,
  RawEmbedVerifierOptions,
} from './embed/embed_assertion.js';
export {
  createEmbedVerifier,
  EMBED_ALGORITHMS,
  EMBED_TOKEN_TYPE,
  embedAudience,
} from './embed/embed_assertion.js';
export type { EmbedClaims, EmbedKeyPair } from './embed/embed_signing.js';
export { createEmbedKeyPair, signEmbedAssertion } from './embed/embed_signing.js';
export type { EmbedViewer } from './embed_viewer.js';
export type { ErrorCode, ErrorOptions } from './errors.js';
export {
  AgentProtocolError,
  AppsModuleInvalidError,
  AppsModuleLoadFailedError,
  AppsModuleNotFoundError,
  ArgsNotJsonError,
  CatalogError,
  ConfigError,
  ConnectFailedError,
  ConnectionLostError,
  DatabaseUnreachableError,
  DatatableUnavailableError,
  DatatableUnreachableError,
  DuckdbRefusedError,
  DuckdbUnavailableError,
  EmbedAudienceError,
  EmbedExpiredError,
  EmbedInvalidError,
  EmbedRevokedError,
  ExecutorFailedError,
  ExecutorTimeoutError,
  errorClassOf,
  errors,
  InvalidationUnsupportedError,
  InvalidDataError,
  InvalidDatatableRefError,
  InvalidJobError,
  InvalidRoleNameError,
  JobTokenInvalidError,
  NoDefaultRoleError,
  NoRolesError,
  NoViewerAttributeError,
  NoViewerError,
  NoWorkersError,
  PoolerUnsafeError,
  PythonUnavailableError,
  QueryFailedError,
  QueryTimeoutError,
  QueueJobRefusedError,
  QueueResultInvalidError,
  QueueTimeoutError,
  QueueUnavailableError,
  QueueWorkerLostError,
  ResultNotJsonError,
  ResultTooLargeError,
  RoleNotPermittedError,
  RoleRequiredError,
  RoleResolutionFailedError,
  SealRequiredError,
  SecretMismatchError,
  StatementRefusedError,
  StoreNotReadyError,
  StoreUnavailableError,
  TransactionEndedError,
  TransactionLimitError,
  TransactionUnknownError,
  UnknownDatatableError,
  UnknownRoleError,
  UnknownRunnableError,
  ViewerCacheError,
  WorkerMisconfiguredError,
} from './errors.js';
export type {
  BypassReason,
  NotStoredReason,
  RejectionReason,
  ResultCacheEvents,
  TypedEmitter,
} from './events.js';
export type {
  DuckdbAppenderLike,
  DuckdbConnectionLike,
  DuckdbInstanceLike,
} from './executor/duckdb/duckdb_run.js';
export type {
  DatatableRequest,
  DuckdbModule,
  DuckdbRunnable,
  Executor,
  JobRequest,
  JobTokenIssuer,
  PythonRunnable,
  RawDuckdbOptions,
  RawExecutorOptions,
  RawPythonOptions,
  RunContext,
  RunnableDefinition,
  SqlRunnable,
  TsRunnable,
} from './executor/executor.js';
export { createExecutor } from './executor/executor.js';
export type { RequiredRole } from './executor/runnable.js';
export type {
  Job,
  JobExecutor,
  JobPerms,
  RunnableRef,
  RunOptions,
  RunOrigin,
  ViewerIdentityOfRun,
} from './job.js';
export {
  recordRoleScope,
  recordViewer,
  recordViewerIdentity,
  WORKSPACE_PATTERN,
  WORKSPACE_RE,
} from './job.js';
export type { JobResult } from './job_result.js';
export type { Logger } from './logger.js';
export { redactIdentity } from './logger.js';
export type { Migration, MigrationPlan } from './pg/migration_runner.js';
export { runMigrations } from './pg/migration_runner.js';
/** Why an error (or its cause chain) says a database cannot be reached, or null: for retries. */
export { isDataException, unreachableReason } from './pg/sqlstate.js';
export { withTransaction } from './pg/transaction.js';
export type {
  ProxiedTransactionQuery,
  ProxiedTransactionResult,
  RawProxyTransactionLimits,
} from './proxy/proxy_transactions.js';
export { endedItsTransaction, ProxyTransactions } from './proxy/proxy_transactions.js';
export type {
  ProxiedQuery,
  ProxiedQueryResult,
  ProxiedReference,
  ProxiedRoleCheck,
  QueryProxyDeps,
  RawQueryProxyLimits,
  RunningJobs,
} from './proxy/query_proxy.js';
export {
  AGENT_PROTOCOL_VERSION,
  runProxiedQuery,
  runProxiedRoleCheck,
} from './proxy/query_proxy.js';
export { migrateQueue, QUEUE_SCHEMA } from './queue/job_records.js';
export { queueFailureCode } from './queue/queue_claim.js';
export type {
  QueueExecutor,
  QueueRedis,
  RawQueueExecutorOptions,
} from './queue/queue_executor.js';
export { createQueueExecutor } from './queue/queue_executor.js';
export type {
  HeldQueueJob,
  QueueJobSource,
  RawQueueJobSourceOptions,
} from './queue/queue_job_source.js';
export { createQueueJobSource } from './queue/queue_job_source.js';
export { QUEUE_DEFAULTS } from './queue/queue_names.js';
export type { QueueTakerOptions } from './queue/queue_taker.js';
export type {
  QueueJobOutcome,
  QueueWorker,
  RawQueueWorkerOptions,
} from './queue/queue_worker.js';
export { createQueueWorker } from './queue/queue_worker.js';
export type {
  JobTokenRedis,
  RawSharedJobTokensOptions,
  SharedJobTokenGrant,
} from './queue/shared_job_tokens.js';
export { SharedJobTokens } from './queue/shared_job_tokens.js';
export { publishInvalidation, RedisInvalidationBus } from './stores/invalidation_bus.js';
export type { RawMemoryCacheStoreOptions } from './stores/memory_store.js';
export { MemoryCacheStore } from './stores/memory_store.js';
export { pathTag } from './stores/path_tag.js';
export type { RawRedisCacheStoreOptions } from './stores/redis_store.js';
export { RedisCacheStore } from './stores/redis_store.js';
export type {
  CacheInvalidation,
  CacheStore,
  InvalidatingCacheStore,
  InvalidationScope,
  MemoryTier,
  StoreTiers,
} from './stores/store.js';
export type {
  OpenTwoTierStoreOptions,
  RawTwoTierCacheStoreOptions,
} from './stores/two_tier_store.js';
export {
  createTwoTierStore,
  openTwoTierStore,
  TwoTierCacheStore,
} from './stores/two_tier_store.js';
export {
  clientTraced,
  runTraced,
  sdkTracer,
  TRACER_NAME,
  traceparentOf,
} from './tracing.js';
export type {
  RawViewerCacheOptions,
  ViewerCache,
  ViewerCacheDatatables,
  ViewerFunction,
  ViewerRun,
} from './viewer_cache/viewer_cache.js';
export { createViewerCache } from './viewer_cache/viewer_cache.js';

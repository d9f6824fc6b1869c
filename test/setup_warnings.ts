// Loaded before every test file (vitest `setupFiles`): warnings that are bugs fail the run.
// Servers started as child processes are checked by their helper (server_e2e.ts).
import { failOnQueryOverlap } from './helpers/query_overlap.js';

failOnQueryOverlap();

// Loaded before every test file (vitest `setupFiles`): warnings that are bugs fail the run, and
// so does a file that leaves a builtin changed for the next file of its worker.
// Servers started as child processes are checked by their helper (server_e2e.ts).
import { failWhenBuiltinsChange } from './helpers/builtins_intact.js';
import { failOnQueryOverlap } from './helpers/query_overlap.js';

failOnQueryOverlap();
failWhenBuiltinsChange();

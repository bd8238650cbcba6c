// A Node tool runner that stalls, built on the stallwatch Node kit (path in
// STALLWATCH_NODE_KIT). The forensics hook (header line in STALLWATCH_STACKS_FILE +
// process.report on SIGUSR2, and the STACKS answer on the heartbeat socket) comes from
// the kit's setup() when the kit provides it; else this script does the SIGUSR2 part of
// the contract itself.
//
// Usage: node runner.js MODE    (the tool span is always `run_notebook`)
//   promise  awaits a promise that never resolves (the event loop is idle)
//   busy     a busy loop on the event loop thread
// Lines the tests look for carry a `// FRAME:<name>` marker.
'use strict';
const fs = require('fs');
const path = require('path');
const sw = require(process.env.STALLWATCH_NODE_KIT);

const mode = process.argv[2];
sw.setup({ refreshIntervalMs: 500 });
const stacksFile = process.env.STALLWATCH_STACKS_FILE;
function kitWroteHeader() {
  try {
    const first = fs.readFileSync(stacksFile, 'utf8').split('\n')[0];
    return first.startsWith(`stallwatch-stacks v1 pid=${process.pid} `);
  } catch {
    return false;
  }
}
if (stacksFile && !kitWroteHeader()) {
  const report = `${stacksFile}.report.json`;
  process.report.directory = path.dirname(report);
  process.report.filename = path.basename(report);
  process.report.signal = 'SIGUSR2';
  process.report.reportOnSignal = true;
  fs.writeFileSync(stacksFile, `stallwatch-stacks v1 pid=${process.pid} signal=SIGUSR2 runtime=node report=${report}\n`);
}
console.log(`forensics runner pid ${process.pid} mode ${mode}`);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitForever() {
  await new Promise(() => {}); // FRAME:waitForever
}

function spin() {
  let x = 0;
  // One line: V8 takes the stack at the loop's back edge, which it reports as the `for`.
  for (;;) { x += 1; } // FRAME:spin
}

async function busy() {
  await sleep(500); // let the span's start snapshot go out
  spin();
}

sw.withToolSpan('run_notebook', mode === 'promise' ? waitForever : busy);
setInterval(() => {}, 60000);

'use strict';
/**
 * @stallwatch/runner: lets stallwatch see a Node tool runner that is stuck.
 * See README.md.
 */
module.exports = {
  ...require('./lib/heartbeat'),
  ...require('./lib/crash'),
  ...require('./lib/onstart'),
  ...require('./lib/setup'),
  Agent: require('./lib/watch').Agent,
  WatchSpanProcessor: require('./lib/watch').WatchSpanProcessor,
  heartbeatTimeoutMs: require('./lib/watch').heartbeatTimeoutMs,
};

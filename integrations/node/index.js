'use strict';
/**
 * @stallwatch/runner: lets stallwatch see a Node tool runner that is stuck.
 * See integrations/README.md.
 */
module.exports = {
  ...require('./lib/heartbeat'),
  ...require('./lib/crash'),
  ...require('./lib/onstart'),
  ...require('./lib/setup'),
};

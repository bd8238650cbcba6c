// The unmodified Node MCP client (@modelcontextprotocol/sdk) driving `stallwatch mcp wrap`.
// Usage: node client.mjs DASHBOARD_URL RUNNER_ID -- WRAPPER_ARGV... ; one JSON line per step.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [dashboard, runnerId] = process.argv.slice(2, 4);
const wrapper = process.argv.slice(process.argv.indexOf("--") + 1);
const out = (o) => console.log(JSON.stringify(o));

const call = async (client, name, args = {}) => {
  const t0 = Date.now();
  try {
    const r = await client.callTool({ name, arguments: args }, undefined, { timeout: 120_000 });
    return { tool: name, ok: true, is_error: !!r.isError, text: r.content?.[0]?.text, elapsed_ms: Date.now() - t0 };
  } catch (e) {
    return { tool: name, ok: false, code: e.code, message: e.message, data: e.data, elapsed_ms: Date.now() - t0 };
  }
};

const admitted = async () => {
  for (let i = 0; i < 400; i++) {
    try {
      const r = await fetch(`${dashboard}/api/v1/runners/${runnerId}/admit`);
      if (r.status === 200) return true;
    } catch {}
    await new Promise((res) => setTimeout(res, 100));
  }
  return false;
};

const transport = new StdioClientTransport({ command: wrapper[0], args: wrapper.slice(1), stderr: "inherit" });
const client = new Client({ name: "stallwatch-node-test-client", version: "1.0.0" });
await client.connect(transport);
out({ step: "initialize", server: client.getServerVersion()?.name });
const tools = await client.listTools();
out({ step: "tools", names: tools.tools.map((t) => t.name).sort() });
out({ step: "first", ...(await call(client, "add", { a: 1, b: 2 })) });
out({ step: "stuck", ...(await call(client, "spin")) });
out({ step: "admitted", ok: await admitted() });
out({ step: "after", ...(await call(client, "add", { a: 20, b: 22 })) });
await client.close();
out({ step: "closed" });

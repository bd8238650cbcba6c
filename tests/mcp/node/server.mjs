// An unmodified Node MCP server (@modelcontextprotocol/sdk) for the `mcp` whole-system
// tests: `add` (healthy) and `spin` (a busy loop that blocks the event loop, so ping stops).
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";

const server = new McpServer({ name: "stallwatch-node-test-server", version: "1.0.0" });

server.registerTool(
  "add",
  { description: "Adds two numbers", inputSchema: { a: z.number(), b: z.number() } },
  async ({ a, b }) => ({ content: [{ type: "text", text: String(a + b) }] }),
);

server.registerTool(
  "spin",
  { description: "Blocks the event loop", inputSchema: {}, _meta: { "dev.stallwatch/sla_ms": 60000 } },
  async () => {
    const end = Date.now() + 600_000;
    while (Date.now() < end) { /* the event loop is stuck */ }
    return { content: [{ type: "text", text: "unreachable" }] };
  },
);

await server.connect(new StdioServerTransport());

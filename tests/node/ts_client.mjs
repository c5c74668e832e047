// The TypeScript SDK's client (@modelcontextprotocol/sdk, 2025-11-25) running one scenario of
// the never-worse matrix against one MCP URL, for tests/integration/test_never_worse.py.
//
//   node ts_client.mjs NODE_MCP_HOME URL < scenario.json > outcome.json
//
// NODE_MCP_HOME is where scripts/install-node-mcp installed the SDK. The scenario and the
// outcome have the shapes tests/matrix_clients.py documents; the Python SDK client's driver
// there prints the same shapes, so the test compares either client's runs the same way.
// The client answers the server's requests with the canned answers both drivers share
// (tests/matrix_clients.py CANNED, passed in the scenario's "canned").
import { createRequire } from "node:module";
import { join } from "node:path";

const [home, url] = process.argv.slice(2);
const require = createRequire(join(home, "package.json"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");
const types = require("@modelcontextprotocol/sdk/types.js");

const scenario = JSON.parse(await readStdin());
const canned = scenario.canned;
const asked = [];
const notifications = [];
const waiters = [];

function readStdin() {
    return new Promise((resolve, reject) => {
        const chunks = [];
        process.stdin.on("data", (chunk) => chunks.push(chunk));
        process.stdin.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
        process.stdin.on("error", reject);
    });
}

function seen(method) {
    return notifications.filter((n) => n.method === method);
}

function noted(notification) {
    notifications.push({ method: notification.method, params: notification.params ?? {} });
    for (const waiter of [...waiters]) waiter();
}

function waitFor(method, count, seconds) {
    return new Promise((resolve) => {
        const check = () => {
            if (seen(method).length >= count) {
                finish({ result: { seen: seen(method).map((n) => n.params) } });
            }
        };
        const timer = setTimeout(() => finish({ timeout: true }), seconds * 1000);
        const finish = (outcome) => {
            clearTimeout(timer);
            const at = waiters.indexOf(check);
            if (at >= 0) waiters.splice(at, 1);
            resolve(outcome);
        };
        waiters.push(check);
        check();
    });
}

const capabilities = {};
const wants = scenario.capabilities ?? [];
if (wants.includes("sampling")) capabilities.sampling = {};
if (wants.includes("elicitation")) capabilities.elicitation = { form: {}, url: {} };
if (wants.includes("roots")) capabilities.roots = { listChanged: true };

const client = new Client({ name: "never-worse-ts", version: "1.0.0" }, { capabilities });
client.fallbackNotificationHandler = async (notification) => noted(notification);
if (capabilities.sampling) {
    client.setRequestHandler(types.CreateMessageRequestSchema, async (request) => {
        asked.push({ method: request.method, params: request.params });
        const text = request.params.messages[0].content.text;
        return { role: "assistant", model: canned.model, content: { type: "text", text: text.toUpperCase() } };
    });
}
if (capabilities.elicitation) {
    client.setRequestHandler(types.ElicitRequestSchema, async (request) => {
        asked.push({ method: request.method, params: request.params });
        if (request.params.mode === "url") return { action: "accept" };
        return { action: "accept", content: canned.elicited };
    });
}
if (capabilities.roots) {
    client.setRequestHandler(types.ListRootsRequestSchema, async (request) => {
        asked.push({ method: request.method, params: request.params ?? {} });
        return { roots: canned.roots };
    });
}

function failure(error) {
    if (error instanceof types.McpError) {
        if (error.code === types.ErrorCode.RequestTimeout && error.data?.timeout !== undefined) {
            return { timeout: true };
        }
        const prefix = `MCP error ${error.code}: `;
        const message = error.message.startsWith(prefix) ? error.message.slice(prefix.length) : error.message;
        const out = { code: error.code, message };
        if (error.data !== undefined) out.data = error.data;
        return { error: out };
    }
    return { error: { client: String(error) } };
}

async function all(list, key, params = {}) {
    const items = [];
    let cursor;
    for (let page = 0; page < 1000; page++) {
        const result = await list(cursor === undefined ? params : { ...params, cursor });
        items.push(...result[key]);
        cursor = result.nextCursor;
        if (!cursor) return { [key]: items };
    }
    throw new Error(`${key}: too many pages`);
}

const STEPS = {
    "tools/list": () => all((p) => client.listTools(p), "tools"),
    "prompts/list": () => all((p) => client.listPrompts(p), "prompts"),
    "resources/list": () => all((p) => client.listResources(p), "resources"),
    "resources/templates/list": () => all((p) => client.listResourceTemplates(p), "resourceTemplates"),
    "resources/read": (step) => client.readResource({ uri: step.uri }),
    "prompts/get": (step) => client.getPrompt({ name: step.name, arguments: step.arguments ?? {} }),
    "completion/complete": (step) =>
        client.complete({ ref: step.ref, argument: step.argument, ...(step.context ? { context: step.context } : {}) }),
    "logging/setLevel": (step) => client.setLoggingLevel(step.level),
    "watch": async (step) => {
        // A 2025 session gets list changes on its standalone stream without asking.
        for (const uri of step.resources ?? []) await client.subscribeResource({ uri });
        return {};
    },
};

async function callTool(step, outcome) {
    const progress = [];
    const controller = new AbortController();
    const options = { timeout: (step.timeout ?? 30) * 1000, signal: controller.signal };
    if (step.progress) {
        options.onprogress = (p) => {
            progress.push(p);
            // The first progress says the server has the call: cancel it now.
            if (step.cancelOnProgress) controller.abort("cancelled by the test");
        };
    }
    try {
        outcome.result = await client.callTool({ name: step.name, arguments: step.arguments ?? {} }, undefined, options);
    } catch (error) {
        if (controller.signal.aborted) outcome.cancelled = true;
        else Object.assign(outcome, failure(error));
    }
    if (step.progress) outcome.progress = progress;
}

async function run(step) {
    const outcome = {};
    try {
        if (step.op === "tools/call") await callTool(step, outcome);
        else if (step.op === "wait") Object.assign(outcome, await waitFor(step.method, step.count ?? 1, step.timeout ?? 5));
        else if (step.op === "streams") Object.assign(outcome, await standaloneStreamOpen(step.timeout ?? 5));
        else if (STEPS[step.op]) outcome.result = await STEPS[step.op](step);
        else outcome.error = { client: `unknown step ${step.op}` };
    } catch (error) {
        Object.assign(outcome, failure(error));
    }
    return outcome;
}

// The session's standalone stream (GET) is open once the server has answered it: what the
// server sends from then on reaches this client. The SDK opens it in the background.
let streamOpened;
const streamOpen = new Promise((resolve) => { streamOpened = resolve; });

async function observingFetch(input, init) {
    const response = await fetch(input, init);
    if ((init?.method ?? "GET") === "GET" && response.ok) streamOpened();
    return response;
}

function standaloneStreamOpen(seconds) {
    let timer;
    const late = new Promise((resolve) => { timer = setTimeout(() => resolve({ timeout: true }), seconds * 1000); });
    return Promise.race([streamOpen.then(() => ({})), late]).finally(() => clearTimeout(timer));
}

const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: observingFetch });
const out = { steps: [] };
try {
    await client.connect(transport);
    out.protocolVersion = transport.protocolVersion;
    out.initialize = {
        capabilities: client.getServerCapabilities() ?? {},
        instructions: client.getInstructions(),
        serverInfo: client.getServerVersion(),
    };
    for (const step of scenario.steps) out.steps.push(await run(step));
} catch (error) {
    out.connect = failure(error);
}
out.asked = asked;
out.notifications = notifications;
try {
    await transport.terminateSession();
} catch {
    // a server without sessions (or one already gone) answers 405 or 404
}
await client.close();
process.stdout.write(JSON.stringify(out));
process.exit(0);

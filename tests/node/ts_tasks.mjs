// The TypeScript SDK client's experimental task API (@modelcontextprotocol/sdk,
// client.experimental.tasks) running one scenario against one MCP URL, for comparing a
// direct connection with one through the gateway (tests/ts_tasks.py documents the shapes).
//
//   node ts_tasks.mjs NODE_MCP_HOME URL < scenario.json > outcome.json
//
// NODE_MCP_HOME is where scripts/install-node-mcp installed the SDK. The client declares
// form elicitation and answers every elicitation/create with "accept": the scenario's
// "elicit" content if given, else the first choice (oneOf const / enum) or a canned value
// for each property the requested schema names.
//
// The outcome is meant to be compared field for field, so it holds nothing that differs by
// itself between two runs:
//   * task ids are replaced by labels "T1", "T2", ... in the order the client first saw them
//     (in any string of the outcome), so a gateway that rewrites ids compares equal as long
//     as it rewrites them consistently;
//   * createdAt / lastUpdatedAt are replaced by "<time>";
//   * the streamed taskStatus messages (one per poll of tasks/get, so their number depends
//     on timing) are collapsed: consecutive messages with the same status are one entry,
//     with the statusMessage of the first of them and "polls" left out (a step with
//     "raw": true adds every message as it came, which is not stable).
import { createRequire } from "node:module";
import { join } from "node:path";

const [home, url] = process.argv.slice(2);
const require = createRequire(join(home, "package.json"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");
const types = require("@modelcontextprotocol/sdk/types.js");

const RELATED_TASK = types.RELATED_TASK_META_KEY; // "io.modelcontextprotocol/related-task"
const TERMINAL = new Set(["completed", "failed", "cancelled"]);

const scenario = JSON.parse(await readStdin());

function readStdin() {
    return new Promise((resolve, reject) => {
        const chunks = [];
        process.stdin.on("data", (chunk) => chunks.push(chunk));
        process.stdin.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
        process.stdin.on("error", reject);
    });
}

// -- task id labels -------------------------------------------------------------------------

const labels = new Map(); // raw task id -> "T<n>"

function label(taskId) {
    if (typeof taskId !== "string") return taskId;
    if (!labels.has(taskId)) labels.set(taskId, `T${labels.size + 1}`);
    return labels.get(taskId);
}

function rawId(taskLabel) {
    for (const [raw, known] of labels) if (known === taskLabel) return raw;
    return taskLabel; // not a label: the scenario named a raw id (e.g. an unknown one)
}

// Every raw task id in any string of `value` replaced by its label (ids the client learned).
function relabel(value) {
    if (typeof value === "string") {
        let out = value;
        for (const [raw, known] of labels) out = out.split(raw).join(known);
        return out;
    }
    if (Array.isArray(value)) return value.map(relabel);
    if (value && typeof value === "object") {
        return Object.fromEntries(Object.entries(value).map(([key, item]) => [relabel(key), relabel(item)]));
    }
    return value;
}

// A task as the server described it: its id labelled, its times scrubbed.
function task(described) {
    const out = { ...described };
    if ("taskId" in out) out.taskId = label(out.taskId);
    for (const key of ["createdAt", "lastUpdatedAt"]) if (typeof out[key] === "string") out[key] = "<time>";
    return out;
}

function relatedTask(meta) {
    const related = meta?.[RELATED_TASK];
    if (related === undefined) return null;
    return typeof related?.taskId === "string" ? label(related.taskId) : { malformed: related };
}

// -- what the server sends the client -------------------------------------------------------

const asked = []; // elicitation requests, in order
const taskNotifications = []; // notifications/tasks/status, in order
const otherNotifications = [];
const waiters = [];
let lastStreamed = null; // the last streamed message, for placing an elicitation in the stream

function noted() {
    for (const waiter of [...waiters]) waiter();
}

function cannedValue(property) {
    const choices = property.oneOf ?? property.anyOf;
    if (Array.isArray(choices) && choices.length && "const" in choices[0]) return choices[0].const;
    if (Array.isArray(property.enum) && property.enum.length) return property.enum[0];
    if (property.default !== undefined) return property.default;
    if (property.type === "boolean") return true;
    if (property.type === "number" || property.type === "integer") return 1;
    return "yes";
}

function answer(params) {
    if (scenario.elicit !== undefined) return scenario.elicit;
    const properties = params.requestedSchema?.properties ?? {};
    return Object.fromEntries(Object.entries(properties).map(([name, property]) => [name, cannedValue(property)]));
}

const client = new Client({ name: "ts-tasks", version: "1.0.0" }, { capabilities: { elicitation: { form: {} } } });
client.setRequestHandler(types.ElicitRequestSchema, async (request) => {
    const params = request.params;
    const content = answer(params);
    const entry = { method: request.method, message: params.message, requestedSchema: params.requestedSchema };
    if (params.mode !== undefined) entry.mode = params.mode;
    entry.relatedTask = relatedTask(params._meta);
    entry.after = lastStreamed; // where in the tool call's stream it came
    entry.answered = { action: "accept", content };
    asked.push(entry);
    noted();
    return { action: "accept", content };
});
client.setNotificationHandler(types.TaskStatusNotificationSchema, async (notification) => {
    const { _meta, ...described } = notification.params;
    const entry = task(described);
    if (_meta !== undefined && Object.keys(_meta).length) entry._meta = _meta;
    taskNotifications.push(entry);
    noted();
});
client.fallbackNotificationHandler = async (notification) => {
    otherNotifications.push(notification.method);
};

function failure(error) {
    if (error instanceof types.McpError) {
        const prefix = `MCP error ${error.code}: `;
        const message = error.message.startsWith(prefix) ? error.message.slice(prefix.length) : error.message;
        const out = { code: error.code, message };
        if (error.data !== undefined) out.data = error.data;
        return { error: out };
    }
    return { error: { client: String(error) } };
}

function toolResult(result) {
    const out = { ...result };
    if (out._meta !== undefined) {
        const { [RELATED_TASK]: related, ...rest } = out._meta;
        out._meta = rest;
        if (related !== undefined) out._meta[RELATED_TASK] = { taskId: relatedTask({ [RELATED_TASK]: related }) };
        if (!Object.keys(out._meta).length) delete out._meta;
    }
    return out;
}

// -- steps ----------------------------------------------------------------------------------

let toolsListed = null;

async function listTools() {
    // also what makes the client know which tools are tasks (it caches execution.taskSupport)
    const tools = [];
    let cursor;
    for (let page = 0; page < 1000; page++) {
        const result = await client.listTools(cursor === undefined ? {} : { cursor });
        tools.push(...result.tools);
        cursor = result.nextCursor;
        if (!cursor) return tools;
    }
    throw new Error("tools/list: too many pages");
}

function streamed(message) {
    if (message.type === "taskCreated" || message.type === "taskStatus") {
        const entry = { type: message.type, ...task(message.task) };
        delete entry.createdAt;
        delete entry.lastUpdatedAt;
        return entry;
    }
    if (message.type === "result") return { type: "result", result: toolResult(message.result) };
    if (message.type === "error") return { type: "error", ...failure(message.error) };
    return { type: message.type };
}

// Consecutive taskStatus messages with the same status as one entry (see the top).
function collapsed(raw) {
    const out = [];
    for (const entry of raw) {
        const previous = out[out.length - 1];
        if (entry.type === "taskStatus" && previous?.type === "taskStatus" && previous.status === entry.status
            && previous.taskId === entry.taskId) continue;
        const kept = { ...entry };
        if (entry.type === "taskCreated") delete kept.statusMessage; // set or not yet, by a race in the server
        out.push(kept);
    }
    return out;
}

async function callToolStream(step) {
    const outcome = {};
    if (toolsListed === null) toolsListed = await listTools();
    const tool = toolsListed.find((t) => t.name === step.name);
    outcome.taskSupport = tool === undefined ? "<unlisted>" : (tool.execution?.taskSupport ?? null);
    const askedBefore = asked.length;
    const options = { timeout: (step.timeout ?? 30) * 1000 };
    if (step.task !== undefined) options.task = step.task;
    const raw = [];
    lastStreamed = null;
    const stream = client.experimental.tasks.callToolStream(
        { name: step.name, arguments: step.arguments ?? {} }, undefined, options);
    for await (const message of stream) {
        const entry = streamed(message);
        raw.push(entry);
        lastStreamed = entry.status ?? entry.type;
        if (step.until !== undefined && message.type === step.until) break; // leaves the task running
    }
    lastStreamed = null;
    outcome.stream = collapsed(raw);
    if (step.raw) outcome.raw = raw;
    outcome.elicitations = asked.slice(askedBefore);
    return outcome;
}

function waitFor(predicate, seconds) {
    return new Promise((resolve) => {
        const check = () => {
            if (predicate()) finish({ seen: true });
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

async function listTasks() {
    const tasks = [];
    let cursor;
    for (let page = 0; page < 1000; page++) {
        const result = await client.experimental.tasks.listTasks(cursor);
        tasks.push(...result.tasks.map(task));
        cursor = result.nextCursor;
        if (!cursor) return { count: tasks.length, tasks };
    }
    throw new Error("tasks/list: too many pages");
}

const STEPS = {
    "tools/list": async () => {
        toolsListed = await listTools();
        return { result: { tools: toolsListed.map((t) => ({ name: t.name, taskSupport: t.execution?.taskSupport ?? null })) } };
    },
    callToolStream,
    "tasks/get": async (step) => ({ result: task(await client.experimental.tasks.getTask(rawId(step.task))) }),
    "tasks/result": async (step) =>
        ({ result: toolResult(await client.experimental.tasks.getTaskResult(rawId(step.task), types.CallToolResultSchema)) }),
    "tasks/list": async () => ({ result: await listTasks() }),
    "tasks/cancel": async (step) => {
        const { _meta, ...described } = await client.experimental.tasks.cancelTask(rawId(step.task));
        return { result: task(described) };
    },
    // until a notifications/tasks/status for the task with that status has come (or timeout)
    "waitTaskStatus": (step) => waitFor(
        () => taskNotifications.some((n) => n.taskId === step.task && n.status === step.status), step.timeout ?? 10),
    "sleep": async (step) => {
        await new Promise((resolve) => setTimeout(resolve, step.seconds * 1000));
        return {};
    },
};

async function run(step) {
    const known = STEPS[step.op];
    if (known === undefined) return { error: { client: `unknown step ${step.op}` } };
    try {
        return await known(step);
    } catch (error) {
        return failure(error);
    }
}

const transport = new StreamableHTTPClientTransport(new URL(url));
const out = { steps: [] };
try {
    await client.connect(transport);
    out.protocolVersion = transport.protocolVersion;
    out.tasksCapability = client.getServerCapabilities()?.tasks ?? null;
    for (const step of scenario.steps) out.steps.push({ op: step.op, ...(await run(step)) });
} catch (error) {
    out.connect = failure(error);
}
out.elicitations = asked;
out.taskNotifications = taskNotifications;
out.otherNotifications = [...new Set(otherNotifications)].sort();
try {
    await transport.terminateSession();
} catch {
    // a server without sessions (or one already gone) answers 405 or 404
}
await client.close();
process.stdout.write(JSON.stringify(relabel(out)));
process.exit(0);

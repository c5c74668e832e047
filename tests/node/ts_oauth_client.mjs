// The TypeScript SDK's client (@modelcontextprotocol/sdk) signing in to an OAuth-protected MCP
// server with the SDK's own flow (an OAuthClientProvider: discovery, dynamic registration or a
// client ID metadata document, PKCE, RFC 8707 resource), then listing the server's tools and
// calling one; for tests/oauth_clients.py (TsSdkClient).
//
//   node ts_oauth_client.mjs NODE_MCP_HOME URL OPTIONS_JSON
//
// OPTIONS_JSON: {"callbackPort": 0, "callbackHost": "127.0.0.1", "callbackPath": "/callback",
//           "store": "/path/store.json" | null, "clientMetadataUrl": "https://..." | null,
//           "clientMetadata": {...} (merged over the defaults below), "call": {"name", "arguments"} | null,
//           "printTokens": false, "elicitation": false}
//
// With "elicitation", the client declares URL elicitation and accepts every request at once,
// printing it first ({"elicit": params}: the caller opens its URL); the outcome then also has
// "elicitations" (their ids) and "completed" (the ids of notifications/elicitation/complete).
//
// The redirect URI is http://<callbackHost>:<callbackPort><callbackPath>, served by this script
// (port 0: one the system picks). With "store", the registration and tokens are read from that
// file at start and written to it on every change, so a second run signs in with what the
// first stored; without it they live in memory only.
//
// stdout carries one JSON object a line:
//   {"authorize": URL}   the authorization URL: the caller plays the user with it (a browser, or
//                        a redirect follower); this script waits for the redirect to its loopback
//                        callback, then finishes the sign-in (transport.finishAuth)
//   {"outcome": {...}}   the last line: "tools" (names), "call" ({"text", "isError"} or null),
//                        "protocolVersion", "authorizations" (how many sign-ins were started),
//                        "tokensSaved" (how many times the SDK saved tokens), "hadTokens" (the
//                        store held tokens at start), "callback" (the redirect's query without
//                        code and state), "tokens" (only with printTokens: what the SDK saved)
// A failure prints {"error": message} and exits 1. Nothing else is printed: tokens stay out
// of stdout unless printTokens asks for them.
import { randomBytes } from "node:crypto";
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { createRequire } from "node:module";
import { join } from "node:path";

const [home, url, optionsJson] = process.argv.slice(2);
const require = createRequire(join(home, "package.json"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");
const { UnauthorizedError } = require("@modelcontextprotocol/sdk/client/auth.js");
const { ElicitRequestSchema, ElicitationCompleteNotificationSchema } = require("@modelcontextprotocol/sdk/types.js");

function emit(line) {
    process.stdout.write(JSON.stringify(line) + "\n");
}

// The loopback redirect target. `received` settles with the first redirect to `path`: its query
// (code, state, iss...), or an error for an error redirect.
function listenForCallback(host, port, path) {
    let deliver;
    let fail;
    const received = new Promise((resolve, reject) => {
        deliver = resolve;
        fail = reject;
    });
    received.catch(() => {}); // awaited later; not an unhandled rejection meanwhile
    const server = createServer((request, response) => {
        const at = new URL(request.url, `http://${host}`);
        if (at.pathname !== path) {
            response.writeHead(404).end();
            return;
        }
        const query = Object.fromEntries(at.searchParams);
        response.setHeader("Cache-Control", "no-store");
        if (query.error || !query.code) {
            response.writeHead(400, { "Content-Type": "text/plain" }).end("Sign-in failed.");
            fail(new Error(`the authorization server redirected with error ${query.error ?? "(no code)"}: ${query.error_description ?? ""}`));
            return;
        }
        response.writeHead(200, { "Content-Type": "text/plain" }).end("Signed in. You may close this window.");
        deliver(query);
    });
    return new Promise((resolve, reject) => {
        server.once("error", reject);
        server.listen(port, host, () => resolve({ server, received, port: server.address().port }));
    });
}

// The SDK's OAuthClientProvider, kept in memory and, with a store, in that file.
class StoredOAuthProvider {
    constructor(redirectUrl, clientMetadata, clientMetadataUrl, store) {
        this._redirectUrl = redirectUrl;
        this._clientMetadata = clientMetadata;
        if (clientMetadataUrl) this.clientMetadataUrl = clientMetadataUrl;
        this._store = store;
        this._saved = {};
        if (store) {
            try {
                this._saved = JSON.parse(readFileSync(store, "utf8"));
            } catch (error) {
                if (error.code !== "ENOENT") throw error;
            }
        }
        this.hadTokens = !!this._saved.tokens;
        this.authorizations = 0;
        this.tokensSaved = 0;
        this.states = [];
    }

    get redirectUrl() {
        return this._redirectUrl;
    }

    get clientMetadata() {
        return this._clientMetadata;
    }

    state() {
        const state = randomBytes(16).toString("base64url");
        this.states.push(state);
        return state;
    }

    clientInformation() {
        return this._saved.clientInformation;
    }

    saveClientInformation(clientInformation) {
        this._saved.clientInformation = clientInformation;
        this._persist();
    }

    tokens() {
        return this._saved.tokens;
    }

    saveTokens(tokens) {
        this._saved.tokens = tokens;
        this.tokensSaved += 1;
        this._persist();
    }

    redirectToAuthorization(authorizationUrl) {
        this.authorizations += 1;
        emit({ authorize: authorizationUrl.href });
    }

    saveCodeVerifier(codeVerifier) {
        this._codeVerifier = codeVerifier;
    }

    codeVerifier() {
        if (!this._codeVerifier) throw new Error("no code verifier saved");
        return this._codeVerifier;
    }

    invalidateCredentials(scope) {
        if (scope === "all" || scope === "client") delete this._saved.clientInformation;
        if (scope === "all" || scope === "tokens") delete this._saved.tokens;
        if (scope === "all" || scope === "verifier") delete this._codeVerifier;
        this._persist();
    }

    _persist() {
        if (!this._store) return;
        const partial = `${this._store}.${process.pid}.tmp`;
        writeFileSync(partial, JSON.stringify(this._saved), { mode: 0o600 });
        renameSync(partial, this._store);
    }
}

async function allTools(client) {
    const names = [];
    let cursor;
    for (let page = 0; page < 1000; page++) {
        const result = await client.listTools(cursor === undefined ? {} : { cursor });
        names.push(...result.tools.map((tool) => tool.name));
        cursor = result.nextCursor;
        if (!cursor) return names;
    }
    throw new Error("tools/list: too many pages");
}

const options = JSON.parse(optionsJson ?? "{}");
const callbackHost = options.callbackHost ?? "127.0.0.1";
const callbackPath = options.callbackPath ?? "/callback";
const callback = await listenForCallback(callbackHost, options.callbackPort ?? 0, callbackPath);
const redirectUrl = `http://${callbackHost}:${callback.port}${callbackPath}`;
const clientMetadata = {
    client_name: "vmcp-actors TypeScript SDK test client",
    redirect_uris: [redirectUrl],
    grant_types: ["authorization_code", "refresh_token"],
    response_types: ["code"],
    token_endpoint_auth_method: "none",
    ...(options.clientMetadata ?? {}),
};
const provider = new StoredOAuthProvider(redirectUrl, clientMetadata, options.clientMetadataUrl, options.store);
const client = new Client({ name: "vmcp-actors-ts-oauth", version: "1.0.0" },
    { capabilities: options.elicitation ? { elicitation: { url: {} } } : {} });
const elicitations = [];
const completed = [];
if (options.elicitation) {
    client.setRequestHandler(ElicitRequestSchema, async (request) => {
        elicitations.push(request.params.elicitationId ?? null);
        emit({ elicit: request.params });
        return { action: "accept" };
    });
    client.setNotificationHandler(ElicitationCompleteNotificationSchema, (notification) => {
        completed.push(notification.params.elicitationId);
    });
}
let transport;
let callbackQuery = null;

// The first connect meets the server's 401 unless the stored tokens are good: the SDK then
// discovers, registers and calls redirectToAuthorization, and connect throws UnauthorizedError.
// With the code from the callback, finishAuth exchanges it; a new transport connects with the tokens.
async function connect() {
    transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
    try {
        await client.connect(transport);
        return;
    } catch (error) {
        if (!(error instanceof UnauthorizedError) || provider.authorizations === 0) throw error;
    }
    const query = await callback.received;
    if (query.state !== provider.states.at(-1)) throw new Error("the callback's state is not the one this client sent");
    const { code, state, ...rest } = query;
    callbackQuery = rest;
    await transport.finishAuth(code);
    transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
    await client.connect(transport);
}

let exitCode = 0;
try {
    await connect();
    const outcome = {
        tools: await allTools(client),
        call: null,
        protocolVersion: transport.protocolVersion ?? null,
    };
    if (options.call) {
        const result = await client.callTool({ name: options.call.name, arguments: options.call.arguments ?? {} });
        const text = (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
        outcome.call = { text, isError: !!result.isError };
    }
    Object.assign(outcome, {
        authorizations: provider.authorizations,
        tokensSaved: provider.tokensSaved,
        hadTokens: provider.hadTokens,
        callback: callbackQuery,
    });
    if (options.elicitation) Object.assign(outcome, { elicitations, completed });
    if (options.printTokens) outcome.tokens = provider.tokens() ?? null;
    emit({ outcome });
} catch (error) {
    emit({ error: String(error?.stack ?? error) });
    exitCode = 1;
}
try {
    await transport?.terminateSession();
} catch {
    // a server without sessions (or one already gone) answers 405 or 404
}
await client.close();
callback.server.close();
process.exit(exitCode);

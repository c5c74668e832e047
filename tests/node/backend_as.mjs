// An MCP backend's own authorization server for the connect tests: panva's certified
// oidc-provider on a loopback port, driven by tests/connect_backend.py.
//
//   BACKEND_AS_CONFIG='{"port": ..., "resource": ..., ...}' node backend_as.mjs NODE_MCP_HOME
//
// NODE_MCP_HOME is where scripts/install-node-mcp installed oidc-provider. Configuration:
//
//   port              the loopback port to listen on (the issuer is http://127.0.0.1:<port>)
//   resource          the one protected resource (RFC 8707): the backend's MCP URL
//   resource_scope    the scopes that resource takes ("whoami")
//   ttl               {access_token, refresh_token} in seconds
//
// Like an MCP server's authorization server: open dynamic client registration (RFC 7591,
// public clients with token_endpoint_auth_method "none" too), authorization_code with PKCE
// S256, resource indicators with JWT access tokens (RFC 9068) for the resource, a refresh
// token with every code (no offline_access needed), rotated on every use, revocation
// (RFC 7009; revoking a refresh token ends its grant), the iss authorization response
// parameter (RFC 9207). Sign-in and consent are oidc-provider's development pages (any
// login, the password is not checked); the login is the tokens' sub.
//
// Test endpoints (no token or secret in any answer):
//   GET  /_test/grants   {grants: {login: live grants}, revoked: grants revoked at /token/revocation}
//   POST /_test/revoke   {"sub": login}: the AS's operator ends every grant of that person
//
// Prints "READY <issuer>" on stdout once listening, and nothing else there. Exits when stdin
// closes (so it never outlives the test process) or on SIGTERM. Logs no token or secret.
import { generateKeyPairSync, randomBytes } from "node:crypto";
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

import { serveUntilStdinCloses, withoutWebFonts } from "./serve_provider.mjs";

const [home] = process.argv.slice(2);
const require = createRequire(join(home, "package.json"));
const { default: Provider, errors } = await import(pathToFileURL(require.resolve("oidc-provider")).href);

const config = JSON.parse(process.env.BACKEND_AS_CONFIG);
const issuer = `http://127.0.0.1:${config.port}`;
const resourceScope = config.resource_scope ?? "whoami";

// A fresh signing key per run: the backend learns it from the AS's JWKS.
const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: "jwk" }), kid: randomBytes(8).toString("hex"), use: "sig", alg: "RS256" };

const provider = new Provider(issuer, {
    jwks: { keys: [signingKey] },
    cookies: { keys: [randomBytes(32).toString("hex")] },
    clientAuthMethods: ["none", "client_secret_basic", "client_secret_post"],
    responseTypes: ["code"],
    features: {
        registration: { enabled: true },  // open: no initial access token
        devInteractions: { enabled: true },
        revocation: { enabled: true },
        resourceIndicators: {
            enabled: true,
            defaultResource: async () => config.resource,
            useGrantedResource: async () => true,
            getResourceServerInfo: async (ctx, indicator) => {
                if (indicator !== config.resource) {
                    throw new errors.InvalidTarget();
                }
                return {
                    scope: resourceScope,
                    audience: config.resource,
                    accessTokenTTL: config.ttl.access_token,
                    accessTokenFormat: "jwt",
                    jwt: { sign: { alg: "RS256" } },
                };
            },
        },
    },
    pkce: { required: () => true },
    scopes: ["openid", "offline_access", ...resourceScope.split(" ")],
    issueRefreshToken: async (ctx, client) => client.grantTypeAllowed("refresh_token"),
    expiresWithSession: async () => false,
    rotateRefreshToken: true,
    ttl: {
        AccessToken: config.ttl.access_token,
        RefreshToken: config.ttl.refresh_token,
        Grant: Math.max(config.ttl.refresh_token, 14 * 24 * 3600),
        Session: 14 * 24 * 3600,
    },
    findAccount: async (ctx, login) => ({ accountId: login, async claims() { return { sub: login }; } }),
});
provider.proxy = false;

// Live grants by id, with their person: what /_test/grants counts and /_test/revoke ends.
const grants = new Map();
let revokedAtEndpoint = 0;
provider.on("grant.saved", (grant) => grants.set(grant.jti, grant.accountId));
provider.on("grant.destroyed", (grant) => grants.delete(grant.jti));
provider.on("grant.revoked", (ctx, grantId) => {
    grants.delete(grantId);
    if (ctx.oidc?.route === "revocation") {
        revokedAtEndpoint += 1;
    }
});

async function endGrant(grantId) {
    await Promise.all([provider.AccessToken, provider.RefreshToken, provider.AuthorizationCode]
        .map((model) => model.revokeByGrantId(grantId)));
    await provider.Grant.adapter.destroy(grantId);
    grants.delete(grantId);
}

async function readJson(ctx) {
    let body = "";
    for await (const chunk of ctx.req) {
        body += chunk;
    }
    return JSON.parse(body || "{}");
}

provider.use(async (ctx, next) => {
    if (ctx.method === "GET" && ctx.path === "/_test/grants") {
        const counts = {};
        for (const login of grants.values()) {
            counts[login] = (counts[login] ?? 0) + 1;
        }
        ctx.body = { grants: counts, revoked: revokedAtEndpoint };
        return;
    }
    if (ctx.method === "POST" && ctx.path === "/_test/revoke") {
        const { sub } = await readJson(ctx);
        const ended = [...grants].filter(([, login]) => login === sub).map(([grantId]) => grantId);
        await Promise.all(ended.map(endGrant));
        ctx.body = { ended: ended.length };
        return;
    }
    await next();
    withoutWebFonts(ctx);
});

serveUntilStdinCloses(provider, config.port, issuer, "backend_as");

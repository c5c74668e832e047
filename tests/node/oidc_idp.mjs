// A company-style OpenID Connect identity provider for the sign-in tests: panva's certified
// oidc-provider on a loopback port, driven by tests/oidc_idp.py.
//
//   OIDC_IDP_CONFIG='{"port": ..., "client": {...}, ...}' node oidc_idp.mjs NODE_MCP_HOME
//
// NODE_MCP_HOME is where scripts/install-node-mcp installed oidc-provider. The configuration
// comes in the environment, not argv, so the client secret is not in the process list:
//
//   port                    the loopback port to listen on (the issuer is http://127.0.0.1:<port>)
//   client                  {client_id, client_secret, redirect_uris}: the one static client
//   ttl                     {access_token, id_token, refresh_token} in seconds
//   rotate_refresh_tokens   a used refresh token is replaced by a new one (reusing it revokes the grant)
//   require_pkce            refuse authorization requests without a code_challenge
//   users                   {login: {email, name, groups}}; any other login gets <login>@example.com
//
// Like a company IdP: no dynamic client registration, confidential client only
// (client_secret_basic or client_secret_post), authorization_code + refresh_token, PKCE S256.
// Sign-in and consent are oidc-provider's own development pages (any login, the password is
// not checked). GET /_test/counts answers the token requests seen so far, by grant type.
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
const { default: Provider } = await import(pathToFileURL(require.resolve("oidc-provider")).href);

const config = JSON.parse(process.env.OIDC_IDP_CONFIG);
const issuer = `http://127.0.0.1:${config.port}`;
const users = config.users ?? {};

function account(login) {
    const user = users[login] ?? {};
    return {
        accountId: login,
        async claims() {
            return {
                sub: login,
                email: user.email ?? `${login}@example.com`,
                email_verified: true,
                name: user.name ?? login,
                preferred_username: login,
                groups: user.groups ?? [],
            };
        },
    };
}

// A fresh signing key per run: nothing the tests see was signed by a key known beforehand.
const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: "jwk" }), kid: randomBytes(8).toString("hex"), use: "sig", alg: "RS256" };

const provider = new Provider(issuer, {
    clients: [{
        client_id: config.client.client_id,
        client_secret: config.client.client_secret,
        redirect_uris: config.client.redirect_uris,
        grant_types: ["authorization_code", "refresh_token"],
        response_types: ["code"],
        token_endpoint_auth_method: "client_secret_basic",  // client_secret_post is accepted too
    }],
    clientAuthMethods: ["client_secret_basic", "client_secret_post"],
    responseTypes: ["code"],
    jwks: { keys: [signingKey] },
    cookies: { keys: [randomBytes(32).toString("hex")] },
    features: {
        registration: { enabled: false },
        devInteractions: { enabled: true },
        revocation: { enabled: true },
        userinfo: { enabled: true },
    },
    pkce: { required: () => config.require_pkce === true },
    claims: {
        openid: ["sub"],
        email: ["email", "email_verified"],
        profile: ["name", "preferred_username"],
        groups: ["groups"],
    },
    scopes: ["openid", "offline_access", "email", "profile", "groups"],
    // Company IdPs put the scopes' claims in the ID token too; oidc-provider by default keeps
    // them for userinfo when an access token is issued.
    conformIdTokenClaims: false,
    // A refresh token for the authorization_code grant without asking for offline_access,
    // and one that outlives the browser session, as company IdPs hand them out.
    issueRefreshToken: async (ctx, client) => client.grantTypeAllowed("refresh_token"),
    expiresWithSession: async () => false,
    rotateRefreshToken: config.rotate_refresh_tokens !== false,
    ttl: {
        AccessToken: config.ttl.access_token,
        IdToken: config.ttl.id_token,
        RefreshToken: config.ttl.refresh_token,
        Grant: Math.max(  // a refresh token dies with its grant: let the grant outlive it
            config.ttl.refresh_token, 14 * 24 * 3600),
        Session: 14 * 24 * 3600,
    },
    findAccount: async (ctx, login) => account(login),
});
provider.proxy = false;

// Every token request, counted by grant type when it is answered (failures too: a second
// refresh with a rotated-away token is a request the tests must see).
const tokenRequests = {};
const failedTokenRequests = {};

provider.use(async (ctx, next) => {
    if (ctx.method === "GET" && ctx.path === "/_test/counts") {
        ctx.body = { requests: tokenRequests, failed: failedTokenRequests };
        return;
    }
    await next();
    if (ctx.oidc?.route === "token") {
        const grantType = ctx.oidc.params?.grant_type ?? "unknown";
        tokenRequests[grantType] = (tokenRequests[grantType] ?? 0) + 1;
        if (ctx.status !== 200) {
            failedTokenRequests[grantType] = (failedTokenRequests[grantType] ?? 0) + 1;
        }
    }
    withoutWebFonts(ctx);
});

serveUntilStdinCloses(provider, config.port, issuer, "oidc_idp");

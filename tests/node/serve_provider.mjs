// What the tests' oidc-provider programs (oidc_idp.mjs, backend_as.mjs) share: a page
// without its web font (the browser stays off the internet), and serving until stdin
// closes (the Python side holds it: the program never outlives the test process).
import { createServer } from "node:http";

// After the provider's own handling: its development pages' stylesheet imports a web font.
export function withoutWebFonts(ctx) {
    if (typeof ctx.body === "string" && ctx.response.is("html")) {
        ctx.body = ctx.body.replace(/@import url\(https:\/\/fonts\.googleapis\.com[^)]*\);/g, "");
    }
}

// Logs its server errors under ``name``, listens on loopback ``port``, prints READY <issuer>.
export function serveUntilStdinCloses(provider, port, issuer, name) {
    provider.on("server_error", (ctx, error) => {
        console.error(`${name}: server error on ${ctx.method} ${ctx.path}: ${error.name}: ${error.message}`);
    });
    const server = createServer(provider.callback());

    function shutdown() {
        server.close();
        server.closeAllConnections();
        process.exit(0);
    }

    process.on("SIGTERM", shutdown);
    process.stdin.on("end", shutdown);
    process.stdin.on("error", shutdown);
    process.stdin.resume();
    server.listen(port, "127.0.0.1", () => {
        process.stdout.write(`READY ${issuer}\n`);
    });
}

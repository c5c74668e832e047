// A small MCP Apps host (the io.modelcontextprotocol/ui extension) for the tests: the page
// of apps_host.html, bundled for the browser by scripts/install-mcp-apps.
//
// It does what a chat client does with MCP Apps: connect to an MCP server, call a tool, read
// the UI resource the tool's _meta.ui.resourceUri names, and show that HTML as an app card in
// a sandboxed iframe, wired to the server by ext-apps' AppBridge.
//
// Query: ?mcp=<url>&tools=<tool>,<tool>... ; repeat the pair for more servers (the n-th
// tools goes with the n-th mcp), one MCP client each. One card per tool, in order, side by
// side: #card-0, #card-1, ... each holding its app's iframe.
//
// What happened is kept in window.appsHost for the tests to read:
//   {ready, error, servers: [{url, tools, connected, serverInfo, error}],
//    cards: [{index, server, tool, uri, mimeType, htmlSha256, toolResult, initialized,
//             appInfo, resultDelivered, settled, error, links, logs,
//             calls: [{name, arguments, done, result, error}]}]}
// ready: every card is settled, that is its app got the tool's input and result, or it
// failed (its error says why); error: the page itself failed (a bad query).
import {
  AppBridge,
  PostMessageTransport,
  RESOURCE_MIME_TYPE,
  getToolUiResourceUri,
} from "@modelcontextprotocol/ext-apps/app-bridge";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const UI_EXTENSION = "io.modelcontextprotocol/ui";
const HOST_INFO = { name: "vmcp-actors-apps-test-host", version: "1.0.0" };
const HOST_CAPABILITIES = { serverTools: {}, serverResources: {}, openLinks: {}, logging: {} };
const MAX_CARD_HEIGHT = 900; // px: an app asking for more scrolls inside its card

const state = { ready: false, error: null, servers: [], cards: [] };
window.appsHost = state;

function message(error) {
  return error instanceof Error ? error.message : String(error);
}

function setStatus(text) {
  document.getElementById("status").textContent = text;
}

// The (url, tool names) pairs of the query.
function requestedServers() {
  const query = new URLSearchParams(window.location.search);
  const urls = query.getAll("mcp");
  const toolLists = query.getAll("tools");
  if (urls.length === 0 || urls.length !== toolLists.length) {
    throw new Error(`need one tools= per mcp= (got ${urls.length} mcp, ${toolLists.length} tools)`);
  }
  return urls.map((url, index) => ({
    url,
    tools: toolLists[index].split(",").map((name) => name.trim()).filter(Boolean),
  }));
}

async function connect(url) {
  // Declaring the extension is what tells a server (or a gateway) this client renders apps.
  const client = new Client(HOST_INFO, {
    capabilities: { extensions: { [UI_EXTENSION]: { mimeTypes: [RESOURCE_MIME_TYPE] } } },
  });
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  return client;
}

async function listAllTools(client) {
  const tools = [];
  let cursor;
  do {
    const page = await client.listTools(cursor === undefined ? undefined : { cursor });
    tools.push(...page.tools);
    cursor = page.nextCursor;
  } while (cursor);
  return tools;
}

// The client as the card's bridge sees it: the same client (the bridge still forwards the
// app's requests to the server itself), with each tools/call the app makes recorded on the card.
function recordingClient(client, card) {
  async function request(outgoing, ...rest) {
    if (outgoing.method !== "tools/call") {
      return client.request(outgoing, ...rest);
    }
    const call = { name: outgoing.params?.name, arguments: outgoing.params?.arguments ?? {}, done: false };
    card.calls.push(call);
    try {
      call.result = await client.request(outgoing, ...rest);
      return call.result;
    } catch (error) {
      call.error = message(error);
      throw error;
    } finally {
      call.done = true;
    }
  }
  return new Proxy(client, {
    get(target, property) {
      if (property === "request") {
        return request;
      }
      const value = Reflect.get(target, property, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

function resourceHtml(contents, uri) {
  const content = contents.find((item) => item.uri === uri) ?? contents[0];
  if (content === undefined) {
    throw new Error(`resources/read of ${uri} gave no contents`);
  }
  if (content.mimeType !== RESOURCE_MIME_TYPE) {
    throw new Error(`${uri} is ${content.mimeType}, not ${RESOURCE_MIME_TYPE}`);
  }
  if (typeof content.text === "string") {
    return content.text;
  }
  const bytes = Uint8Array.from(atob(content.blob ?? ""), (char) => char.charCodeAt(0));
  return new TextDecoder().decode(bytes);
}

async function sha256Hex(text) {
  if (!window.crypto?.subtle) {
    return null; // not a secure context (served from neither https nor loopback)
  }
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Array.from(new Uint8Array(digest), (byte) => byte.toString(16).padStart(2, "0")).join("");
}

function cardElement(card) {
  const element = document.createElement("section");
  element.className = "card";
  element.id = `card-${card.index}`;
  const title = document.createElement("p");
  title.className = "card-title";
  title.textContent = `${card.tool} (${card.server})`;
  element.append(title);
  document.getElementById("cards").append(element);
  return element;
}

function showError(element, card, error) {
  card.error = message(error);
  const note = document.createElement("p");
  note.className = "card-error";
  note.textContent = card.error;
  element.append(note);
}

// Call the card's tool, read its UI resource and run that app in the card's iframe.
async function renderCard(client, tools, card, element) {
  const tool = tools.find((candidate) => candidate.name === card.tool);
  if (tool === undefined) {
    throw new Error(`the server lists no tool ${card.tool}`);
  }
  card.uri = getToolUiResourceUri(tool) ?? null;
  if (card.uri === null) {
    throw new Error(`tool ${card.tool} names no UI resource (_meta.ui.resourceUri)`);
  }
  const toolArguments = {};
  card.toolResult = await client.callTool({ name: card.tool, arguments: toolArguments });
  const { contents } = await client.readResource({ uri: card.uri });
  const html = resourceHtml(contents, card.uri);
  card.mimeType = RESOURCE_MIME_TYPE;
  card.htmlSha256 = await sha256Hex(html);

  // No allow-same-origin: the app runs in an opaque origin and reaches us by postMessage only.
  const iframe = document.createElement("iframe");
  iframe.setAttribute("sandbox", "allow-scripts");
  iframe.title = card.tool;
  element.append(iframe);

  const bridge = new AppBridge(recordingClient(client, card), HOST_INFO, HOST_CAPABILITIES, {
    hostContext: {
      toolInfo: { tool },
      theme: "light",
      displayMode: "inline",
      availableDisplayModes: ["inline"],
      platform: "web",
      locale: navigator.language,
      containerDimensions: { maxHeight: MAX_CARD_HEIGHT },
    },
  });
  bridge.onsizechange = ({ height }) => {
    if (typeof height === "number") {
      iframe.style.height = `${Math.min(Math.ceil(height), MAX_CARD_HEIGHT)}px`;
    }
  };
  bridge.onopenlink = async ({ url }) => {
    card.links.push(url); // recorded, never opened
    return {};
  };
  bridge.onloggingmessage = (params) => {
    card.logs.push(params);
  };
  const delivered = new Promise((resolve, reject) => {
    // The app may only be sent its input and result once it says it is initialised.
    bridge.oninitialized = () => {
      card.initialized = true;
      card.appInfo = bridge.getAppVersion() ?? null;
      bridge
        .sendToolInput({ arguments: toolArguments })
        .then(() => bridge.sendToolResult(card.toolResult))
        .then(resolve, reject);
    };
  });
  // Listen before the app's document exists: its first message is its ui/initialize.
  await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
  iframe.srcdoc = html;
  await delivered;
  card.resultDelivered = true;
}

async function main() {
  let requested;
  try {
    requested = requestedServers();
  } catch (error) {
    state.error = message(error);
    state.ready = true;
    setStatus(`Error: ${state.error}`);
    return;
  }
  const renders = [];
  for (const { url, tools: toolNames } of requested) {
    const server = { url, tools: toolNames, connected: false, serverInfo: null, error: null };
    state.servers.push(server);
    // Cards are numbered in query order, before anything loads, so their ids are stable.
    const cards = toolNames.map((tool) => {
      const card = {
        index: state.cards.length, server: url, tool, uri: null, mimeType: null, htmlSha256: null,
        toolResult: null, initialized: false, appInfo: null, resultDelivered: false,
        settled: false, error: null, links: [], logs: [], calls: [],
      };
      state.cards.push(card);
      return { card, element: cardElement(card) };
    });
    renders.push(renderServer(server, cards));
  }
  await Promise.all(renders);
  const failed = state.cards.filter((card) => card.error !== null).length;
  state.ready = true;
  setStatus(failed ? `${failed} of ${state.cards.length} apps failed` : `${state.cards.length} apps ready`);
}

async function renderServer(server, cards) {
  let client;
  let tools;
  try {
    client = await connect(server.url);
    server.connected = true;
    server.serverInfo = client.getServerVersion() ?? null;
    tools = await listAllTools(client);
  } catch (error) {
    server.error = message(error);
    for (const { card, element } of cards) {
      showError(element, card, `cannot reach ${server.url}: ${server.error}`);
      card.settled = true;
    }
    return;
  }
  await Promise.all(cards.map(async ({ card, element }) => {
    try {
      await renderCard(client, tools, card, element);
    } catch (error) {
      showError(element, card, error);
    } finally {
      card.settled = true;
    }
  }));
}

main().catch((error) => {
  state.error = message(error);
  state.ready = true;
  setStatus(`Error: ${state.error}`);
});

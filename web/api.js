// The API key (kept in localStorage) and REST calls that surface the server's error message as is.

const KEY_STORAGE = "voxgate.apiKey";
// RFC 7230 token characters: only such a key can travel as a WebSocket subprotocol.
const TOKEN_RE = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

export function loadKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) || "";
  } catch {
    return ""; // storage disabled (privacy mode): the key lives only in the field
  }
}

export function saveKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  } catch {
    /* storage disabled: nothing to persist */
  }
}

/** An HTTP error from the gateway, with the body's `error.message` verbatim. */
export class ApiError extends Error {
  constructor(status, message, code = null, param = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.param = param;
  }
}

/** fetch() with the Bearer key; returns the parsed JSON body or throws ApiError. */
export async function apiFetch(path, key, options = {}) {
  const headers = new Headers(options.headers || {});
  if (key) headers.set("Authorization", `Bearer ${key}`);
  let response;
  try {
    response = await fetch(path, { ...options, headers });
  } catch (err) {
    throw new ApiError(0, `could not reach the gateway: ${err.message}`);
  }
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    const error = body && typeof body === "object" ? body.error : null;
    if (error && typeof error.message === "string") {
      throw new ApiError(response.status, error.message, error.code ?? null, error.param ?? null);
    }
    const detail = text.trim() ? `: ${text.trim().slice(0, 300)}` : "";
    throw new ApiError(response.status, `HTTP ${response.status} ${response.statusText}${detail}`);
  }
  return body;
}

/** Subprotocol that opts in to voxgate's extensions (session.ready, input.cancel, timings). */
export const EXTENSIONS = "voxgate.v1";

/** URL and subprotocols for the streaming WebSocket, carrying the key the way browsers can. */
export function socketTarget(path, key) {
  const url = new URL(path, window.location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (!key) return { url: url.href, protocols: [EXTENSIONS] };
  if (TOKEN_RE.test(key)) return { url: url.href, protocols: [EXTENSIONS, `voxgate.key.${key}`] };
  url.searchParams.set("api_key", key); // not a valid subprotocol token: fall back to the query
  return { url: url.href, protocols: [EXTENSIONS] };
}

// The retrieval-host operator console: one ES module, no dependencies, no build step.
//
// The bearer token lives in `state.token`, a variable of this tab: never in a URL, a cookie or
// web storage. Every element is built with the DOM API and every text from the host goes in
// through text nodes, so a passage holding markup shows as text. Locations in the address bar
// (`#/...`) hold corpus, source and passage ids, a citation's revision and page cursors, never
// the token.
//
// Each page the console shows has an AbortSignal (`state.page`), aborted when the user leaves
// the page or signs out: the page's requests end with it (the host cancels a run or an ingest
// whose client leaves), and nothing they answer late reaches another page.

const state = {
  token: null,
  signedIn: false,
  corpora: [],
  writeOnly: [],
  keepError: false,
  page: new AbortController(),
};

const PHASES = [
  "run.started",
  "retrieval.authorization",
  "retrieval.embedding",
  "retrieval.scan",
  "retrieval.receipt",
  "generation",
  "recording",
  "run.completed",
];
const INGEST_PHASES = ["ingest.started", "parse", "embed", "commit", "ingest.completed"];
const MEDIA_TYPES = {
  pdf: "application/pdf",
  md: "text/markdown",
  markdown: "text/markdown",
  txt: "text/plain",
  html: "text/html",
  htm: "text/html",
  eml: "message/rfc822",
  mbox: "application/mbox",
};
// The host's and the client's citation rule (`_OPEN`, `_WELL_FORMED`): any "[source:", in any
// case and with spaces around `source`, opens a marker; one that is not `[source:ID]` is
// malformed. A malformed marker is shown up to its "]" when one closes it on its line.
// Whitespace as Python's `str.isspace()` (the host's `\s`), spelled out: JavaScript's `\s`
// leaves out U+001C-U+001F and U+0085 and adds U+FEFF.
const SPACE = "\\t-\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const CITATION_OPEN = new RegExp(`\\[[${SPACE}]*source[${SPACE}]*:`, "giu");
const CITATION = new RegExp(`\\[source:([^\\[\\]${SPACE}]+)\\]`, "uy");
const MALFORMED_CITATION = new RegExp(`\\[[${SPACE}]*source[${SPACE}]*:(?:[^\\[\\]\\n]*\\])?`, "iuy");
// Bidirectional controls in an id or a title can make "gpj.exe" read "exe.jpg": shown as
// visible marks where ids, titles, headers and answers are shown, escaped in JSON (passages
// stay as indexed).
const BIDI_CONTROLS = /([\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069])/u;
const BIDI_CONTROLS_ALL = new RegExp(BIDI_CONTROLS.source, "gu");
const TOKEN = /^[\x21-\x7e]+$/;

// --- DOM ------------------------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name in element && typeof value !== "string") element[name] = value;
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

function main() {
  return document.getElementById("main");
}

function show(...children) {
  const target = main();
  target.replaceChildren();
  append(target, children);
  target.focus();
}

function field(label, control) {
  return h("label", {}, label, control);
}

function select(name, options, value) {
  return h(
    "select",
    { name },
    options.map((option) => h("option", { value: option, selected: option === value }, option)),
  );
}

function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.filter(([, value]) => value !== null && value !== undefined && value !== "")
      .map(([term, value]) => [h("dt", {}, term), h("dd", { dir: "auto" }, value)]),
  );
}

function link(href, text) {
  return h("a", { href }, text);
}

function hash(...parts) {
  return "#/" + parts.map((part) => encodeURIComponent(part)).join("/");
}

// A link to a passage, pinned to the revision its hit, manifest entry or listing showed: the
// passage route answers 404 when the source is at another revision, never other text.
function passageHash(corpus, chunkId, revision) {
  return hash("passage", corpus, chunkId) + "?" + new URLSearchParams({ revision });
}

// An id as one segment of an API path. Browsers drop "." and ".." path segments (escaped or
// not) before a request leaves, so such an id cannot be asked for from here.
function segment(id) {
  if (unopenable(id)) {
    throw new Error(`The id "${id}" cannot be opened in a browser, which drops "." and ".." ` +
      "from a URL path. Read it with the client or the command line.");
  }
  return encodeURIComponent(id);
}

function unopenable(id) {
  return id === "." || id === "..";
}

// A link to a source's page, or its id alone when a browser cannot ask for it ("." and "..").
function sourceLink(corpus, id, text) {
  if (!unopenable(id)) return link(hash("source", corpus, id), text);
  return h("span", { title: `A browser drops "${id}" from a URL path: this source cannot be opened here.` }, text);
}

// JSON for reading, its bidirectional controls escaped as JSON escapes (`\u202e`): a header in
// a source's metadata or a receipt must not read reversed (a black-box test).
function json(value) {
  return JSON.stringify(value === undefined ? null : value, null, 2).replace(BIDI_CONTROLS_ALL,
    (control) => "\\u" + control.codePointAt(0).toString(16).padStart(4, "0"));
}

// An id, title or header as text, its bidirectional controls shown as marks.
function named(text) {
  if (text === null || text === undefined || !BIDI_CONTROLS.test(text)) return text;
  return String(text).split(BIDI_CONTROLS).map((piece, i) => {
    if (i % 2 === 0) return piece;
    const code = piece.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
    return h("span", { class: "control", title: "A bidirectional control character" },
      `U+${code}`);
  });
}

// A revision (cut to 24 characters) and a location's message id come from documents and
// applications, as ids and titles do: their bidirectional controls are shown as marks too
// ("msg<U+202E>gpj.exe" read "msgexe.jpg", a black-box test).
function short(revision) {
  return named(revision.length > 24 ? revision.slice(0, 19) + "…" : revision);
}

function where(location) {
  if (!location) return "";
  const parts = [];
  if (location.page !== null && location.page !== undefined) parts.push(`page ${location.page}`);
  if (location.startLine !== null && location.startLine !== undefined) {
    parts.push(`lines ${location.startLine}–${location.endLine ?? location.startLine}`);
  }
  if (location.documentId) parts.push(["message ", named(location.documentId)]);
  if (!parts.length) return "";
  return parts.flatMap((part, i) => (i ? [", ", part] : [part]));
}

// A heading naming a passage's location, when it has one: "Cited passage (page 2)".
function located(label, location) {
  const at = where(location);
  return at === "" ? label : [label, " (", at, ")"];
}

function number(value, digits = 3) {
  return typeof value === "number" ? value.toFixed(digits) : "–";
}

// The lexical analyzer's stop words (`core/lexical.py`): never marked.
const STOP_WORDS = new Set(
  ("a an and are as at be but by for if in into is it no not of on or such that the their " +
    "then there these they this to was will with").split(" "),
);

// Scripts written without spaces between words: their query words are marked wherever they
// occur (the analyzer cuts such runs into pairs of characters).
const UNSPACED = /[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}]/u;

// Query words marked in a passage where they stand as words (a letter's combining marks are
// part of it), with a plural or tense ending ("token" marks "tokens"), never inside another
// word ("do" in "downtime"): split into text nodes and <mark> elements, never markup.
function highlighted(text, query) {
  const words = query.toLowerCase().match(/[\p{L}\p{N}\p{M}]{2,}/gu) || [];
  const terms = [...new Set(words)].filter((word) => !STOP_WORDS.has(word));
  if (terms.length === 0) return [text];
  const escape = (term) => term.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const spaced = terms.filter((term) => !UNSPACED.test(term)).map(escape);
  const unspaced = terms.filter((term) => UNSPACED.test(term)).map(escape);
  const alternatives = [];
  if (spaced.length > 0) {
    const word = "[\\p{L}\\p{N}\\p{M}]";
    alternatives.push(`(?<!${word})(?:${spaced.join("|")})(?:s|es|d|ed|ing)?(?!${word})`);
  }
  if (unspaced.length > 0) alternatives.push(unspaced.join("|"));
  const pattern = new RegExp(`(${alternatives.join("|")})`, "giu");
  return text.split(pattern).map((piece, i) => (i % 2 === 1 ? h("mark", {}, piece) : piece));
}

// --- errors ---------------------------------------------------------------------------------

class ProblemError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function showError(error) {
  const box = document.getElementById("error");
  box.replaceChildren();
  if (error === null) {
    box.hidden = true;
    return;
  }
  const problem = error instanceof ProblemError ? error.problem : null;
  const title = problem ? problem.title || "The host refused the request" : "Something went wrong";
  const detail = problem ? problem.detail || "" : String(error.message || error);
  const extra = problem && problem.code ? ` (${problem.code}${problem.reason ? ", " + problem.reason : ""}` +
    `${problem.requestId ? ", request " + problem.requestId : ""})` : "";
  // A detail may quote a provider's message, an id or a file name: its bidirectional controls
  // are shown as marks, or "quota for user <U+202E>txt.exe<U+202C> exceeded" reorders the box.
  append(box, [h("strong", {}, named(title)), named(detail), extra]);
  box.hidden = false;
}

async function problemOf(response) {
  try {
    return new ProblemError(response.status, await response.json());
  } catch {
    return new ProblemError(response.status, { title: `HTTP ${response.status}`, detail: response.statusText });
  }
}

// --- the API --------------------------------------------------------------------------------

async function request(path, { method = "GET", body, type, accept, signal = null } = {}) {
  const headers = { Authorization: `Bearer ${state.token}` };
  if (type) headers["Content-Type"] = type;
  if (accept) headers.Accept = accept;
  const response = await fetch(path, {
    method,
    headers,
    body,
    signal,
    cache: "no-store",
    credentials: "omit",
    referrerPolicy: "no-referrer",
  });
  if (!response.ok) {
    const error = await problemOf(response);
    if (response.status === 401 && state.signedIn) {
      showError(error); // the error that signs the user out stays on screen
      signOut();
    }
    throw error;
  }
  return response;
}

// The JSON of a GET; an AbortError once `signal` is aborted, even when the answer was in.
async function getJson(path, signal) {
  const body = await (await request(path, { signal })).json();
  signal.throwIfAborted();
  return body;
}

async function postJson(path, body, signal) {
  const response = await request(path, {
    method: "POST", body: JSON.stringify(body), type: "application/json", signal,
  });
  const result = await response.json();
  signal.throwIfAborted();
  return result;
}

// A new page: what the previous one started ends with it.
function newPage() {
  state.page.abort();
  state.page = new AbortController();
  return state.page.signal;
}

// Server-Sent Events from a fetch response: `{event, data}` for each event with data; comment
// lines (heartbeats) are skipped. A CR at the end of one chunk may pair with an LF in the next.
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let held = "";
    if (buffer.endsWith("\r")) {
      held = "\r";
      buffer = buffer.slice(0, -1);
    }
    buffer = buffer.replace(/\r\n|\r/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const parsed = parseEvent(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
      if (parsed) yield parsed;
    }
    buffer += held;
  }
}

function parseEvent(block) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const key = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (key === "event") name = value;
    else if (key === "data") data.push(value);
  }
  return data.length === 0 ? null : { event: name, data: JSON.parse(data.join("\n")) };
}

// --- sign-in --------------------------------------------------------------------------------

function signOut() {
  state.token = null;
  state.signedIn = false;
  state.corpora = [];
  state.writeOnly = [];
  newPage(); // a run or an ingest the session started ends with it
  document.getElementById("nav").hidden = true;
  if (location.hash !== "#/") {
    state.keepError = true; // an error shown now (the 401 that signed out) stays on screen
    location.hash = "#/";
  } else render();
}

function signInView() {
  const input = h("input", {
    type: "password", name: "token", autocomplete: "off", spellcheck: "false", required: true,
  });
  const form = h(
    "form",
    { class: "panel", id: "sign-in" },
    h("h1", { class: "wide" }, "Sign in"),
    h("p", { class: "wide muted" },
      "Paste a bearer token. The console keeps it in this tab's memory only: not in the address, " +
      "a cookie or storage. Closing or reloading the tab forgets it."),
    h("div", { class: "wide" }, field("Bearer token", input)),
    h("div", {}, h("button", { type: "submit" }, "Sign in")),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    input.value = "";
    if (!TOKEN.test(token)) {
      // fetch() refuses a header outside Latin-1: say what is wrong with the token instead.
      showError(new ProblemError(401, {
        title: "Authentication required",
        detail: "This is not a valid bearer token: a token is printable ASCII, without spaces.",
      }));
      return;
    }
    state.token = token;
    try {
      await loadCorpora(state.page.signal);
      state.signedIn = true;
      document.getElementById("nav").hidden = false;
      showError(null);
      // The address the console was opened at (a citation in a new tab, a reload) holds no
      // secret: it is the page to show. Signing out leaves "#/", which shows the corpora.
      if (/^#\/./.test(location.hash)) render();
      else location.hash = "#/corpora";
    } catch (error) {
      state.token = null;
      showError(error);
    }
  });
  show(form);
  input.focus();
}

async function loadCorpora(signal) {
  const body = await getJson("/v1/corpora", signal);
  state.corpora = body.corpora;
  // The corpora this token may write to but not search (ids and operations only).
  state.writeOnly = body.writeOnly || [];
}

function corporaFor(operation) {
  return [...state.corpora, ...state.writeOnly]
    .filter((corpus) => corpus.operations.includes(operation)).map((c) => c.id);
}

// --- browse ---------------------------------------------------------------------------------

async function corporaView(signal) {
  await loadCorpora(signal);
  if (state.corpora.length === 0) {
    const writable = state.writeOnly.map((c) => `${c.id} (${c.operations.join(", ")})`);
    show(h("h1", {}, "Corpora"), h("p", { class: "notice", id: "no-corpora" },
      "This token may not search any corpus: there is nothing to show."),
    writable.length
      ? h("p", { id: "write-only" }, "It may write to: ", writable.join("; "), ". ",
        link("#/ingest", "Ingest"), " sends documents there.")
      : null);
    return;
  }
  show(
    h("h1", {}, "Corpora"),
    h("p", { class: "muted" }, "What this token may do, per corpus, and what its subject may see."),
    h("div", { class: "table-wrap" }, h(
      "table",
      { id: "corpora" },
      h("thead", {}, h("tr", {}, ["Corpus", "May", "Sources", "Passages", "Bytes", "Model", "Store"]
        .map((name) => h("th", { scope: "col" }, name)))),
      h("tbody", {}, state.corpora.map((corpus) => h(
        "tr",
        {},
        h("td", { dir: "auto" }, link(hash("sources", corpus.id), named(corpus.id))),
        h("td", { class: "ops" }, corpus.operations.map((op) => h("span", {}, op))),
        h("td", {}, corpus.sources),
        h("td", {}, corpus.passages),
        h("td", {}, corpus.bytes),
        h("td", {}, `${corpus.embedding.model} (${corpus.embedding.dimensions})`),
        h("td", {}, corpus.readOnly ? "read-only" : "writable"),
      ))),
    )),
  );
}

async function sourcesView(corpus, params, signal) {
  const query = new URLSearchParams();
  query.set("limit", "50");
  for (const name of ["cursor", "title", "mediaType"]) {
    if (params.get(name)) query.set(name, params.get(name));
  }
  const page = await getJson(`/v1/corpora/${segment(corpus)}/sources?${query}`, signal);
  const title = h("input", { name: "title", value: params.get("title") || "", type: "search" });
  const mediaType = select("mediaType", ["", ...new Set(Object.values(MEDIA_TYPES))], params.get("mediaType") || "");
  const filter = h("form", { class: "panel", id: "source-filter" },
    field("Title contains", title), field("Media type", mediaType),
    h("div", {}, h("button", { type: "submit" }, "Filter")));
  filter.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    if (title.value) next.set("title", title.value);
    if (mediaType.value) next.set("mediaType", mediaType.value);
    location.hash = hash("sources", corpus) + (next.size ? "?" + next : "");
  });
  // The filter stays on every page; cursors only go forward (the browser's Back goes back).
  const firstParams = new URLSearchParams(params);
  firstParams.delete("cursor");
  const first = hash("sources", corpus) + (firstParams.size ? "?" + firstParams : "");
  const nextParams = new URLSearchParams(params);
  if (page.nextCursor) nextParams.set("cursor", page.nextCursor);
  show(
    h("h1", { dir: "auto" }, "Sources of ", named(corpus)),
    filter,
    page.sources.length === 0 ? h("p", { class: "muted" }, "No source on this page.") : null,
    h("div", { class: "table-wrap" }, h(
      "table",
      { id: "sources" },
      h("thead", {}, h("tr", {}, ["Source", "Title", "Media type", "Revision", "Passages", "Indexed"]
        .map((name) => h("th", { scope: "col" }, name)))),
      h("tbody", {}, page.sources.map((source) => h(
        "tr",
        {},
        h("td", { dir: "auto" }, sourceLink(corpus, source.id, named(source.id))),
        h("td", { dir: "auto" }, named(source.title)),
        h("td", {}, source.mediaType || "–"),
        h("td", { title: source.revision }, short(source.revision)),
        h("td", {}, source.chunkCount),
        h("td", {}, source.indexedAt || "–"),
      ))),
    )),
    h("p", {},
      params.get("cursor") ? [link(first, "First page"), " "] : null,
      page.nextCursor ? link(hash("sources", corpus) + "?" + nextParams, "Next page") : null),
  );
}

// The parsed message a passage comes from. A caller's metadata is laid over the document's key
// by key, so `messages` may be anything: `{"messages": 5}` made every passage of its source
// fail to open ("messages.find is not a function", a black-box test).
function messageOf(metadata, documentId) {
  const messages = metadata && Array.isArray(metadata.messages) ? metadata.messages : [];
  return messages.find((message) => message && typeof message === "object" &&
    message.messageId === documentId) || null;
}

// A message's header as text, or nothing: the caller's metadata may hold any JSON there.
function header(value) {
  return typeof value === "string" ? named(value) : null;
}

// Why a message of a long thread shows no headers; the counts only when they are numbers.
function truncatedNote(metadata) {
  const kept = Array.isArray(metadata.messages) ? metadata.messages.length : null;
  const count = typeof metadata.messageCount === "number" ? metadata.messageCount : null;
  return "Not kept: this thread's header list was cut short" +
    (kept !== null && count !== null ? ` at ${kept} of ${count} messages.` : ".");
}

// A message's attachment names. `{"attachments": "report.pdf"}` or `[null]` from a caller made
// the passage fail to open ("….map is not a function", probe G): only an array's entries that
// are objects with a string `filename` are named.
function attachmentNames(message) {
  const attachments = Array.isArray(message.attachments) ? message.attachments : [];
  return attachments.filter((a) => a !== null && typeof a === "object" &&
    typeof a.filename === "string").map((a) => a.filename).join(", ");
}

async function sourceView(corpus, sourceId, params, signal) {
  const query = new URLSearchParams({ limit: "200" });
  if (params.get("cursor")) query.set("cursor", params.get("cursor"));
  const detail = await getJson(
    `/v1/corpora/${segment(corpus)}/sources/${segment(sourceId)}?${query}`, signal);
  const source = detail.source;
  show(
    h("h1", { dir: "auto" }, named(source.title || source.id)),
    facts([
      ["Corpus", link(hash("sources", corpus), named(corpus))],
      ["Source", named(source.id)],
      ["Revision", named(source.revision)],
      ["Media type", source.mediaType],
      ["Indexed", source.indexedAt],
      ["Passages", String(source.chunkCount)],
      ["Bytes", String(source.bytes)],
    ]),
    h("details", {}, h("summary", {}, "Metadata"), h("pre", { id: "metadata" }, json(source.metadata))),
    h("h2", {}, "Passages in document order"),
    h("div", { class: "table-wrap" }, h(
      "table",
      { id: "passages" },
      h("thead", {}, h("tr", {}, ["Passage", "Where", "Bytes"].map((name) => h("th", { scope: "col" }, name)))),
      h("tbody", {}, detail.passages.map((passage) => h(
        "tr",
        {},
        h("td", { dir: "auto" }, link(passageHash(corpus, passage.chunkId, source.revision),
          named(passage.chunkId))),
        h("td", {}, where(passage.location)),
        h("td", {}, passage.bytes),
      ))),
    )),
    detail.nextCursor
      ? h("p", {}, link(hash("source", corpus, sourceId) + "?" + new URLSearchParams({ cursor: detail.nextCursor }), "More passages"))
      : null,
  );
}

// A cited passage in its source: re-read through the passage route (authorized now), with the
// passages before and after it, and for e-mail the headers of its message. Every read is of one
// revision (the citation's when the link names one, else the passage's), so a re-index landing
// while the page loads never puts two revisions on it: an unpinned link is read again.
async function passageView(corpus, chunkId, revision, signal) {
  for (let attempt = 1; ; attempt += 1) {
    let read;
    try {
      read = await readPassage(corpus, chunkId, revision, signal);
    } catch (error) {
      if (!revision || !(error instanceof ProblemError) || error.status !== 404) throw error;
      await showStaleCitation(corpus, chunkId, revision, error, signal);
      return;
    }
    if (read !== null) {
      showPassage(corpus, chunkId, read);
      return;
    }
    if (revision) {
      throw new Error(`The source was re-indexed while this page loaded: revision ${revision}, ` +
        "the one this link cites, is no longer indexed.");
    }
    if (attempt === 3) throw new Error("The source kept changing while this page loaded.");
  }
}

// A link pinned to a revision the passage route no longer has (404): most often the source was
// re-indexed or deleted since the link was made. The host's problem stays on screen; the page
// says what it likely means and, when the passage's source can be read now, links to its
// current listing (never to the new text itself: the link cited another).
async function showStaleCitation(corpus, chunkId, revision, error, signal) {
  let current = null;
  try {
    current = await getJson(
      `/v1/corpora/${segment(corpus)}/passages/${segment(chunkId)}`, signal);
  } catch (unread) {
    if (signal.aborted) throw unread;
  }
  showError(error);
  const sourceId = current ? current.source.id : null;
  show(
    h("h1", {}, "Passage ", named(chunkId)),
    h("p", { id: "stale" }, "This link cites revision ",
      h("span", { title: revision }, short(revision)),
      ", which may no longer be indexed: the source was re-indexed or deleted since the link " +
      "was made, or this token may not read it. The host never shows another revision's text " +
      "in its place."),
    sourceId !== null && !unopenable(sourceId)
      ? h("p", { id: "stale-source" }, "The source as indexed now: ",
        link(hash("source", corpus, sourceId), named(sourceId)), ".")
      : null,
  );
}

// The passage, its source and its neighbours at one revision; null when the source is found at
// another revision than the passage (re-indexed between two reads). A source whose id is "."
// or ".." cannot be listed from a browser: its passage comes alone (`source` null).
async function readPassage(corpus, chunkId, revision, signal) {
  const base = `/v1/corpora/${segment(corpus)}`;
  const at = (rev) => "?" + new URLSearchParams({ revision: rev });
  const passage = await getJson(
    `${base}/passages/${segment(chunkId)}${revision ? at(revision) : ""}`, signal);
  if (unopenable(passage.source.id)) return { passage, source: null, before: null, after: null };
  const pinned = at(passage.source.revision);
  // The source's passages in document order, page after page, until the cited passage and the
  // one after it are known (a source may hold up to 10,000, pages hold 1,000).
  const order = [];
  let source = null;
  let index = -1;
  let cursor = null;
  do {
    const query = new URLSearchParams({ limit: "1000" });
    if (cursor) query.set("cursor", cursor);
    const page = await getJson(`${base}/sources/${segment(passage.source.id)}?${query}`, signal);
    if (page.source.revision !== passage.source.revision) return null;
    source = source || page.source;
    order.push(...page.passages.map((p) => p.chunkId));
    index = order.indexOf(chunkId);
    cursor = page.nextCursor;
  } while (cursor && (index < 0 || index === order.length - 1));
  const around = (i) => (i < 0 || i >= order.length
    ? null
    : getJson(`${base}/passages/${segment(order[i])}${pinned}`, signal));
  try {
    const [before, after] = index < 0
      ? [null, null]
      : await Promise.all([around(index - 1), around(index + 1)]);
    return { passage, source, before, after };
  } catch (error) {
    if (error instanceof ProblemError && error.status === 404) return null; // re-indexed
    throw error;
  }
}

function showPassage(corpus, chunkId, { passage, source, before, after }) {
  const metadata = source ? source.metadata : null;
  const message = messageOf(metadata, passage.location.documentId);
  show(
    h("h1", { dir: "auto" }, "Passage ", named(chunkId)),
    facts([
      ["Source", source
        ? link(hash("source", corpus, source.id), named(source.title || source.id))
        : named(passage.source.id)],
      ["Revision", named(passage.source.revision)],
      ["Media type", source ? source.mediaType : null],
      ["Where", where(passage.location)],
      ["Page", passage.location.page === null ? null : String(passage.location.page)],
    ]),
    message ? [h("h2", {}, "Message headers"), facts([
      ["From", header(message.from)], ["Date", header(message.date)],
      ["Subject", header(message.subject)], ["Message-ID", named(message.messageId)],
      ["Attachments", named(attachmentNames(message))],
    ])] : null,
    !message && passage.location.documentId && metadata
      && metadata.messagesTruncated === true
      ? [h("h2", {}, "Message headers"), h("p", { class: "muted" }, truncatedNote(metadata))]
      : null,
    source ? null : h("p", { class: "notice", id: "source-unopenable" },
      `The passages around it and its source's page are not shown: a browser drops ` +
      `"${passage.source.id}" from a URL path, so this source cannot be listed from here ` +
      "(the client or the command line can)."),
    before ? [h("h2", {}, located("Before", before.location)),
      h("pre", { class: "passage around", dir: "auto" }, before.text)] : null,
    h("h2", {}, located("Cited passage", passage.location)),
    h("pre", { class: "passage cited", id: "cited", dir: "auto" }, passage.text),
    after ? [h("h2", {}, located("After", after.location)),
      h("pre", { class: "passage around", dir: "auto" }, after.text)] : null,
  );
}

// --- search ---------------------------------------------------------------------------------

function searchView(signal) {
  const corpora = corporaFor("search");
  const form = h("form", { class: "panel", id: "search-form" },
    field("Corpus", select("corpus", corpora, corpora[0])),
    field("Mode", select("mode", ["hybrid", "dense", "lexical"], "hybrid")),
    field("Limit", h("input", { // the host's limit: 1-100 hits
      name: "limit", type: "number", min: "1", max: "100", value: "10",
    })),
    field("Byte budget", h("input", { name: "maxContextBytes", type: "number", min: "1", placeholder: "host default" })),
    h("div", { class: "wide" }, field("Query", h("input", { name: "query", type: "search", required: true }))),
    h("div", { class: "wide" }, field("Filters (JSON, optional)", h("textarea", { name: "filters", placeholder: '{"mediaType": "text/markdown"}' }))),
    h("div", {}, h("button", { type: "submit" }, "Search")),
  );
  const results = h("section", { id: "results", "aria-live": "polite" });
  let searching = new AbortController(); // a new search replaces the one still under way
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    searching.abort();
    searching = new AbortController();
    const current = AbortSignal.any([signal, searching.signal]);
    const data = new FormData(form);
    const body = {
      corpus: data.get("corpus"),
      query: data.get("query"),
      mode: data.get("mode"),
      limit: Number(data.get("limit") || 10),
    };
    if (data.get("maxContextBytes")) body.maxContextBytes = Number(data.get("maxContextBytes"));
    if (String(data.get("filters")).trim()) {
      try {
        body.filters = JSON.parse(String(data.get("filters")));
      } catch (error) {
        results.replaceChildren(); // not the previous search's hits under this error
        showError(new Error(`The filters are not JSON: ${error.message}`));
        return;
      }
    }
    showError(null);
    try {
      renderHits(results, body, await postJson("/v1/retrieval/search", body, current));
    } catch (error) {
      if (current.aborted) return;
      results.replaceChildren();
      showError(error);
    }
  });
  show(h("h1", {}, "Search"), corpora.length ? form : h("p", { class: "notice" }, "This token may not search any corpus."), results);
}

function renderHits(target, body, result) {
  target.replaceChildren();
  append(target, [
    h("h2", {}, `${result.hits.length} hit(s), ${body.mode}`),
    result.truncated ? h("p", { class: "notice", id: "truncated" }, "truncated: more passages matched than the limit or the byte budget let through.") : null,
    h("ol", { class: "hits" }, result.hits.map((hit, i) => h(
      "li",
      { class: "hit" },
      h("header", {},
        h("strong", {}, `#${i + 1}`),
        h("span", { class: "score" }, `score ${number(hit.score)}`),
        h("span", { class: "score" }, `dense ${number(hit.scores && hit.scores.dense)}`),
        h("span", { class: "score" }, `lexical ${number(hit.scores && hit.scores.lexical)}`),
        hit.scores && hit.scores.rerank !== null && hit.scores.rerank !== undefined
          ? h("span", { class: "score" }, `rerank ${number(hit.scores.rerank)}`) : null,
        h("span", { dir: "auto" }, sourceLink(body.corpus, hit.source.id, named(hit.source.id))),
        h("span", { title: hit.source.revision }, short(hit.source.revision)),
        h("span", {}, where(hit.location)),
      ),
      h("pre", { class: "passage", dir: "auto" }, highlighted(hit.text, body.query)),
      link(passageHash(body.corpus, hit.chunkId, hit.source.revision),
        "Open the passage in its source"),
    ))),
  ]);
}

// --- ask ------------------------------------------------------------------------------------

// The Ask page. Once a run starts, the address names it (`#/ask?run=ID&corpus=C`, replacing the
// entry, so no extra Back step): following a citation and coming Back shows the run's record,
// its answer with checked citations if it completed, what ended it if not. The question is not
// in the address (addresses hold ids only) and the record does not keep it.
async function askView(signal, params) {
  const corpora = corporaFor("search");
  const form = h("form", { class: "panel", id: "ask-form" },
    field("Corpus", select("corpus", corpora, corpora[0])),
    field("Provider", h("input", { name: "provider", value: "local", required: true })),
    field("Model", h("input", { name: "model", value: "extractive", required: true })),
    field("Retrieval", select("mode", ["before", "tool"], "before")),
    field("Search mode", select("searchMode", ["hybrid", "dense", "lexical"], "hybrid")),
    h("div", { class: "wide" }, field("Question", h("textarea", { name: "input", required: true }))),
    h("div", {}, h("button", { type: "submit" }, "Ask"), " ",
      h("button", { type: "button", class: "secondary", id: "stop", disabled: true }, "Stop")),
  );
  const bar = h("progress", { id: "run-progress", max: String(PHASES.length - 1), value: "0", "aria-label": "Run progress" });
  const phase = h("span", { id: "run-phase", "aria-live": "polite" }, "not started");
  const runId = h("span", { id: "run-id" }); // to read the run's record later: GET /v1/runs/{id}
  const ending = h("div", { id: "run-ending", "aria-live": "polite" }); // how the answer ended
  const answer = h("div", { class: "answer", id: "answer", "aria-live": "polite", dir: "auto" });
  const after = h("section", { id: "run-details" });
  const stop = form.querySelector("#stop");
  const ask = form.querySelector("button[type=submit]");
  let running = new AbortController();
  // A read of a run's record (the run the address names, or one whose connection was lost)
  // ends when a question is asked: its record, arriving late, overwrote the new run's outcome
  // (probe K, session 40: a failed run shown "completed" under its own id, with the old run's
  // answer and a second Sources list).
  let reading = new AbortController();
  stop.addEventListener("click", () => running.abort());
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!stop.disabled) return; // one run at a time: Stop ends it
    reading.abort();
    reading = new AbortController();
    const data = new FormData(form);
    const body = {
      provider: data.get("provider"),
      model: data.get("model"),
      input: data.get("input"),
      retrieval: { corpus: data.get("corpus"), mode: data.get("mode"), searchMode: data.get("searchMode") },
    };
    showError(null);
    ending.replaceChildren();
    answer.replaceChildren();
    after.replaceChildren();
    bar.value = 0;
    runId.replaceChildren();
    running = new AbortController();
    const current = AbortSignal.any([signal, running.signal]);
    stop.disabled = false;
    ask.disabled = true;
    let outcome = null; // "completed" or "failed", once the host said so
    let started = null; // the run's id, once `run.started` named it
    let lost = null; // the network error that cut the stream after `run.started`
    try {
      const response = await request("/v1/runs", {
        method: "POST", body: JSON.stringify(body), type: "application/json",
        accept: "text/event-stream", signal: current,
      });
      for await (const { event: name, data: payload } of events(response)) {
        const step = name === "run.progress" ? payload.phase : name;
        const at = PHASES.indexOf(step);
        if (at > bar.value) bar.value = at;
        if (name === "run.progress" || name === "run.started") phase.textContent = step;
        if (name === "run.started" && payload.runId) {
          started = payload.runId;
          runId.replaceChildren(`run ${payload.runId}`);
          const names = new URLSearchParams({ run: payload.runId, corpus: body.retrieval.corpus });
          history.replaceState(null, "", `${hash("ask")}?${names}`);
        }
        if (name === "run.delta") append(answer, [named(payload.text)]);
        if (name === "run.completed") {
          outcome = "completed";
          bar.value = PHASES.length - 1;
          phase.textContent = "completed";
          renderAnswer({ ending, answer, after }, payload.result, body.retrieval.corpus);
        }
        if (name === "run.failed") {
          outcome = "failed";
          phase.textContent = "failed";
          showError(new ProblemError(payload.problem ? payload.problem.status : 500, payload.problem || payload));
          markUnchecked(answer, "The run failed");
        }
      }
      if (outcome === null) {
        phase.textContent = "failed";
        showError(new Error("The run's stream ended before the host said how the run ended."));
        markUnchecked(answer, "The run did not complete");
      }
    } catch (error) {
      if (signal.aborted) return; // the page was left: the run ended with it
      if (outcome !== null) return; // Stop pressed after the host said how the run ended
      const stopped = error.name === "AbortError";
      // A network error (fetch's TypeError) once the run started: the connection was cut (a
      // proxy's timeout, Wi-Fi lost), not the run, which the host may have completed and
      // recorded, or recorded cancelled (a disconnect cancels a run). "failed" was wrong for
      // the first (probe K, session 40): the run's record says which, read below.
      if (!stopped && started !== null && error instanceof TypeError) {
        lost = error;
      } else {
        phase.textContent = stopped ? "stopped" : "failed";
        if (!stopped) showError(error);
        markUnchecked(answer, stopped ? "The run was stopped" : "The run failed");
      }
    } finally {
      stop.disabled = true;
      ask.disabled = false;
    }
    if (lost !== null) {
      // Read once Ask is enabled again: a question asked meanwhile ends this read.
      const shown = { bar, phase, runId, ending, answer, after, form };
      await showCutRun(started, lost, body.retrieval.corpus, shown,
        AbortSignal.any([signal, reading.signal]));
    }
  });
  show(
    h("h1", {}, "Ask"),
    corpora.length ? form : h("p", { class: "notice" }, "This token may not search any corpus."),
    h("div", { class: "progress" }, bar, phase, runId),
    ending,
    answer,
    after,
  );
  const recorded = params.get("run");
  if (recorded) {
    const shown = { bar, phase, runId, ending, answer, after, form };
    await showRecordedRun(recorded, params.get("corpus"), shown,
      AbortSignal.any([signal, reading.signal]));
  }
}

async function showRecordedRun(id, addressed, shown, signal) {
  const { phase, runId, answer } = shown;
  runId.replaceChildren(`run ${id}`);
  let record;
  try {
    record = await getJson(`/v1/runs/${segment(id)}`, signal);
  } catch (error) {
    if (signal.aborted) return;
    showError(error);
    if (!(error instanceof ProblemError) || error.problem.code !== "SOURCE_UNAVAILABLE") {
      phase.textContent = "not read";
      return;
    }
    // The host gives this one answer, with no reason, both for a run of this subject whose
    // sources changed since and for a run this token cannot read or that does not exist
    // (`RunEngine.get_run`): "not found" was wrong for the first (probe K, session 40).
    phase.textContent = "unavailable";
    append(answer, [h("p", { class: "notice", id: "answer-note" },
      "This run's answer can no longer be shown: a source it read was re-indexed or deleted " +
      "since the run, or this token may no longer read it. Or there is no such run for this " +
      "token: the host answers both the same way.")]);
    return;
  }
  showRecord(record, addressed, shown);
}

// A run whose stream was cut by a network error once it had started: "connection lost", its
// streamed text marked unchecked and the error kept on screen while its record is read; then
// what the record says, as for a run the address names. A record that cannot be read leaves
// the outcome unknown (the address names the run: a reload reads it again).
async function showCutRun(id, lost, asked, shown, signal) {
  const { phase, answer } = shown;
  phase.textContent = "connection lost";
  showError(new Error(`The connection to the host was lost during the run (${lost.message}). ` +
    "The host may still have completed the run, or cancelled it: its record says how it ended."));
  markUnchecked(answer, "The connection was lost");
  let record;
  try {
    record = await getJson(`/v1/runs/${segment(id)}`, signal);
  } catch (error) {
    if (signal.aborted) return;
    phase.textContent = "outcome unknown";
    showError(error);
    answer.prepend(h("p", { class: "notice", id: "run-unknown" },
      "The connection was lost during the run and its record could not be read: reload the " +
      "page to read it again."));
    return;
  }
  showRecord(record, asked, shown);
}

// A run's record: its answer with checked citations and its sources, or how it ended. A note
// for a run without an answer comes before any text it streamed (marked unchecked).
function showRecord(record, addressed, { bar, phase, ending, answer, after, form }) {
  // The citation links go to the corpus the run searched, which its result names: the address
  // (a run id pasted with another corpus, or none) pointed them at the form's first corpus
  // (probe G). The address is a fallback only, believed only for a corpus this token may
  // search (a crafted address pointed the links at another corpus, probe V).
  const searchable = corporaFor("search");
  const fallback = searchable.includes(addressed) ? addressed : form.elements.corpus?.value;
  const corpus = typeof record.result?.corpus === "string" ? record.result.corpus : fallback;
  if (form.elements.corpus && searchable.includes(corpus)) form.elements.corpus.value = corpus;
  phase.textContent = record.status;
  if (record.result) {
    bar.value = PHASES.length - 1;
    renderAnswer({ ending, answer, after }, record.result, corpus);
  } else {
    const streamed = answer.hasChildNodes(); // text a cut run streamed: its note is `answer-note`
    answer.prepend(h("p", { class: "notice", id: streamed ? "record-note" : "answer-note" },
      record.status === "running"
        ? "This run is still running: reload the page to see its answer once it ends."
        : `This run ended without an answer (${record.status}${record.errorCode ? `, ${record.errorCode}` : ""}).`));
  }
}

// How the model ended a completed run's answer (`finishReason`, added in session 42). A run
// completes whatever it says, so an answer cut at the token limit, filtered or ended for
// another reason looked whole in this console, its citations checked (until session 43): such
// an ending is said above the answer; "stop", and null (a record from before hosts kept the
// reason), in a quiet line.
const FINISH_NOTES = {
  length: ["The answer was cut at the token limit",
    " (length): it is incomplete, even where its citations check."],
  "content-filter": ["The answer was cut by the provider's content filter",
    " (content-filter): it may be incomplete."],
  other: ["The answer ended for another reason the provider gave",
    " (other): it may be incomplete."],
};

function finishNote(reason) {
  if (reason === "stop" || reason === null || reason === undefined) {
    return h("p", { class: "finish muted", id: "finish-reason" }, reason === "stop"
      ? "Ended: the model finished its answer (stop)."
      : "How the answer ended: not recorded (an earlier release).");
  }
  // A reason a later host may add: shown as sent, as a warning still.
  const [headline, detail] = Object.hasOwn(FINISH_NOTES, reason) ? FINISH_NOTES[reason]
    : ["The answer ended for a reason this console does not know",
      [" (", named(String(reason)), "): it may be incomplete."]];
  return h("p", { class: "notice finish", id: "finish-reason" }, h("strong", {}, headline), detail);
}

// Text a run streamed before it failed or was stopped: the host checked none of its citations
// and recorded no answer, so it stays readable (what the model said, for the operator) but under
// a label and greyed and struck through, its markers not links.
function markUnchecked(answer, what) {
  if (!answer.hasChildNodes()) return;
  const streamed = [...answer.childNodes];
  answer.replaceChildren(
    h("p", { class: "unchecked-note", id: "answer-note" },
      `${what}: this text was not checked and is not an answer.`),
    h("pre", { class: "unchecked", dir: "auto" }, streamed),
  );
}

// The answer with its `[source:ID]` markers as links to the cited passages, at the revision the
// run's source manifest names; a marker that names no entry is marked invalid, and one the
// host's check calls malformed (wrong case, spaces, an empty id) is marked malformed. Neither
// is a link. The text around the markers comes from documents and models: its bidirectional
// controls are shown as marks, and each marker is isolated (`<bdi>`), so neither the text nor
// a right-to-left passage quoted in it reorders a marker (a black-box test saw
// "[source:p…]" read "[…p:ecruos]").
function renderAnswer({ ending, answer, after }, result, corpus) {
  ending.replaceChildren(finishNote(result.finishReason));
  const manifest = new Map((result.sources || []).map((source) => [source.id, source]));
  const text = result.text;
  const pieces = [];
  const counts = { valid: 0, invalid: 0, malformed: 0 };
  let last = 0;
  for (const opening of text.matchAll(CITATION_OPEN)) {
    if (opening.index < last) continue;
    pieces.push(named(text.slice(last, opening.index)));
    CITATION.lastIndex = opening.index;
    const match = CITATION.exec(text);
    const entry = match ? manifest.get(match[1]) : undefined;
    if (entry) {
      counts.valid += 1;
      const href = passageHash(corpus, entry.id, entry.source.revision);
      pieces.push(h("bdi", {}, h("a", { class: "citation", href }, named(match[0]))));
      last = opening.index + match[0].length;
    } else if (match) {
      counts.invalid += 1;
      pieces.push(h("bdi", {}, h("span", {
        class: "citation invalid", title: "Not in the run's source manifest",
      }, named(match[0]), " (invalid)")));
      last = opening.index + match[0].length;
    } else {
      counts.malformed += 1;
      MALFORMED_CITATION.lastIndex = opening.index;
      const marker = MALFORMED_CITATION.exec(text)[0];
      pieces.push(h("bdi", {}, h("span", {
        class: "citation invalid malformed",
        title: "A malformed marker: the host's citation check refuses it (malformed-marker)",
      }, named(marker), " (malformed)")));
      last = opening.index + marker.length;
    }
  }
  pieces.push(named(text.slice(last)));
  answer.replaceChildren(h("pre", { dir: "auto" }, pieces));
  append(after, [
    h("p", { id: "citation-check" },
      `${counts.valid + counts.invalid + counts.malformed} citation(s): ${counts.valid} checked ` +
      `against the run's source manifest, ${counts.invalid} invalid, ` +
      `${counts.malformed} malformed.`),
    h("h2", {}, "Sources"),
    h("ul", {}, [...manifest.values()].map((source) => h("li", {},
      link(passageHash(corpus, source.id, source.source.revision), named(source.id)), " ",
      named(source.source.id), " ",
      h("span", { title: source.source.revision }, short(source.source.revision)), " ",
      where(source.location)))),
    h("details", { id: "receipts" }, h("summary", {}, `Receipts (${(result.receipts || []).length})`),
      h("pre", {}, json(result.receipts || []))),
  ]);
}

// --- ingest ---------------------------------------------------------------------------------

function mediaTypeOf(file) {
  const extension = file.name.includes(".") ? file.name.split(".").pop().toLowerCase() : "";
  return MEDIA_TYPES[extension] || file.type || "application/octet-stream";
}

// `GET /v1/corpora` lists the corpora a token may search: an index-only token's are not there.
// The corpus is therefore a field (with the listed ones as suggestions), and the host says
// whether this token may index into the one named.
function ingestView(signal) {
  const corpora = corporaFor("index");
  const fileInput = h("input", { type: "file", name: "file", accept: Object.keys(MEDIA_TYPES).map((e) => "." + e).join(",") });
  const sourceId = h("input", { name: "sourceId", required: true });
  const chosenName = h("span", { id: "chosen" }, "No file chosen.");
  const drop = h("label", { class: "drop wide", id: "drop" },
    "Drop a PDF, Markdown, text, HTML or e-mail file here, or choose one: ", fileInput,
    h("span", { class: "chosen" }, chosenName));
  // The file sent is the one named here; the source id follows it unless the user typed one.
  let chosen = null;
  let filledId = "";
  const choose = (file) => {
    chosen = file;
    chosenName.replaceChildren(); // `named()` may return an array: `append` flattens it
    append(chosenName, [file ? named(file.name) : "No file chosen."]);
    if (file && (sourceId.value === "" || sourceId.value === filledId)) {
      filledId = file.name.replace(/\.[^.]*$/, "");
      sourceId.value = filledId;
    }
  };
  fileInput.addEventListener("change", () => choose(fileInput.files[0] || null));
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    const files = event.dataTransfer.files;
    if (files.length !== 1) {
      showError(new Error(`Drop one file at a time (this drop held ${files.length}).`));
      return;
    }
    showError(null);
    fileInput.files = files;
    choose(files[0]);
  });
  const corpus = h("input", {
    name: "corpus", list: "index-corpora", required: true, value: corpora[0] || "",
    autocomplete: "off", spellcheck: "false",
  });
  const ingest = h("button", { type: "submit" }, "Ingest");
  const form = h("form", { class: "panel", id: "ingest-form" },
    drop,
    field("Corpus", corpus),
    h("datalist", { id: "index-corpora" }, corpora.map((id) => h("option", { value: id }))),
    field("Source id", sourceId),
    field("Revision (optional: the content's hash)", h("input", { name: "revision" })),
    field("Title (optional)", h("input", { name: "title" })),
    h("div", {}, ingest),
    corpora.length ? null : h("p", { class: "wide muted", id: "no-index-corpora" },
      "The host lists no corpus this token may index into: name one, and the host answers ",
      "whether this token may."),
  );
  const bar = h("progress", { id: "ingest-progress", max: String(INGEST_PHASES.length - 1), value: "0", "aria-label": "Ingest progress" });
  const phase = h("span", { id: "ingest-phase", "aria-live": "polite" }, "not started");
  const outcome = h("section", { id: "ingest-result", "aria-live": "polite" });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (ingest.disabled) return; // one upload at a time
    if (!chosen) {
      showError(new Error("Choose a file to ingest."));
      return;
    }
    const data = new FormData(form);
    const query = new URLSearchParams({ corpus: data.get("corpus"), sourceId: data.get("sourceId") });
    for (const name of ["revision", "title"]) if (data.get(name)) query.set(name, data.get(name));
    showError(null);
    outcome.replaceChildren();
    bar.value = 0;
    ingest.disabled = true;
    let ended = false; // the host said how the ingest ended
    let streaming = false; // the host answered: the ingest began, its outcome comes as events
    try {
      const response = await request(`/v1/retrieval/ingest?${query}`, {
        method: "POST", body: chosen, type: mediaTypeOf(chosen), accept: "text/event-stream",
        signal,
      });
      streaming = true;
      for await (const { event: name, data: payload } of events(response)) {
        const step = name === "ingest.progress" ? payload.phase : name;
        const at = INGEST_PHASES.indexOf(step);
        if (at > bar.value) bar.value = at;
        phase.textContent = name === "ingest.progress" && payload.passagesTotal !== null
          ? `${step}: ${payload.passagesDone} of ${payload.passagesTotal} passages` : step;
        if (name === "ingest.completed") {
          ended = true;
          const result = payload.result;
          phase.textContent = "completed";
          // A write-only token may not open the source it wrote: its id, not a link to a 403.
          const readable = state.corpora.some((c) => c.id === data.get("corpus"));
          outcome.append(h("p", { id: "ingested" }, `${result.status}: ${result.chunkCount} passage(s) of `,
            readable
              ? sourceLink(data.get("corpus"), result.source.id, named(result.source.id))
              : named(result.source.id),
            " at revision ", short(result.source.revision), "."));
        }
        if (name === "ingest.failed") {
          ended = true;
          phase.textContent = "failed";
          showError(new ProblemError(payload.problem.status, payload.problem));
        }
      }
      if (!ended) showUnknownIngest(phase, outcome, data.get("corpus"), data.get("sourceId"));
    } catch (error) {
      if (signal.aborted) return; // the page was left: the upload ended with it
      // A connection cut once the stream began ends the read with a network error, not a
      // clean end: the ingest may still have been committed (review V, session 40).
      if (streaming && !ended) {
        showUnknownIngest(phase, outcome, data.get("corpus"), data.get("sourceId"));
        return;
      }
      phase.textContent = "failed";
      showError(error);
    } finally {
      ingest.disabled = false;
    }
  });
  show(
    h("h1", {}, "Ingest"),
    form,
    h("div", { class: "progress" }, bar, phase),
    outcome,
  );
}

// A stream that ended before the host said how the ingest ended (a proxy closing a long
// stream, a cut connection): it left "embed: 64 of 200 passages" on screen with no error
// (probe K, session 40). The ingest may have been committed or not: the source says which
// revision is indexed.
function showUnknownIngest(phase, outcome, corpus, sourceId) {
  phase.textContent = "outcome unknown";
  showError(new Error("The ingest's stream ended before the host said how the ingest ended."));
  const readable = state.corpora.some((c) => c.id === corpus);
  outcome.append(h("p", { class: "notice", id: "ingest-unknown" },
    "It may or may not have been indexed: read the source back to see which revision is ",
    "indexed now",
    " (", !readable ? [named(sourceId), ", with a token that may search its corpus"]
      : unopenable(sourceId) ? [named(sourceId), ", with the client or the command line"]
        : sourceLink(corpus, sourceId, named(sourceId)),
    ")."));
}

// --- routing --------------------------------------------------------------------------------

function currentNav(route) {
  for (const anchor of document.querySelectorAll("#nav a")) {
    if (anchor.getAttribute("href") === `#/${route}`) anchor.setAttribute("aria-current", "page");
    else anchor.removeAttribute("aria-current");
  }
}

async function render() {
  const signal = newPage();
  if (state.token === null) {
    currentNav("");
    signInView();
    return;
  }
  const [path, search] = location.hash.replace(/^#\/?/, "").split("?");
  const names = path.split("/").filter((part) => part !== "");
  const route = names[0] || "corpora";
  const params = new URLSearchParams(search || "");
  currentNav(route);
  try {
    const parts = names.map((part) => {
      try {
        return decodeURIComponent(part);
      } catch {
        throw new Error("This address holds a broken %-escape: no page has it.");
      }
    });
    if (route === "corpora") await corporaView(signal);
    else if (route === "sources" && parts[1]) await sourcesView(parts[1], params, signal);
    else if (route === "source" && parts[2]) await sourceView(parts[1], parts[2], params, signal);
    else if (route === "passage" && parts[2]) {
      await passageView(parts[1], parts[2], params.get("revision"), signal);
    } else if (route === "search") searchView(signal);
    else if (route === "ask") await askView(signal, params);
    else if (route === "ingest") ingestView(signal);
    else show(h("h1", {}, "Not found"), h("p", {}, "No such page in the console."), link("#/corpora", "Corpora"));
  } catch (error) {
    if (signal.aborted) return; // the user left this page (or was signed out) meanwhile
    showError(error);
    show(h("h1", {}, "Could not load this page"),
      h("p", {}, link("#/corpora", "Back to the corpora")));
  }
}

document.getElementById("sign-out").addEventListener("click", () => {
  showError(null);
  signOut();
});
window.addEventListener("hashchange", () => {
  if (!state.keepError) showError(null);
  state.keepError = false;
  render();
});
render();

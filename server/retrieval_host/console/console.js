// The retrieval-host operator console: one ES module, no dependencies, no build step.
//
// The bearer token lives in `state.token`, a variable of this tab: never in a URL, a cookie or
// web storage. Every element is built with the DOM API and every text from the host goes in
// through text nodes, so a passage holding markup shows as text. Locations in the address bar
// (`#/...`) hold corpus, source and passage ids and page cursors, never the token.

const state = { token: null, signedIn: false, corpora: [], keepError: false };

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
  text: "text/plain",
  html: "text/html",
  htm: "text/html",
  eml: "message/rfc822",
  mbox: "application/mbox",
};
const CITATION = /\[source:([^\]\s]+)\]/g;

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
      .map(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]),
  );
}

function link(href, text) {
  return h("a", { href }, text);
}

function hash(...parts) {
  return "#/" + parts.map((part) => encodeURIComponent(part)).join("/");
}

function short(revision) {
  return revision.length > 24 ? revision.slice(0, 19) + "…" : revision;
}

function where(location) {
  if (!location) return "";
  const parts = [];
  if (location.page !== null && location.page !== undefined) parts.push(`page ${location.page}`);
  if (location.startLine !== null && location.startLine !== undefined) {
    parts.push(`lines ${location.startLine}–${location.endLine ?? location.startLine}`);
  }
  if (location.documentId) parts.push(`message ${location.documentId}`);
  return parts.join(", ");
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
  append(box, [h("strong", {}, title), detail + extra]);
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

async function request(path, { method = "GET", body, type, accept, signal } = {}) {
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
    if (response.status === 401 && state.signedIn) signOut();
    throw error;
  }
  return response;
}

async function getJson(path) {
  return (await request(path)).json();
}

async function postJson(path, body) {
  return (await request(path, { method: "POST", body: JSON.stringify(body), type: "application/json" })).json();
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
  document.getElementById("nav").hidden = true;
  if (location.hash !== "#/") {
    state.keepError = true; // the error that signed the user out stays on screen
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
    state.token = input.value.trim();
    input.value = "";
    try {
      await loadCorpora();
      state.signedIn = true;
      document.getElementById("nav").hidden = false;
      showError(null);
      if (location.hash === "#/corpora") render();
      else location.hash = "#/corpora";
    } catch (error) {
      state.token = null;
      showError(error);
    }
  });
  show(form);
  input.focus();
}

async function loadCorpora() {
  state.corpora = (await getJson("/v1/corpora")).corpora;
}

function corporaFor(operation) {
  return state.corpora.filter((corpus) => corpus.operations.includes(operation)).map((c) => c.id);
}

// --- browse ---------------------------------------------------------------------------------

async function corporaView() {
  await loadCorpora();
  if (state.corpora.length === 0) {
    show(h("h1", {}, "Corpora"), h("p", { class: "notice", id: "no-corpora" },
      "This token may not search any corpus: there is nothing to show."));
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
        h("td", {}, link(hash("sources", corpus.id), corpus.id)),
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

async function sourcesView(corpus, params) {
  const query = new URLSearchParams();
  query.set("limit", "50");
  for (const name of ["cursor", "title", "mediaType"]) {
    if (params.get(name)) query.set(name, params.get(name));
  }
  const page = await getJson(`/v1/corpora/${encodeURIComponent(corpus)}/sources?${query}`);
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
  const nextParams = new URLSearchParams(params);
  if (page.nextCursor) nextParams.set("cursor", page.nextCursor);
  show(
    h("h1", {}, `Sources of ${corpus}`),
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
        h("td", {}, link(hash("source", corpus, source.id), source.id)),
        h("td", {}, source.title),
        h("td", {}, source.mediaType || "–"),
        h("td", { title: source.revision }, short(source.revision)),
        h("td", {}, source.chunkCount),
        h("td", {}, source.indexedAt || "–"),
      ))),
    )),
    h("p", {},
      params.get("cursor") ? [link(hash("sources", corpus), "First page"), " "] : null,
      page.nextCursor ? link(hash("sources", corpus) + "?" + nextParams, "Next page") : null),
  );
}

function messageOf(metadata, documentId) {
  const messages = (metadata && metadata.messages) || [];
  return messages.find((message) => message.messageId === documentId) || null;
}

async function sourceView(corpus, sourceId, params) {
  const query = new URLSearchParams({ limit: "200" });
  if (params.get("cursor")) query.set("cursor", params.get("cursor"));
  const detail = await getJson(
    `/v1/corpora/${encodeURIComponent(corpus)}/sources/${encodeURIComponent(sourceId)}?${query}`);
  const source = detail.source;
  show(
    h("h1", {}, source.title || source.id),
    facts([
      ["Corpus", link(hash("sources", corpus), corpus)],
      ["Source", source.id],
      ["Revision", source.revision],
      ["Media type", source.mediaType],
      ["Indexed", source.indexedAt],
      ["Passages", String(source.chunkCount)],
      ["Bytes", String(source.bytes)],
    ]),
    h("details", {}, h("summary", {}, "Metadata"), h("pre", {}, JSON.stringify(source.metadata, null, 2))),
    h("h2", {}, "Passages in document order"),
    h("div", { class: "table-wrap" }, h(
      "table",
      { id: "passages" },
      h("thead", {}, h("tr", {}, ["Passage", "Where", "Bytes"].map((name) => h("th", { scope: "col" }, name)))),
      h("tbody", {}, detail.passages.map((passage) => h(
        "tr",
        {},
        h("td", {}, link(hash("passage", corpus, passage.chunkId), passage.chunkId)),
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
// passages before and after it, and for e-mail the headers of its message.
async function passageView(corpus, chunkId) {
  const base = `/v1/corpora/${encodeURIComponent(corpus)}`;
  const passage = await getJson(`${base}/passages/${encodeURIComponent(chunkId)}`);
  const sourceId = passage.source.id;
  const detail = await getJson(`${base}/sources/${encodeURIComponent(sourceId)}?limit=1000`);
  const order = detail.passages.map((p) => p.chunkId);
  const at = order.indexOf(chunkId);
  const around = async (i) => (i < 0 || i >= order.length
    ? null
    : getJson(`${base}/passages/${encodeURIComponent(order[i])}`).catch(() => null));
  const [before, after] = at < 0 ? [null, null] : await Promise.all([around(at - 1), around(at + 1)]);
  const message = messageOf(detail.source.metadata, passage.location.documentId);
  show(
    h("h1", {}, `Passage ${chunkId}`),
    facts([
      ["Source", link(hash("source", corpus, sourceId), detail.source.title || sourceId)],
      ["Revision", passage.source.revision],
      ["Media type", detail.source.mediaType],
      ["Where", where(passage.location)],
      ["Page", passage.location.page === null ? null : String(passage.location.page)],
    ]),
    message ? [h("h2", {}, "Message headers"), facts([
      ["From", message.from], ["Date", message.date], ["Subject", message.subject],
      ["Message-ID", message.messageId],
      ["Attachments", (message.attachments || []).map((a) => a.filename).join(", ")],
    ])] : null,
    before ? [h("h2", {}, `Before (${where(before.location)})`), h("pre", { class: "passage around" }, before.text)] : null,
    h("h2", {}, `Cited passage (${where(passage.location)})`),
    h("pre", { class: "passage cited", id: "cited" }, passage.text),
    after ? [h("h2", {}, `After (${where(after.location)})`), h("pre", { class: "passage around" }, after.text)] : null,
  );
}

// --- search ---------------------------------------------------------------------------------

function searchView() {
  const corpora = corporaFor("search");
  const form = h("form", { class: "panel", id: "search-form" },
    field("Corpus", select("corpus", corpora, corpora[0])),
    field("Mode", select("mode", ["hybrid", "dense", "lexical"], "hybrid")),
    field("Limit", h("input", { name: "limit", type: "number", min: "1", max: "1000", value: "10" })),
    field("Byte budget", h("input", { name: "maxContextBytes", type: "number", min: "1", placeholder: "host default" })),
    h("div", { class: "wide" }, field("Query", h("input", { name: "query", type: "search", required: true }))),
    h("div", { class: "wide" }, field("Filters (JSON, optional)", h("textarea", { name: "filters", placeholder: '{"mediaType": "text/markdown"}' }))),
    h("div", {}, h("button", { type: "submit" }, "Search")),
  );
  const results = h("section", { id: "results", "aria-live": "polite" });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
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
        showError(new Error(`The filters are not JSON: ${error.message}`));
        return;
      }
    }
    showError(null);
    try {
      renderHits(results, body, await postJson("/v1/retrieval/search", body));
    } catch (error) {
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
        link(hash("source", body.corpus, hit.source.id), hit.source.id),
        h("span", { title: hit.source.revision }, short(hit.source.revision)),
        h("span", {}, where(hit.location)),
      ),
      h("pre", { class: "passage" }, highlighted(hit.text, body.query)),
      link(hash("passage", body.corpus, hit.chunkId), "Open the passage in its source"),
    ))),
  ]);
}

// --- ask ------------------------------------------------------------------------------------

let running = null;

function askView() {
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
  const answer = h("div", { class: "answer", id: "answer", "aria-live": "polite" });
  const after = h("section", { id: "run-details" });
  const stop = form.querySelector("#stop");
  stop.addEventListener("click", () => running && running.abort());
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const body = {
      provider: data.get("provider"),
      model: data.get("model"),
      input: data.get("input"),
      retrieval: { corpus: data.get("corpus"), mode: data.get("mode"), searchMode: data.get("searchMode") },
    };
    showError(null);
    answer.replaceChildren();
    after.replaceChildren();
    bar.value = 0;
    running = new AbortController();
    stop.disabled = false;
    try {
      const response = await request("/v1/runs", {
        method: "POST", body: JSON.stringify(body), type: "application/json",
        accept: "text/event-stream", signal: running.signal,
      });
      for await (const { event: name, data: payload } of events(response)) {
        const step = name === "run.progress" ? payload.phase : name;
        const at = PHASES.indexOf(step);
        if (at > bar.value) bar.value = at;
        if (name === "run.progress" || name === "run.started") phase.textContent = step;
        if (name === "run.delta") answer.append(document.createTextNode(payload.text));
        if (name === "run.completed") {
          bar.value = PHASES.length - 1;
          phase.textContent = "completed";
          renderAnswer(answer, after, payload.result, body.retrieval.corpus);
        }
        if (name === "run.failed") {
          phase.textContent = "failed";
          showError(new ProblemError(payload.problem ? payload.problem.status : 500, payload.problem || payload));
        }
      }
    } catch (error) {
      phase.textContent = error.name === "AbortError" ? "stopped" : "failed";
      if (error.name !== "AbortError") showError(error);
    } finally {
      running = null;
      stop.disabled = true;
    }
  });
  show(
    h("h1", {}, "Ask"),
    corpora.length ? form : h("p", { class: "notice" }, "This token may not search any corpus."),
    h("div", { class: "progress" }, bar, phase),
    answer,
    after,
  );
}

// The answer with its `[source:ID]` markers as links to the cited passages; a marker that names
// no entry of the run's source manifest is marked invalid, not linked.
function renderAnswer(answer, after, result, corpus) {
  const manifest = new Map((result.sources || []).map((source) => [source.id, source]));
  const pieces = [];
  let last = 0;
  let valid = 0;
  let invalid = 0;
  for (const match of result.text.matchAll(CITATION)) {
    pieces.push(result.text.slice(last, match.index));
    const id = match[1];
    if (manifest.has(id)) {
      valid += 1;
      pieces.push(h("a", { class: "citation", href: hash("passage", corpus, id) }, match[0]));
    } else {
      invalid += 1;
      pieces.push(h("span", { class: "citation invalid", title: "Not in the run's source manifest" }, match[0] + " (invalid)"));
    }
    last = match.index + match[0].length;
  }
  pieces.push(result.text.slice(last));
  answer.replaceChildren(h("pre", {}, pieces));
  append(after, [
    h("p", { id: "citation-check" },
      `${valid + invalid} citation(s): ${valid} checked against the run's source manifest, ${invalid} invalid.`),
    h("h2", {}, "Sources"),
    h("ul", {}, [...manifest.values()].map((source) => h("li", {},
      link(hash("passage", corpus, source.id), source.id), ` ${source.source.id} `,
      h("span", { title: source.source.revision }, short(source.source.revision)), ` ${where(source.location)}`))),
    h("details", { id: "receipts" }, h("summary", {}, `Receipts (${(result.receipts || []).length})`),
      h("pre", {}, JSON.stringify(result.receipts || [], null, 2))),
  ]);
}

// --- ingest ---------------------------------------------------------------------------------

function mediaTypeOf(file) {
  const extension = file.name.includes(".") ? file.name.split(".").pop().toLowerCase() : "";
  return MEDIA_TYPES[extension] || file.type || "application/octet-stream";
}

function ingestView() {
  const corpora = corporaFor("index");
  let chosen = null;
  const fileInput = h("input", { type: "file", name: "file", accept: Object.keys(MEDIA_TYPES).map((e) => "." + e).join(",") });
  const sourceId = h("input", { name: "sourceId", required: true });
  const drop = h("label", { class: "drop wide", id: "drop" }, "Drop a PDF, Markdown, text, HTML or e-mail file here, or choose one: ", fileInput);
  const choose = (file) => {
    chosen = file;
    if (file && !sourceId.value) sourceId.value = file.name.replace(/\.[^.]*$/, "");
  };
  fileInput.addEventListener("change", () => choose(fileInput.files[0] || null));
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    choose(event.dataTransfer.files[0] || null);
    if (chosen) drop.lastChild.before(document.createTextNode(`${chosen.name} `));
  });
  const form = h("form", { class: "panel", id: "ingest-form" },
    drop,
    field("Corpus", select("corpus", corpora, corpora[0])),
    field("Source id", sourceId),
    field("Revision (optional: the content's hash)", h("input", { name: "revision" })),
    field("Title (optional)", h("input", { name: "title" })),
    h("div", {}, h("button", { type: "submit" }, "Ingest")),
  );
  const bar = h("progress", { id: "ingest-progress", max: String(INGEST_PHASES.length - 1), value: "0", "aria-label": "Ingest progress" });
  const phase = h("span", { id: "ingest-phase", "aria-live": "polite" }, "not started");
  const outcome = h("section", { id: "ingest-result", "aria-live": "polite" });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
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
    try {
      const response = await request(`/v1/retrieval/ingest?${query}`, {
        method: "POST", body: chosen, type: mediaTypeOf(chosen), accept: "text/event-stream",
      });
      for await (const { event: name, data: payload } of events(response)) {
        const step = name === "ingest.progress" ? payload.phase : name;
        const at = INGEST_PHASES.indexOf(step);
        if (at > bar.value) bar.value = at;
        phase.textContent = name === "ingest.progress" && payload.passagesTotal !== null
          ? `${step}: ${payload.passagesDone} of ${payload.passagesTotal} passages` : step;
        if (name === "ingest.completed") {
          const result = payload.result;
          phase.textContent = "completed";
          outcome.append(h("p", { id: "ingested" }, `${result.status}: ${result.chunkCount} passage(s) of `,
            link(hash("source", data.get("corpus"), result.source.id), result.source.id),
            ` at revision ${short(result.source.revision)}.`));
        }
        if (name === "ingest.failed") {
          phase.textContent = "failed";
          showError(new ProblemError(payload.problem.status, payload.problem));
        }
      }
    } catch (error) {
      phase.textContent = "failed";
      showError(error);
    }
  });
  show(
    h("h1", {}, "Ingest"),
    corpora.length ? form : h("p", { class: "notice" }, "This token may not index into any corpus."),
    h("div", { class: "progress" }, bar, phase),
    outcome,
  );
}

// --- routing --------------------------------------------------------------------------------

function currentNav(route) {
  for (const anchor of document.querySelectorAll("#nav a")) {
    if (anchor.getAttribute("href") === `#/${route}`) anchor.setAttribute("aria-current", "page");
    else anchor.removeAttribute("aria-current");
  }
}

async function render() {
  const [path, search] = location.hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/").filter((part) => part !== "").map(decodeURIComponent);
  const params = new URLSearchParams(search || "");
  if (state.token === null) {
    currentNav("");
    signInView();
    return;
  }
  const route = parts[0] || "corpora";
  currentNav(route);
  try {
    if (route === "corpora") await corporaView();
    else if (route === "sources" && parts[1]) await sourcesView(parts[1], params);
    else if (route === "source" && parts[2]) await sourceView(parts[1], parts[2], params);
    else if (route === "passage" && parts[2]) await passageView(parts[1], parts[2]);
    else if (route === "search") searchView();
    else if (route === "ask") askView();
    else if (route === "ingest") ingestView();
    else show(h("h1", {}, "Not found"), h("p", {}, "No such page in the console."), link("#/corpora", "Corpora"));
  } catch (error) {
    showError(error);
    if (state.token !== null) show(h("h1", {}, "Could not load this page"), h("p", {}, link("#/corpora", "Back to the corpora")));
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

"""The operator console's static files (`index.html`, `console.js`, `console.css`), served by
`retrieval_host.http.console` at `/console/`. Plain HTML, CSS and an ES module: no build step,
no third-party script, nothing fetched from anywhere but the host itself."""

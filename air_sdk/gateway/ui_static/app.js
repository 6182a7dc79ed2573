// AIR's web page: the jobs list and a live job page. The token stays in this tab's
// sessionStorage and goes out only as an Authorization header. Everything shown that a
// user wrote is either set as text (textContent) or comes as HTML the gateway escaped
// (the notebook monitor's renderer).
"use strict";

const TOKEN_KEY = "air-token";
const REFRESH_MIN_MS = 500; // the job page is redrawn at most twice a second
let current = null; // {jobId, abort, timer, pending, lastDraw}

function $(id) { return document.getElementById(id); }
function token() { return sessionStorage.getItem(TOKEN_KEY); }

function show(section) {
  for (const id of ["login", "jobs", "job"]) $(id).hidden = id !== section;
  $("logout").hidden = section === "login";
  $("error").textContent = "";
}

async function api(path, options = {}) {
  const headers = Object.assign({ Authorization: "Bearer " + token() }, options.headers || {});
  const answer = await fetch(path, Object.assign({}, options, { headers }));
  if (answer.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    stopJob();
    show("login");
    $("login-error").textContent = await detail(answer);
    throw new Error("not signed in");
  }
  return answer;
}

async function detail(answer) {
  try {
    const body = await answer.json();
    return typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
  } catch (e) {
    return answer.status + " " + answer.statusText;
  }
}

function age(createdAt) {
  const s = Math.max(0, Date.now() / 1000 - createdAt);
  if (s < 90) return Math.round(s) + "s";
  if (s < 5400) return Math.round(s / 60) + "m";
  if (s < 129600) return Math.round(s / 3600) + "h";
  return Math.round(s / 86400) + "d";
}

// -- the jobs list ---------------------------------------------------------------------

async function showJobs() {
  show("jobs");
  const answer = await api("/v1/jobs?limit=200");
  if (!answer.ok) { $("error").textContent = await detail(answer); return; }
  const jobs = (await answer.json()).jobs;
  const body = $("jobs-table").querySelector("tbody");
  body.replaceChildren();
  for (const job of jobs) {
    const row = document.createElement("tr");
    row.className = "job-row";
    row.dataset.job = job.id;
    const link = document.createElement("a");
    link.href = "#job=" + encodeURIComponent(job.id);
    link.textContent = job.id;
    const res = job.spec.resources;
    const cells = [link, job.name, job.state, res.nodes + " x " + res.procs_per_node, age(job.created_at)];
    for (const value of cells) {
      const cell = document.createElement("td");
      if (value instanceof Node) cell.append(value); else cell.textContent = value;
      row.append(cell);
    }
    body.append(row);
  }
  $("jobs-empty").hidden = jobs.length > 0;
}

// -- one job, live ---------------------------------------------------------------------

function stopJob() {
  if (current === null) return;
  if (current.abort) current.abort.abort();
  clearTimeout(current.timer);
  current = null;
}

async function draw(view) {
  const answer = await api("/v1/ui/jobs/" + encodeURIComponent(view.jobId));
  if (view !== current) return;
  if (!answer.ok) { $("error").textContent = await detail(answer); return; }
  const page = await answer.json();
  $("job-title").textContent = page.job_id;
  $("monitor").innerHTML = page.html; // escaped by the gateway's renderer
  $("monitor").dataset.state = page.state;
  $("cancel").hidden = !page.can_cancel;
  $("action-result").dataset.readOnly = page.can_cancel || page.terminal ? "" : "yes";
  if (!page.can_cancel && !page.terminal) $("action-result").textContent = "read-only token: it cannot cancel";
  view.lastSeq = page.last_seq;
  view.lastDraw = Date.now();
  return page;
}

function redrawSoon(view) {
  if (view.pending) return;
  view.pending = true;
  const wait = Math.max(0, REFRESH_MIN_MS - (Date.now() - (view.lastDraw || 0)));
  view.timer = setTimeout(async () => {
    view.pending = false;
    if (view === current) await draw(view).catch(() => {});
  }, wait);
}

async function follow(view) {
  // The event stream, read with fetch so that the token travels as a header. Each event
  // is only a reason to redraw: the page's content is always the gateway's rendering.
  while (view === current) {
    view.abort = new AbortController();
    let answer;
    try {
      answer = await api("/v1/jobs/" + encodeURIComponent(view.jobId) + "/events/stream?after=" + (view.lastSeq || 0),
        { signal: view.abort.signal, headers: { Accept: "text/event-stream" } });
    } catch (e) { return; }
    if (!answer.ok) { // e.g. 429: too many open streams; poll instead
      await new Promise((r) => setTimeout(r, 2000));
      redrawSoon(view);
      continue;
    }
    const reader = answer.body.getReader();
    try {
      for (;;) {
        const { done } = await reader.read();
        if (done) break;
        redrawSoon(view);
      }
    } catch (e) { return; }
    const page = await draw(view).catch(() => null);
    if (page && page.terminal) return; // the stream ends once the job has ended
  }
}

async function showJob(jobId) {
  stopJob();
  show("job");
  $("monitor").replaceChildren();
  $("action-result").textContent = "";
  const view = { jobId, lastSeq: 0 };
  current = view;
  const page = await draw(view);
  if (page && !page.terminal) follow(view);
}

async function cancelJob() {
  if (current === null) return;
  const view = current;
  $("action-result").textContent = "cancelling...";
  const answer = await api("/v1/jobs/" + encodeURIComponent(view.jobId) + "/cancel", { method: "POST" });
  $("action-result").textContent = answer.ok ? "cancel requested" : await detail(answer);
  if (answer.ok) redrawSoon(view);
}

// -- routing ---------------------------------------------------------------------------

function route() {
  if (!token()) { stopJob(); show("login"); return; }
  $("who").textContent = "signed in";
  const match = /^#job=(.+)$/.exec(location.hash);
  if (match) showJob(decodeURIComponent(match[1])).catch(() => {});
  else { stopJob(); showJobs().catch(() => {}); }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    $("login-error").textContent = "";
    route();
  });
  $("logout").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); route(); });
  $("cancel").addEventListener("click", () => { cancelJob().catch(() => {}); });
  $("back").addEventListener("click", (event) => { event.preventDefault(); location.hash = ""; route(); });
  $("home").addEventListener("click", (event) => { event.preventDefault(); location.hash = ""; route(); });
  window.addEventListener("hashchange", route);
  route();
});

// The fp8rl web console: a jobs page, a job page with live charts, a submit page. Everything it
// shows comes from the coordinator's /v1 REST API (docs/guide.md "Web console"); it polls with
// If-None-Match, so an unchanged answer is a 304 with no body, and redraws only what changed.
'use strict';

const POLL_MS = 2000;
const PAGE_SIZE = 20;
const MAX_POINTS = 400;  // per metric; the server thins longer histories (max_points)
const TOKEN_KEY = 'fp8rl_token';
const STATES = ['QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED'];

const view = document.getElementById('view');
const etagCache = new Map();  // GET path -> {etag, data}
let chartSpec = null;         // /console/charts.json
let pollTimer = null;
let routeSerial = 0;          // bumps on every route change; stale polls drop their answers

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function esc(text) {
  return String(text).replace(/[&<>"']/g,
      (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'})[c]);
}

// Numbers as a chart or table shows them: 4 significant digits, no trailing zeros.
function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (a >= 1e5 || a < 1e-3) return v.toExponential(2);
  return String(Number(v.toPrecision(4)));
}

function fmtTime(ms) {
  return ms ? new Date(ms).toLocaleString() : '–';
}

function fmtDuration(ms) {
  if (!(ms >= 0)) return '–';
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

// One call to the API. GETs send the last ETag and reuse the cached body on 304. A 401 shows the
// token form and throws.
async function api(path, {method = 'GET', body, contentType} = {}) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers['Authorization'] = 'Bearer ' + token;
  const cached = method === 'GET' ? etagCache.get(path) : undefined;
  if (cached) headers['If-None-Match'] = cached.etag;
  if (body !== undefined) headers['Content-Type'] = contentType || 'application/json';
  const res = await fetch(path, {method, headers, body, cache: 'no-store'});
  document.getElementById('live').textContent = 'updated ' + new Date().toLocaleTimeString();
  if (res.status === 401) {
    showTokenPanel(true);
    throw new ApiError(401, 'the coordinator asks for a token');
  }
  if (res.status === 304 && cached) return {status: 200, data: cached.data, changed: false};
  let data = null;
  try {
    data = await res.json();
  } catch (e) {
    data = null;
  }
  if (res.ok && method === 'GET') {
    const etag = res.headers.get('ETag');
    if (etag) etagCache.set(path, {etag, data});
  }
  return {status: res.status, data, changed: true};
}

function showTokenPanel(show) {
  document.getElementById('token-panel').hidden = !show;
  if (show) document.getElementById('token-input').focus();
}

document.getElementById('token-form').addEventListener('submit', (e) => {
  e.preventDefault();
  const token = document.getElementById('token-input').value.trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  etagCache.clear();
  showTokenPanel(false);
  route();
});

function showError(err) {
  if (err instanceof ApiError && err.status === 401) {
    view.innerHTML = '<p class="error" id="auth-error">This coordinator needs a token: enter it above.</p>';
  } else {
    view.innerHTML = `<p class="error" id="load-error">${esc(err.message || err)}</p>`;
  }
}

// ---- charts ---------------------------------------------------------------------------------

// An SVG line chart of `series` ([{key, label}]) over `rows` (metrics rows in step order). A
// series is drawn from the rows that carry its key; each point is a <circle> with data-key,
// data-step and data-value (the raw value, also when stacked). Stacked charts draw cumulative
// sums (bars, one segment per series; a row lacking a key adds nothing for it).
function chartSvg(spec, rows, palette) {
  const W = 460, H = 200, L = 52, R = 10, T = 10, B = 28;
  const lines = [];  // [{key, label, color, pts: [[step, raw, drawn]]}]
  spec.series.forEach((s, i) => {
    lines.push({key: s.key, label: s.label, color: palette[i % palette.length], pts: []});
  });
  if (spec.stacked) {
    for (const row of rows) {
      if (!spec.series.some((s) => s.key in row.metrics)) continue;
      let sum = 0;
      lines.forEach((line) => {
        const v = row.metrics[line.key];
        if (v === undefined) return;
        sum += v;
        line.pts.push([row.step, v, sum]);
      });
    }
  } else {
    for (const row of rows) {
      for (const line of lines) {
        const v = row.metrics[line.key];
        if (v !== undefined && Number.isFinite(v)) line.pts.push([row.step, v, v]);
      }
    }
  }
  const all = lines.flatMap((l) => l.pts);
  if (all.length === 0) return null;
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  let y0 = Math.min(...all.map((p) => p[2])), y1 = Math.max(...all.map((p) => p[2]));
  if (spec.stacked) y0 = Math.min(0, y0);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const out = [`<svg viewBox="0 0 ${W} ${H}" xmlns="http://www.w3.org/2000/svg" role="img">`];
  out.push(`<rect x="${L}" y="${T}" width="${W - L - R}" height="${H - T - B}" fill="#fbfcfd" stroke="#d5dae1"/>`);
  for (const f of [0, 0.5, 1]) {
    const y = y0 + f * (y1 - y0);
    out.push(`<line x1="${L}" x2="${W - R}" y1="${sy(y)}" y2="${sy(y)}" stroke="#e6e9ee"/>`);
    out.push(`<text x="${L - 4}" y="${sy(y) + 4}" font-size="10" text-anchor="end" fill="#566">${esc(fmt(y))}</text>`);
  }
  out.push(`<text x="${L}" y="${H - 8}" font-size="10" fill="#566">step ${fmt(x0)}</text>`);
  out.push(`<text x="${W - R}" y="${H - 8}" font-size="10" text-anchor="end" fill="#566">step ${fmt(x1)}</text>`);
  // Stacked: one bar per step, a segment per series from the sum below it to its own top.
  const steps = new Set(all.map((p) => p[0]));
  const barWidth = Math.max(1, Math.min(24, 0.8 * (W - L - R) / Math.max(1, steps.size)));
  for (const line of lines) {
    if (line.pts.length === 0) continue;
    if (spec.stacked) {
      for (const p of line.pts) {
        const top = sy(p[2]), bottom = sy(p[2] - p[1]);
        out.push(`<rect class="stack-seg" x="${(sx(p[0]) - barWidth / 2).toFixed(1)}" y="${top.toFixed(1)}" width="${barWidth.toFixed(1)}" height="${Math.max(0, bottom - top).toFixed(1)}" fill="${line.color}" opacity="0.85"/>`);
      }
    } else {
      const d = line.pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[2]).toFixed(1)}`).join(' ');
      out.push(`<polyline class="series" data-key="${esc(line.key)}" fill="none" stroke="${line.color}" stroke-width="1.5" points="${d}"/>`);
    }
    for (const p of line.pts) {
      out.push(`<circle class="pt" data-key="${esc(line.key)}" data-step="${p[0]}" data-value="${p[1]}" ` +
               `cx="${sx(p[0]).toFixed(1)}" cy="${sy(p[2]).toFixed(1)}" r="${spec.stacked ? 1 : 2}" fill="${line.color}">` +
               `<title>${esc(line.label)} at step ${p[0]}: ${esc(fmt(p[1]))}</title></circle>`);
    }
  }
  out.push('</svg>');
  const legend = lines.filter((l) => l.pts.length > 0).map(
      (l) => `<span><i style="background:${l.color}"></i>${esc(l.label)}</span>`).join('');
  return out.join('') + `<div class="legend">${legend}</div>`;
}

function renderCharts(container, rows) {
  const html = chartSpec.charts.map((spec) => {
    const svg = chartSvg(spec, rows, chartSpec.palette);
    const body = svg || '<p class="empty">no values recorded yet</p>';
    return `<div class="chart" id="chart-${esc(spec.id)}"><h3>${esc(spec.title)}</h3>${body}</div>`;
  }).join('');
  container.innerHTML = html;
}

// ---- jobs page ------------------------------------------------------------------------------

function progressCell(job) {
  const p = job.progress;
  if (!p) return job.state === 'SUCCEEDED' ? 'done' : '–';
  const frac = p.total > 0 ? Math.min(1, p.done / p.total) : 0;
  const bar = p.total > 0 ? `<span class="bar"><span style="width:${(frac * 100).toFixed(0)}%"></span></span>` : '';
  const count = p.total > 0 ? ` ${p.done}/${p.total}` : '';
  return `${bar}${esc(p.phase)}${count}${p.detail ? ' · ' + esc(p.detail) : ''}`;
}

function durationOf(job) {
  const end = ['SUCCEEDED', 'FAILED', 'CANCELLED'].includes(job.state) ? job.updated_unix_ms : Date.now();
  return fmtDuration(end - job.created_unix_ms);
}

function finalAccuracy(job) {
  const m = job.latest_metrics && job.latest_metrics.metrics;
  return m && m.val_accuracy !== undefined ? fmt(m.val_accuracy) : '–';
}

function jobsPage(params) {
  const state = params.get('state') || '';
  let page = Math.max(0, parseInt(params.get('page') || '0', 10) || 0);
  view.innerHTML = `<h1>Jobs</h1>
    <div class="toolbar"><label>State <select id="state-filter">
      <option value="">all</option>${STATES.map((s) => `<option${s === state ? ' selected' : ''}>${s}</option>`).join('')}
    </select></label><a href="#/submit">Submit a job</a></div>
    <div id="jobs-body"><p>Loading…</p></div>`;
  document.getElementById('state-filter').addEventListener('change', (e) => {
    location.hash = '#/jobs' + (e.target.value ? '?state=' + e.target.value : '');
  });
  const setPage = (p) => {
    location.hash = '#/jobs?' + new URLSearchParams({...(state ? {state} : {}), page: String(p)});
  };
  return async (serial) => {
    const res = await api('/v1/jobs' + (state ? '?state=' + state : ''));
    if (serial !== routeSerial) return;
    if (res.status !== 200) throw new Error(res.data && res.data.error || `HTTP ${res.status}`);
    const jobs = res.data.jobs;  // newest first
    const pages = Math.max(1, Math.ceil(jobs.length / PAGE_SIZE));
    page = Math.min(page, pages - 1);
    const shown = jobs.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
    const rows = shown.map((job) => `<tr data-id="${esc(job.id)}">
        <td><a href="#/jobs/${encodeURIComponent(job.id)}">${esc(job.id)}</a></td>
        <td class="state state-${esc(job.state)}">${esc(job.state)}</td>
        <td>${progressCell(job)}</td><td>${job.step}/${job.total_steps}</td>
        <td>${esc(fmtTime(job.created_unix_ms))}</td><td>${esc(durationOf(job))}</td>
        <td class="accuracy">${esc(finalAccuracy(job))}</td></tr>`).join('');
    document.getElementById('jobs-body').innerHTML = jobs.length === 0 ?
        '<p id="no-jobs">No jobs' + (state ? ' in state ' + esc(state) : '') + '.</p>' :
        `<table id="jobs"><thead><tr><th>id</th><th>state</th><th>phase and progress</th><th>step</th>
           <th>submitted</th><th>duration</th><th>val accuracy (latest)</th></tr></thead>
         <tbody>${rows}</tbody></table>
         <div class="pager"><button id="prev-page"${page === 0 ? ' disabled' : ''}>newer</button>
           <span id="page-info">page ${page + 1} of ${pages} (${jobs.length} jobs)</span>
           <button id="next-page"${page >= pages - 1 ? ' disabled' : ''}>older</button></div>`;
    const prev = document.getElementById('prev-page'), next = document.getElementById('next-page');
    if (prev) prev.onclick = () => setPage(page - 1);
    if (next) next.onclick = () => setPage(page + 1);
  };
}

// ---- job page -------------------------------------------------------------------------------

function jobPage(id) {
  const jobPath = '/v1/jobs/' + encodeURIComponent(id);
  const metricsPath = jobPath + '/metrics?max_points=' + MAX_POINTS;
  view.innerHTML = `<h1>Job <span id="job-id">${esc(id)}</span></h1>
    <div id="job-summary" class="summary"><span>Loading…</span></div>
    <div id="action-msg"></div>
    <p><button id="cancel-btn" class="danger" hidden>Cancel job…</button></p>
    <h2>Events</h2><div id="job-events"><p class="muted">none</p></div>
    <h2>Metrics <small id="points-info"></small></h2><div id="charts" class="charts"></div>
    <h2>Config</h2><pre id="job-config"></pre>`;
  const cancelBtn = document.getElementById('cancel-btn');
  cancelBtn.onclick = () => confirmCancel(id);
  return async (serial) => {
    const [job, metrics, events] =
        await Promise.all([api(jobPath), api(metricsPath), api(jobPath + '/events')]);
    if (serial !== routeSerial) return;
    if (job.status !== 200) throw new Error(job.data && job.data.error || `HTTP ${job.status}`);
    if (job.changed) {
      const j = job.data;
      const terminal = ['SUCCEEDED', 'FAILED', 'CANCELLED'].includes(j.state);
      document.getElementById('job-summary').innerHTML = `
        <span>state</span><span id="job-state" class="state state-${esc(j.state)}">${esc(j.state)}</span>
        <span>phase</span><span id="job-phase">${progressCell(j)}</span>
        <span>step</span><span id="job-step">${j.step} / ${j.total_steps}</span>
        <span>submitted</span><span>${esc(fmtTime(j.created_unix_ms))}</span>
        <span>duration</span><span>${esc(durationOf(j))}</span>
        ${j.error ? `<span>error</span><span id="job-error">${esc(j.error)}</span>` : ''}`;
      cancelBtn.hidden = terminal;
      document.getElementById('job-config').textContent = JSON.stringify(j.config, null, 2);
    }
    if (events.status === 200 && events.changed) renderEvents(events.data.events);
    if (metrics.status === 200 && metrics.changed) {
      const m = metrics.data;
      renderCharts(document.getElementById('charts'), m.steps);
      document.getElementById('points-info').textContent = m.recorded_rows > m.steps.length ?
          `(${m.recorded_rows} steps recorded, thinned to ${m.steps.length} rows)` :
          `(${m.steps.length} rows)`;
    }
  };
}

// The faults the coordinator handled for the job (GET /v1/jobs/{id}/events), oldest first.
function renderEvents(events) {
  const box = document.getElementById('job-events');
  if (!events || events.length === 0) {
    box.innerHTML = '<p class="muted">none</p>';
    return;
  }
  box.innerHTML = `<table class="events"><thead><tr><th>time</th><th>kind</th><th>what happened</th>
    </tr></thead><tbody>${events.map((e) => `<tr class="event event-${esc(e.kind)}">
      <td>${esc(fmtTime(e.recorded_unix_ms))}</td><td class="event-kind">${esc(e.kind)}</td>
      <td class="event-message">${esc(e.message)}</td></tr>`).join('')}</tbody></table>`;
}

function confirmCancel(id) {
  const dialog = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent =
      `Cancel job ${id}? A running job stops at its next phase boundary.`;
  dialog.hidden = false;
  const close = () => { dialog.hidden = true; };
  document.getElementById('confirm-no').onclick = close;
  document.getElementById('confirm-yes').onclick = async () => {
    close();
    const msg = document.getElementById('action-msg');
    try {
      const res = await api('/v1/jobs/' + encodeURIComponent(id) + ':cancel', {method: 'POST'});
      msg.innerHTML = res.status === 200 ?
          `<p class="message" id="cancel-result">Cancel requested; the job is ${esc(res.data.state)}.</p>` :
          `<p class="error" id="cancel-result">${esc(res.data && res.data.error || 'HTTP ' + res.status)}</p>`;
    } catch (err) {
      msg.innerHTML = `<p class="error" id="cancel-result">${esc(err.message)}</p>`;
    }
    poll();
  };
}

// ---- submit page ----------------------------------------------------------------------------

// The line of `text` (YAML) holding the key at `path` ("algorithm.is.cap"), or -1. Follows the
// path through nested blocks by indentation; list indices ("stop_ids[2]") match their key.
function findYamlLine(text, path) {
  const lines = text.split('\n');
  let start = 0, parentIndent = -1, found = -1;
  for (const part of path.split('.').map((p) => p.replace(/\[\d+\]$/, ''))) {
    found = -1;
    for (let i = start; i < lines.length; i++) {
      const line = lines[i];
      if (!line.trim() || line.trim().startsWith('#')) continue;
      const indent = line.length - line.replace(/^[\s-]*/, '').length;
      if (indent <= parentIndent) break;  // left the parent's block
      const m = /^[\s-]*([^\s#:][^:]*?)\s*:(\s|$)/.exec(line);
      if (m && m[1].replace(/^["']|["']$/g, '') === part) {
        found = i;
        parentIndent = indent;
        start = i + 1;
        break;
      }
    }
    if (found < 0) return -1;
  }
  return found;
}

function submitPage() {
  view.innerHTML = `<h1>Submit a job</h1>
    <p>Paste a job config (YAML or JSON, the same keys as <code>fp8rl submit</code>; see the guide's
      job config reference). Paths are resolved on the coordinator's machine.</p>
    <textarea id="config-text" spellcheck="false" placeholder="name: demo&#10;model:&#10;  init: ..."></textarea>
    <p><button id="submit-btn">Submit</button></p>
    <div id="submit-result"></div>`;
  document.getElementById('submit-btn').onclick = async () => {
    const text = document.getElementById('config-text').value;
    const out = document.getElementById('submit-result');
    let res;
    try {
      res = await api('/v1/jobs', {method: 'POST', body: text, contentType: 'application/yaml'});
    } catch (err) {
      out.innerHTML = `<p class="error" id="submit-error">${esc(err.message)}</p>`;
      return;
    }
    if (res.status === 201) {
      out.innerHTML = `<p class="message" id="submit-ok">Submitted <a href="#/jobs/${encodeURIComponent(res.data.id)}">${esc(res.data.id)}</a> (${esc(res.data.state)}).</p>`;
      return;
    }
    const error = res.data && res.data.error || `HTTP ${res.status}`;
    // The API names the field first: "algorithm.samples_per_prompt: must be >= 2".
    const m = /^([A-Za-z_][\w.\[\]]*): ([\s\S]*)$/.exec(error);
    const path = m ? m[1] : '';
    const message = m ? m[2] : error;
    let html = `<div class="field-error" id="submit-error"><span class="field-path" id="error-path">${esc(path || 'config')}</span>: <span id="error-message">${esc(message)}</span></div>`;
    const line = path ? findYamlLine(text, path) : -1;
    if (line >= 0) {
      html += '<div class="lines" id="config-lines">' + text.split('\n').map((l, i) =>
          i === line ?
              `<div class="error-line" id="error-line"><span class="lineno">${i + 1}</span>${esc(l)}<span class="inline-error">← ${esc(message)}</span></div>` :
              `<div><span class="lineno">${i + 1}</span>${esc(l)}</div>`).join('') + '</div>';
    }
    out.innerHTML = html;
  };
  return null;  // nothing to poll
}

// ---- routing and polling --------------------------------------------------------------------

let poller = null;

async function poll() {
  if (!poller) return;
  const serial = routeSerial;
  try {
    await poller(serial);
  } catch (err) {
    if (serial === routeSerial) showError(err);
    poller = null;  // stop until the next route change (the token form calls route())
  }
}

async function route() {
  routeSerial += 1;
  clearInterval(pollTimer);
  poller = null;
  if (!chartSpec) {
    const res = await fetch('/console/charts.json');
    chartSpec = await res.json();
  }
  const hash = location.hash.replace(/^#/, '') || '/jobs';
  const [path, query] = hash.split('?');
  const params = new URLSearchParams(query || '');
  let m;
  if ((m = /^\/jobs\/(.+)$/.exec(path))) {
    poller = jobPage(decodeURIComponent(m[1]));
  } else if (path === '/submit') {
    poller = submitPage();
  } else {
    poller = jobsPage(params);
  }
  if (poller) {
    await poll();
    pollTimer = setInterval(poll, POLL_MS);
  }
}

window.addEventListener('hashchange', route);
route();

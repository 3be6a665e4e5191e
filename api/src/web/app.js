// Kiln's web view: plain JavaScript, no build step, no dependencies.
//
// Rules this file keeps:
// - Everything the API returns is untrusted (model output, tool output,
//   prompts). It only ever becomes text nodes, attribute values or
//   `textContent`; nothing is parsed as HTML. The page's CSP forbids inline
//   script besides.
// - A run page renders each event once, in seq order: events that arrive
//   twice (a reconnect) are dropped, and a gap (an event kind this page has
//   no listener for) is filled from the JSON page of the same endpoint.
//   Every rendered piece carries `data-from`/`data-to`, the seqs it shows.
// - Long runs stay fast: events are queued and rendered in batches, only
//   ever appended or patched in place (never a re-render of the list), and
//   consecutive text deltas grow one text node.
'use strict';

(() => {
  const TOKEN_KEY = 'kiln.token';
  const TERMINAL = ['run.succeeded', 'run.failed', 'run.cancelled', 'run.timed_out'];
  // EventSource delivers named events only to listeners of that name.
  const KINDS = [
    'run.queued', 'run.started', 'sandbox.ready', 'step.started', 'text.delta', 'reasoning.delta',
    'tool_call.started', 'tool_call.delta', 'tool_call.ready', 'tool.output', 'tool.result',
    'step.finished', 'approval.requested', 'approval.resolved', 'message.queued', 'model.retry',
    'compaction', 'todo', 'delivery.succeeded', 'delivery.failed', 'delivery.retrying', 'callback.succeeded', 'callback.failed',
    'network.denied', 'network.allowed', 'subagent.started', 'subagent.event', 'subagent.finished',
    'attempt.event', 'attempt.finished', 'attempt.selected',
    'changes.captured', 'environment.started', 'environment.output', 'environment.finished', ...TERMINAL,
  ];
  const RENDER_BATCH = 500; // events rendered per frame; the rest wait for the next
  const RUNS_POLL_MS = 2000;

  const $ = (id) => document.getElementById(id);

  // Builds an element. Children that are strings become text nodes.
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === 'class') node.className = value;
      else if (key === 'data') for (const [k, v] of Object.entries(value)) node.dataset[k] = String(v);
      else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  // ---- token and API -------------------------------------------------------

  const token = () => sessionStorage.getItem(TOKEN_KEY) || '';

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body) {
    const headers = { Authorization: 'Bearer ' + token(), Accept: 'application/json' };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let res;
    try {
      res = await fetch(path, {
        method, headers, cache: 'no-store', body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw new ApiError(0, 'network', 'The API cannot be reached (' + e.message + ')');
    }
    let data = null;
    try { data = await res.json(); } catch (_) { /* not JSON: the status says enough */ }
    if (!res.ok) {
      const err = (data && data.error) || {};
      if (res.status === 401) signOut('Signed out: ' + (err.message || 'the token was refused'));
      throw new ApiError(res.status, err.code || 'http', err.message || 'HTTP ' + res.status);
    }
    return data;
  }

  // The subject and expiry of a JWT, for display only (the API checks it).
  function tokenClaims(t) {
    try {
      const part = t.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
      return JSON.parse(atob(part + '='.repeat((4 - (part.length % 4)) % 4)));
    } catch (_) {
      return {};
    }
  }

  function notice(message) {
    const n = $('notice');
    n.textContent = message || '';
    n.hidden = !message;
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    route();
    notice(message || '');
  }

  // ---- formatting ----------------------------------------------------------

  function age(iso) {
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (s < 60) return Math.floor(s) + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm';
    if (s < 86400) return Math.floor(s / 3600) + 'h';
    return Math.floor(s / 86400) + 'd';
  }
  const usd = (n) => '$' + n.toFixed(4);
  // As `kiln runs` and `kiln follow` say it: `$x`, `$x+` when some model
  // calls had no price, `n/a` when none had, `—` before any step.
  function costText(c) {
    if (c.usd > 0) return usd(c.usd) + (c.unpriced ? '+' : '');
    if (c.unpriced) return 'n/a';
    return c.steps ? usd(0) : '—';
  }
  const ms = (n) => (n >= 1000 ? (n / 1000).toFixed(1) + ' s' : n + ' ms');
  const num = (n) => Number(n || 0).toLocaleString('en');
  function pretty(value) {
    if (typeof value === 'string') return value;
    try { return JSON.stringify(value, null, 2); } catch (_) { return String(value); }
  }
  function safeLink(url) {
    try {
      const u = new URL(url);
      if (u.protocol === 'https:' || u.protocol === 'http:') return el('a', { href: u.href, rel: 'noopener noreferrer', target: '_blank' }, u.href);
    } catch (_) { /* not a URL: show as text */ }
    return String(url);
  }

  // ---- routing -------------------------------------------------------------

  let view = null; // the open view; its stop() ends its timers and streams

  function route() {
    if (view) view.stop();
    view = null;
    notice('');
    for (const id of ['view-signin', 'view-runs', 'view-run', 'view-envs']) $(id).hidden = true;
    const t = token();
    $('signout').hidden = !t;
    $('whoami').textContent = t ? String(tokenClaims(t).sub || '') : '';
    if (!t) {
      $('nav-envs').hidden = true;
      $('view-signin').hidden = false;
      return;
    }
    $('nav-envs').hidden = false;
    if (location.hash === '#/environments') {
      view = envsView();
      return;
    }
    const m = /^#\/runs\/([0-9a-fA-F-]{36})$/.exec(location.hash);
    view = m ? runView(m[1].toLowerCase()) : runsView();
  }

  // ---- sign in -------------------------------------------------------------

  // The token in what was pasted: the token itself, `Bearer <token>`, or the
  // whole `export KILN_URL=… KILN_TOKEN=…` line `kiln up` prints.
  function pastedToken(text) {
    const t = String(text || '').trim();
    const m = /(?:^|\s)KILN_TOKEN=(["']?)([^\s"']+)\1/.exec(t);
    if (m) return m[2];
    return t.replace(/^Bearer\s+/i, '');
  }

  async function signIn(ev) {
    ev.preventDefault();
    const t = pastedToken($('signin-token').value);
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    try {
      await api('GET', '/v1/runs?limit=1');
    } catch (e) {
      if (e.status !== 401) notice(e.message);
      return;
    }
    $('signin-token').value = '';
    if (location.hash !== '#/' && !location.hash.startsWith('#/runs/')) location.hash = '#/';
    route();
  }

  // ---- runs list -----------------------------------------------------------

  // Cost per run, summed from its step.finished events and extended as new
  // events arrive; `after` is the last seq read.
  const costs = new Map();

  function runsView() {
    $('view-runs').hidden = false;
    const body = $('runs-body');
    body.replaceChildren();
    const rows = new Map();
    let timer = null;
    let stopped = false;
    let costing = false;

    function makeRow(run) {
      const status = el('span', { class: 'status' });
      const link = el('a', { href: '#/runs/' + run.id }, run.prompt);
      const tr = el('tr', { data: { run: run.id } },
        el('td', null, status), el('td', { class: 'prompt', title: run.prompt }, link),
        el('td', { class: 'age' }), el('td', { class: 'num cost' }, '…'));
      tr.addEventListener('click', (e) => { if (e.target.tagName !== 'A') location.hash = '#/runs/' + run.id; });
      return { tr, status, age: tr.children[2], cost: tr.children[3] };
    }

    function render(runs) {
      runs.forEach((run, i) => {
        let row = rows.get(run.id);
        if (!row) { row = makeRow(run); rows.set(run.id, row); }
        if (row.status.dataset.status !== run.status) {
          row.status.dataset.status = run.status;
          row.status.textContent = run.status.replace('_', ' ');
        }
        row.age.textContent = age(run.created_at);
        row.age.title = run.created_at;
        const c = costs.get(run.id);
        if (c && c.after >= run.last_event_seq) row.cost.textContent = costText(c);
        if (body.children[i] !== row.tr) body.insertBefore(row.tr, body.children[i] || null);
      });
      const keep = new Set(runs.map((r) => r.id));
      for (const [id, row] of rows) if (!keep.has(id)) { row.tr.remove(); rows.delete(id); }
      $('runs-empty').hidden = runs.length > 0;
    }

    // Reads new events of each listed run, one run at a time, to total its cost.
    async function updateCosts(runs) {
      if (costing) return;
      costing = true;
      try {
        for (const run of runs) {
          if (stopped) return;
          const c = costs.get(run.id) || { after: 0, usd: 0, unpriced: false, steps: 0 };
          costs.set(run.id, c);
          while (c.after < run.last_event_seq && !stopped) {
            const page = await api('GET', `/v1/runs/${run.id}/events?after=${c.after}&limit=1000`);
            for (const ev of page.events) {
              if (ev.kind === 'step.finished') {
                c.steps += 1;
                if (typeof ev.payload.cost_usd === 'number') c.usd += ev.payload.cost_usd;
                else c.unpriced = true;
              } else if (ev.kind === 'attempt.finished') {
                // A group spends nothing itself: its attempts' sum.
                const steps = Number(ev.payload.steps) || 0;
                c.steps += steps;
                if (typeof ev.payload.cost_usd === 'number') c.usd += ev.payload.cost_usd;
                else if (steps) c.unpriced = true;
              }
            }
            if (!page.events.length) break;
            c.after = page.next_after;
          }
          const row = rows.get(run.id);
          if (row) row.cost.textContent = costText(c);
        }
      } catch (e) {
        if (e.status !== 401) notice(e.message);
      } finally {
        costing = false;
      }
    }

    async function refresh() {
      timer = null;
      try {
        const page = await api('GET', '/v1/runs?limit=50');
        if (stopped) return;
        notice('');
        render(page.runs);
        updateCosts(page.runs);
      } catch (e) {
        if (e.status === 401) return;
        notice(e.message);
      }
      // Slower while the tab is hidden: nobody is looking.
      if (!stopped) timer = setTimeout(refresh, document.hidden ? RUNS_POLL_MS * 5 : RUNS_POLL_MS);
    }
    refresh();
    listEnvironments();

    return {
      stop() {
        stopped = true;
        if (timer) clearTimeout(timer);
      },
    };
  }

  // The new-run form's environments: the caller's, listed when the form shows.
  // A listing that finds the names already shown leaves the options alone:
  // replacing them would close a list the user has open (and hand a script
  // holding an option a stale one), e.g. when the view is shown twice in a row.
  async function listEnvironments() {
    const select = $('new-environment');
    try {
      const page = await api('GET', '/v1/environments');
      const names = ['', ...page.environments.map((e) => e.name)];
      const shown = [...select.options].map((o) => o.value);
      if (names.length === shown.length && names.every((name, i) => name === shown[i])) return;
      const chosen = select.value;
      select.replaceChildren(el('option', { value: '' }, 'none (the repository\'s .kiln/environment.toml, or the bare image)'),
        ...page.environments.map((e) => el('option', { value: e.name }, e.name)));
      select.value = page.environments.some((e) => e.name === chosen) ? chosen : '';
    } catch (e) {
      if (e.status !== 401) notice('Could not list environments: ' + e.message);
    }
  }

  // `{mode, allow}` from the form's network choice; null for the default (none).
  function egressChoice() {
    const mode = $('new-egress').value;
    if (mode === 'none') return null;
    const hosts = $('new-allow').value.split(/[\s,]+/).filter(Boolean);
    if (mode !== 'allowlist' || !hosts.length) return { mode };
    return {
      mode,
      allow: hosts.map((h) => {
        const m = /^(.+):(\d+)$/.exec(h);
        return m ? { host: m[1], ports: [Number(m[2])] } : { host: h };
      }),
    };
  }

  async function startRun(ev) {
    ev.preventDefault();
    const prompt = $('new-prompt').value;
    if (!prompt.trim()) return;
    const spec = { prompt, approval: $('new-approval').value };
    const environment = $('new-environment').value;
    if (environment) spec.environment = environment;
    const egress = egressChoice();
    if (egress) spec.sandbox = { egress };
    const url = $('new-repo').value.trim();
    if (url) {
      spec.repo = { url };
      const ref = $('new-ref').value.trim();
      if (ref) spec.repo.ref = ref;
    }
    const button = $('new-run-submit');
    button.disabled = true;
    try {
      const run = await api('POST', '/v1/runs', spec);
      $('new-prompt').value = '';
      location.hash = '#/runs/' + run.id;
    } catch (e) {
      if (e.status !== 401) notice('Could not start the run: ' + e.message);
    } finally {
      button.disabled = false;
    }
  }

  // ---- environments ----------------------------------------------------------

  // `NAME=VALUE` lines (blank lines and `#` comments skipped) as an object.
  function pairs(text) {
    const out = {};
    for (const line of String(text || '').split('\n')) {
      if (!line.trim() || line.trim().startsWith('#')) continue;
      const at = line.indexOf('=');
      if (at < 1) throw new Error(`"${line.slice(0, 40)}" is not NAME=VALUE`);
      out[line.slice(0, at).trim()] = line.slice(at + 1);
    }
    return out;
  }

  // The environments page: the caller's environments with their last runs,
  // a form that creates or edits one (secrets write-only: never shown, kept
  // when left empty), and a cache reset per environment.
  function envsView() {
    $('view-envs').hidden = false;
    const form = $('env-form');
    let editing = null; // the name being edited, or null to create
    // Set by stop(): a list still loading for a view the user left must not
    // replace the rows of the view now open (whose form is another's).
    let stopped = false;
    // Which load() is the latest: an earlier one answered late (a save's,
    // overtaken by a reset's) must not put back what the later replaced.
    let loads = 0;

    function fill(env) {
      editing = env ? env.name : null;
      $('env-name').value = env ? env.name : '';
      $('env-name').readOnly = Boolean(env);
      $('env-image').value = (env && env.image) || '';
      $('env-setup').value = env ? env.setup_script : '';
      $('env-maintenance').value = (env && env.maintenance_script) || '';
      $('env-variables').value = env ? Object.entries(env.variables).map(([k, v]) => `${k}=${v}`).join('\n') : '';
      $('env-secrets').value = '';
      $('env-secrets').placeholder = env && env.secret_names.length
        ? `stored: ${env.secret_names.join(', ')} (values never shown; leave empty to keep them)` : 'NAME=VALUE, one a line';
      $('env-lock-files').value = env ? env.lock_files.join(', ') : '';
      $('env-form-title').textContent = env ? `Edit ${env.name}` : 'New environment';
      $('env-submit').textContent = env ? 'Save' : 'Create';
    }

    function lastRuns(runs, name) {
      const mine = runs.filter((r) => r.environment === name).slice(0, 3);
      if (!mine.length) return el('span', { class: 'muted' }, 'no runs yet');
      return el('span', null, ...mine.flatMap((r, i) => [i ? ', ' : null,
        el('a', { href: '#/runs/' + r.id, class: 'status', data: { status: r.status } }, r.status.replace('_', ' '))]));
    }

    async function resetCache(name) {
      try {
        const env = await api('POST', `/v1/environments/${encodeURIComponent(name)}/reset-cache`);
        notice('');
        $('env-said').textContent = `${env.name}: cache reset (generation ${env.cache_generation}); the next run sets up afresh`;
        load();
      } catch (e) {
        if (e.status !== 401) notice('Could not reset the cache: ' + e.message);
      }
    }

    async function load() {
      const n = ++loads;
      try {
        const [page, runs] = await Promise.all([api('GET', '/v1/environments'), api('GET', '/v1/runs?limit=200')]);
        if (stopped || n !== loads) return;
        $('envs-body').replaceChildren(...page.environments.map((env) => {
          const edit = el('button', { type: 'button', class: 'secondary', data: { action: 'edit' } }, 'Edit');
          const reset = el('button', { type: 'button', class: 'secondary', data: { action: 'reset' } }, 'Reset cache');
          edit.addEventListener('click', () => fill(env));
          reset.addEventListener('click', () => resetCache(env.name));
          return el('tr', { data: { env: env.name } },
            el('td', { class: 'name' }, env.name), el('td', null, env.image || 'default'),
            el('td', { class: 'secrets' }, env.secret_names.join(', ') || '—'),
            el('td', { class: 'num generation' }, String(env.cache_generation)),
            el('td', { class: 'runs' }, lastRuns(runs.runs, env.name)), el('td', null, edit, ' ', reset));
        }));
        $('envs-empty').hidden = page.environments.length > 0;
      } catch (e) {
        if (e.status !== 401) notice(e.message);
      }
    }

    async function save(ev) {
      ev.preventDefault();
      let spec;
      try {
        spec = { name: $('env-name').value.trim(), setup_script: $('env-setup').value, variables: pairs($('env-variables').value) };
        const image = $('env-image').value.trim();
        if (image) spec.image = image;
        const maintenance = $('env-maintenance').value;
        if (maintenance.trim()) spec.maintenance_script = maintenance;
        const locks = $('env-lock-files').value.split(/[\s,]+/).filter(Boolean);
        if (locks.length) spec.lock_files = locks;
        // Write-only: sent only when given; on an edit, absent keeps the stored ones.
        if ($('env-secrets').value.trim()) spec.secrets = pairs($('env-secrets').value);
      } catch (e) {
        notice('Could not read the form: ' + e.message);
        return;
      }
      try {
        const env = editing
          ? await api('PUT', `/v1/environments/${encodeURIComponent(editing)}`, spec)
          : await api('POST', '/v1/environments', spec);
        notice('');
        $('env-said').textContent = `${editing ? 'Saved' : 'Created'} ${env.name}`;
        fill(null);
        load();
      } catch (e) {
        if (e.status !== 401) notice('Could not save: ' + e.message);
      }
    }

    form.onsubmit = save;
    $('env-new').onclick = () => fill(null);
    fill(null);
    $('env-said').textContent = '';
    // The rows of the last visit would act on that view's form, not this one's.
    $('envs-body').replaceChildren();
    load();
    return {
      stop() {
        stopped = true;
        form.onsubmit = null;
        $('env-new').onclick = null;
      },
    };
  }

  // ---- a run's change -------------------------------------------------------

  // `3 files, +10 −2`.
  function changeWords(t) {
    const files = Number(t.files) || 0;
    return `${num(files)} file${files === 1 ? '' : 's'}, +${num(t.additions)} −${num(t.deletions)}`;
  }

  // The patch cut at each `diff --git` line: one piece per file, in order.
  function splitPatch(text) {
    const pieces = [];
    for (const line of text.replace(/\n$/, '').split('\n')) {
      if (line.startsWith('diff --git ') || !pieces.length) pieces.push([]);
      pieces[pieces.length - 1].push(line);
    }
    return pieces.filter((p) => p.length && p[0].startsWith('diff --git '));
  }

  // The piece of `pieces` about `file`: the one whose header names its
  // path (`… b/<path>`), else the one at its place in the list.
  function pieceFor(pieces, file, index) {
    const tail = ' b/' + file.path;
    return pieces.find((p) => p[0].endsWith(tail) || p[0].endsWith(tail + '"')) || pieces[index] || [];
  }

  function patchLines(lines) {
    const pre = el('pre', { class: 'diff' });
    const frag = document.createDocumentFragment();
    for (const line of lines) {
      let cls = null;
      if (line.startsWith('@@')) cls = 'hunk';
      else if (line.startsWith('+') && !line.startsWith('+++')) cls = 'add';
      else if (line.startsWith('-') && !line.startsWith('---')) cls = 'del';
      frag.append(el('span', { class: cls }, line + '\n'));
    }
    pre.append(frag);
    return pre;
  }

  function fileBox(file, lines) {
    const name = file.old_path && file.old_path !== file.path ? `${file.old_path} → ${file.path}` : file.path;
    const counts = file.binary
      ? [el('span', { class: 'status' }, 'binary')]
      : [el('span', { class: 'plus' }, '+' + num(file.additions)), el('span', { class: 'minus' }, '−' + num(file.deletions))];
    const body = file.binary
      ? el('p', { class: 'muted' }, 'Binary file: in the patch, not shown here.')
      : patchLines(lines);
    const small = lines.length <= 400;
    return el('details', { class: 'diff-file', open: small, data: { path: file.path, status: file.status } },
      el('summary', null, name, el('span', { class: 'status' }, file.status.replace('_', ' ')), ...counts), body);
  }

  // Run `id`'s change: its summary (`/changes`) and, when there is one to
  // show, the patch's exact bytes (`/patch`). Rejects with the API's error
  // (404: nothing captured, or for a group, no attempt chosen yet).
  async function fetchChange(id) {
    const changes = await api('GET', `/v1/runs/${id}/changes`);
    if (changes.too_large || !changes.files.length) return { changes, bytes: null };
    const res = await fetch(`/v1/runs/${id}/patch`, { headers: { Authorization: 'Bearer ' + token() }, cache: 'no-store' });
    if (!res.ok) throw new ApiError(res.status, 'http', 'HTTP ' + res.status);
    return { changes, bytes: await res.arrayBuffer() };
  }

  // A change's files, each a foldable box with its piece of the patch.
  function changeFiles(changes, bytes) {
    const pieces = bytes ? splitPatch(new TextDecoder('utf-8').decode(bytes)) : [];
    return changes.files.map((f, i) => fileBox(f, bytes ? pieceFor(pieces, f, i) : []));
  }

  // The diff panel of run `id`: filled from `/changes` and `/patch` once
  // the run has ended (its change is captured right before its end), and
  // again when a group's chosen attempt changes (`reload`).
  function changesPanel(id) {
    const p = { loading: false, loaded: false, stopped: false, url: null, again: false };
    const link = $('diff-download');
    function clear() {
      $('diff').hidden = true;
      $('diff-files').replaceChildren();
      $('diff-summary').textContent = '';
      $('diff-note').hidden = true;
      link.hidden = true;
      link.removeAttribute('href');
      if (p.url) URL.revokeObjectURL(p.url);
      p.url = null;
    }
    clear();

    async function load(attempt) {
      if (p.loading) { p.again = true; return; }
      if (p.loaded || p.stopped) return;
      p.loading = true;
      try {
        const { changes, bytes } = await fetchChange(id);
        if (p.stopped) return;
        show(changes, bytes);
        p.loaded = true;
      } catch (e) {
        // 404: nothing captured (no workspace, or its capture failed), or,
        // right at the end, the run's status catching up: asked once more.
        if (e.status === 404 && !attempt) setTimeout(() => load(1), 1000);
        else if (e.status && e.status !== 404 && e.status !== 401) notice('Could not load the run\'s changes: ' + e.message);
      } finally {
        p.loading = false;
      }
      // A reload asked for while this load was under way: the choice it
      // read may be the old one.
      if (p.again && !p.stopped) {
        p.again = false;
        p.loaded = false;
        load(1);
      }
    }

    function show(changes, bytes) {
      clear();
      $('diff-summary').textContent = changes.files.length ? changeWords(changes.totals) : 'No files changed.';
      if (changes.too_large) {
        $('diff-note').textContent = `The patch (${num(changes.patch_bytes)} bytes) was larger than this deployment keeps; its files are listed.`;
        $('diff-note').hidden = false;
      }
      $('diff-files').replaceChildren(...changeFiles(changes, bytes));
      if (bytes) {
        p.url = URL.createObjectURL(new Blob([bytes], { type: 'text/x-diff' }));
        link.href = p.url;
        link.setAttribute('download', `kiln-run-${id}.patch`);
        link.hidden = false;
      }
      $('diff').hidden = false;
    }

    return {
      load: () => load(0),
      // A group's choice changed: its change is another attempt's now.
      reload() {
        if (p.loading) { p.again = true; return; }
        p.loaded = false;
        load(1);
      },
      stop() {
        p.stopped = true;
        if (p.url) URL.revokeObjectURL(p.url);
      },
    };
  }

  // ---- a group's attempts ---------------------------------------------------

  const ENDED = ['succeeded', 'failed', 'cancelled', 'timed_out'];

  // The attempts of group `groupId`, side by side: each one's status,
  // steps, cost and diffstat, its diff on demand, and a Select button that
  // makes it the group's result. Kept current from the group's own stream
  // (the run page passes its `attempt.*` events to `event`), so it needs no
  // polling; `onSelected` runs when the group's choice changed.
  function attemptsPanel(groupId, onSelected) {
    const list = $('attempts-list');
    list.replaceChildren();
    $('attempts').hidden = true;
    const cards = new Map(); // attempt number -> its card
    let stopped = false;
    let selected = null;

    function stat(label) {
      const dd = el('dd');
      return { box: el('div', null, el('dt', null, label), dd), dd };
    }

    function cardOf(k, runId) {
      let a = cards.get(k);
      if (a) {
        if (runId && !a.runId) setRun(a, runId);
        return a;
      }
      const status = el('span', { class: 'status' });
      const link = el('a', { class: 'attempt-open' }, `Attempt ${k}`);
      const chosen = el('span', { class: 'chosen', hidden: true }, 'selected');
      const steps = stat('Steps');
      const cost = stat('Cost');
      const change = stat('Change');
      const model = el('p', { class: 'muted attempt-model' });
      const files = el('div', { class: 'diff-files' });
      const diff = el('details', { class: 'attempt-diff' }, el('summary', null, 'Diff'), files);
      const select = el('button', { type: 'button', class: 'secondary attempt-select', disabled: true }, 'Select');
      const root = el('div', { class: 'attempt', data: { attempt: k, status: 'queued' } },
        el('div', { class: 'attempt-head' }, link, status, chosen), model,
        el('dl', { class: 'attempt-stats' }, steps.box, cost.box, change.box), select, diff);
      a = { k, runId: null, root, status, link, chosen, steps: steps.dd, cost: cost.dd, change: change.dd, model, files,
        diff, select, spent: { usd: 0, unpriced: false, steps: 0 }, ended: false, diffLoaded: false };
      cards.set(k, a);
      diff.addEventListener('toggle', () => { if (diff.open) loadDiff(a); });
      select.addEventListener('click', () => choose(a));
      // In attempt order, whatever order they became known in.
      const after = [...list.children].find((n) => Number(n.dataset.attempt) > k);
      list.insertBefore(root, after || null);
      $('attempts').hidden = false;
      setStatus(a, 'queued');
      showSpent(a);
      a.change.textContent = '—';
      if (runId) setRun(a, runId);
      return a;
    }

    function setRun(a, runId) {
      a.runId = runId;
      a.root.dataset.run = runId;
      a.link.href = '#/runs/' + runId;
    }

    function setStatus(a, status) {
      if (a.ended && !ENDED.includes(status)) return; // an ended attempt stays ended
      a.ended = ENDED.includes(status);
      a.root.dataset.status = status;
      a.status.dataset.status = status;
      a.status.textContent = status.replace('_', ' ');
      a.select.disabled = !a.ended || selected === a.k;
    }

    function showSpent(a) {
      a.steps.textContent = String(a.spent.steps);
      a.cost.textContent = costText(a.spent);
    }

    function showChange(a, c) {
      a.change.textContent = c ? changeWords(c) + (c.too_large ? ' (too large to keep)' : '') : 'no change captured';
    }

    function markSelected(k) {
      selected = k;
      for (const a of cards.values()) {
        const is = a.k === k;
        a.chosen.hidden = !is;
        if (is) a.root.dataset.selected = ''; else delete a.root.dataset.selected;
        a.select.disabled = !a.ended || is;
        a.select.textContent = is ? 'Selected' : 'Select';
      }
    }

    async function loadDiff(a) {
      if (a.diffLoaded || !a.runId) return;
      if (!a.ended) {
        a.files.replaceChildren(el('p', { class: 'muted' }, 'Its change is captured when it ends.'));
        return;
      }
      a.files.replaceChildren(el('p', { class: 'muted' }, 'Loading…'));
      try {
        const { changes, bytes } = await fetchChange(a.runId);
        if (stopped) return;
        const summary = el('p', { class: 'diff-summary' }, changes.files.length ? changeWords(changes.totals) : 'No files changed.');
        a.files.replaceChildren(summary, ...changeFiles(changes, bytes));
        a.diffLoaded = true;
      } catch (e) {
        if (stopped || e.status === 401) return;
        a.files.replaceChildren(el('p', { class: 'muted' }, e.status === 404 ? 'No change was captured.' : 'Could not load its change: ' + e.message));
      }
    }

    async function choose(a) {
      a.select.disabled = true;
      try {
        const group = await api('POST', `/v1/runs/${groupId}/select`, { attempt: a.k });
        if (stopped) return;
        markSelected(group.selected_attempt || a.k);
        onSelected();
      } catch (e) {
        a.select.disabled = !a.ended || selected === a.k;
        if (e.status !== 401) notice('Could not select attempt ' + a.k + ': ' + e.message);
      }
    }

    // What GET /v1/runs/{id} says of the group and each attempt: the
    // stream then keeps them current.
    async function read(group) {
      (group.attempts || []).forEach((runId, i) => cardOf(i + 1, runId));
      if (group.selected_attempt) markSelected(group.selected_attempt);
      for (const [i, runId] of (group.attempts || []).entries()) {
        let run;
        try { run = await api('GET', '/v1/runs/' + runId); } catch (_) { continue; }
        if (stopped) return;
        const a = cardOf(i + 1, runId);
        a.model.textContent = run.model && run.model.name ? 'Model: ' + run.model.name : '';
        if (!a.ended || ENDED.includes(run.status)) setStatus(a, run.status);
        if (ENDED.includes(run.status)) showChange(a, run.changes);
      }
    }

    // One `attempt.*` event of the group's stream.
    function event(kind, p) {
      const k = Number(p.attempt);
      if (!Number.isSafeInteger(k) || k < 1) return;
      const a = cardOf(k, p.run_id);
      if (kind === 'attempt.event') {
        const inner = p.event || {};
        const q = inner.payload || {};
        if (!a.ended) setStatus(a, 'running');
        if (inner.kind === 'step.finished' && !a.ended) {
          a.spent.steps += 1;
          if (typeof q.cost_usd === 'number') a.spent.usd += q.cost_usd;
          else a.spent.unpriced = true;
          showSpent(a);
        }
      } else if (kind === 'attempt.finished') {
        // What it spent, as the group counts it, replaces the running count.
        a.spent = { steps: Number(p.steps) || 0, usd: typeof p.cost_usd === 'number' ? p.cost_usd : 0,
          unpriced: typeof p.cost_usd !== 'number' && Number(p.steps) > 0 };
        setStatus(a, String(p.status));
        showSpent(a);
        showChange(a, p.changes);
      } else if (kind === 'attempt.selected') {
        if (selected !== k) { markSelected(k); onSelected(); }
      }
    }

    return { read, event, stop() { stopped = true; } };
  }

  // ---- one run -------------------------------------------------------------

  function runView(id) {
    $('view-run').hidden = false;
    const timeline = $('timeline');
    timeline.replaceChildren();
    // Whose events the timeline holds: the hash changes before `hashchange`
    // runs this, so the hash alone does not say the old run's are gone.
    timeline.dataset.run = id;
    $('plan').hidden = true;
    $('plan-items').replaceChildren();
    const changes = changesPanel(id);
    const group = attemptsPanel(id, () => changes.reload());
    $('run-prompt').textContent = '';
    $('run-repo').textContent = '';
    // Nothing of the previous run's view stays: its status, its controls.
    const badge = $('run-status');
    badge.textContent = '';
    delete badge.dataset.status;
    $('run-cancel').hidden = true;
    $('steer-form').hidden = false;
    const conn = $('run-conn');

    const s = {
      lastSeq: 0, // every event up to here is accepted (rendered or queued to render)
      held: new Map(), // events that arrived ahead of a gap, by seq
      filling: false,
      queue: [],
      flushTimer: null,
      es: null,
      retryTimer: null,
      retryDelay: 1000,
      reconnects: 0,
      tokenExpires: 0, // when the stream token in the open stream's URL expires (ms)
      stopped: false,
      done: false,
      calls: new Map(), // call_id -> tool card
      children: new Map(), // sub-agent run id -> its box inside the call that started it
      phases: new Map(), // environment phase (setup, maintenance) -> its log
      block: null, // the assistant text or reasoning block that text deltas extend
      status: null,
      pendingApprovals: new Set(),
      totals: { input: 0, cached: 0, output: 0, usd: 0, unpriced: false, steps: 0 },
    };

    function setConn(state) {
      conn.dataset.state = state;
      conn.dataset.reconnects = String(s.reconnects);
      conn.textContent = { connecting: 'connecting…', live: 'live', reconnecting: 'reconnecting…', ended: '' }[state];
    }

    function setStatus(status) {
      if (!status || status === s.status) return;
      s.status = status;
      const badge = $('run-status');
      badge.dataset.status = status;
      badge.textContent = status.replace('_', ' ');
      $('run-cancel').hidden = ['succeeded', 'failed', 'cancelled', 'timed_out'].includes(status);
    }

    api('GET', '/v1/runs/' + id).then((run) => {
      if (s.stopped) return;
      $('run-prompt').textContent = run.prompt;
      // Without a repository the agent works in an empty /workspace (or
      // what earlier runs of its session left): say so, not leave it implied.
      $('run-repo').textContent = run.repo
        ? 'Repository: ' + run.repo.url + (run.repo.ref ? ' @ ' + run.repo.ref : '')
        : 'No repository: a new session starts in an empty workspace';
      if (!s.status || TERMINAL.includes('run.' + run.status)) setStatus(run.status);
      if (TERMINAL.includes('run.' + run.status)) changes.load();
      // A group runs no agent of its own: nothing to message (409), and
      // its change is the chosen attempt's.
      if (run.attempts) {
        $('steer-form').hidden = true;
        group.read(run);
      }
    }).catch((e) => {
      if (e.status === 404) notFound();
      else if (e.status !== 401) notice(e.message);
    });

    // An unknown run (or another subject's): say so and offer nothing to do
    // with it — no stream to wait for, no message box.
    function notFound() {
      s.stopped = true;
      if (s.es) s.es.close();
      for (const t of [s.flushTimer, s.retryTimer]) if (t) clearTimeout(t);
      setConn('ended');
      $('steer-form').hidden = true;
      $('run-cancel').hidden = true;
      notice('No run with this id (or it belongs to another subject).');
    }

    // -- the stream --

    // EventSource cannot send the token as a header, and a URL ends up in
    // logs: the URL carries a stream token instead, minted for this run and
    // valid for minutes, and a fresh one is minted for every (re)connection.
    async function connect() {
      if (s.stopped || s.done) return;
      setConn(s.reconnects ? 'reconnecting' : 'connecting');
      let minted;
      try {
        minted = await api('POST', `/v1/runs/${id}/stream-token`);
      } catch (e) {
        // A refused token signs out (api() did); a deleted run says so above.
        if (e.status === 404) notFound();
        else if (e.status !== 401) retryLater();
        return;
      }
      if (s.stopped || s.done) return;
      s.tokenExpires = Date.parse(minted.expires_at);
      const url = `/v1/runs/${id}/events?after=${s.lastSeq}&access_token=${encodeURIComponent(minted.token)}`;
      const es = new EventSource(url);
      s.es = es;
      for (const kind of KINDS) es.addEventListener(kind, onEvent);
      es.onmessage = onEvent; // events without a name
      es.onopen = () => {
        s.retryDelay = 1000;
        setConn('live');
      };
      es.onerror = () => {
        if (s.stopped || s.done) return;
        s.reconnects += 1;
        setConn('reconnecting');
        // CONNECTING: the browser retries by itself, sending Last-Event-ID,
        // with the same URL: once its stream token is near expiry that would
        // be refused, so reconnect with a fresh one instead.
        // CLOSED: it gave up (an error status, or it judged retrying futile).
        const stale = !(Date.now() < s.tokenExpires - 15000);
        if (es.readyState === EventSource.CONNECTING && stale) {
          es.close();
          s.es = null;
          connect();
        } else if (es.readyState === EventSource.CLOSED) {
          es.close();
          s.es = null;
          retryLater();
        }
      };
    }

    function retryLater() {
      if (s.retryTimer || s.stopped || s.done) return;
      s.retryTimer = setTimeout(async () => {
        s.retryTimer = null;
        s.retryDelay = Math.min(s.retryDelay * 2, 10000);
        try {
          // Tells a refused token (signs out) or a deleted run from a network error.
          await api('GET', '/v1/runs/' + id);
        } catch (e) {
          if (e.status === 404) notFound();
          if (e.status === 401 || e.status === 404) return;
          retryLater();
          return;
        }
        connect();
      }, s.retryDelay);
    }

    function onEvent(e) {
      const seq = Number(e.lastEventId);
      if (!Number.isSafeInteger(seq) || seq < 1) return;
      let payload;
      try { payload = JSON.parse(e.data); } catch (_) { payload = { data: e.data }; }
      ingest({ seq, kind: e.type, payload });
    }

    // Accepts events strictly in seq order, each once.
    function ingest(ev) {
      if (ev.seq <= s.lastSeq || s.held.has(ev.seq)) return; // seen already
      if (ev.seq !== s.lastSeq + 1) {
        s.held.set(ev.seq, ev);
        fillGap();
        return;
      }
      accept(ev);
      while (s.held.has(s.lastSeq + 1)) {
        const next = s.held.get(s.lastSeq + 1);
        s.held.delete(next.seq);
        accept(next);
      }
    }

    function accept(ev) {
      s.lastSeq = ev.seq;
      s.queue.push(ev);
      if (TERMINAL.includes(ev.kind)) {
        // The server ends the stream here; without this EventSource would reconnect.
        s.done = true;
        s.held.clear();
        if (s.es) s.es.close();
        s.es = null;
        setConn('ended');
      }
      if (!s.flushTimer) s.flushTimer = setTimeout(flush, 16);
    }

    // Reads the events missing before the held ones from the JSON page.
    async function fillGap() {
      if (s.filling) return;
      s.filling = true;
      try {
        while (!s.stopped && s.held.size && !s.held.has(s.lastSeq + 1)) {
          const first = Math.min(...s.held.keys());
          const limit = Math.min(1000, first - s.lastSeq - 1);
          const page = await api('GET', `/v1/runs/${id}/events?after=${s.lastSeq}&limit=${limit}`);
          if (!page.events.length) break;
          for (const ev of page.events) ingest(ev);
        }
      } catch (e) {
        if (e.status !== 401) setTimeout(fillGap, 1000);
      } finally {
        s.filling = false;
      }
    }

    function flush() {
      s.flushTimer = null;
      const stick = window.innerHeight + window.scrollY >= document.body.scrollHeight - 120;
      const batch = s.queue.splice(0, RENDER_BATCH);
      for (const ev of batch) {
        try {
          render(ev);
        } catch (err) {
          // One malformed payload must not stop the rest of the stream.
          add(mark(el('div', { class: 'ev-meta ev-warn' }, `#${ev.seq} ${ev.kind}: cannot show (${err.message})`), ev.seq));
        }
      }
      renderTotals();
      if (s.queue.length) s.flushTimer = setTimeout(flush, 0);
      if (stick) window.scrollTo(0, document.body.scrollHeight);
    }

    // -- rendering --

    function mark(node, seq) {
      node.dataset.from = String(seq);
      node.dataset.to = String(seq);
      return node;
    }

    // A new timeline entry; ends the text block deltas were extending.
    function add(node) {
      timeline.append(node);
      s.block = null;
      return node;
    }

    // Appends streamed text; grows the last segment when this event directly follows it.
    function stream(container, seq, text) {
      const last = container.lastElementChild;
      if (last && last.classList.contains('seg') && Number(last.dataset.to) === seq - 1) {
        last.firstChild.appendData(text);
        last.dataset.to = String(seq);
      } else {
        container.append(mark(el('span', { class: 'seg' }, document.createTextNode(text)), seq));
      }
    }

    function textBlock(kind) {
      if (s.block && s.block.kind === kind && timeline.lastElementChild === s.block.root) return s.block.body;
      let root;
      let body;
      if (kind === 'reasoning') {
        body = el('div', { class: 'body' });
        root = el('details', { class: 'reasoning' }, el('summary', null, 'Thinking'), body);
      } else {
        root = body = el('div', { class: 'msg assistant' });
      }
      timeline.append(root);
      s.block = { kind, root, body };
      return body;
    }

    function meta(seq, text, cls) {
      return add(mark(el('div', { class: 'ev-meta' + (cls ? ' ' + cls : '') }, text), seq));
    }

    function card(callId, name) {
      let c = s.calls.get(callId);
      if (c) return c;
      const head = el('div', { class: 'tool-head' }, name || 'tool');
      const argsStream = el('pre', { class: 'args-stream' });
      const args = el('pre', { class: 'args', hidden: true });
      const out = el('pre', { class: 'output' });
      const outBox = el('details', { class: 'out', hidden: true, open: true }, el('summary', null, 'Output'), out);
      const root = add(el('div', { class: 'tool', data: { call: callId, state: 'running' } }, head, argsStream, args, outBox));
      c = { root, head, argsStream, args, out, outBox, approval: null, buttons: [], named: Boolean(name), name: '' };
      if (name) nameCard(c, name);
      s.calls.set(callId, c);
      return c;
    }

    // A sub-agent, nested in the card of the `task` call that started it:
    // a header with a link that opens its own run, then a line per step and
    // tool call as its events arrive, then how it ended.
    function child(p) {
      let k = s.children.get(p.run_id);
      if (k) return k;
      const c = card(p.call_id, 'task');
      const open = el('a', { href: '#/runs/' + p.run_id, class: 'open-child' }, 'Open');
      const head = el('div', { class: 'subagent-head' }, el('strong', null, String(p.agent_path || 'sub-agent')), ' ', open);
      const lines = el('div', { class: 'subagent-lines' });
      const root = el('div', { class: 'subagent', data: { run: p.run_id, state: 'running' } }, head, lines);
      c.root.append(root);
      k = { root, head, lines };
      s.children.set(p.run_id, k);
      return k;
    }

    // Whose tool an MCP call waiting for approval is: the model's name
    // for it is flattened (mcp__<server>__<tool>, maybe cut).
    function mcpOrigin(p) {
      if (!p.mcp_server) return '';
      const tool = p.mcp_tool ? `tool "${String(p.mcp_tool).slice(0, 80)}" of ` : '';
      return ` (${tool}the MCP server "${p.mcp_server}")`;
    }

    // A sub-agent's or an attempt's event, copied into this stream, as one
    // short line (`who` is where to decide an approval).
    function nestedWords(inner, who) {
      const q = inner.payload || {};
      let text;
      switch (inner.kind) {
        case 'step.started': text = `Step ${q.step}`; break;
        case 'step.finished': text = `Step ${q.step} finished (${q.finish_reason})`; break;
        case 'tool_call.ready': text = `→ ${q.name} ${JSON.stringify(q.arguments)}`; break;
        case 'tool.result': text = `${q.is_error ? '✗' : '✓'} ${q.name} · ${ms(Number(q.duration_ms) || 0)}`; break;
        case 'approval.requested': text = `${q.name}${mcpOrigin(q)} waits for approval (open the ${who} to decide)`; break;
        case 'sandbox.ready': text = `Sandbox ready (${q.image})`; break;
        case 'changes.captured': text = 'Changes captured: ' + (Number(q.files) ? changeWords(q) : 'no files changed'); break;
        default: text = String(inner.kind);
      }
      return text.length > 300 ? text.slice(0, 300) + '…' : text;
    }

    function childEvent(k, seq, inner) {
      const text = nestedWords(inner, 'sub-agent');
      return k.lines.append(mark(el('div', { class: 'ev-meta child-line', data: { kind: String(inner.kind) } }, text), seq));
    }

    // An attempt's event in its group's stream: the attempts panel keeps
    // count, the timeline gets a line naming the attempt.
    function attemptEvent(ev) {
      const p = ev.payload || {};
      group.event(ev.kind, p);
      const who = `Attempt ${p.attempt}`;
      let text;
      if (ev.kind === 'attempt.event') text = `${who} · ${nestedWords(p.event || {}, 'attempt')}`;
      else if (ev.kind === 'attempt.finished') {
        // A group's totals are its attempts' sum.
        const u = p.usage || {};
        s.totals.input += Number(u.input_tokens) || 0;
        s.totals.cached += (Number(u.cache_read_tokens) || 0) + (Number(u.cache_write_tokens) || 0);
        s.totals.output += Number(u.output_tokens) || 0;
        if (typeof p.cost_usd === 'number') s.totals.usd += p.cost_usd;
        else if (Number(p.steps)) s.totals.unpriced = true;
        s.totals.steps += Number(p.steps) || 0;
        text = `${who} ${String(p.status).replace('_', ' ')} after ${p.steps} step${Number(p.steps) === 1 ? '' : 's'}: ${p.summary}`;
      } else text = `${who} selected: the group's change is its change`;
      return add(mark(el('div', { class: 'ev-meta attempt-line', data: { attempt: String(p.attempt) } }, text), ev.seq));
    }

    // A call's arguments as its tool means them: a `write` as the file's
    // content, an `edit` as the lines it takes out and puts in, anything
    // else as formatted JSON.
    function showArgs(c, args) {
      const a = args && typeof args === 'object' ? args : {};
      if (c.name === 'write' && typeof a.content === 'string') {
        c.args.replaceChildren(el('span', { class: 'file-path' }, String(a.path || '')), '\n', a.content);
        c.args.dataset.view = 'file';
      } else if (c.name === 'edit' && typeof a.old_string === 'string' && typeof a.new_string === 'string') {
        const lines = (text, sign, cls) => text.split('\n').map((l) => el('span', { class: cls }, sign + l + '\n'));
        c.args.replaceChildren(el('span', { class: 'file-path' }, String(a.path || '') + (a.replace_all ? ' (every occurrence)' : '')), '\n',
          ...lines(a.old_string, '-', 'del'), ...lines(a.new_string, '+', 'add'));
        c.args.dataset.view = 'diff';
      } else {
        c.args.textContent = pretty(args);
      }
      c.args.hidden = false;
      c.argsStream.hidden = true;
    }

    // `mcp__<server>__<tool>`: the server the model's name for a tool
    // says it comes from (the name may be cut; the server part is first).
    function mcpServerOf(name) {
      const m = /^mcp__(.+?)__(.+)$/.exec(String(name || ''));
      return m ? { server: m[1], tool: m[2] } : null;
    }

    function nameCard(c, name) {
      c.name = name;
      c.head.textContent = name;
      const mcp = mcpServerOf(name);
      if (mcp) c.head.append(el('span', { class: 'mcp-origin' }, ` · tool "${mcp.tool}" of the MCP server "${mcp.server}"`));
    }

    // An environment's phase (setup, maintenance): a foldable log whose
    // summary says the phase and, once it ended, its exit code and time.
    function phaseLog(phase) {
      let log = s.phases.get(phase);
      if (log) return log;
      const summary = el('summary', null, el('span', { class: 'phase-name' }, phase));
      const out = el('pre', { class: 'output' });
      const root = add(el('details', { class: 'env-log', data: { phase, state: 'running' } }, summary, out));
      log = { root, summary, out };
      s.phases.set(phase, log);
      return log;
    }

    function environmentStarted(p, seq) {
      const how = p.hit ? 'cache hit: a prepared sandbox is reused' : 'cache miss: setting up';
      return meta(seq, `Environment ${p.environment} (${p.image}): ${how} · key ${String(p.cache_key).slice(0, 12)}`);
    }

    function environmentFinished(p, seq) {
      const log = phaseLog(String(p.phase));
      const ok = Number(p.exit_code) === 0;
      log.root.dataset.state = ok ? 'ok' : 'error';
      log.root.dataset.exit = String(p.exit_code);
      // `stored` (earlier events: `cached`): setup's result kept for the next run.
      const stored = p.stored === true || (p.stored === undefined && p.cached === true);
      const words = ` · exit ${p.exit_code} · ${ms(Number(p.duration_ms) || 0)}${stored ? ' · stored in the cache' : ''}`;
      if (!ok) log.root.open = true;
      return log.summary.append(mark(el('span', { class: 'phase-end' }, words), seq));
    }

    // An event kind this page does not know: its fields as one line of words.
    function readableLine(kind, p) {
      const fields = Object.entries(p && typeof p === 'object' ? p : { value: p }).map(([k, v]) => {
        const text = typeof v === 'string' ? v : JSON.stringify(v);
        return `${k.replace(/_/g, ' ')} ${text.length > 200 ? text.slice(0, 200) + '…' : text}`;
      });
      return `${String(kind).replace(/[._]/g, ' ')}: ${fields.join('; ')}`;
    }

    function decide(callId, decision, c) {
      for (const b of c.buttons) b.disabled = true;
      api('POST', `/v1/runs/${id}/approvals/${encodeURIComponent(callId)}`, { decision }).catch((e) => {
        if (e.status === 409) return; // decided elsewhere; approval.resolved will show how
        for (const b of c.buttons) b.disabled = false;
        if (e.status !== 401) notice('Could not ' + decision + ': ' + e.message);
      });
    }

    function render(ev) {
      const p = ev.payload || {};
      switch (ev.kind) {
        case 'run.queued':
          setStatus('queued');
          return meta(ev.seq, 'Queued');
        case 'run.started':
          setStatus(s.pendingApprovals.size ? 'awaiting_approval' : 'running');
          return meta(ev.seq, `Started on ${p.worker} (attempt ${p.attempt})`);
        case 'sandbox.ready':
          return meta(ev.seq, `Sandbox ready (${p.image})`);
        case 'step.started':
          s.totals.steps = Math.max(s.totals.steps, Number(p.step) || 0);
          return add(mark(el('div', { class: 'ev-step' }, `Step ${p.step}`), ev.seq));
        case 'text.delta':
          return stream(textBlock('text'), ev.seq, String(p.text));
        case 'reasoning.delta':
          return stream(textBlock('reasoning'), ev.seq, String(p.text));
        case 'tool_call.started': {
          const known = s.calls.has(p.call_id);
          const c = card(p.call_id, p.name);
          if (known) return c.root.append(mark(el('div', { class: 'ev-meta' }, 'started again'), ev.seq));
          return mark(c.head, ev.seq);
        }
        case 'tool_call.delta':
          return stream(card(p.call_id).argsStream, ev.seq, String(p.arguments_delta));
        case 'tool_call.ready': {
          const c = card(p.call_id, p.name);
          if (!c.named || c.name !== p.name) { nameCard(c, p.name); c.named = true; }
          showArgs(c, p.arguments);
          // The formatted arguments replace the streamed ones on screen;
          // this event is the formatted block.
          return mark(c.args, ev.seq);
        }
        case 'approval.requested': {
          const c = card(p.call_id, p.name);
          if (c.args.hidden) showArgs(c, p.arguments);
          const approve = el('button', { type: 'button', data: { decision: 'approve' } }, 'Approve');
          const deny = el('button', { type: 'button', class: 'secondary', data: { decision: 'deny' } }, 'Deny');
          approve.addEventListener('click', () => decide(p.call_id, 'approve', c));
          deny.addEventListener('click', () => decide(p.call_id, 'deny', c));
          c.buttons = [approve, deny];
          c.root.dataset.state = 'awaiting';
          s.pendingApprovals.add(p.call_id);
          setStatus('awaiting_approval');
          const asking = 'Waiting for your approval' + mcpOrigin(p);
          c.approval = mark(el('div', { class: 'approval' }, el('div', null, asking), approve, deny), ev.seq);
          return c.root.append(c.approval);
        }
        case 'approval.resolved': {
          const c = card(p.call_id);
          if (c.approval) {
            // The request stays on the page (it is an event), without its buttons.
            c.approval.replaceChildren('Approval requested');
            c.approval.classList.add('done');
          }
          c.buttons = [];
          c.root.dataset.state = p.approved ? 'running' : 'denied';
          s.pendingApprovals.delete(p.call_id);
          if (!s.pendingApprovals.size) setStatus('running');
          const text = (p.approved ? 'Approved' : 'Denied') + (p.reason ? ': ' + p.reason : '');
          return c.root.append(mark(el('div', { class: 'decision' }, text), ev.seq));
        }
        case 'tool.output': {
          const c = card(p.call_id);
          c.outBox.hidden = false;
          return stream(c.out, ev.seq, String(p.text));
        }
        case 'tool.result': {
          const c = card(p.call_id, p.name);
          const output = String(p.output);
          const lines = output ? output.replace(/\n$/, '').split('\n').length : 0;
          const summary = `${p.is_error ? 'Error' : 'Result'} · ${ms(Number(p.duration_ms) || 0)} · ${lines} line${lines === 1 ? '' : 's'}`;
          // The result holds the whole output: it replaces the streamed copy
          // on screen. Short results open, long ones fold.
          const open = lines <= 20;
          c.outBox.hidden = true;
          c.root.dataset.state = p.is_error ? 'error' : 'ok';
          return c.root.append(mark(el('details', { class: 'result', open }, el('summary', null, summary), el('pre', null, output)), ev.seq));
        }
        case 'step.finished': {
          const u = p.usage || {};
          s.totals.input += Number(u.input_tokens) || 0;
          s.totals.cached += (Number(u.cache_read_tokens) || 0) + (Number(u.cache_write_tokens) || 0);
          s.totals.output += Number(u.output_tokens) || 0;
          if (typeof p.cost_usd === 'number') s.totals.usd += p.cost_usd;
          else s.totals.unpriced = true;
          const cost = typeof p.cost_usd === 'number' ? ' · ' + usd(p.cost_usd) : '';
          const cached = (Number(u.cache_read_tokens) || 0) + (Number(u.cache_write_tokens) || 0);
          const input = num(u.input_tokens) + ' in' + (cached ? ' + ' + num(cached) + ' cached' : '');
          return meta(ev.seq, `Step ${p.step} finished (${p.finish_reason}) · ${input} / ${num(u.output_tokens)} out${cost}`);
        }
        case 'subagent.started': {
          const k = child(p);
          const what = `${p.agent} sub-agent${p.taken_over ? ' (continued after a lost worker)' : ''}: ${p.description}`;
          return k.head.append(mark(el('div', { class: 'subagent-what' }, what), ev.seq));
        }
        case 'subagent.event':
          return childEvent(child(p), ev.seq, p.event || {});
        case 'attempt.event':
        case 'attempt.finished':
        case 'attempt.selected':
          return attemptEvent(ev);
        case 'subagent.finished': {
          const k = child(p);
          const u = p.usage || {};
          // A sub-agent's spending is its parent's (its steps are its own).
          s.totals.input += Number(u.input_tokens) || 0;
          s.totals.cached += (Number(u.cache_read_tokens) || 0) + (Number(u.cache_write_tokens) || 0);
          s.totals.output += Number(u.output_tokens) || 0;
          if (typeof p.cost_usd === 'number') s.totals.usd += p.cost_usd;
          k.root.dataset.state = p.status === 'succeeded' ? 'ok' : 'error';
          const tokens = (Number(u.input_tokens) || 0) + (Number(u.output_tokens) || 0);
          return k.root.append(mark(el('div', { class: 'subagent-end' },
            `${p.status} after ${p.steps} step${p.steps === 1 ? '' : 's'} · ${num(tokens)} tokens: `, String(p.summary)), ev.seq));
        }
        case 'message.queued':
          return add(mark(el('div', { class: 'msg user' }, String(p.text)), ev.seq));
        case 'model.retry':
          return meta(ev.seq, `Model call failed, retry ${p.attempt} in ${ms(Number(p.delay_ms) || 0)}: ${p.error}`, 'ev-warn');
        case 'compaction':
          return meta(ev.seq, 'Conversation compacted');
        case 'todo':
          renderPlan(p.items);
          return meta(ev.seq, `Plan updated (${Array.isArray(p.items) ? p.items.length : 0} items)`);
        case 'delivery.succeeded':
          return add(mark(el('div', { class: 'ev-meta' }, 'Delivered to GitHub ',
            p.pull_request ? safeLink(p.pull_request) : null, p.comment ? ' ' : null, p.comment ? safeLink(p.comment) : null), ev.seq));
        case 'delivery.failed':
          return meta(ev.seq, 'Delivery failed: ' + p.error, 'ev-warn');
        case 'delivery.retrying':
          return meta(ev.seq, `Push attempt ${p.attempt} failed: ${p.error}; retrying in ${ms(p.retry_in_ms)}`, 'ev-warn');
        case 'callback.succeeded':
          return meta(ev.seq, `Callback delivered (attempt ${p.attempt}, HTTP ${p.status})`);
        case 'callback.failed': {
          const next = typeof p.retry_in_ms === 'number' ? `; retrying in ${ms(p.retry_in_ms)}` : '; given up';
          return meta(ev.seq, `Callback attempt ${p.attempt} failed: ${p.error}${next}`, 'ev-warn');
        }
        case 'network.denied': {
          const more = p.suppressed ? ` (+${p.suppressed} more not shown)` : '';
          const method = p.method ? p.method + ' ' : '';
          return meta(ev.seq, `Network denied: ${method}${p.host}:${p.port} by the ${p.layer} policy: ${p.rule}${more}`, 'ev-warn');
        }
        case 'changes.captured': {
          const what = Number(p.files) ? `${changeWords(p)}${p.too_large ? '; too large to keep as a patch' : ''}` : 'no files changed';
          return meta(ev.seq, 'Changes captured: ' + what, p.too_large ? 'ev-warn' : null);
        }
        case 'network.allowed':
          return meta(ev.seq, `Network allowed: ${p.host}:${p.port} reached through the egress proxy`);
        case 'environment.started':
          return environmentStarted(p, ev.seq);
        case 'environment.output':
          return stream(phaseLog(String(p.phase)).out, ev.seq, String(p.text));
        case 'environment.finished':
          return environmentFinished(p, ev.seq);
        case 'run.succeeded':
        case 'run.failed':
        case 'run.cancelled':
        case 'run.timed_out': {
          const status = ev.kind.slice(4);
          setStatus(status);
          const detail = { succeeded: p.summary, failed: p.error, cancelled: p.reason, timed_out: `after ${p.limit_s} s` }[status];
          changes.load();
          return add(mark(el('div', { class: 'end ' + status }, el('strong', null, status.replace('_', ' ')), detail ? ': ' + detail : ''), ev.seq));
        }
        default:
          return meta(ev.seq, readableLine(ev.kind, p));
      }
    }

    function renderPlan(items) {
      const list = $('plan-items');
      if (!Array.isArray(items)) return;
      list.replaceChildren(...items.map((item) =>
        el('li', { data: { status: String(item.status || 'pending') } }, String(item.text || ''),
          item.status === 'in_progress' ? ' (in progress)' : '')));
      $('plan').hidden = items.length === 0;
    }

    function renderTotals() {
      const t = s.totals;
      $('tot-in').textContent = num(t.input);
      $('tot-cached').textContent = num(t.cached);
      $('tot-out').textContent = num(t.output);
      $('tot-cost').textContent = costText(t);
      $('tot-steps').textContent = String(t.steps);
    }

    // -- actions --

    async function steer(ev) {
      ev.preventDefault();
      const text = $('steer-text').value;
      if (!text.trim()) return;
      try {
        const res = await api('POST', `/v1/runs/${id}/messages`, { text });
        $('steer-text').value = '';
        if (res.disposition === 'follow_up') location.hash = '#/runs/' + res.run.id;
      } catch (e) {
        if (e.status !== 401) notice('Could not send: ' + e.message);
      }
    }

    async function cancel() {
      try {
        await api('POST', `/v1/runs/${id}/cancel`);
      } catch (e) {
        if (e.status !== 401) notice('Could not cancel: ' + e.message);
      }
    }

    $('steer-form').onsubmit = steer;
    $('run-cancel').onclick = cancel;
    renderTotals();
    connect();

    return {
      stop() {
        s.stopped = true;
        delete timeline.dataset.run; // it holds that run's events no longer: no view does
        changes.stop();
        group.stop();
        if (s.es) s.es.close();
        for (const t of [s.flushTimer, s.retryTimer]) if (t) clearTimeout(t);
        $('steer-form').onsubmit = null;
        $('run-cancel').onclick = null;
      },
    };
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('signin-form').addEventListener('submit', signIn);
    $('new-run-form').addEventListener('submit', startRun);
    $('signout').addEventListener('click', () => signOut(''));
    window.addEventListener('hashchange', route);
    route();
  });
})();

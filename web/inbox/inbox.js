// The approvals inbox: lists what agents wait for (tool calls and spending
// overruns), lets a human answer, and follows GET /v1/approvals/events live.
//
// Rules this file keeps:
// - Data from the API is untrusted (agents write tool inputs and reasons):
//   it reaches the DOM only as textContent or attribute values, never as
//   HTML, and never as a link.
// - The token lives in sessionStorage and travels only in the
//   Authorization header: never in a URL, a cookie or localStorage.
// - An answer is never lost silently: a failed POST keeps the item, the
//   note and the choice, and says why in words.
(() => {
  'use strict';

  const TOKEN_KEY = 'reveille.inbox.token';
  const EVENTS_PATH = '/v1/approvals/events';
  const TOOL_PATH = '/v1/tool-approvals';
  const MANDATE_PATH = '/v1/mandate-approvals';
  const PAGE_LIMIT = 500;
  const MAX_PAGES = 20; // per list: 10,000 items is more than a person reads
  const SILENCE_MS = 45000; // three missed keep-alives: the stream is dead
  const RETRY_MIN_MS = 500;
  const RETRY_MAX_MS = 30000;
  const KINDS = { tool_call: 'Tool call', mandate_overrun: 'Spending overrun' };
  const MANDATE_STATES = ['approved', 'denied', 'expired', 'canceled'];
  const MAX_NOTE_BYTES = 1000; // the server's bound on a note, in UTF-8 bytes

  const $ = (id) => document.getElementById(id);

  const state = {
    token: null,
    me: null,
    gen: 0, // bumped on sign-in/out: older async work sees it and stops
    items: new Map(), // approval id → item
    lingering: new Set(), // resolved while shown in Pending: kept there until dismissed
    drafts: new Map(), // approval id → {note, policy, busy, error, last}
    tab: 'pending',
    agent: '',
    kind: '',
    seq: null, // the last event seq the page reflects
    cut: { pending: false, resolved: false }, // a tab's lists held more than MAX_PAGES pages
    resolvedLoaded: false,
    stream: null, // AbortController of the open stream
    confirming: null, // {id, close} while the deny dialog is open
    wake: null, // resolves the reconnect wait early
  };

  // ---- DOM helpers: text only --------------------------------------------

  // el builds an element; attrs are set as attributes (values are text to
  // the browser), children are nodes or strings (as text nodes).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === 'text') node.textContent = String(value);
      else node.setAttribute(name, value === true ? '' : String(value));
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      node.append(typeof c === 'string' ? document.createTextNode(c) : c);
    }
    return node;
  }

  function announce(text) {
    const a = $('announce');
    a.textContent = '';
    // A change the screen reader notices even when the text repeats.
    requestAnimationFrame(() => { a.textContent = text; });
  }

  // ---- time, in the browser's locale ---------------------------------------

  const rtf = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' });
  const dtf = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' });

  function relative(date, now) {
    const s = Math.round((date.getTime() - now) / 1000);
    const abs = Math.abs(s);
    if (abs < 45) return rtf.format(s, 'second');
    if (abs < 2700) return rtf.format(Math.round(s / 60), 'minute');
    if (abs < 172800) return rtf.format(Math.round(s / 3600), 'hour');
    return rtf.format(Math.round(s / 86400), 'day');
  }

  function parseTime(v) {
    const d = v ? new Date(v) : null;
    return d && !isNaN(d.getTime()) ? d : null;
  }

  // timeEl is a <time> that tick() keeps current; soonMs marks it urgent
  // when the moment is closer than that.
  function timeEl(date, soonMs) {
    if (!date) return el('span', { text: '—' });
    const t = el('time', { datetime: date.toISOString(), title: dtf.format(date), 'data-rel': '' });
    if (soonMs) t.setAttribute('data-soon', String(soonMs));
    renderTime(t, Date.now());
    return t;
  }

  function renderTime(t, now) {
    const date = new Date(t.dateTime);
    t.textContent = relative(date, now);
    const soon = Number(t.getAttribute('data-soon') || 0);
    t.classList.toggle('soon', soon > 0 && date.getTime() - now < soon);
  }

  function tick() {
    const now = Date.now();
    for (const t of document.querySelectorAll('time[data-rel]')) renderTime(t, now);
  }

  // ---- API -----------------------------------------------------------------

  class APIError extends Error {
    constructor(status, problem, retryAfter) {
      super((problem && (problem.detail || problem.title)) || (status ? 'HTTP ' + status : 'network error'));
      this.status = status; // 0: the request never got an answer
      this.problem = problem || {};
      this.retryAfter = retryAfter;
    }
  }

  function authHeaders(extra) {
    return Object.assign({ Authorization: 'Bearer ' + state.token }, extra || {});
  }

  async function api(method, path, body, extraHeaders) {
    const headers = authHeaders(Object.assign({ Accept: 'application/json, application/problem+json' }, extraHeaders || {}));
    const init = { method, headers, credentials: 'omit', cache: 'no-store', referrerPolicy: 'no-referrer' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new APIError(0, null, null);
    }
    const text = await res.text().catch(() => '');
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (!res.ok) throw new APIError(res.status, data, res.headers.get('Retry-After'));
    return data;
  }

  // listAll reads a list's pages, newest first, up to MAX_PAGES of them;
  // seq is the smallest events_seq the pages reflect (null when the server
  // sends none). The mandate approvals' list is asked for newest first
  // (order=newest): in its default creation order, the first pages of an
  // org's history would be its oldest requests.
  async function listAll(path, params) {
    let items = [];
    let seq = null;
    let cursor = null;
    for (let page = 0; page < MAX_PAGES; page++) {
      const q = new URLSearchParams(Object.assign({ limit: String(PAGE_LIMIT) }, params));
      if (cursor) q.set('cursor', cursor);
      const body = await api('GET', path + '?' + q.toString());
      items = items.concat(body.items || []);
      if (typeof body.events_seq === 'number') seq = seq === null ? body.events_seq : Math.min(seq, body.events_seq);
      cursor = body.next_cursor;
      if (!cursor) break;
    }
    return { items, seq, more: Boolean(cursor) };
  }

  // ---- items ---------------------------------------------------------------

  // normalize turns either kind's JSON into one shape; raw keeps the rest.
  function normalize(kind, a) {
    return {
      kind,
      id: String(a.id),
      agent: a.agent_id || '',
      status: (kind === 'tool_call' ? a.status : a.state) || 'pending',
      createdAt: parseTime(a.created_at),
      expiresAt: parseTime(a.expires_at),
      resolvedAt: parseTime(a.resolved_at),
      resolvedBy: a.resolved_by || '',
      note: a.note || '',
      requestedBy: a.requested_by || '',
      raw: a,
    };
  }

  // upsert applies an approval as the server shows it. It is idempotent by
  // id, and an answer is final: a pending copy (an older list page, a
  // replayed `requested` event) never reopens a resolved item.
  function upsert(kind, approval) {
    if (!approval || !approval.id) return null;
    const next = normalize(kind, approval);
    const prev = state.items.get(next.id);
    if (prev && prev.status !== 'pending' && next.status === 'pending') return null;
    state.items.set(next.id, next);
    if (prev && prev.status === 'pending' && next.status !== 'pending' && state.tab === 'pending' && itemNode(next.id)) {
      state.lingering.add(next.id);
    }
    return { item: next, prev };
  }

  function draftOf(id) {
    let d = state.drafts.get(id);
    if (!d) {
      d = { note: '', policy: '', busy: false, error: '', last: null };
      state.drafts.set(id, d);
    }
    return d;
  }

  function title(it) {
    return it.kind === 'tool_call' ? (it.raw.tool_name || 'tool') : (it.raw.scope || 'spend');
  }

  function describe(it) {
    const who = it.agent ? ' from ' + it.agent : '';
    return (KINDS[it.kind] || 'Request') + ' ' + title(it) + who;
  }

  // ---- rendering -------------------------------------------------------------

  function visible() {
    const out = [];
    for (const it of state.items.values()) {
      const inTab = state.tab === 'pending' ? (it.status === 'pending' || state.lingering.has(it.id)) : it.status !== 'pending';
      if (!inTab) continue;
      if (state.agent && it.agent !== state.agent) continue;
      if (state.kind && it.kind !== state.kind) continue;
      out.push(it);
    }
    const when = (it) => {
      const d = state.tab === 'resolved' ? (it.resolvedAt || it.createdAt) : it.createdAt;
      return d ? d.getTime() : 0;
    };
    // Newest first; ids (uuid v7) break ties in creation order.
    out.sort((a, b) => (when(b) - when(a)) || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0));
    return out;
  }

  function itemNode(id) {
    return document.querySelector('#list > li[data-id="' + CSS.escape(id) + '"]');
  }

  function render() {
    const closeStale = staleConfirm();
    const list = $('list');
    const items = visible();
    const wanted = new Set(items.map((it) => it.id));
    // One pass over the list's elements, not a document-wide query per
    // item: quadratic in the items shown, a render of thousands took seconds.
    const shown = new Map();
    for (const li of Array.from(list.children)) {
      if (!wanted.has(li.dataset.id)) li.remove();
      else shown.set(li.dataset.id, li);
    }
    items.forEach((it, i) => {
      let li = shown.get(it.id);
      const sig = signature(it);
      if (!li) {
        li = el('li', { class: 'item', tabindex: 0, 'data-id': it.id });
        fillItem(li, it);
      } else if (li.dataset.sig !== sig) {
        const hadFocus = li.contains(document.activeElement);
        const focusedRole = hadFocus && document.activeElement.dataset ? document.activeElement.dataset.role : null;
        li.replaceChildren();
        fillItem(li, it);
        if (hadFocus) {
          const again = focusedRole && li.querySelector('[data-role="' + focusedRole + '"]:not(:disabled)');
          (again || li).focus();
        }
      }
      if (list.children[i] !== li) list.insertBefore(li, list.children[i] || null);
    });
    renderCounts();
    renderCut();
    renderEmpty(items.length);
    renderAgentFilter();
    if (closeStale) closeStale();
    renderDismissAnswered(items);
  }

  // renderCut says when the tab shows only the newest of its lists: the
  // oldest pending requests are the nearest to expiry, and not listed.
  function renderCut() {
    const cut = $('cut');
    cut.hidden = !state.cut[state.tab];
    cut.textContent = state.tab === 'pending'
      ? 'Showing the newest ' + (MAX_PAGES * PAGE_LIMIT).toLocaleString('en-US') + ' pending requests of each kind. Older ones, the nearest to expiring, are not listed here: answer them through the API (GET /v1/tool-approvals, GET /v1/mandate-approvals).'
      : 'Showing the newest ' + (MAX_PAGES * PAGE_LIMIT).toLocaleString('en-US') + ' answered requests of each list; older ones are in the API.';
  }

  // answeredShown are the shown items answered while they were in Pending
  // — here, by another approver, a policy or their expiry: what "Dismiss
  // answered" removes (an approver who answers twenty has twenty to clear
  // too). An answer being sent and the request whose deny dialog is open
  // stay.
  function answeredShown(items) {
    if (state.tab !== 'pending') return [];
    return items.filter((it) => {
      const d = state.drafts.get(it.id);
      return it.status !== 'pending' && state.lingering.has(it.id) &&
        !(d && d.busy) && !(state.confirming && state.confirming.id === it.id);
    });
  }

  function renderDismissAnswered(items) {
    const button = $('dismiss-answered');
    const n = answeredShown(items).length;
    const hadFocus = document.activeElement === button;
    button.textContent = 'Dismiss answered (' + n + ')';
    button.hidden = n === 0;
    if (hadFocus && button.hidden) focusListStart();
  }

  // focusListStart keeps focus off <body> when what had it goes: the first
  // request shown, else the Pending tab.
  function focusListStart() {
    ($('list').firstElementChild || $('tab-' + state.tab)).focus();
  }

  function dismissAnswered() {
    const gone = answeredShown(visible());
    if (!gone.length) return;
    for (const it of gone) state.lingering.delete(it.id);
    render();
    focusListStart();
    announce('Dismissed ' + gone.length + ' answered request' + (gone.length === 1 ? '' : 's'));
  }

  // staleConfirm notices that the request the deny dialog is open for was
  // answered meanwhile (by someone else, a policy, its expiry): the item
  // gets the reason, and the returned function closes the dialog once the
  // item is rendered. Null while the dialog still has a question to ask.
  function staleConfirm() {
    const c = state.confirming;
    if (!c) return null;
    const now = state.items.get(c.id);
    if (now && now.status === 'pending') return null;
    if (now) {
      let why;
      if (now.status === 'expired') why = 'it expired first';
      else if (now.status === 'canceled') why = 'it was canceled first';
      else {
        const by = now.resolvedBy || (now.raw.source === 'policy' ? 'a standing policy' : 'someone else');
        why = by + ' ' + now.status + ' it first';
      }
      draftOf(c.id).error = 'Your denial was not sent: ' + why + '.';
    }
    return c.close;
  }

  // signature changes when an item's element must be rebuilt. A draft not
  // made yet reads as an empty one: fillItem makes it (answerForm) after
  // it has stored the signature, and a card then read as changed on the
  // next redraw and was rebuilt under the approver's hands.
  function signature(it) {
    const d = state.drafts.get(it.id);
    return [it.status, it.resolvedBy, it.resolvedAt ? it.resolvedAt.getTime() : '', state.lingering.has(it.id),
      Boolean(d && d.busy), (d && d.error) || ''].join('|');
  }

  function renderCounts() {
    let n = 0;
    for (const it of state.items.values()) if (it.status === 'pending') n++;
    const count = String(n) + (state.cut.pending ? '+' : ''); // (more than the tab holds)
    $('count-pending').textContent = count;
    document.title = (n ? '(' + count + ') ' : '') + 'Approvals inbox · Reveille';
  }

  function renderEmpty(shown) {
    const empty = $('empty');
    empty.hidden = shown > 0 || !$('loading').hidden;
    if (state.agent || state.kind) {
      empty.textContent = 'Nothing here matches these filters.';
    } else if (state.tab === 'pending') {
      empty.textContent = 'Nothing is waiting for you. When an agent asks to call a tool that needs a human, or a spend goes over its mandate, the request appears here at once, newest first, until someone answers it or it expires.';
    } else {
      empty.textContent = 'Nothing has been answered yet. Approvals, denials and expired requests appear here with who decided and when.';
    }
  }

  function renderAgentFilter() {
    const select = $('filter-agent');
    const agents = new Set();
    for (const it of state.items.values()) if (it.agent) agents.add(it.agent);
    if (state.agent) agents.add(state.agent);
    const sorted = Array.from(agents).sort();
    const current = Array.from(select.options).slice(1).map((o) => o.value);
    if (current.join('\n') === sorted.join('\n')) return;
    select.replaceChildren(el('option', { value: '', text: 'All agents' }), ...sorted.map((a) => el('option', { value: a, text: a })));
    select.value = state.agent;
  }

  function metaRow(label, value) {
    return el('div', null, el('dt', { text: label }), el('dd', null, value));
  }

  function fillItem(li, it) {
    const pending = it.status === 'pending';
    li.dataset.kind = it.kind;
    li.dataset.status = it.status;
    li.dataset.sig = signature(it);
    // Its name says what it is and where it stands, as a screen reader
    // announces the request a keyboard user focuses (a, d act on it).
    li.setAttribute('aria-label', describe(it) + ', ' + statusWord(it.status).toLowerCase());
    li.setAttribute('aria-describedby', pending ? 'keys-help' : '');
    if (!pending) li.removeAttribute('aria-describedby');

    const head = el('div', { class: 'item-head' },
      el('span', { class: 'kind', text: KINDS[it.kind] || it.kind }),
      el('h3', { text: title(it) }),
      el('span', { class: 'status', 'data-status': it.status, 'data-role': 'status', text: statusWord(it.status) }));
    li.append(head);

    const meta = el('dl', { class: 'meta' });
    meta.append(metaRow('Agent', it.agent || '—'));
    if (it.kind === 'tool_call') meta.append(metaRow('Session', it.raw.session_id || '—'));
    meta.append(metaRow('Requested by', it.requestedBy || '—'));
    meta.append(metaRow('Requested', timeEl(it.createdAt)));
    if (pending) meta.append(metaRow('Expires', timeEl(it.expiresAt, 5 * 60 * 1000)));
    li.append(meta);

    if (it.kind === 'tool_call') li.append(...toolBody(it));
    else li.append(...overrunBody(it));

    if (pending) li.append(answerForm(it));
    else li.append(outcome(it));
  }

  function statusWord(s) {
    return { pending: 'Pending', approved: 'Approved', denied: 'Denied', expired: 'Expired', canceled: 'Canceled' }[s] || String(s);
  }

  function toolBody(it) {
    let input = it.raw.input;
    let text;
    if (input === null || input === undefined) text = '(no input)';
    else {
      try { text = JSON.stringify(input, null, 2); } catch (e) { text = String(input); }
    }
    return [el('span', { class: 'label', text: 'Input' }), el('pre', { class: 'json', tabindex: 0, 'aria-label': 'Input of the tool call' }, el('code', { text }))];
  }

  // money renders a decimal (a number or a decimal string) as given.
  function money(v) {
    return v === null || v === undefined || v === '' ? '—' : String(v);
  }

  function overrunBody(it) {
    const r = it.raw;
    const parts = [];
    const cost = Number(r.cost);
    const budget = Number(r.budget);
    const spent = Number(r.spent);
    const line = el('p', { class: 'money' }, 'Cost ', el('strong', { text: money(r.cost) }));
    if (r.budget !== undefined && r.budget !== null) {
      line.append(' against a budget of ', el('strong', { text: money(r.budget) }));
      if (r.spent !== undefined && r.spent !== null) {
        line.append(', of which ', el('strong', { text: money(r.spent) }), ' is spent');
        if (isFinite(cost) && isFinite(budget) && isFinite(spent)) {
          const after = spent + cost;
          line.append(el('span', { class: after > budget ? 'over' : '', text: ' (' + after + ' after this, ' + (after > budget ? (after - budget) + ' over' : 'within budget') + ')' }));
        }
      }
    }
    parts.push(line);
    if (r.refusal) parts.push(el('p', { class: 'help', text: 'Refused because: ' + refusalWords(r.refusal) }));
    parts.push(el('span', { class: 'label', text: 'Reason' }), el('p', { class: 'reason', text: r.reason || '(none given)' }));
    return parts;
  }

  function refusalWords(r) {
    return {
      insufficient: 'the spend would go over what is left of the budget',
      no_mandate: 'the agent has no mandate for this scope',
      expired: 'the mandate has expired',
      revoked: 'the mandate was revoked',
    }[r] || r;
  }

  function answerForm(it) {
    const d = draftOf(it.id);
    const box = el('div', { class: 'answer' });
    const noteId = 'note-' + it.id;
    const note = el('input', { type: 'text', id: noteId, class: 'note', 'data-role': 'note', autocomplete: 'off', maxlength: MAX_NOTE_BYTES });
    note.value = d.note;
    note.disabled = d.busy;
    note.addEventListener('input', () => { d.note = note.value; });
    box.append(el('label', { class: 'note-label', for: noteId }, 'Note (optional)', note));

    if (it.kind === 'tool_call') {
      const fs = el('fieldset', { class: 'policy' }, el('legend', { text: 'And from now on, for ' + (it.raw.tool_name || 'this tool') + ' by ' + (it.agent || 'this agent') }));
      const options = [['', 'This call only'], ['always', 'Always allow this tool for this agent'], ['never', 'Never allow it']];
      for (const [value, label] of options) {
        const radio = el('input', { type: 'radio', name: 'policy-' + it.id, value, 'data-role': 'policy-' + (value || 'once') });
        radio.checked = d.policy === value;
        radio.disabled = d.busy;
        radio.addEventListener('change', () => { if (radio.checked) d.policy = value; });
        fs.append(el('label', null, radio, label));
      }
      box.append(fs);
    }

    const what = describe(it);
    const approve = el('button', { type: 'button', class: 'approve', 'data-role': 'approve', 'aria-label': 'Approve ' + what, text: d.busy ? 'Sending…' : 'Approve' });
    const deny = el('button', { type: 'button', class: 'deny', 'data-role': 'deny', 'aria-label': 'Deny ' + what, text: 'Deny…' });
    approve.disabled = deny.disabled = d.busy;
    approve.addEventListener('click', () => answer(it.id, 'approved'));
    deny.addEventListener('click', () => answer(it.id, 'denied'));
    box.append(el('div', { class: 'buttons' }, approve, deny));
    box.append(el('p', { class: 'error', role: 'alert', 'data-role': 'error', text: d.error }));
    return box;
  }

  function outcome(it) {
    const box = el('div');
    const p = el('p', { class: 'outcome', 'data-role': 'outcome' });
    const by = it.resolvedBy;
    const source = it.raw.source;
    let words;
    if (it.status === 'expired') words = 'Expired without an answer';
    else if (it.status === 'canceled') words = 'Canceled: the work it was for was canceled';
    else if (source === 'policy') words = statusWord(it.status) + ' by a standing policy';
    else words = statusWord(it.status) + (by ? ' by ' + (state.me && by === state.me.sub ? by + ' (you)' : by) : '');
    p.append(words, ' ');
    if (it.resolvedAt) p.append(timeEl(it.resolvedAt));
    if (it.note) p.append(el('span', { class: 'note', text: 'Note: ' + it.note }));
    box.append(p);
    const d = state.drafts.get(it.id);
    if (d && d.error) box.append(el('p', { class: 'error', role: 'alert', 'data-role': 'error', text: d.error }));
    if (state.tab === 'pending' && state.lingering.has(it.id)) {
      const dismiss = el('button', { type: 'button', class: 'secondary dismiss', 'data-role': 'dismiss', 'aria-label': 'Dismiss ' + describe(it), text: 'Dismiss' });
      dismiss.addEventListener('click', () => {
        const li = itemNode(it.id);
        const next = li && (li.nextElementSibling || li.previousElementSibling);
        state.lingering.delete(it.id);
        render();
        if (next) next.focus();
        else $('main').focus();
      });
      box.append(dismiss);
    }
    return box;
  }

  // ---- answering -------------------------------------------------------------

  function randomKey() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    const b = new Uint8Array(16);
    crypto.getRandomValues(b);
    return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  }

  async function answer(id, decision) {
    const it = state.items.get(id);
    if (!it || it.status !== 'pending') return;
    const d = draftOf(id);
    if (d.busy) return;
    // maxlength counts characters; the server counts UTF-8 bytes.
    const noteBytes = new TextEncoder().encode(d.note.trim()).length;
    if (noteBytes > MAX_NOTE_BYTES) {
      d.error = 'The note is ' + noteBytes + ' bytes long in UTF-8, and the server takes at most ' + MAX_NOTE_BYTES + ': shorten it, then answer again. Nothing was sent.';
      render();
      const note = itemNode(id) && itemNode(id).querySelector('[data-role="note"]');
      if (note) note.focus();
      announce('Not sent: ' + d.error);
      return;
    }
    if (decision === 'denied' && !(await confirmDeny(it, d))) return;

    let path;
    const body = {};
    if (it.kind === 'tool_call') {
      path = '/v1/sessions/' + encodeURIComponent(it.raw.session_id) + '/tool-approvals';
      body.approval_id = it.id;
      body.decision = decision;
      if (d.policy) body.update_policy = d.policy;
    } else {
      path = MANDATE_PATH + '/' + encodeURIComponent(it.id) + (decision === 'approved' ? '/approve' : '/deny');
    }
    if (d.note.trim()) body.note = d.note.trim();
    const sent = path + ' ' + JSON.stringify(body);
    // The same answer sent again keeps its Idempotency-Key, so a retry
    // after a lost response is the same request, not a second answer.
    const key = d.last && d.last.sent === sent ? d.last.key : randomKey();
    d.last = { sent, key };
    d.busy = true;
    d.error = '';
    render();
    const gen = state.gen;
    try {
      await api('POST', path, body, { 'Idempotency-Key': key });
      if (gen !== state.gen) return;
      d.last = null;
      state.lingering.add(id);
      upsert(it.kind, Object.assign({}, it.raw, it.kind === 'tool_call' ? { status: decision, source: 'human' } : { state: decision },
        { resolved_by: state.me ? state.me.sub : '', resolved_at: new Date().toISOString(), note: body.note || null }));
      announce(statusWord(decision) + ': ' + describe(it));
      refreshOne(it.kind, id, gen);
    } catch (err) {
      if (gen !== state.gen) return;
      d.error = await answerError(err, it, gen);
      if (d.error) announce('Not recorded: ' + d.error);
      else {
        d.last = null;
        announce(statusWord(decision) + ': ' + describe(it));
      }
    } finally {
      d.busy = false;
      if (gen === state.gen) render();
    }
  }

  // refreshOne replaces an item with the server's copy (who, when, note).
  async function refreshOne(kind, id, gen) {
    try {
      const a = await api('GET', (kind === 'tool_call' ? TOOL_PATH : MANDATE_PATH) + '/' + encodeURIComponent(id));
      if (gen === state.gen && upsert(kind, a)) render();
      return a;
    } catch (e) {
      return null;
    }
  }

  // answerError says in words why an answer was not recorded.
  async function answerError(err, it, gen) {
    const p = err.problem || {};
    const detail = p.detail || '';
    switch (err.status) {
      case 0: {
        // The request may have reached the server and only its answer been
        // lost: ask what became of the request before saying anything.
        const fresh = await refreshOne(it.kind, it.id, gen);
        const now = fresh ? normalize(it.kind, fresh) : null;
        if (now && now.status !== 'pending' && state.me && now.resolvedBy === state.me.sub) {
          state.lingering.add(it.id);
          return '';
        }
        return 'The server could not be reached, so your answer may not have been recorded. Check the connection and answer again (the same answer is not recorded twice).';
      }
      case 401:
        return 'The server refused your token (it may have expired), so your answer was not recorded. Sign out and sign in with a new token.';
      case 403:
        if (/requested it|created it|the principal that/i.test(detail)) {
          return 'You cannot approve or deny your own request: another approver has to answer it.';
        }
        return 'You may not answer this request: ' + (detail || 'your token lacks the approver role') + '.';
      case 404:
        return 'This request no longer exists (or is not in your organisation).';
      case 409: {
        if (/still being processed/i.test(detail)) return 'Your earlier attempt is still being processed; try again in a moment.';
        const fresh = await refreshOne(it.kind, it.id, gen);
        const now = fresh ? normalize(it.kind, fresh) : null;
        if (now && now.status !== 'pending') {
          state.lingering.add(it.id);
          if (now.status === 'expired') return 'It expired before your answer arrived.';
          if (now.status === 'canceled') return 'It was canceled before your answer arrived.';
          const when = now.resolvedAt ? ' (' + dtf.format(now.resolvedAt) + ')' : '';
          return 'Already answered by ' + (now.resolvedBy || (fresh.source === 'policy' ? 'a standing policy' : 'someone else')) + ': ' + statusWord(now.status).toLowerCase() + when + '.';
        }
        return 'The server refused the answer: ' + (detail || 'conflict') + '.';
      }
      case 413:
        return 'The note is too long for the server.';
      case 429:
        return 'Too many requests from your organisation right now; try again' + (err.retryAfter ? ' in ' + err.retryAfter + ' s' : ' shortly') + '.';
      case 400:
      case 422: {
        const fields = (p.errors || []).map((e) => e.field + ': ' + e.detail).join('; ');
        return 'The server refused the answer: ' + (fields || detail || 'invalid request') + '.';
      }
      default:
        return 'The server failed to record your answer (HTTP ' + err.status + '). Try again.';
    }
  }

  // confirmDeny asks in an in-page dialog; it resolves to true to deny.
  function confirmDeny(it, d) {
    const dialog = $('confirm');
    $('confirm-title').textContent = 'Deny this ' + (KINDS[it.kind] || 'request').toLowerCase() + '?';
    $('confirm-text').textContent = it.kind === 'tool_call'
      ? 'The agent ' + (it.agent || '') + ' will be told it may not call ' + title(it) + (d.policy ? ', and your policy choice is saved' : '') + '.'
      : 'The spend on ' + title(it) + ' by ' + (it.agent || 'the agent') + ' will not happen (if a wake-up asked for it, its workflow wakes with the outcome denied).';
    $('confirm-note').textContent = d.note.trim() ? 'Note: ' + d.note.trim() : '';
    const opener = document.activeElement;
    return new Promise((resolve) => {
      const done = (yes) => {
        state.confirming = null;
        $('confirm-deny').removeEventListener('click', onDeny);
        $('confirm-cancel').removeEventListener('click', onCancel);
        dialog.removeEventListener('cancel', onEsc);
        if (dialog.open) dialog.close();
        // The opener is gone when the item was rebuilt meanwhile: the item
        // itself, else the list's start, keeps focus off <body>.
        const back = opener && document.contains(opener) ? opener : itemNode(it.id) || $('main');
        back.focus();
        resolve(yes);
      };
      state.confirming = { id: it.id, close: () => done(false) };
      const onDeny = () => done(true);
      const onCancel = () => done(false);
      const onEsc = (e) => { e.preventDefault(); done(false); };
      $('confirm-deny').addEventListener('click', onDeny);
      $('confirm-cancel').addEventListener('click', onCancel);
      dialog.addEventListener('cancel', onEsc);
      dialog.showModal();
      $('confirm-cancel').focus(); // the safe choice is the default
    });
  }

  // ---- loading and live updates ----------------------------------------------

  async function loadPending(gen) {
    const [tools, overruns] = await Promise.all([
      listAll(TOOL_PATH, { status: 'pending' }),
      listAll(MANDATE_PATH, { status: 'pending', order: 'newest' }),
    ]);
    if (gen !== state.gen) return;
    // What was pending and is absent now was answered meanwhile: the
    // resolved tab reloads it; here it simply leaves (unless lingering).
    const now = new Set();
    for (const a of tools.items) { upsert('tool_call', a); now.add(String(a.id)); }
    for (const a of overruns.items) { upsert('mandate_overrun', a); now.add(String(a.id)); }
    state.cut.pending = tools.more || overruns.more;
    for (const [id, it] of state.items) {
      if (it.status === 'pending' && !now.has(id)) state.items.delete(id);
    }
    const seqs = [tools.seq, overruns.seq].filter((s) => s !== null);
    state.seq = seqs.length ? Math.min(...seqs) : null;
  }

  async function loadResolved(gen) {
    const lists = [listAll(TOOL_PATH, { status: 'resolved' })];
    for (const s of MANDATE_STATES) lists.push(listAll(MANDATE_PATH, { status: s, order: 'newest' }));
    const [tools, ...overruns] = await Promise.all(lists);
    if (gen !== state.gen) return;
    for (const a of tools.items) upsert('tool_call', a);
    for (const l of overruns) for (const a of l.items) upsert('mandate_overrun', a);
    state.cut.resolved = tools.more || overruns.some((l) => l.more);
    state.resolvedLoaded = true;
  }

  function setConn(s, text) {
    const c = $('conn');
    c.dataset.state = s;
    $('conn-text').textContent = text;
  }

  function showBanner(text) {
    const b = $('banner');
    b.textContent = text || '';
    b.hidden = !text;
  }

  // follow keeps the event stream open for this sign-in (gen): it resumes
  // from state.seq with Last-Event-ID, and reconnects with backoff.
  async function follow(gen) {
    let failures = 0;
    while (gen === state.gen) {
      setConn(failures ? 'reconnecting' : 'connecting', failures ? 'Reconnecting…' : 'Connecting…');
      let outcome;
      if (state.seq === null) {
        // The list never loaded (the banner says it loads again): load it
        // before following, or the stream starts at the end and what was
        // pending before never shows.
        try {
          await loadPending(gen);
          if (gen !== state.gen) return;
          showBanner('');
          render();
        } catch (e) {
          if (gen !== state.gen) return;
          if (e.status === 401) return expired(gen);
          outcome = { retry: true, error: e };
        }
      }
      if (!outcome) {
        try {
          outcome = await streamOnce(gen, () => { failures = 0; setConn('live', 'Live'); });
        } catch (e) {
          outcome = { retry: true, error: e };
        }
      }
      if (gen !== state.gen) return;
      if (outcome.stop) {
        setConn('failed', outcome.text);
        return;
      }
      if (outcome.reload) {
        try {
          await loadPending(gen);
          if (gen !== state.gen) return;
          // What was answered in the hole left Pending: Resolved must be
          // read again to show it (now if it is the tab shown, else when
          // it is next opened).
          state.resolvedLoaded = false;
          if (state.tab === 'resolved') {
            try {
              await loadResolved(gen);
            } catch (e) {
              // (Pending did reload: follow from it; Resolved is read again
              // when the tab is next opened)
              if (e.status === 401) return expired(gen);
            }
          }
          if (gen !== state.gen) return;
          render();
          continue; // resubscribe at once from the reloaded list's seq
        } catch (e) {
          if (e.status === 401) return expired(gen);
        }
      }
      failures++;
      const delay = Math.min(RETRY_MAX_MS, RETRY_MIN_MS * 2 ** Math.min(failures - 1, 8)) * (0.5 + Math.random() / 2);
      setConn('reconnecting', 'Reconnecting in ' + Math.max(1, Math.round(delay / 1000)) + ' s…');
      await new Promise((resolve) => {
        const t = setTimeout(resolve, delay);
        state.wake = () => { clearTimeout(t); resolve(); };
      });
      state.wake = null;
    }
  }

  // streamOnce reads one connection of the event stream until it ends.
  async function streamOnce(gen, onOpen) {
    const ctrl = new AbortController();
    state.stream = ctrl;
    const headers = authHeaders({ Accept: 'text/event-stream' });
    if (state.seq !== null) headers['Last-Event-ID'] = String(state.seq);
    let res;
    try {
      res = await fetch(EVENTS_PATH, { headers, signal: ctrl.signal, credentials: 'omit', cache: 'no-store', referrerPolicy: 'no-referrer' });
    } catch (e) {
      return { retry: true };
    }
    if (res.status === 401) {
      expired(gen);
      return { stop: true, text: 'Not connected' };
    }
    if (res.status === 403) {
      // The server's problem says why (a missing role, an agent binding).
      const p = await res.json().catch(() => null);
      return { stop: true, text: 'Live updates refused: ' + ((p && (p.detail || p.title)) || 'HTTP 403') };
    }
    if (!res.ok || !res.body) return { retry: true };
    onOpen();
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    let ev = { id: null, type: 'message', data: [] };
    let silence = setTimeout(() => ctrl.abort(), SILENCE_MS);
    let changed = false; // an event of this read changed an item: redraw
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done || gen !== state.gen) return { retry: true };
        clearTimeout(silence);
        silence = setTimeout(() => ctrl.abort(), SILENCE_MS);
        buf += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + (buf[nl] === '\r' && buf[nl + 1] === '\n' ? 2 : 1));
          if (line === '') {
            const r = dispatch(ev, gen);
            ev = { id: null, type: 'message', data: [] };
            if (r && r.reload) return r;
            if (r && r.changed) changed = true;
            continue;
          }
          if (line[0] === ':') continue; // keep-alive
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? '' : line.slice(colon + 1);
          if (value[0] === ' ') value = value.slice(1);
          if (field === 'id') ev.id = value;
          else if (field === 'event') ev.type = value;
          else if (field === 'data') ev.data.push(value);
        }
        // One redraw for the events of this read, not one each: a redraw
        // sorts and walks every item, and a catch-up of hundreds of
        // events over a long list, redrawn one by one, froze the page.
        if (changed && gen === state.gen) render();
        changed = false;
      }
    } catch (e) {
      return { retry: true };
    } finally {
      clearTimeout(silence);
      ctrl.abort();
      if (changed && gen === state.gen) render();
    }
  }

  // dispatch applies one event; {reload: true} asks for a fresh list,
  // {changed: true} for a redraw (the reader redraws once per read).
  function dispatch(ev, gen) {
    if (gen !== state.gen) return null;
    if (ev.type === 'reset') return { reload: true };
    if (ev.type !== 'requested' && ev.type !== 'resolved') return null;
    let data;
    try { data = JSON.parse(ev.data.join('\n')); } catch (e) { return null; }
    const kind = data.kind === 'mandate_overrun' ? 'mandate_overrun' : 'tool_call';
    const change = upsert(kind, data.approval);
    const seq = Number(ev.id || data.seq);
    if (isFinite(seq) && (state.seq === null || seq > state.seq)) state.seq = seq;
    if (change) {
      if (ev.type === 'requested' && !change.prev) announce('New ' + describe(change.item).toLowerCase());
      if (ev.type === 'resolved' && change.prev && change.prev.status === 'pending') {
        announce(describe(change.item) + ': ' + statusWord(change.item.status).toLowerCase() + (change.item.resolvedBy ? ' by ' + change.item.resolvedBy : ''));
      }
      return { changed: true };
    }
    return null;
  }

  // ---- session ---------------------------------------------------------------

  function expired(gen) {
    if (gen !== state.gen) return;
    signOut('The server refused your token (it may have expired). Sign in again.');
  }

  async function signIn(token, fromLink, attempt = 0) {
    const gen = ++state.gen;
    state.token = token;
    const err = $('signin-error');
    if (!attempt) err.textContent = '';
    let me;
    try {
      me = await api('GET', '/v1/whoami');
    } catch (e) {
      if (gen !== state.gen) return;
      showSignIn();
      if (e.status === 0 || e.status === 429 || e.status >= 500) {
        // Not the token's fault (a replica restarting, a proxy's 502, no
        // network): keep it, and sign in again by itself — a reload
        // during a restart must not sign the approver out.
        state.token = null;
        sessionStorage.setItem(TOKEN_KEY, token);
        const wait = Math.min(30, 2 ** Math.min(attempt + 1, 5));
        err.textContent = (e.status === 0 ? 'The server could not be reached' : 'Sign-in failed: ' + e.message) +
          '. Trying again in ' + wait + ' s.';
        setTimeout(() => { if (gen === state.gen) signIn(token, fromLink, attempt + 1); }, wait * 1000);
        return;
      }
      state.token = null;
      sessionStorage.removeItem(TOKEN_KEY);
      err.textContent = e.status === 401
        ? 'The server refused this token: it is malformed, expired, or signed with another secret.'
        : 'Sign-in failed: ' + e.message;
      if (fromLink) $('token-input').focus();
      return;
    }
    if (gen !== state.gen) return;
    if (!(me.roles || []).includes('approver')) {
      state.token = null;
      sessionStorage.removeItem(TOKEN_KEY);
      showSignIn();
      err.textContent = 'This token has no approver role (it has: ' + ((me.roles || []).join(', ') || 'none') + '), so it cannot see or answer approval requests.';
      return;
    }
    // The answering routes and the event stream refuse such a token (403):
    // it could see the list but not answer it or follow it.
    const cannot = me.agent_id
      ? 'This token is bound to agent ' + me.agent_id + ' (its agent_id claim), and a token bound to an agent never answers approvals'
      : !me.sub ? 'This token has no sub claim, and a token without sub never answers approvals (sub names who answered, so that no one answers their own request)' : '';
    if (cannot) {
      state.token = null;
      sessionStorage.removeItem(TOKEN_KEY);
      showSignIn();
      err.textContent = cannot + '. The inbox needs an approver token with a sub that is not bound to an agent.';
      if (fromLink) $('token-input').focus();
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    state.me = me;
    $('who').textContent = me.sub + ' · ' + me.org_id;
    $('who').hidden = false;
    $('signout').hidden = false;
    $('signin-view').hidden = true;
    $('inbox-view').hidden = false;
    $('token-input').value = '';
    showBanner('');
    $('loading').hidden = false;
    render();
    try {
      await loadPending(gen);
    } catch (e) {
      if (gen !== state.gen) return;
      if (e.status === 401) return expired(gen);
      showBanner('The list could not be loaded: ' + e.message + '. It loads again when the connection returns.');
    }
    if (gen !== state.gen) return;
    $('loading').hidden = true;
    render();
    follow(gen);
  }

  function signOut(message) {
    state.gen++;
    if (state.confirming) state.confirming.close();
    if (state.stream) state.stream.abort();
    if (state.wake) state.wake();
    sessionStorage.removeItem(TOKEN_KEY);
    Object.assign(state, { token: null, me: null, seq: null, resolvedLoaded: false, tab: 'pending', agent: '', kind: '', cut: { pending: false, resolved: false } });
    state.items.clear();
    state.lingering.clear();
    state.drafts.clear();
    $('list').replaceChildren();
    $('who').hidden = true;
    $('signout').hidden = true;
    $('filter-agent').value = '';
    $('filter-kind').value = '';
    selectTab('pending', false);
    setConn('off', 'Not connected');
    showBanner(message || '');
    showSignIn();
  }

  function showSignIn() {
    $('inbox-view').hidden = true;
    $('signin-view').hidden = false;
  }

  // ---- controls --------------------------------------------------------------

  function selectTab(tab, focus) {
    state.tab = tab;
    state.lingering.clear();
    for (const name of ['pending', 'resolved']) {
      const t = $('tab-' + name);
      t.setAttribute('aria-selected', String(name === tab));
      t.tabIndex = name === tab ? 0 : -1;
    }
    $('panel').setAttribute('aria-labelledby', 'tab-' + tab);
    if (focus) $('tab-' + tab).focus();
    if (tab === 'resolved' && !state.resolvedLoaded && state.token) {
      const gen = state.gen;
      $('loading').hidden = false;
      render();
      const failed = 'Resolved requests could not be loaded: ';
      loadResolved(gen).then(() => {
        // (a failure of an earlier opening no longer holds)
        if (gen === state.gen && $('banner').textContent.startsWith(failed)) showBanner('');
      }, (e) => {
        if (gen === state.gen) showBanner(failed + e.message + '.');
      }).finally(() => {
        if (gen !== state.gen) return;
        $('loading').hidden = true;
        render();
      });
      return;
    }
    render();
  }

  function onListKey(e) {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    const key = e.key.toLowerCase();
    if (key !== 'a' && key !== 'd') return;
    const target = e.target;
    // Only the focused request itself takes a and d. From its controls —
    // typing a note, a policy radio, the Approve or Deny… button — a key
    // press is not an answer: from the "Always allow" radio, `a` approved
    // as "this call only" when that radio was focused but not selected,
    // and a person who had just picked a policy could not tell which one
    // was sent. The buttons answer by Enter or Space, with what is selected.
    if (target.closest('input, textarea, select, button, [contenteditable]')) return;
    const li = target.closest('li.item');
    if (!li) return;
    e.preventDefault();
    answer(li.dataset.id, key === 'a' ? 'approved' : 'denied');
  }

  function onTabsKey(e) {
    if (e.key !== 'ArrowLeft' && e.key !== 'ArrowRight' && e.key !== 'Home' && e.key !== 'End') return;
    e.preventDefault();
    const next = e.key === 'Home' ? 'pending' : e.key === 'End' ? 'resolved' : state.tab === 'pending' ? 'resolved' : 'pending';
    selectTab(next, true);
  }

  // takeFragmentToken reads #token=… and removes it from the address bar
  // (replacing the history entry that holds it), so it is neither
  // bookmarked nor shared by accident. A fragment without a token (the
  // skip link's #main) is left alone.
  function takeFragmentToken() {
    const hash = location.hash.replace(/^#/, '');
    if (!hash) return null;
    const params = new URLSearchParams(hash);
    if (!params.has('token')) return null;
    const token = params.get('token');
    history.replaceState(null, '', location.pathname + location.search);
    return token && token.trim() ? token.trim() : null;
  }

  // onHashChange takes a #token=… link opened in a tab already on the page
  // (a fragment-only navigation does not reload it): the token replaces the
  // current sign-in, as the same link in a new tab would.
  function onHashChange() {
    const token = takeFragmentToken();
    if (!token) return;
    if (state.token) signOut('');
    signIn(token, true);
  }

  function start() {
    $('signin').addEventListener('submit', (e) => {
      e.preventDefault();
      const token = $('token-input').value.replace(/^\s*(Bearer\s+)?/i, '').trim();
      if (!token) {
        $('signin-error').textContent = 'Paste a token first.';
        return;
      }
      signIn(token, false);
    });
    $('signout').addEventListener('click', () => signOut('Signed out. The token was removed from this tab.'));
    $('tab-pending').addEventListener('click', () => selectTab('pending', false));
    $('tab-resolved').addEventListener('click', () => selectTab('resolved', false));
    document.querySelector('.tabs').addEventListener('keydown', onTabsKey);
    $('filter-agent').addEventListener('change', (e) => { state.agent = e.target.value; render(); });
    $('filter-kind').addEventListener('change', (e) => { state.kind = e.target.value; render(); });
    $('list').addEventListener('keydown', onListKey);
    $('dismiss-answered').addEventListener('click', dismissAnswered);
    window.addEventListener('hashchange', onHashChange);
    setInterval(tick, 15000);

    const token = takeFragmentToken() || sessionStorage.getItem(TOKEN_KEY);
    if (token) signIn(token, true);
    else showSignIn();
  }

  start();
})();

// trioqueue dashboard: live counts, a throughput chart and live job pages, fed by one
// server-sent event stream per page (the server holds one subscription per queue).
"use strict";
(function () {
  const BUCKET = 5;            // seconds per chart point
  const POINTS = 60;           // 5 minutes
  const KINDS = ["enqueued", "completed", "failed"];
  const COLORS = { enqueued: "#6b8fd6", completed: "#2e9d5b", failed: "#d64545" };
  const perSecond = {};        // kind -> Map(second -> count), all queues together
  KINDS.forEach(k => { perSecond[k] = new Map(); });
  let clockSkew = 0;           // server time - browser time (seconds)

  function now() { return Date.now() / 1000 + clockSkew; }

  function addHistory(throughput) {
    for (const q of Object.keys(throughput)) {
      const h = throughput[q];
      const start = h.end - h.series[KINDS[0]].length;
      for (const k of KINDS) {
        h.series[k].forEach((n, i) => {
          if (n) { const m = perSecond[k]; m.set(start + i, (m.get(start + i) || 0) + n); }
        });
      }
    }
  }

  function setCounts(queue, counts, paused) {
    document.querySelectorAll("[data-count]").forEach(el => {
      if (el.dataset.queue === queue) {
        const v = String(counts[el.dataset.state] || 0);
        el.classList.toggle("zero", v === "0");
        if (el.textContent !== v) { el.textContent = v; el.classList.remove("bump"); void el.offsetWidth; el.classList.add("bump"); }
      }
    });
    document.querySelectorAll("[data-paused]").forEach(el => {
      if (el.dataset.paused === queue) el.classList.toggle("hidden", !paused);
    });
  }

  // -- live page content: re-read this page when an event concerns it ----------------
  const main = document.getElementById("content");
  // A job page re-reads itself 0.3 s after an event about its job; a job list at most
  // every 2 s while its queue has events (one small read per burst, never a timer loop).
  let refreshTimer = null, refreshing = false, again = false, lastRefresh = 0;
  function scheduleRefresh() {
    if (refreshTimer || !main) return;
    const gap = main.dataset.liveList !== undefined ? 2000 : 300;
    const wait = Math.max(300, lastRefresh + gap - Date.now());
    refreshTimer = setTimeout(refresh, wait);
  }
  async function refresh() {
    refreshTimer = null;
    if (refreshing) { again = true; return; }
    const typing = document.activeElement;
    if (typing && main.contains(typing) && typing.tagName === "INPUT" && typing.value) {
      refreshTimer = setTimeout(refresh, 2000);  // never wipe what the user is typing
      return;
    }
    refreshing = true;
    lastRefresh = Date.now();
    try {
      const resp = await fetch(location.href, { headers: { "Accept": "text/html" }, credentials: "same-origin" });
      if (resp.ok || resp.status === 404) {
        const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
        const fresh = doc.getElementById("content");
        if (fresh) { main.innerHTML = fresh.innerHTML; wireForms(main); }
      }
    } catch (e) { /* the next event tries again */ }
    refreshing = false;
    if (again) { again = false; scheduleRefresh(); }
  }

  function onJobs(msg) {
    const second = Math.floor(msg.t);
    for (const k of KINDS) {
      if (msg.kinds[k]) perSecond[k].set(second, (perSecond[k].get(second) || 0) + msg.kinds[k]);
    }
    if (!main) return;
    if (main.dataset.liveJob !== undefined) {
      const mine = msg.more || msg.kinds.resync || msg.ids.indexOf(main.dataset.liveJob) >= 0;
      if (main.dataset.liveQueue === msg.queue && mine) scheduleRefresh();
    } else if (main.dataset.liveList !== undefined && main.dataset.liveList === msg.queue) {
      scheduleRefresh();
    }
  }

  // -- chart --------------------------------------------------------------------------
  function draw() {
    const canvas = document.getElementById("chart");
    if (!canvas) return;
    const ratio = window.devicePixelRatio || 1;
    const w = canvas.clientWidth, h = canvas.clientHeight;
    if (canvas.width !== Math.round(w * ratio)) { canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio); }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const end = Math.floor(now() / BUCKET) * BUCKET;   // exclusive: the last full bucket is drawn
    const start = end - BUCKET * POINTS;
    const series = {};
    let max = 1;
    for (const k of KINDS) {
      const pts = new Array(POINTS).fill(0);
      for (const [s, n] of perSecond[k]) {
        if (s < start - 600) { perSecond[k].delete(s); continue; }
        const i = Math.floor((s - start) / BUCKET);
        if (i >= 0 && i < POINTS) pts[i] += n;
      }
      series[k] = pts;
      max = Math.max(max, ...pts);
      const lastMinute = pts.slice(-12).reduce((a, b) => a + b, 0);
      const rate = document.querySelector('[data-rate="' + k + '"]');
      if (rate) rate.textContent = String(lastMinute);
    }
    const left = 44, right = 8, top = 10, bottom = 22;
    const pw = w - left - right, ph = h - top - bottom;
    const scale = niceMax(max);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#7a8391"; ctx.strokeStyle = "#e4e7ec"; ctx.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = top + ph - (ph * i) / 4;
      ctx.beginPath(); ctx.moveTo(left, y + 0.5); ctx.lineTo(left + pw, y + 0.5); ctx.stroke();
      ctx.textAlign = "right"; ctx.fillText(String(Math.round((scale * i) / 4)), left - 6, y + 4);
    }
    ctx.textAlign = "center";
    for (let m = 5; m >= 0; m--) {
      const x = left + pw - (pw * m * 60) / (BUCKET * POINTS);
      ctx.fillText(m ? "-" + m + "m" : "now", Math.min(Math.max(x, left + 10), left + pw - 12), h - 6);
    }
    for (const k of KINDS) {
      ctx.strokeStyle = COLORS[k]; ctx.lineWidth = 2; ctx.beginPath();
      series[k].forEach((n, i) => {
        const x = left + (pw * (i + 0.5)) / POINTS, y = top + ph - (ph * n) / scale;
        if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
      });
      ctx.stroke();
    }
  }
  function niceMax(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return Math.max(4, m * p);
    return v;
  }

  // -- forms: confirmation of destructive actions --------------------------------------
  function wireForms(root) {
    root.querySelectorAll("form[data-confirm]").forEach(f => {
      if (f.dataset.wired) return;
      f.dataset.wired = "1";
      f.addEventListener("submit", ev => { if (!window.confirm(f.dataset.confirm)) ev.preventDefault(); });
    });
  }

  // -- the event stream ----------------------------------------------------------------
  function connect() {
    const url = document.body.dataset.sse;
    if (!url || !window.EventSource) return;
    const live = document.getElementById("live");
    const es = new EventSource(url);
    es.addEventListener("open", () => { live && live.classList.replace("off", "on"); });
    es.addEventListener("error", () => { live && live.classList.replace("on", "off"); });
    es.addEventListener("hello", ev => {
      const msg = JSON.parse(ev.data);
      clockSkew = msg.now - Date.now() / 1000;
      KINDS.forEach(k => perSecond[k].clear());
      addHistory(msg.throughput);
      for (const q of Object.keys(msg.counts)) setCounts(q, msg.counts[q], msg.paused[q]);
      // Events between this page's rendering and its subscription are not replayed:
      // a live page re-reads itself if its queue had any.
      if (main) {
        const q = main.dataset.liveList !== undefined ? main.dataset.liveList : main.dataset.liveQueue;
        if (q !== undefined && (msg.last_event[q] || 0) >= Number(main.dataset.rendered || 0)) scheduleRefresh();
      }
      live && live.classList.replace("off", "on");
      draw();
    });
    es.addEventListener("counts", ev => { const m = JSON.parse(ev.data); setCounts(m.queue, m.counts, m.paused); });
    es.addEventListener("jobs", ev => onJobs(JSON.parse(ev.data)));
    es.addEventListener("resync", () => location.reload());
  }

  document.addEventListener("DOMContentLoaded", () => {
    wireForms(document);
    connect();
    draw();
    setInterval(draw, 1000);
    window.addEventListener("resize", draw);
  });
})();

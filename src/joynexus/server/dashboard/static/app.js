// JoyNexus dashboard: polls /v1/dashboard/state with the viewer's API key and draws
// tables and SVG charts. No libraries, no build step; every value from the server is
// written with textContent / SVG attributes, never parsed as HTML.
"use strict";

(function () {
  const KEY_STORAGE = "joynexus.dashboard.key";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const SERVICE_COLORS = { training: "#2563eb", inference: "#d97706", environment: "#059669" };
  const CURVE_LABELS = {
    "train.loss": "training loss",
    "rollout.mean_return": "rollout mean return",
    "rollout.success_rate": "rollout success rate",
    "eval.mean_return": "evaluation mean return",
    "eval.success_rate": "evaluation success rate",
  };

  const params = new URLSearchParams(window.location.search);
  const intervalMs = Math.max(250, Number(params.get("interval")) || 2000);
  let timer = null;

  // --- key handling -------------------------------------------------------------------
  // A key comes from the login box, or from the address's fragment (#key=...): browsers
  // never send a fragment to the server, so it stays out of request lines and logs.
  // Never put it in the query (?key=): the server would see it in every request line.
  function takeKeyFromUrl() {
    const fragment = new URLSearchParams(window.location.hash.replace(/^#/, ""));
    const key = fragment.get("key");
    if (key) {
      window.sessionStorage.setItem(KEY_STORAGE, key);
      fragment.delete("key");
      const rest = fragment.toString();
      // Keep the key out of the address bar and the history.
      window.history.replaceState(
        null, "", window.location.pathname + window.location.search + (rest ? "#" + rest : ""));
    }
  }

  function currentKey() {
    return window.sessionStorage.getItem(KEY_STORAGE);
  }

  function showLogin(message) {
    document.getElementById("main").hidden = true;
    document.getElementById("logout").hidden = true;
    document.getElementById("login").hidden = false;
    setStatus(message ? "error" : "idle", message || "not connected");
  }

  function setStatus(state, text) {
    const el = document.getElementById("status");
    el.dataset.state = state;
    el.textContent = text;
  }

  // --- DOM helpers --------------------------------------------------------------------
  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v);
    }
    for (const child of children || []) node.appendChild(child);
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, String(v));
    }
    return node;
  }

  function td(value, cls) {
    return el("td", { class: cls || "", text: value === null || value === undefined ? "" : String(value) });
  }

  function fmtBytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    let v = n;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return (i === 0 ? String(v) : v.toFixed(1)) + " " + units[i];
  }

  function fmtNum(v) {
    if (v === null || v === undefined) return "–";
    if (!Number.isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a < 0.01 || a >= 1e5)) return v.toExponential(2);
    return (Math.round(v * 1000) / 1000).toString();
  }

  function fmtTime(t) {
    const d = new Date(t * 1000);
    return d.toTimeString().slice(0, 8);
  }

  // --- sections -----------------------------------------------------------------------
  function renderQueues(data) {
    const q = data.queues;
    const total = Object.values(data.jobs_by_state).reduce((a, b) => a + b, 0);
    const cards = [
      ["tenants", String(data.tenants.length)],
      ["training jobs", String(total)],
      ["Training Queue", fmtBytes(q.training_queue_bytes)],
      ["queue partitions", String(q.training_queue_partitions)],
      ["Inference Queue depth", q.inference_queue_depth === null ? "–" : String(q.inference_queue_depth)],
      ["predicts in flight", q.inference_in_flight === null ? "–" : String(q.inference_in_flight)],
    ];
    document.getElementById("queues").replaceChildren(
      ...cards.map(([label, value]) =>
        el("div", { class: "card", "data-card": label }, [
          el("div", { class: "label", text: label }),
          el("div", { class: "value", text: value }),
        ]))
    );
  }

  function renderWorkloads(data) {
    const rows = [];
    for (const tenant of data.tenants) {
      if (tenant.workloads.length === 0) {
        rows.push(el("tr", { "data-tenant": tenant.tenant_id }, [
          td(tenant.tenant_id), el("td", { class: "muted", colspan: "8", text: "no workloads" }),
        ]));
      }
      for (const w of tenant.workloads) {
        const jobs = w.task === "eval"
          ? `${w.eval_runs_completed ?? 0}/${w.eval_runs_target ?? "?"} runs`
          : `${w.jobs_completed ?? 0}/${w.jobs_target ?? "∞"}`;
        rows.push(el("tr", { "data-workload-id": w.workload_id, "data-state": w.state }, [
          td(w.tenant_id),
          td(w.workload_id),
          td(w.task),
          el("td", {}, [el("span", { class: "state state-" + w.state, text: w.state })]),
          td(jobs, "num"),
          td(w.jobs_in_flight, "num"),
          td(w.jobs_failed, "num"),
          td(w.policy_version, "num"),
          td(w.restarts ?? 0, "num"),
          td(w.error || (w.stalled ? `stalled: ${w.stalled}` : ""), "error"),
        ]));
      }
    }
    document.querySelector("#workloads tbody").replaceChildren(...rows);
  }

  function renderJobs(data) {
    const entries = Object.entries(data.jobs_by_state).filter(([, n]) => n > 0);
    const rows = entries.length
      ? entries.map(([state, n]) => el("tr", { "data-job-state": state }, [td(state), td(n, "num")]))
      : [el("tr", {}, [el("td", { class: "muted", text: "no jobs yet" })])];
    document.querySelector("#jobs tbody").replaceChildren(...rows);
  }

  function renderUsage(data) {
    const rows = [];
    for (const tenant of data.tenants) {
      const u = tenant.usage;
      if (!u) continue;
      const s = u.device_seconds;
      rows.push(el("tr", { "data-usage-tenant": tenant.tenant_id }, [
        td(tenant.tenant_id),
        td(fmtNum(s.training || 0), "num"),
        td(fmtNum(s.inference || 0), "num"),
        td(fmtNum(s.environment || 0), "num"),
        td(u.requests, "num"),
        td(u.samples_trained, "num"),
        td(u.env_steps, "num"),
      ]));
    }
    document.querySelector("#usage tbody").replaceChildren(...rows);
  }

  function renderHealth(data) {
    const section = document.getElementById("health-section");
    if (!data.health) { section.hidden = true; return; }
    section.hidden = false;
    const events = data.health.events.slice().reverse();
    const rows = events.length
      ? events.map((e) => el("tr", { "data-health-kind": e.kind }, [
        td(e.seq, "num"), td(fmtNum(e.time), "num"), td(e.role), td(e.kind), td(e.detail),
      ]))
      : [el("tr", {}, [el("td", { class: "muted", colspan: "5", text: "no health events" })])];
    document.querySelector("#health tbody").replaceChildren(...rows);
  }

  // --- charts -------------------------------------------------------------------------
  const W = 320, H = 150, M = { l: 44, r: 8, t: 8, b: 22 };

  function scale(lo, hi, a, b) {
    if (hi === lo) { lo -= 1; hi += 1; }
    return (v) => a + ((v - lo) / (hi - lo)) * (b - a);
  }

  function lineChart(points, series) {
    const useStep = points.every((p) => p.step !== null && p.step !== undefined);
    const xs = points.map((p, i) => (useStep ? p.step : i));
    const ys = points.map((p) => p.value);
    let yLo = Math.min(...ys), yHi = Math.max(...ys);
    const pad = (yHi - yLo) * 0.08 || Math.abs(yHi) * 0.1 || 1;
    yLo -= pad; yHi += pad;
    const xLo = Math.min(...xs), xHi = Math.max(...xs);
    const x = scale(xLo, xHi, M.l, W - M.r);
    const y = scale(yLo, yHi, H - M.b, M.t);
    const root = svg("svg", {
      viewBox: `0 0 ${W} ${H}`, class: "curve-svg", role: "img",
      "data-series": series, "data-points": points.length,
      "aria-label": `${series}: ${points.length} points`,
    });
    for (let i = 0; i <= 3; i += 1) {
      const v = yLo + ((yHi - yLo) * i) / 3;
      const yy = y(v);
      root.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: yy, y2: yy, class: "grid" }));
      root.appendChild(svg("text", { x: M.l - 4, y: yy + 3, "text-anchor": "end", text: fmtNum(v) }));
    }
    root.appendChild(svg("line", { x1: M.l, x2: M.l, y1: M.t, y2: H - M.b, class: "axis" }));
    root.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, class: "axis" }));
    root.appendChild(svg("text", { x: M.l, y: H - 6, text: String(xLo) }));
    root.appendChild(svg("text", { x: W - M.r, y: H - 6, "text-anchor": "end", text: String(xHi) }));
    root.appendChild(svg("text", {
      x: (M.l + W - M.r) / 2, y: H - 6, "text-anchor": "middle",
      text: useStep ? "policy version" : "sample",
    }));
    const coords = points.map((p, i) => `${x(xs[i]).toFixed(1)},${y(p.value).toFixed(1)}`);
    root.appendChild(svg("polyline", { points: coords.join(" "), class: "line" }));
    if (points.length <= 80) {
      points.forEach((p, i) => {
        const dot = svg("circle", { cx: x(xs[i]).toFixed(1), cy: y(p.value).toFixed(1), r: 2.2, class: "dot" });
        dot.appendChild(svg("title", { text: `${useStep ? "version " + p.step : "#" + i}: ${fmtNum(p.value)}` }));
        root.appendChild(dot);
      });
    }
    return root;
  }

  function renderCurves(data) {
    const boxes = [];
    for (const tenant of data.tenants) {
      for (const [name, points] of Object.entries(tenant.curves)) {
        if (!points.length) continue;
        const series = `${tenant.tenant_id}/${name}`;
        const last = points[points.length - 1];
        boxes.push(el("div", { class: "curve", "data-tenant": tenant.tenant_id, "data-curve": name }, [
          el("h3", {}, [
            document.createTextNode(`${tenant.tenant_id} · ${CURVE_LABELS[name] || name}`),
            el("span", { class: "muted", text: `latest ${fmtNum(last.value)}` }),
          ]),
          lineChart(points, series),
        ]));
      }
    }
    const box = document.getElementById("curves");
    if (boxes.length) box.replaceChildren(...boxes);
    else box.replaceChildren(el("div", { class: "empty", text: "no learning signals yet" }));
  }

  function renderUtilization(data) {
    const box = document.getElementById("utilization");
    const u = data.utilization;
    if (!u || u.buckets.length === 0) {
      document.getElementById("util-caption").textContent = "";
      box.replaceChildren(el("div", { class: "empty", text: "no device work measured yet" }));
      return;
    }
    document.getElementById("util-caption").textContent =
      `busy device-seconds per ${u.bucket_s} s bucket`;
    const w = 960, h = 170, m = { l: 44, r: 8, t: 8, b: 22 };
    const totals = u.buckets.map((b) => u.services.reduce((a, s) => a + (b.seconds[s] || 0), 0));
    const yHi = Math.max(u.bucket_s * 0.1, ...totals);
    // Show a window of at least 24 buckets so one busy bucket is a bar, not the whole chart.
    const tEnd = u.buckets[u.buckets.length - 1].start;
    const t0 = Math.min(u.buckets[0].start, tEnd - 23 * u.bucket_s), t1 = tEnd + u.bucket_s;
    const x = scale(t0, t1, m.l, w - m.r);
    const y = scale(0, yHi, h - m.b, m.t);
    const root = svg("svg", {
      viewBox: `0 0 ${w} ${h}`, class: "util-svg", role: "img",
      "data-buckets": u.buckets.length, "aria-label": "service utilization timeline",
    });
    for (let i = 0; i <= 3; i += 1) {
      const v = (yHi * i) / 3;
      root.appendChild(svg("line", { x1: m.l, x2: w - m.r, y1: y(v), y2: y(v), class: "grid" }));
      root.appendChild(svg("text", { x: m.l - 4, y: y(v) + 3, "text-anchor": "end", text: fmtNum(v) + " s" }));
    }
    const barW = Math.max(1, x(t0 + u.bucket_s) - x(t0) - 1);
    for (const b of u.buckets) {
      let acc = 0;
      for (const s of u.services) {
        const v = b.seconds[s] || 0;
        if (v <= 0) continue;
        const rect = svg("rect", {
          x: x(b.start).toFixed(1), width: barW.toFixed(1),
          y: y(acc + v).toFixed(1), height: Math.max(0.5, y(acc) - y(acc + v)).toFixed(1),
          fill: SERVICE_COLORS[s] || "#6b7280", "data-service": s,
        });
        rect.appendChild(svg("title", { text: `${fmtTime(b.start)} ${s}: ${fmtNum(v)} s` }));
        root.appendChild(rect);
        acc += v;
      }
    }
    root.appendChild(svg("line", { x1: m.l, x2: w - m.r, y1: h - m.b, y2: h - m.b, class: "axis" }));
    root.appendChild(svg("text", { x: m.l, y: h - 6, text: fmtTime(t0) }));
    root.appendChild(svg("text", { x: w - m.r, y: h - 6, "text-anchor": "end", text: fmtTime(t1) }));
    const legend = el("div", { class: "legend" }, u.services.map((s) =>
      el("span", {}, [
        el("span", { class: "swatch" }),
        document.createTextNode(s),
      ])));
    // Colours are set through the DOM (the page's CSP forbids inline style attributes).
    legend.querySelectorAll(".swatch").forEach((sw, i) => {
      sw.style.background = SERVICE_COLORS[u.services[i]] || "#6b7280";
    });
    box.replaceChildren(legend, root);
  }

  function render(data) {
    document.getElementById("viewer").textContent = data.viewer === "admin"
      ? "admin view: every tenant"
      : `tenant ${data.tenant_id}`;
    renderQueues(data);
    renderWorkloads(data);
    renderJobs(data);
    renderUsage(data);
    renderUtilization(data);
    renderCurves(data);
    renderHealth(data);
    setStatus("live", "live · " + fmtTime(data.generated_at));
  }

  // --- polling ------------------------------------------------------------------------
  async function poll() {
    const key = currentKey();
    if (!key) { showLogin(); return; }
    try {
      const response = await fetch("/v1/dashboard/state", {
        headers: { Authorization: "Bearer " + key, Accept: "application/json" },
        cache: "no-store",
      });
      if (response.status === 401 || response.status === 403) {
        window.sessionStorage.removeItem(KEY_STORAGE);
        const body = await response.json().catch(() => ({}));
        showLogin(body.message || "the key was refused");
        return;
      }
      if (!response.ok) {
        setStatus("error", `server answered ${response.status}`);
      } else {
        document.getElementById("login").hidden = true;
        document.getElementById("main").hidden = false;
        document.getElementById("logout").hidden = false;
        render(await response.json());
      }
    } catch (err) {
      setStatus("error", "server unreachable");
    }
    timer = window.setTimeout(poll, intervalMs);
  }

  function start() {
    takeKeyFromUrl();
    document.getElementById("login").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const input = document.getElementById("key");
      const key = input.value.trim();
      if (!key) return;
      window.sessionStorage.setItem(KEY_STORAGE, key);
      input.value = "";
      if (timer !== null) window.clearTimeout(timer);
      poll();
    });
    document.getElementById("logout").addEventListener("click", () => {
      window.sessionStorage.removeItem(KEY_STORAGE);
      if (timer !== null) window.clearTimeout(timer);
      showLogin();
    });
    poll();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

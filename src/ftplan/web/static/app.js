// ftplan web app: the job form, the API calls and the charts (inline SVG, no libraries).
// Everything is fetched from this server; the job lives in the URL hash so a result can be shared.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const SVGNS = "http://www.w3.org/2000/svg";
  const TOP = 1000; // plans requested for the table and the scatter
  const ROWS = 25; // table rows shown before "show all"
  const COMPONENTS = ["cuda_context", "frozen_weights", "trainable_weights", "master_weights", "gradients",
    "optimizer_states", "comm_buffers", "activations", "logits_and_loss", "transient", "stream_pools",
    "allocator_reserve"];
  const COLORS = {
    cuda_context: "#6b7280", frozen_weights: "#2563eb", trainable_weights: "#0891b2", master_weights: "#7c3aed",
    gradients: "#db2777", optimizer_states: "#dc2626", activations: "#16a34a", logits_and_loss: "#ca8a04",
    transient: "#ea580c", allocator_reserve: "#a3a3a3", comm_buffers: "#0d9488",
    stream_pools: "#c084fc",
  };
  // form state <-> URL: every key is a string; only values that differ from DEFAULTS go in the URL.
  // DEFAULTS come from the options schema (GET /api/options), never copied here; PAGE holds the
  // form's own fields and choices that are not option defaults.
  const PAGE = {
    model: "", config: "", config_name: "",
    micro_batch: "auto", // the search picks the micro-batch per plan
  };
  const FORM_OPTIONS = ["method", "precision", "optimizer", "attn", "seq_len", "micro_batch", "global_batch",
    "tokens", "epochs", "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "quant_type", "compute_dtype",
    "no_double_quant", "checkpointing", "loss", "activation_offloading", "packing", "objective", "deadline", "budget", "max_gpus", "margin", "pricing", "providers",
    "gpus_filter", "preemption_rate", "checkpoint_interval"];
  const BOOL_FIELDS = ["activation_offloading", "packing"]; // schema bools shown as checkboxes
  let DEFAULTS = { ...PAGE };
  let MB_FIXED = ""; // the micro-batch option's default, shown when "let ftplan choose" is off
  function asText(v) {
    if (v === null || v === undefined) return "";
    return Array.isArray(v) ? v.join(",") : String(v);
  }
  function applySchema(schema) {
    const byName = {};
    for (const group of Object.values(schema.groups)) for (const o of group) if (!(o.name in byName)) byName[o.name] = o;
    const d = {};
    for (const name of FORM_OPTIONS) {
      const o = byName[name];
      if (!o) continue;
      // an option the search needs without a default (tokens) starts at its example
      d[name] = asText(o.default !== null && o.default !== undefined ? o.default : (o.type === "tokens" ? o.example : null));
    }
    MB_FIXED = d.micro_batch || "";
    d.double_quant = d.no_double_quant === "true" ? "0" : "1"; // the page shows the positive checkbox
    delete d.no_double_quant;
    DEFAULTS = { ...d, ...PAGE };
    // select boxes list the schema's choices (labels from the page where it has one)
    for (const o of Object.values(byName)) {
      const sel = $(o.name);
      if (!o.choices || !sel || sel.tagName !== "SELECT") continue;
      const labels = Object.fromEntries([...sel.options].map((x) => [x.value, x.textContent]));
      sel.replaceChildren(...o.choices.map((c) => el("option", { value: c }, labels[c] || c)));
    }
  }
  const TEXT_FIELDS = ["model", "config", "config_name", "method", "precision", "optimizer", "attn", "seq_len",
    "checkpointing", "loss",
    "global_batch", "tokens", "epochs", "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "quant_type",
    "compute_dtype", "objective", "deadline", "budget", "max_gpus", "margin", "preemption_rate", "checkpoint_interval"];

  const S = { models: [], gpus: {}, rec: null, cmp: null, body: null, form: null, sel: 0, showAll: false, fitSeq: 0 };

  // ------------------------------------------------------------------ small helpers
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v; else e.setAttribute(k, v === true ? "" : v);
    }
    for (const k of kids.flat()) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function tip(node, text) { node.append(svg("title", {}, text)); return node; }
  const gb = (b) => (b / 1e9).toLocaleString("en-US", { maximumFractionDigits: 1, minimumFractionDigits: 1 });
  const usd = (x) => x >= 1000 ? "$" + Math.round(x).toLocaleString("en-US") : "$" + x.toFixed(2);
  const hours = (h) => h < 10 ? h.toFixed(2) : h.toLocaleString("en-US", { maximumFractionDigits: 1 });
  const num = (x, d = 0) => x.toLocaleString("en-US", { maximumFractionDigits: d });
  const label = (s) => s.replace(/_/g, " ");
  function gpusLabel(lo) { return lo.nodes > 1 ? `${lo.gpus_per_node}x${lo.nodes}` : String(lo.gpus_per_node); }
  function planKey(p) {
    return [p.offer.provider, p.offer.sku, p.offer.region, p.offer.pricing, JSON.stringify(p.layout)].join("|");
  }
  function download(blob, name) {
    const a = el("a", { href: URL.createObjectURL(blob), download: name });
    document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }

  // ------------------------------------------------------------------ API
  class ApiError extends Error {
    constructor(status, doc) {
      super((doc && doc.message) || `HTTP ${status}`);
      this.status = status; this.detail = (doc && Array.isArray(doc.detail)) ? doc.detail : [];
    }
  }
  async function api(path, body) {
    const opts = body === undefined ? {} : {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) };
    const r = await fetch(path, opts);
    if (!r.ok) {
      let doc = null;
      try { doc = await r.json(); } catch (e) { /* not JSON */ }
      throw new ApiError(r.status, doc);
    }
    return r;
  }
  const getJSON = async (path, body) => (await api(path, body)).json();

  // ------------------------------------------------------------------ form <-> state
  function readForm() {
    const s = {};
    for (const k of TEXT_FIELDS) s[k] = ($(k).value || "").trim();
    if ($("src-catalog").checked) { s.config = ""; s.config_name = ""; } else { s.model = ""; }
    s.micro_batch = $("mb_auto").checked ? "auto" : ($("micro_batch").value || MB_FIXED);
    s.double_quant = $("double_quant").checked ? "1" : "0";
    for (const k of BOOL_FIELDS) s[k] = $(k).checked ? "true" : "false";
    const checked = (box) => [...document.querySelectorAll(`#${box} input:checked`)].map((i) => i.value);
    s.pricing = checked("pricing").join(",");
    s.providers = checked("providers").join(",");
    s.gpus_filter = checked("gpus_filter").join(",");
    return s;
  }
  function writeForm(st) {
    const s = { ...DEFAULTS, ...st };
    for (const k of TEXT_FIELDS) $(k).value = s[k];
    const pasted = !!s.config;
    $("src-config").checked = pasted; $("src-catalog").checked = !pasted;
    $("mb_auto").checked = s.micro_batch === "auto";
    $("micro_batch").value = s.micro_batch === "auto" ? MB_FIXED : s.micro_batch;
    $("double_quant").checked = s.double_quant !== "0";
    for (const k of BOOL_FIELDS) $(k).checked = s[k] === "true";
    const setChecks = (box, csv) => {
      const want = new Set(csv.split(",").filter(Boolean));
      for (const i of document.querySelectorAll(`#${box} input`)) i.checked = want.has(i.value);
    };
    setChecks("pricing", s.pricing); setChecks("providers", s.providers); setChecks("gpus_filter", s.gpus_filter);
    syncForm();
  }
  function stateToHash(s, sel) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(s)) {
      if (v !== DEFAULTS[k] || (["method", "tokens", "seq_len"].includes(k) && v !== "")) q.set(k, v);
    }
    if (sel) q.set("sel", String(sel));
    return "#" + q.toString();
  }
  function hashToState() {
    const h = location.hash.replace(/^#/, "");
    if (!h) return null;
    const q = new URLSearchParams(h);
    const s = {};
    for (const k of Object.keys(DEFAULTS)) if (q.has(k)) s[k] = q.get(k);
    if (!s.model && !s.config) return null;
    return { state: s, sel: parseInt(q.get("sel") || "0", 10) || 0 };
  }
  function syncForm() {
    const m = $("method").value;
    $("lora-box").hidden = m === "full";
    $("qlora-box").hidden = m !== "qlora";
    const pasted = $("src-config").checked;
    $("catalog-box").hidden = pasted; $("config-box").hidden = !pasted;
    $("micro_batch").disabled = $("mb_auto").checked;
    const np = document.querySelectorAll("#providers input:checked").length;
    const ng = document.querySelectorAll("#gpus_filter input:checked").length;
    $("filter-count").textContent = (np || ng) ? `(${np || "all"} providers, ${ng || "all"} GPU types)` : "(all)";
    showModelInfo();
  }
  function showModelInfo() {
    const v = $("model").value.trim().toLowerCase();
    const m = S.models.find((x) => x.name.toLowerCase() === v || x.hf_id.toLowerCase() === v);
    const info = $("model-info");
    if (m) {
      const act = m.params_active !== m.params_total ? `, ${(m.params_active / 1e9).toFixed(2)}B active` : "";
      info.textContent = `${m.name}: ${m.family}, ${(m.params_total / 1e9).toFixed(2)}B parameters${act}, ` +
        `${m.layers} layers, hidden ${m.hidden_size} — ${m.hf_id}`;
    } else {
      info.textContent = v ? "not a catalog name: pick one from the list, or paste its config.json"
        : `${S.models.length} models in the catalog`;
    }
  }

  // request bodies (field names are the API's, which mirror the CLI options)
  function jobBody(s) {
    const b = {};
    if (s.config) {
      try { b.config = JSON.parse(s.config); } catch (e) {
        throw new ApiError(422, { message: `config: not valid JSON (${e.message})`,
          detail: [{ loc: ["body", "config"], msg: "not valid JSON" }] });
      }
      if (s.config_name) b.config_name = s.config_name;
    } else {
      b.model = s.model;
    }
    const int = (k) => { if (s[k] !== "") b[k] = /^-?\d+$/.test(s[k]) ? parseInt(s[k], 10) : s[k]; };
    const flt = (k) => { if (s[k] !== "") b[k] = isFinite(Number(s[k])) ? Number(s[k]) : s[k]; };
    for (const k of ["method", "precision", "optimizer", "attn", "quant_type", "compute_dtype", "lora_targets", "tokens",
      "checkpointing", "loss"]) {
      if (s[k] !== "") b[k] = s[k];
    }
    int("seq_len"); int("lora_r"); int("lora_alpha"); flt("lora_dropout"); flt("epochs");
    if (s.micro_batch !== "auto") int("micro_batch");
    b.no_double_quant = s.double_quant === "0";
    for (const k of BOOL_FIELDS) b[k] = s[k] === "true";
    return b;
  }
  function searchBody(s) {
    const b = jobBody(s);
    if (s.micro_batch === "auto") delete b.micro_batch; // the search chooses the micro-batch per plan
    const int = (k) => { if (s[k] !== "") b[k] = /^-?\d+$/.test(s[k]) ? parseInt(s[k], 10) : s[k]; };
    const flt = (k) => { if (s[k] !== "") b[k] = isFinite(Number(s[k])) ? Number(s[k]) : s[k]; };
    b.objective = s.objective;
    flt("deadline"); flt("budget"); int("max_gpus"); int("global_batch"); flt("margin");
    flt("preemption_rate"); flt("checkpoint_interval");
    b.pricing = s.pricing ? s.pricing.split(",") : ["any"];
    if (s.providers) b.providers = s.providers.split(",");
    if (s.gpus_filter) b.gpus_filter = s.gpus_filter.split(",");
    b.top = TOP;
    return b;
  }

  // ------------------------------------------------------------------ errors and status
  function clearErrors() {
    $("error").hidden = true; $("error").textContent = "";
    for (const e of document.querySelectorAll(".invalid")) e.classList.remove("invalid");
  }
  function showError(err) {
    const box = $("error");
    box.hidden = false;
    if (err instanceof ApiError) {
      box.textContent = err.status === 413 ? err.message : `${err.message}`;
      const ids = { no_double_quant: "double_quant", gpu: null };
      for (const d of err.detail) {
        const f = (d.loc || [])[1];
        const id = f in ids ? ids[f] : f;
        if (id && $(id)) $(id).classList.add("invalid");
      }
    } else {
      box.textContent = `error: ${err && err.message ? err.message : err}`;
    }
  }
  function busy(on, text) {
    $("run").disabled = on;
    $("status").textContent = text || "";
  }

  // ------------------------------------------------------------------ running a job
  async function run(sel) {
    clearErrors();
    const s = readForm();
    let body;
    try { body = searchBody(s); } catch (e) { showError(e); return; }
    busy(true, "planning…");
    const t0 = performance.now();
    try {
      const [rec, cmp] = await Promise.all([getJSON("/api/recommend", body),
        getJSON("/api/compare", { ...body, top: 10 })]);
      S.rec = rec; S.cmp = cmp; S.body = body; S.form = s; S.showAll = false;
      S.sel = Math.min(Math.max(0, sel || 0), Math.max(0, rec.plans.length - 1));
      if (S.sel >= ROWS) S.showAll = true;
      render();
      select(S.sel);
      busy(false, `${rec.plans_total} plans in ${((performance.now() - t0) / 1000).toFixed(2)} s`);
    } catch (e) {
      busy(false, "");
      showError(e);
    }
  }
  function setUrl() {
    const h = stateToHash(S.form, S.sel);
    if (location.hash !== h) history.replaceState(null, "", h);
    $("share").value = location.href;
  }

  // ------------------------------------------------------------------ rendering
  function render() {
    const d = S.rec;
    $("results").hidden = false;
    renderSummary(d);
    renderPlans();
    renderCompare(S.cmp);
    renderWhyNot(d);
    drawScatter();
  }
  // the runtime model's calibrated band (10th-90th percentile of published measurements / prediction)
  function bandText(p) {
    const h = p.runtime.band && p.runtime.band.total_hours, c = p.cost.usd_band;
    if (!h || h[0] === null || !c || c[0] === null) return "";
    return ` — likely ${hours(h[0])}–${hours(h[1])} h, ${usd(c[0])}–${usd(c[1])}`;
  }
  function renderSummary(d) {
    const box = $("summary");
    box.replaceChildren();
    const j = d.job;
    const toks = (j.dataset_tokens || 0) * (j.epochs || 1);
    box.append(el("p", {}, el("strong", {}, d.model.name), d.model.hf_id ? ` (${d.model.hf_id})` : "",
      `, ${(d.model.params_total / 1e9).toFixed(2)}B parameters — ${j.method}, ${j.precision}, ${j.optimizer}, ` +
      `seq ${j.seq_len}, ${num(toks / 1e6, 1)}M tokens` + (j.epochs !== 1 ? ` (${j.epochs} epochs)` : "") +
      `; objective: ${d.objective}`));
    const s = d.search;
    box.append(el("p", { class: "hint" }, `searched ${s.offers} offers on ${s.gpu_types} GPU types, ` +
      `${num(s.candidates)} candidates (${num(s.memory_evals)} memory evaluations) in ${s.seconds.toFixed(2)} s`));
    const cheapest = d.plans.find((p) => p.cheapest) || d.pareto[0];
    const fastest = d.plans.find((p) => p.fastest) || d.pareto[d.pareto.length - 1];
    const say = (what, p) => p ? el("p", {}, el("strong", {}, what + ": "),
      `${usd(p.cost.usd)} in ${hours(p.runtime.total_hours)} h on ${p.layout.gpus_per_node * p.layout.nodes}x ` +
      `${p.offer.gpu} (${p.offer.provider} ${p.offer.sku}, ${p.strategy_label})` + bandText(p)) : null;
    if (d.plans.length) {
      box.append(say("cheapest", cheapest), say("fastest", fastest));
    } else {
      box.append(el("p", { class: "error" }, "no plan fits the constraints — see “why not” below"));
    }
    const notes = $("notes");
    notes.replaceChildren(...d.notes.map((n) => el("p", {}, "note: " + n)));
    if (d.assumptions && d.assumptions.length) {
      notes.append(el("details", { id: "assumptions" }, el("summary", {}, "assumed defaults (reference stack)"),
        el("ul", {}, d.assumptions.map((a) => el("li", {}, `${a.text} — ${a.source} (change: ${a.change})`)))));
    }
  }
  const PLAN_COLS = [["#", "r"], ["provider", "l"], ["sku", "l"], ["gpu", "l"], ["gpus", "r"], ["strategy", "l"],
    ["mb", "r"], ["ga", "r"], ["ckpt", "l"], ["GB/GPU", "r"], ["host GiB/disk GB", "r"], ["tok/s", "r"], ["MFU", "r"],
    ["hours", "r"], ["$", "r"], ["spot E[$]", "r"], ["$/Mtok", "r"], ["flags", "l"]];
  // host RAM (GiB) / local disk (GB) per node; expected cost with preemptions on spot offers
  function hostCell(p) {
    return p.host ? `${num(p.host.ram_bytes / 2 ** 30)}/${num(p.host.disk_bytes / 1e9)}` : "?";
  }
  function spotCell(p) {
    if (!p.spot) return "";
    const s = p.spot;
    return el("span", { title: `reclaim rate ${s.rate_per_instance_hour}/instance-h (${s.rate_basis}); ` +
      `${s.expected_preemptions.toFixed(2)} expected preemptions; checkpoint every ` +
      `${s.checkpoint_interval_hours === null ? "-" : hours(s.checkpoint_interval_hours)} h` },
      `${usd(s.expected_usd)} (${s.expected_preemptions.toFixed(2)})`);
  }
  function head(table, cols) {
    table.tHead.replaceChildren(el("tr", {}, cols.map(([c, a]) => el("th", { class: a === "l" ? "l" : null }, c))));
  }
  function flags(p) {
    return ["cheapest", "fastest", "pareto"].filter((f) => p[f]).map((f) => el("span", { class: "flag " + f }, f));
  }
  function renderPlans() {
    const d = S.rec;
    const t = $("plans");
    head(t, PLAN_COLS);
    const n = S.showAll ? d.plans.length : Math.min(ROWS, d.plans.length);
    const rows = d.plans.slice(0, n).map((p, i) => {
      const m = p.memory;
      const cells = [i + 1, p.offer.provider, [p.offer.sku, p.offer.stale ? el("span", { class: "stale", title: `price as of ${p.offer.as_of}` }, " stale") : null],
        p.offer.gpu, gpusLabel(p.layout), p.strategy_label, p.job.micro_batch, p.job.grad_accum,
        p.job.gradient_checkpointing ? "on" : "off", `${gb(m.device_total_bytes)}/${num(m.gpu_memory_bytes / 1e9)}`,
        hostCell(p), num(p.runtime.tokens_per_s), `${Math.round(p.runtime.mfu * 100)}%`, hours(p.runtime.total_hours),
        usd(p.cost.usd), spotCell(p), p.cost.usd_per_million_tokens === null ? "?" : p.cost.usd_per_million_tokens.toFixed(3),
        flags(p)];
      const tr = el("tr", { "data-index": i }, cells.map((c, k) => el("td", { class: PLAN_COLS[k][1] === "l" ? "l" : null }, c)));
      tr.addEventListener("click", () => select(i));
      return tr;
    });
    t.tBodies[0].replaceChildren(...rows);
    $("plans-count").textContent = d.plans_total > d.plans.length
      ? `(${d.plans.length} best of ${d.plans_total} feasible)` : `(${d.plans_total} feasible)`;
    $("more").hidden = n >= d.plans.length;
    $("more").textContent = `show all ${d.plans.length}`;
    markSelected();
  }
  function markSelected() {
    for (const tr of $("plans").tBodies[0].rows) tr.classList.toggle("selected", Number(tr.dataset.index) === S.sel);
  }
  function renderCompare(d) {
    const cols = [["#", "r"], ["gpu", "l"], ["provider", "l"], ["sku", "l"], ["gpus", "r"], ["strategy", "l"],
      ["$/GPU-h", "r"], ["tok/s/GPU", "r"], ["hours", "r"], ["job $", "r"], ["$/Mtok", "r"], ["kWh", "r"]];
    const t = $("compare");
    head(t, cols);
    const keys = new Map(S.rec.plans.map((p, i) => [planKey(p), i]));
    t.tBodies[0].replaceChildren(...d.per_gpu.map((p, i) => {
      const world = p.layout.gpus_per_node * p.layout.nodes;
      const cells = [i + 1, p.offer.gpu, p.offer.provider, p.offer.sku, world, p.strategy_label,
        p.offer.usd_per_gpu_hour.toFixed(2), num(p.runtime.tokens_per_s / world), hours(p.runtime.total_hours),
        usd(p.cost.usd), p.cost.usd_per_million_tokens === null ? "?" : p.cost.usd_per_million_tokens.toFixed(3),
        p.cost.energy_kwh_upper_bound === null ? "?" : num(p.cost.energy_kwh_upper_bound, 1)];
      const tr = el("tr", {}, cells.map((c, k) => el("td", { class: cols[k][1] === "l" ? "l" : null }, c)));
      const idx = keys.get(planKey(p));
      if (idx !== undefined) { tr.addEventListener("click", () => select(idx)); tr.title = "select this plan"; }
      return tr;
    }));
  }
  function renderWhyNot(d) {
    const ul = $("why-not");
    ul.replaceChildren(...d.infeasible.map((i) => el("li", {}, el("span", { class: "gpu" }, i.gpu), ": ", i.reason,
      i.hint ? el("span", { class: "hint" }, " — " + i.hint) : null)));
    if (!d.infeasible.length) ul.append(el("li", { class: "hint" }, "every searched GPU type has a plan"));
  }

  function select(i) {
    const d = S.rec;
    if (!d || !d.plans.length) {
      $("mem-chart").replaceChildren(); $("fit").replaceChildren(); setUrl(); return;
    }
    S.sel = Math.min(Math.max(0, i), d.plans.length - 1);
    if (S.sel >= ROWS && !S.showAll) { S.showAll = true; renderPlans(); }
    markSelected();
    const p = d.plans[S.sel];
    drawMemory(p);
    drawScatter();
    loadFit(p);
    setUrl();
  }

  // ------------------------------------------------------------------ memory chart
  function niceStep(max, n) {
    const raw = max / n;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (raw <= m * p) return m * p;
    return 10 * p;
  }
  function drawMemory(p) {
    const g = $("mem-chart");
    g.replaceChildren();
    const m = p.memory;
    const cap = m.gpu_memory_bytes;
    const margin = S.body && typeof S.body.margin === "number" ? S.body.margin : 0.05;
    const maxB = Math.max(cap, m.device_total_bytes) * 1.08;
    const X0 = 20, X1 = 620, Y = 42, H = 46;
    const x = (b) => X0 + (b / maxB) * (X1 - X0);
    $("mem-title").textContent = `Per-GPU memory of plan #${S.sel + 1}: ${gb(m.device_total_bytes)} GB on ` +
      `${p.offer.gpu} (${gb(cap)} GB), ${p.strategy_label}, micro-batch ${p.job.micro_batch}; ` +
      `step ${p.runtime.step_time_s.toFixed(2)} s, ${num(p.runtime.tokens_per_s)} tok/s` + bandText(p);
    // axis and grid
    const step = niceStep(maxB / 1e9, 8);
    for (let v = 0; v * 1e9 <= maxB; v += step) {
      g.append(svg("line", { class: "grid", x1: x(v * 1e9), x2: x(v * 1e9), y1: Y - 6, y2: Y + H + 6 }));
      g.append(svg("text", { x: x(v * 1e9), y: Y + H + 20, "text-anchor": "middle" }, `${num(v, 1)}`));
    }
    g.append(svg("text", { x: (X0 + X1) / 2, y: Y + H + 34, "text-anchor": "middle" }, "GB per GPU"));
    // stacked segments
    let acc = 0;
    const present = COMPONENTS.filter((c) => (m.components[c] || 0) > 0);
    for (const c of present) {
      const v = m.components[c];
      const r = svg("rect", { class: "seg", x: x(acc), y: Y, width: Math.max(0.5, x(acc + v) - x(acc)), height: H,
        fill: COLORS[c] || "#888", "data-component": c });
      g.append(tip(r, `${label(c)}: ${gb(v)} GB`));
      acc += v;
    }
    // capacity and usable lines
    g.append(tip(svg("line", { class: "cap", x1: x(cap), x2: x(cap), y1: Y - 22, y2: Y + H + 8 }), `GPU memory ${gb(cap)} GB`));
    g.append(svg("text", { x: x(cap), y: Y - 26, "text-anchor": "end" }, `${p.offer.gpu} ${gb(cap)} GB`));
    if (margin > 0) {
      const u = cap * (1 - margin);
      g.append(tip(svg("line", { class: "usable", x1: x(u), x2: x(u), y1: Y - 10, y2: Y + H + 8 }),
        `usable with a ${Math.round(margin * 100)}% margin: ${gb(u)} GB`));
    }
    // legend
    present.forEach((c, k) => {
      const col = k % 3, row = Math.floor(k / 3);
      const lx = X0 + col * 205, ly = 150 + row * 20;
      g.append(svg("rect", { class: "key", x: lx, y: ly - 10, width: 12, height: 12, fill: COLORS[c] }));
      g.append(svg("text", { x: lx + 17, y: ly }, `${label(c)} ${gb(m.components[c])} GB`));
    });
    const ky = 150 + Math.ceil(present.length / 3) * 20 + 4;
    g.append(svg("line", { class: "cap", x1: X0, x2: X0 + 22, y1: ky - 4, y2: ky - 4 }));
    g.append(svg("text", { x: X0 + 28, y: ky }, "GPU memory"));
    g.append(svg("line", { class: "usable", x1: X0 + 130, x2: X0 + 152, y1: ky - 4, y2: ky - 4 }));
    g.append(svg("text", { x: X0 + 158, y: ky }, `usable with the ${Math.round(margin * 100)}% margin`));
    if (m.host_bytes > 0) {
      g.append(svg("text", { x: X0 + 360, y: ky }, `+ host RAM for offload: ${gb(m.host_bytes)} GB`));
    }
  }

  // ------------------------------------------------------------------ cost-time scatter
  function logTicks(lo, hi) {
    const out = [];
    for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
      for (const m of [1, 2, 5]) { const v = m * Math.pow(10, e); if (v >= lo && v <= hi) out.push(v); }
    }
    return out;
  }
  const shortNum = (v) => v >= 1e6 ? num(v / 1e6, 1) + "M" : v >= 1e3 ? num(v / 1e3, 1) + "k" : num(v, v < 1 ? 2 : 1);
  function drawScatter() {
    const g = $("scatter");
    g.replaceChildren();
    const d = S.rec;
    if (!d) return;
    const pts = d.plans.map((p, i) => ({ p, i }));
    const keys = new Set(d.plans.map(planKey));
    for (const p of d.pareto) if (!keys.has(planKey(p))) pts.push({ p, i: null });
    const L = 64, R = 620, T = 14, B = 310;
    if (!pts.length) {
      g.append(svg("text", { x: 320, y: 180, "text-anchor": "middle" }, "no feasible plan"));
      return;
    }
    const hs = pts.map((q) => q.p.runtime.total_hours), cs = pts.map((q) => q.p.cost.usd);
    let h0 = Math.min(...hs), h1 = Math.max(...hs), c0 = Math.min(...cs), c1 = Math.max(...cs);
    h0 = Math.max(h0, 1e-4); c0 = Math.max(c0, 1e-4);
    if (h1 / h0 < 2) { h0 /= 1.5; h1 *= 1.5; } if (c1 / c0 < 2) { c0 /= 1.5; c1 *= 1.5; }
    h0 /= 1.15; h1 *= 1.15; c0 /= 1.15; c1 *= 1.15;
    const x = (h) => L + (Math.log10(Math.max(h, 1e-4) / h0) / Math.log10(h1 / h0)) * (R - L);
    const y = (c) => B - (Math.log10(Math.max(c, 1e-4) / c0) / Math.log10(c1 / c0)) * (B - T);
    for (const v of logTicks(h0, h1)) {
      g.append(svg("line", { class: "grid", x1: x(v), x2: x(v), y1: T, y2: B }));
      g.append(svg("text", { x: x(v), y: B + 16, "text-anchor": "middle" }, shortNum(v)));
    }
    for (const v of logTicks(c0, c1)) {
      g.append(svg("line", { class: "grid", x1: L, x2: R, y1: y(v), y2: y(v) }));
      g.append(svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, "$" + shortNum(v)));
    }
    g.append(svg("line", { class: "axis", x1: L, x2: R, y1: B, y2: B }));
    g.append(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: B }));
    g.append(svg("text", { x: (L + R) / 2, y: B + 36, "text-anchor": "middle" }, "hours (training + start-up), log scale"));
    g.append(svg("text", { x: 14, y: (T + B) / 2, "text-anchor": "middle", transform: `rotate(-90 14 ${(T + B) / 2})` },
      "job cost (USD), log scale"));
    // frontier
    const fr = [...d.pareto].sort((a, b) => a.cost.usd - b.cost.usd);
    if (fr.length > 1) {
      const dpath = fr.map((p, k) => `${k ? "L" : "M"}${x(p.runtime.total_hours).toFixed(1)},${y(p.cost.usd).toFixed(1)}`).join(" ");
      g.append(svg("path", { class: "frontier", d: dpath }));
    }
    // points: dominated first, then the frontier on top
    pts.sort((a, b) => Number(a.p.pareto) - Number(b.p.pareto));
    for (const { p, i } of pts) {
      const c = svg("circle", { class: "pt" + (p.pareto ? " pareto" : ""), cx: x(p.runtime.total_hours).toFixed(1),
        cy: y(p.cost.usd).toFixed(1), r: p.pareto ? 5 : 3.5, "data-index": i === null ? "" : i });
      tip(c, `${i === null ? "" : "#" + (i + 1) + " "}${p.offer.provider} ${p.offer.sku}: ${gpusLabel(p.layout)}x ${p.offer.gpu}, ` +
        `${p.strategy_label} — ${usd(p.cost.usd)}, ${hours(p.runtime.total_hours)} h${p.pareto ? " (Pareto)" : ""}`);
      if (i !== null) c.addEventListener("click", () => select(i));
      g.append(c);
    }
    const sp = d.plans[S.sel];
    if (sp) {
      g.append(svg("circle", { class: "sel", cx: x(sp.runtime.total_hours), cy: y(sp.cost.usd), r: 9 }));
    }
    // legend
    g.append(svg("rect", { class: "legend-bg", x: R - 160, y: T - 2, width: 158, height: 38 }));
    g.append(svg("circle", { class: "pt pareto", cx: R - 150, cy: T + 8, r: 5 }));
    g.append(svg("text", { x: R - 141, y: T + 12 }, "Pareto frontier"));
    g.append(svg("circle", { class: "pt", cx: R - 150, cy: T + 26, r: 3.5 }));
    g.append(svg("text", { x: R - 141, y: T + 30 }, `other plans (${d.plans.length})`));
  }

  // ------------------------------------------------------------------ fit answers
  async function loadFit(p) {
    const seq = ++S.fitSeq;
    const box = $("fit");
    $("fit-gpu").textContent = p.offer.gpu;
    box.replaceChildren(el("p", { class: "hint" }, "computing…"));
    let body;
    try { body = jobBody(S.form); } catch (e) { return; }
    body.gpu = [p.offer.gpu];
    if (S.form.micro_batch === "auto") body.micro_batch = p.job.micro_batch;
    body.gradient_checkpointing = p.job.gradient_checkpointing;
    body.attn = p.job.attn_impl;
    if (S.body && typeof S.body.margin === "number") body.margin = S.body.margin;
    delete body.tokens; delete body.epochs;
    try {
      const d = await getJSON("/api/fit", body);
      if (seq !== S.fitSeq) return;
      const r = d.results[0];
      const j = d.job;
      const rows = [
        ["this job on one GPU", r.fits ? `fits (${gb(r.device_total_bytes)} GB of ${gb(r.usable_bytes)} usable)`
          : `does not fit (needs ${r.device_total_bytes === null ? "?" : gb(r.device_total_bytes)} GB, ${gb(r.usable_bytes)} usable)`],
        [`longest sequence (micro-batch ${j.micro_batch}, checkpointing ${j.gradient_checkpointing ? "on" : "off"})`,
          r.max_seq_len ? num(r.max_seq_len) + " tokens" : "none"],
        [`largest micro-batch (seq ${num(j.seq_len)})`, r.max_micro_batch ? num(r.max_micro_batch) : "none"],
      ];
      for (const [k, v] of Object.entries(r.min_gpus)) rows.push([`fewest GPUs with ${k}`, v === null ? "more than the limit" : String(v)]);
      box.replaceChildren(el("table", { id: "fit-table" }, el("tbody", {}, rows.map(([a, b]) =>
        el("tr", {}, el("td", { class: "l" }, a), el("td", {}, b))))),
        ...r.notes.map((n) => el("p", { class: "hint" }, "note: " + n)),
        ...(r.advice && r.advice.length ? [el("p", {}, "single changes that make it fit on one GPU:"),
          el("ul", { id: "fit-advice" }, r.advice.map((x) => el("li", {}, x.text)))] : []));
    } catch (e) {
      if (seq !== S.fitSeq) return;
      box.replaceChildren(el("p", { class: "error" }, e.message));
    }
  }

  // ------------------------------------------------------------------ downloads and sharing
  function selectedPlan() { return S.rec && S.rec.plans[S.sel]; }
  function slug(s) { return String(s).replace(/[^A-Za-z0-9._-]+/g, "-"); }
  function onDownloadJson() {
    const p = selectedPlan();
    if (!p) return;
    const doc = { ...p, model: S.rec.model, objective: S.rec.objective, rank: S.sel + 1 };
    download(new Blob([JSON.stringify(doc, null, 2) + "\n"], { type: "application/json" }),
      `ftplan-plan-${slug(S.rec.model.name)}-${slug(p.offer.gpu)}.json`);
  }
  async function onDownloadZip() {
    const p = selectedPlan();
    if (!p) return;
    $("dl-status").textContent = "building…";
    try {
      const r = await api("/api/export", { ...S.body, plan_index: S.sel, export_target: $("export-target").value });
      const cd = r.headers.get("content-disposition") || "";
      const m = /filename="([^"]+)"/.exec(cd);
      download(await r.blob(), m ? m[1] : "ftplan-export.zip");
      $("dl-status").textContent = "";
    } catch (e) {
      $("dl-status").textContent = e.message;
    }
  }
  async function onCopy() {
    try { await navigator.clipboard.writeText($("share").value); $("dl-status").textContent = "link copied"; }
    catch (e) { $("share").select(); $("dl-status").textContent = "press Ctrl+C to copy"; }
  }

  // ------------------------------------------------------------------ catalogs and start-up
  async function loadCatalogs() {
    const [schema, models, gpus, offers] = await Promise.all([getJSON("/api/options"), getJSON("/api/models"),
      getJSON("/api/gpus"), getJSON("/api/offers?pricing=any")]);
    applySchema(schema);
    S.models = models.models;
    $("model-list").replaceChildren(...S.models.map((m) => el("option", { value: m.name,
      label: `${m.hf_id} · ${m.family} · ${(m.params_total / 1e9).toFixed(1)}B` })));
    for (const g of gpus.gpus) S.gpus[g.name] = g;
    const providers = [...new Set(offers.offers.map((o) => o.provider))].sort((a, b) => a.localeCompare(b));
    const offered = new Set(offers.offers.map((o) => o.gpu));
    const gpuNames = gpus.gpus.map((g) => g.name).filter((n) => offered.has(n));
    const box = (id, values, title) => $(id).replaceChildren(el("span", { class: "label" }, title),
      ...values.map((v) => el("label", {}, el("input", { type: "checkbox", value: v }), v)));
    box("providers", providers, "Providers (none = all)");
    box("gpus_filter", gpuNames, "GPU types (none = all)");
  }
  function fromUrl() {
    const h = hashToState();
    if (!h) return false;
    writeForm(h.state);
    run(h.sel);
    return true;
  }
  async function start() {
    $("job-form").addEventListener("submit", (e) => { e.preventDefault(); run(0); });
    $("job-form").addEventListener("change", syncForm);
    $("model").addEventListener("input", showModelInfo);
    $("config_file").addEventListener("change", async (e) => {
      const f = e.target.files && e.target.files[0];
      if (f) { $("config").value = await f.text(); if (!$("config_name").value) $("config_name").value = f.name.replace(/\.json$/, ""); }
    });
    $("more").addEventListener("click", () => { S.showAll = true; renderPlans(); });
    $("dl-json").addEventListener("click", onDownloadJson);
    $("dl-zip").addEventListener("click", onDownloadZip);
    $("copy-share").addEventListener("click", onCopy);
    window.addEventListener("hashchange", () => {
      if (S.form && location.hash === stateToHash(S.form, S.sel)) return;
      fromUrl();
    });
    try {
      await loadCatalogs();
    } catch (e) {
      showError(e);
    }
    if (!fromUrl()) { writeForm(DEFAULTS); $("model").focus(); }
    document.body.dataset.ready = "1";
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();

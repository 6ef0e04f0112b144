// delayq web: confirmations for actions, live refresh of the #live part of the page, times in
// the viewer's zone (or UTC, remembered) with a relative form, bulk selection, and a search
// that continues by itself until the page is full or the table is searched to its end, and the
// progress of a bulk action running in the background.
// Plain JS, no build step, no external assets (the CSP allows no inline script).
(function () {
  "use strict";
  var TZ_KEY = "delayq.tz";

  // -- times: <time datetime="ISO"> elements and chart ticks (data-at) ----------------------
  function useUtc() {
    try { return window.localStorage.getItem(TZ_KEY) === "utc"; } catch (e) { return false; }
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function absolute(d, utc) {
    if (utc) return d.toISOString().slice(0, 19).replace("T", " ") + " UTC";
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }
  function relative(d) {
    var s = Math.round((d.getTime() - Date.now()) / 1000), a = Math.abs(s), text;
    if (a < 45) return "now";
    if (a < 5400) text = Math.round(a / 60) + " min";
    else if (a < 172800) text = Math.round(a / 3600) + " h";
    else text = Math.round(a / 86400) + " d";
    return s > 0 ? "in " + text : text + " ago";
  }
  function zoneName() {
    if (useUtc()) return "UTC";
    try { return Intl.DateTimeFormat().resolvedOptions().timeZone || "local time"; }
    catch (e) { return "local time"; }
  }
  function showTimes(root) {
    var utc = useUtc();
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d.getTime())) return;
      el.textContent = absolute(d, utc);
      el.title = d.toISOString() + " (" + zoneName() + ")";
      if (el.getAttribute("data-rel") !== "no") {
        var rel = document.createElement("span");
        rel.className = "rel";
        rel.textContent = " (" + relative(d) + ")";
        el.appendChild(rel);
      }
    });
    var lastDay = null;
    root.querySelectorAll("text.tick[data-at]").forEach(function (el) {
      // Hours, and the date where the day changes (not on the first tick: no room).
      var d = new Date(el.getAttribute("data-at"));
      if (isNaN(d.getTime())) return;
      var full = absolute(d, utc), day = full.slice(0, 10);
      el.textContent = lastDay === null || day === lastDay ? full.slice(11, 16) : full.slice(5, 16);
      lastDay = day;
    });
    root.querySelectorAll(".tz-name").forEach(function (el) { el.textContent = zoneName(); });
  }
  var tz = document.getElementById("tz-toggle");
  function labelTz() { if (tz) tz.textContent = useUtc() ? "UTC" : "local time"; }
  if (tz) tz.addEventListener("click", function () {
    try { window.localStorage.setItem(TZ_KEY, useUtc() ? "local" : "utc"); } catch (e) {}
    labelTz();
    showTimes(document);
  });
  labelTz();
  showTimes(document);

  // -- confirmations --------------------------------------------------------------------------
  document.addEventListener("submit", function (event) {
    var message = event.target.getAttribute("data-confirm");
    if (message && !window.confirm(message)) event.preventDefault();
  });

  // -- bulk selection: "select all on this page" ------------------------------------------------
  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el.id === "select-page") {
      document.querySelectorAll("input.pick").forEach(function (box) { box.checked = el.checked; });
    }
    if (el.id === "all-matching") previewAll(el.checked);
    if (el.id === "select-page" || el.classList.contains("pick") || el.id === "all-matching") {
      var n = document.querySelectorAll("input.pick:checked").length;
      var count = document.getElementById("selected-count");
      if (count) count.textContent = String(n);
    }
  });

  // How many "all matching" would touch (the confirmation shows it again before acting).
  function previewAll(on) {
    var out = document.getElementById("all-count");
    if (!out) return;
    out.textContent = "";
    if (!on) return;
    var params = new URLSearchParams(window.location.search);
    params.delete("cursor"); params.delete("msg"); params.set("all", "1");
    fetch("/api/tasks/bulk/preview?" + params.toString(), {credentials: "same-origin"})
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) { if (data) out.textContent = "(" + data.label + ")"; })
      .catch(function () {});
  }

  // -- live refresh -----------------------------------------------------------------------------
  var live = true;
  var seconds = parseFloat(document.body.getAttribute("data-refresh") || "3");
  var toggle = document.getElementById("live-toggle");
  if (toggle) toggle.addEventListener("click", function () {
    live = !live;
    toggle.classList.toggle("on", live);
  });
  function busy() {
    var el = document.activeElement;
    return (el && (el.tagName === "INPUT" || el.tagName === "SELECT" || el.tagName === "BUTTON")) ||
      document.querySelector("input.pick:checked, #all-matching:checked, #search-progress[data-next]");
  }
  function refresh() {
    var target = document.getElementById("live");
    if (!live || !target || busy() || document.hidden) return;
    fetch(window.location.href, {credentials: "same-origin"}).then(function (response) {
      if (!response.ok) return null;
      return response.text();
    }).then(function (html) {
      if (!html) return;
      var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
      if (fresh) { target.innerHTML = fresh.innerHTML; showTimes(target); }
    }).catch(function () {});
  }
  if (seconds > 0) window.setInterval(refresh, seconds * 1000);

  // -- search that continues by itself ------------------------------------------------------------
  // A search page the server could not fill within its time slice carries the next slice's URL
  // (data-next); fetch it, append its rows and progress, until the page is full or the end.
  function continueSearch() {
    var progress = document.getElementById("search-progress");
    var body = document.querySelector("#task-table tbody");
    if (!progress || !body) return;
    var next = progress.getAttribute("data-next");
    var want = parseInt(progress.getAttribute("data-want") || "50", 10);
    var have = body.querySelectorAll("tr[data-key]").length;
    if (!next || have >= want) return;
    fetch(next, {credentials: "same-origin"}).then(function (response) {
      return response.ok ? response.text() : null;
    }).then(function (html) {
      if (!html) { progress.removeAttribute("data-next"); return; }
      var doc = new DOMParser().parseFromString(html, "text/html");
      var rows = doc.querySelectorAll("#task-table tbody tr[data-key]");
      if (rows.length) {
        body.querySelectorAll("tr.none").forEach(function (tr) { tr.remove(); });
        rows.forEach(function (tr) { body.appendChild(document.importNode(tr, true)); });
        showTimes(body);
      }
      var fresh = doc.getElementById("search-progress");
      var nxt = fresh ? fresh.getAttribute("data-next") : null;
      var pager = document.getElementById("pager");
      var freshPager = doc.getElementById("pager");
      if (pager && freshPager) pager.innerHTML = freshPager.innerHTML;
      var haveNow = body.querySelectorAll("tr[data-key]").length;
      if (!nxt) {
        if (haveNow === 0) {
          body.innerHTML = '<tr class="none"><td colspan="7" class="empty" id="no-match">' +
            "No task matches: every row was searched.</td></tr>";
        }
        return;
      }
      var now = document.getElementById("search-progress");
      if (now) now.setAttribute("data-want", String(want));
      if (haveNow < want) window.setTimeout(continueSearch, 0);
    }).catch(function () { progress.removeAttribute("data-next"); });
  }
  continueSearch();

  // -- a bulk action running in the background: follow its progress until it ends ----------------
  function followJob() {
    var box = document.getElementById("bulk-job");
    if (!box) return;
    var state = box.getAttribute("data-state");
    if (state === "done" || state === "failed") return;
    fetch(box.getAttribute("data-status"), {credentials: "same-origin"}).then(function (response) {
      return response.ok ? response.json() : null;
    }).then(function (job) {
      if (!job) return;
      box.setAttribute("data-state", job.state);
      document.getElementById("bulk-progress").value = job.percent;
      document.getElementById("bulk-percent").textContent = job.percent + "%";
      document.getElementById("bulk-state").textContent = job.state;
      document.getElementById("bulk-detail").textContent = job.detail;
      if (!job.finished) window.setTimeout(followJob, 500);
    }).catch(function () { window.setTimeout(followJob, 2000); });
  }
  followJob();
})();

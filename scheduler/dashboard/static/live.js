// The dashboard's only script: live refresh of <main id="live"> and confirmation of actions.
// Every few seconds it fetches the same URL (so the filters in the query string are kept) with
// the X-Dashboard-Live header, and the server answers with the live region alone. It pauses
// while the tab is hidden or while someone types in a field of the live region.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var badge = document.getElementById("live-status");
  var every = Math.max(1, parseFloat(document.body.dataset.refresh || "5")) * 1000;
  var busy = false;

  function mark(text, cls) {
    if (!badge) return;
    badge.textContent = text;
    badge.className = "live-status " + cls;
  }

  function typing() {
    var el = document.activeElement;
    return el && live.contains(el) && (el.tagName === "INPUT" || el.tagName === "TEXTAREA") && el.value;
  }

  function refresh() {
    if (!live || busy || document.hidden || typing()) return;
    busy = true;
    fetch(window.location.href, {
      headers: { "X-Dashboard-Live": "1" },
      credentials: "same-origin",
      cache: "no-store",
    })
      .then(function (response) {
        if (response.status === 401) { window.location.reload(); return null; }
        if (!response.ok) { mark("stale", "stale"); return null; }
        return response.text();
      })
      .then(function (html) {
        if (html === null || html === undefined) return;
        live.innerHTML = html;
        live.dataset.refreshed = String(Date.now());
        mark("live", "on");
      })
      .catch(function () { mark("offline", "stale"); })
      .then(function () { busy = false; });
  }

  if (live) {
    mark("live", "on");
    window.setInterval(refresh, every);
    document.addEventListener("visibilitychange", function () { if (!document.hidden) refresh(); });
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();

// ProxOps web UI: refreshes a page's content in place every few seconds (body
// data-refresh="N"), without reloading the page, while the tab is visible. Everything is
// readable without it; it only keeps the page current.
(function () {
  "use strict";
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  var state = document.getElementById("refresh-state");
  if (!seconds || !window.fetch || !window.DOMParser) {
    return;
  }
  function stamp(text) {
    if (state) {
      state.textContent = text;
    }
  }
  function refresh() {
    if (document.hidden) {
      return;
    }
    var active = document.activeElement;
    if (active && (active.tagName === "INPUT" || active.tagName === "SELECT")) {
      return; // do not replace a form being filled in
    }
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (text) {
        var next = new DOMParser().parseFromString(text, "text/html").getElementById("content");
        var here = document.getElementById("content");
        if (next && here) {
          here.replaceWith(next);
        }
        stamp("updated " + new Date().toLocaleTimeString());
      })
      .catch(function (error) {
        stamp("refresh failed: " + error.message);
      });
  }
  stamp("refreshes every " + seconds + " s");
  window.setInterval(refresh, seconds * 1000);
})();

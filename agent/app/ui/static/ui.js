// sre-agent web UI: progressive enhancement only; every page works without this file.
// Polls the page it is on every data-refresh-s seconds and swaps in the regions marked
// data-refresh (tables, counts) from the fresh HTML, leaving forms and open <details> alone.
// The fetched HTML is parsed into an inert document (scripts in it never run) and was escaped
// by the server; nothing here builds HTML from strings.
(function () {
  "use strict";
  var body = document.body;
  var seconds = Number(body.getAttribute("data-refresh-s")) || 0;
  if (!seconds || !document.querySelector("[data-refresh]")) {
    return;
  }
  var stamp = document.getElementById("updated");
  var busy = false;

  function swap(fresh) {
    document.querySelectorAll("[data-refresh]").forEach(function (region) {
      if (!region.id) {
        return;
      }
      var next = fresh.getElementById(region.id);
      if (next && !region.contains(document.activeElement)) {
        region.replaceWith(document.importNode(next, true));
      }
    });
    var freshStamp = fresh.getElementById("updated");
    if (stamp && freshStamp) {
      stamp.textContent = freshStamp.textContent;
    }
  }

  function poll() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", redirect: "manual", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (text) {
        swap(new DOMParser().parseFromString(text, "text/html"));
        body.removeAttribute("data-stale");
      })
      .catch(function () {
        body.setAttribute("data-stale", "true");
        if (stamp) {
          stamp.textContent = "not updating: the agent did not answer";
        }
      })
      .finally(function () {
        busy = false;
      });
  }

  window.setInterval(poll, seconds * 1000);
  document.addEventListener("visibilitychange", poll);
})();

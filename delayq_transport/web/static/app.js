// delayq web: confirmations for actions, and live refresh of the #live part of the page.
// Plain JS, no build step, no external assets.
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    var message = event.target.getAttribute("data-confirm");
    if (message && !window.confirm(message)) event.preventDefault();
  });
  var live = true;
  var seconds = parseFloat(document.body.getAttribute("data-refresh") || "3");
  var toggle = document.getElementById("live-toggle");
  if (toggle) toggle.addEventListener("click", function () {
    live = !live;
    toggle.classList.toggle("on", live);
  });
  function busy() {
    var el = document.activeElement;
    return el && (el.tagName === "INPUT" || el.tagName === "SELECT" || el.tagName === "BUTTON");
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
      if (fresh) target.innerHTML = fresh.innerHTML;
    }).catch(function () {});
  }
  if (seconds > 0) window.setInterval(refresh, seconds * 1000);
})();

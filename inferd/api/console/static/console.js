// inferd's console: sparklines of the Now view's last 15 minutes (uPlot), drawn again after each htmx refresh.
// No inline script anywhere: the Content-Security-Policy allows scripts from the daemon only.
"use strict";
(function () {
  function draw() {
    var sparks = document.querySelectorAll(".spark[data-engine]");
    if (!sparks.length || typeof uPlot === "undefined") { return; }
    fetch("/admin/ui/now/series", {credentials: "same-origin"}).then(function (r) {
      return r.ok ? r.json() : {};
    }).then(function (series) {
      sparks.forEach(function (el) {
        var s = series[el.dataset.engine];
        el.replaceChildren();
        if (!s || s.t.length < 2) { el.textContent = "collecting"; return; }
        new uPlot({width: 160, height: 36, legend: {show: false}, cursor: {show: false},
                   axes: [{show: false}, {show: false}], scales: {x: {time: true}},
                   series: [{}, {stroke: "#3b6fd8", width: 1.5}]},
                  [s.t, s[el.dataset.field]], el);
      });
    });
  }
  document.addEventListener("DOMContentLoaded", draw);
  document.addEventListener("htmx:afterSettle", draw);
})();

// inferd's console: the Now view's 15-minute sparklines and the Tenants view's daily usage (uPlot), drawn again
// after each htmx refresh.
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
  var PALETTE = ["#3b6fd8", "#d8843b", "#2e9e5b", "#b03bd8", "#c0392b", "#7f8c8d", "#16a085", "#8e6c3b"];
  function daily() {
    var el = document.querySelector(".daily");
    if (!el || typeof uPlot === "undefined") { return; }
    fetch("/admin/ui/tenants/daily", {credentials: "same-origin"}).then(function (r) {
      return r.ok ? r.json() : null;
    }).then(function (d) {
      if (!d) { return; }
      var names = Object.keys(d.tenants).sort();
      var series = [{}].concat(names.map(function (name, i) {
        return {label: name, stroke: PALETTE[i % PALETTE.length], width: 2, points: {show: true}};
      }));
      el.replaceChildren();
      new uPlot({width: Math.min(el.clientWidth || 600, 900), height: 220, series: series,
                 scales: {x: {time: true}}, axes: [{}, {label: "tokens"}]},
                [d.days].concat(names.map(function (n) { return d.tenants[n]; })), el);
    });
  }
  function all() { draw(); daily(); }
  document.addEventListener("DOMContentLoaded", all);
  document.addEventListener("htmx:afterSettle", all);
})();

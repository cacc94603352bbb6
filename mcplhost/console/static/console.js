// The console's only script (no build step, nothing from another origin): the live feed and the overview's
// live states, both from server-sent events. Every text goes in with textContent, never as markup.
"use strict";
(function () {
  const FEED_MAX = 500;
  // A link the server made is a path of this console; anything else becomes the overview.
  const PATH = /^\/(?!\/)[A-Za-z0-9\/?=&_.#-]*$/;

  function safeHref(href) {
    return typeof href === "string" && PATH.test(href) ? href : "/";
  }

  function clock(ms) {
    const d = new Date(ms);
    return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
  }

  function ago(ms) {
    if (typeof ms !== "number") return "never";
    let s = Math.max(0, Math.floor((Date.now() - ms) / 1000));
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
      if (s >= size) return Math.floor(s / size) + unit + " ago";
    }
    return s + "s ago";
  }

  // As the server's `field` filter shows a status value.
  function field(key, value) {
    if (value === null || value === undefined) return key.endsWith("At") ? "never" : "–";
    if (typeof value === "boolean") return value ? "yes" : "no";
    if (key.endsWith("At") && typeof value === "number") return ago(value);
    if (Array.isArray(value)) return value.length ? value.join(", ") : "–";
    return String(value);
  }

  function feed(list) {
    const empty = document.getElementById("feed-empty");
    const source = new EventSource(list.dataset.events + "?after=" + encodeURIComponent(list.dataset.after || "0"));
    source.addEventListener("line", (event) => {
      const line = JSON.parse(event.data);
      const item = document.createElement("li");
      item.className = "line";
      item.dataset.kind = String(line.kind);
      const time = document.createElement("time");
      time.textContent = clock(line.at);
      const link = document.createElement("a");
      link.href = safeHref(line.href);
      link.textContent = String(line.text);
      item.append(time, " ", link);
      list.prepend(item);
      if (empty) empty.remove();
      while (list.children.length > FEED_MAX) list.lastElementChild.remove();
    });
  }

  function overview(root) {
    const cards = Array.from(document.querySelectorAll("article[data-kind][data-name]"));
    const source = new EventSource(root.dataset.live);
    source.addEventListener("status", (event) => {
      const status = JSON.parse(event.data);
      for (const card of cards) {
        const rows = status[card.dataset.kind];
        if (!Array.isArray(rows)) continue;
        const row = rows.find((r) => r && r.name === card.dataset.name);
        if (!row) continue;
        for (const cell of card.querySelectorAll("[data-field]")) {
          const key = cell.dataset.field;
          if (!(key in row)) continue;
          cell.textContent = field(key, row[key]);
          if (key === "state") cell.className = "state state-" + String(row[key]).replace(/[^a-z_]/g, "");
        }
      }
    });
  }

  const list = document.getElementById("feed");
  if (list) feed(list);
  const live = document.querySelector("[data-live]");
  if (live) overview(live);
})();

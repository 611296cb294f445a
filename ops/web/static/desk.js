// The ops page's one script, and optional: every action that changes state works without it.
// 1. Picking: the header box ticks or clears every row's box at once (without the script, the
//    "Tick every row on this page" link does the same).
// 2. Live: a part marked data-live re-reads the page's own address every data-live
//    milliseconds and swaps in its parts (data-live-part, by id), keeping the boxes ticked, and
//    says how much changed since the page was opened (#live-status, a polite live region).
"use strict";
(function () {
  const boxes = () => Array.from(document.querySelectorAll("input.pick"));
  const all = document.getElementById("pick-all");
  if (all) {
    all.hidden = false;
    all.addEventListener("change", () => boxes().forEach((b) => { b.checked = all.checked; }));
    document.addEventListener("change", (e) => {
      if (!e.target.classList || !e.target.classList.contains("pick")) return;
      const b = boxes();
      all.checked = b.length > 0 && b.every((x) => x.checked);
      all.indeterminate = !all.checked && b.some((x) => x.checked);
    });
  }

  const live = document.querySelector("[data-live]");
  const status = document.getElementById("live-status");
  if (!live || !status) return;
  const every = Math.max(1000, parseInt(live.getAttribute("data-live"), 10) || 5000);
  const rows = (root) => new Set(Array.from(root.querySelectorAll("[data-live-part] tr[data-step]"), (r) => r.getAttribute("data-step")));
  const counts = (root) => Object.fromEntries(Array.from(root.querySelectorAll("[data-count]"), (c) => [c.getAttribute("data-count"), parseInt(c.textContent, 10) || 0]));
  const opened = { rows: rows(document), counts: counts(document) };

  function changes(now) {
    const parts = [];
    const added = [...now.rows].filter((id) => !opened.rows.has(id)).length;
    const gone = [...opened.rows].filter((id) => !now.rows.has(id)).length;
    if (added) parts.push(added + " new row" + (added === 1 ? "" : "s"));
    if (gone) parts.push(gone + " row" + (gone === 1 ? "" : "s") + " gone");
    for (const [name, n] of Object.entries(now.counts)) {
      const d = n - (opened.counts[name] || 0);
      if (d) parts.push(name + " " + (d > 0 ? "+" : "") + d);
    }
    const at = new Date().toLocaleTimeString();
    return (parts.length ? parts.join(", ") : "nothing changed") + " since you opened this page (checked " + at + ")";
  }

  async function refresh() {
    try {
      const answer = await fetch(window.location.href, { credentials: "same-origin", headers: { "X-Evq-Live": "1" } });
      if (!answer.ok) return;
      const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
      const ticked = new Set(boxes().filter((b) => b.checked).map((b) => b.value));
      // A part is swapped only when what it says changed (ages ticking on do not count): the rows
      // under the operator's pointer stay the same elements while nothing new arrived.
      const said = (html) => html.replace(/<time[^>]*>[^<]*<\/time>/g, "");
      document.querySelectorAll("[data-live-part]").forEach((part) => {
        const next = part.id && fresh.getElementById(part.id);
        if (next && said(next.innerHTML) !== said(part.innerHTML)) part.innerHTML = next.innerHTML;
      });
      boxes().forEach((b) => { b.checked = ticked.has(b.value); });
      status.textContent = changes({ rows: rows(document), counts: counts(document) });
    } catch (e) {
      status.textContent = "live updates paused: " + e;
    }
  }
  setInterval(refresh, every);
})();

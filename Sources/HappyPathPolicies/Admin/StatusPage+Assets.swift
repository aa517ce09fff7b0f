/// `/status.css` and `/status.js`: served by the admin listener beside the
/// page, so its `Content-Security-Policy` needs no inline style or script.
extension StatusPage {
    public static let scriptHeaders: [(String, String)] = [
        ("Content-Type", "text/javascript; charset=utf-8"),
        ("X-Content-Type-Options", "nosniff"),
        ("Cache-Control", "no-cache"),
    ]

    public static let styleHeaders: [(String, String)] = [
        ("Content-Type", "text/css; charset=utf-8"),
        ("X-Content-Type-Options", "nosniff"),
        ("Cache-Control", "no-cache"),
    ]

    /// Colour is a second cue: every coloured span also says its state in
    /// words, and bad states are bold as well.
    public static let style = """
        :root { color-scheme: light; --ok: #1a7f37; --warn: #9a6700; --bad: #cf222e; }
        * { box-sizing: border-box; }
        body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1f2328; background: #f6f8fa; }
        header { background: #24292f; color: #fff; padding: 12px 20px; }
        header h1 { margin: 0; font-size: 20px; }
        header p { margin: 4px 0 0; }
        header .ok { color: #7ee2a8; } header .bad { color: #ffaba8; }
        main { padding: 12px 20px; max-width: 1200px; }
        h2 { font-size: 17px; margin: 18px 0 8px; }
        #upstreams { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 12px; }
        #upstreams h2 { grid-column: 1 / -1; margin-bottom: 0; }
        .upstream { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; padding: 10px 14px; min-width: 0; }
        .upstream h3 { margin: 0 0 6px; font-size: 16px; overflow-wrap: anywhere; }
        dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0 0 8px; }
        dt { font-weight: 600; } dd { margin: 0; overflow-wrap: anywhere; }
        table { border-collapse: collapse; width: 100%; background: #fff; margin-bottom: 8px; }
        caption { text-align: left; font-weight: 600; padding: 4px 0; }
        th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; overflow-wrap: anywhere; }
        .wide { overflow-x: auto; }
        .wide th, .wide td { white-space: nowrap; overflow-wrap: normal; }
        .ok { color: var(--ok); }
        .warn { color: var(--warn); font-weight: 600; }
        .bad { color: var(--bad); font-weight: 700; }
        .note, .live { color: #57606a; font-size: 13px; }
        header .live { color: #d0d7de; }
        #event-list { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 8px 8px 44px;
          font: 13px/1.4 ui-monospace, monospace; max-height: 420px; overflow-y: auto; overflow-wrap: anywhere; }
        @media (max-width: 600px) {
          main { padding: 8px; }
          #upstreams { grid-template-columns: 1fr; }
          dl { grid-template-columns: 1fr; } dt { margin-top: 4px; }
        }

        """

    /// Keeps the page live: reads `/admin/events` as a stream (each event
    /// is listed, newest first, as text) and `/admin/state` after an event
    /// and every few seconds, and rewrites the cells that show state.
    /// Writes only `textContent` and class names, never HTML.
    public static let script = """
        "use strict";
        (function () {
          var MAX_EVENTS = \(eventsShown);
          function two(n) { return n < 10 ? "0" + n : "" + n; }
          function clock(d) { return two(d.getUTCHours()) + ":" + two(d.getUTCMinutes()) + ":" + two(d.getUTCSeconds()) + " UTC"; }
          function secs(s) { s = Math.max(0, s); return s < 60 ? s.toFixed(1) + " s" : Math.floor(s / 60) + " min " + Math.floor(s % 60) + " s"; }
          function span(tone, text) { var e = document.createElement("span"); e.className = tone; e.textContent = text; return e; }
          function put(cell, tone, text, rest) {
            if (!cell) return;
            cell.textContent = "";
            cell.appendChild(span(tone, text));
            if (rest) cell.appendChild(document.createTextNode(rest));
          }
          function breakerWords(b) {
            if (b.state === "open") return ["bad", "open until " + clock(new Date(Date.now() + b.open_for_s * 1000)) + " (" + secs(b.open_for_s) + ")"];
            if (b.state === "half_open") return ["warn", "half-open"];
            return ["ok", "closed"];
          }
          function apply(state) {
            var k = function (root, key) { return root.querySelector('[data-k="' + key + '"]'); };
            var inFlight = k(document, "in_flight"); if (inFlight) inFlight.textContent = state.in_flight;
            var parked = k(document, "parked"); if (parked) parked.textContent = state.parked;
            var cards = document.querySelectorAll("article.upstream");
            (state.upstreams || []).forEach(function (u, i) {
              var card = cards[i];
              if (!card || card.getAttribute("data-upstream") !== u.name) return;
              put(k(card, "reachable"), u.reachable ? "ok" : "bad", u.reachable ? "reachable" : "unreachable");
              var w = breakerWords(u.circuit_breaker);
              put(k(card, "breaker"), w[0], w[1]);
              var f = u.breaker_failures;
              if (f) k(card, "failures").textContent = (u.circuit_breaker.state === "closed" ? f.consecutive + " in a row; " : "") + f.failed + " of " + f.requests + " failed in the window";
              var total = 0, parts = [];
              Object.keys(u.parked || {}).forEach(function (r) { var n = u.parked[r]; total += n; if (n > 0) parts.push(n + " " + r); });
              put(k(card, "parked"), total > 0 ? "warn" : "ok", total + " parked", parts.length ? " (" + parts.join(", ") + ")" : "");
              if (typeof u.retries_left === "number") k(card, "retries_left").textContent = u.retries_left + " retries left";
              var pause = u.paused_until ? "paused until " + clock(new Date(u.paused_until)) : "not paused";
              if (u.paused_clients > 0) pause += "; " + u.paused_clients + " client" + (u.paused_clients === 1 ? "" : "s") + " paused";
              put(k(card, "pause"), u.paused_until ? "warn" : "ok", pause);
              var rows = card.querySelectorAll("table.endpoints tbody tr");
              (u.endpoints || []).forEach(function (e, j) {
                if (rows[j]) put(rows[j].cells[1], e.ejected ? "bad" : "ok", e.ejected ? "ejected" : "in rotation");
              });
            });
            var d = state.deliveries;
            if (d) {
              var backlog = (d.queued || 0) + (d.in_flight || 0);
              var b = k(document, "backlog");
              if (b && b.firstChild) { b.firstChild.className = backlog > 0 ? "warn" : "ok"; b.firstChild.textContent = backlog + " in the backlog"; }
              put(k(document, "store"), d.writable ? "ok" : "bad", d.writable ? "writable" : "cannot write");
              ["queued", "in_flight", "delivered", "dead"].forEach(function (s) {
                var c = k(document, "delivery-" + s);
                if (c && typeof d[s] === "number") { c.textContent = d[s]; c.className = s === "dead" && d[s] > 0 ? "bad" : ""; }
              });
            }
            var live = document.getElementById("live");
            if (live) live.textContent = "Live: updated " + clock(new Date()) + ".";
            document.documentElement.setAttribute("data-live", "1");
            // Whether anything is wider than the window (the layout test reads it).
            var root = document.documentElement;
            root.setAttribute("data-fits", root.scrollWidth <= window.innerWidth + 1 ? "1" : "0");
          }
          var pending = null;
          function refresh() {
            pending = null;
            fetch("/admin/state", { cache: "no-store" }).then(function (r) { return r.json(); }).then(apply).catch(function () {
              var live = document.getElementById("live");
              if (live) live.textContent = "Not live: /admin/state did not answer.";
            });
          }
          function soon() { if (!pending) pending = setTimeout(refresh, 300); }
          function addEvent(data) {
            var list = document.getElementById("event-list");
            if (!list) return;
            var none = list.querySelector(".none"); if (none) none.remove();
            var li = document.createElement("li");
            var t = document.createElement("time"); t.textContent = data.ts || ""; li.appendChild(t);
            li.appendChild(document.createTextNode(" "));
            var b = document.createElement("b"); b.textContent = data.type || ""; li.appendChild(b);
            var rest = Object.keys(data).filter(function (x) { return x !== "type" && x !== "ts"; })
              .map(function (x) { return x + "=" + data[x]; }).join(" ");
            li.appendChild(document.createTextNode(" " + rest));
            list.insertBefore(li, list.firstChild);
            while (list.children.length > MAX_EVENTS) list.removeChild(list.lastChild);
          }
          function frame(text) {
            text.split("\\n").forEach(function (line) {
              if (line.indexOf("data: ") !== 0) return;
              try { addEvent(JSON.parse(line.slice(6))); } catch (e) { return; }
              soon();
            });
          }
          function listen() {
            if (!window.fetch || !window.ReadableStream) return;
            var root = document.documentElement;
            fetch("/admin/events", { cache: "no-store" }).then(function (r) {
              root.setAttribute("data-events", "open");
              var reader = r.body.getReader(), decoder = new TextDecoder(), buffer = "";
              function pump() {
                return reader.read().then(function (chunk) {
                  if (chunk.done) { root.setAttribute("data-events", "closed"); setTimeout(listen, 2000); return; }
                  buffer += decoder.decode(chunk.value, { stream: true });
                  var end;
                  while ((end = buffer.indexOf("\\n\\n")) >= 0) { frame(buffer.slice(0, end)); buffer = buffer.slice(end + 2); }
                  return pump();
                });
              }
              return pump();
            }).catch(function () { root.setAttribute("data-events", "closed"); setTimeout(listen, 2000); });
          }
          // Delivery actions: each confirmed, sent as a POST of the page's own
          // origin (the admin listener logs it, and its event says by whom).
          function say(text) { var out = document.getElementById("action-result"); if (out) out.textContent = text; }
          function act(path, question, done) {
            if (!window.confirm(question)) return;
            fetch(path, { method: "POST", cache: "no-store" }).then(function (r) {
              return r.json().then(function (body) { say(r.status === 200 ? done(body) : "Refused (" + r.status + "): " + (body.detail || "")); });
            }).catch(function () { say("The admin listener did not answer."); }).then(function () { loadDead(); soon(); });
          }
          function cell(row, text) { var c = row.insertCell(-1); c.textContent = text; return c; }
          function loadDead() {
            var body = document.querySelector("#dead-deliveries tbody");
            if (!body) return;
            fetch("/admin/deliveries?state=dead&limit=20", { cache: "no-store" }).then(function (r) { return r.json(); }).then(function (page) {
              body.textContent = "";
              (page.deliveries || []).forEach(function (d) {
                var row = body.insertRow(-1);
                cell(row, d.id); cell(row, d.upstream); cell(row, d.method + " " + d.target); cell(row, d.updated_at || "");
                var button = document.createElement("button");
                button.type = "button"; button.textContent = "Replay";
                button.addEventListener("click", function () {
                  act("/admin/deliveries/" + encodeURIComponent(d.id) + "/replay", "Replay delivery " + d.id + " (" + d.method + " " + d.target + ")?",
                    function (b) { return "Replayed " + b.id + ": now " + b.state + "."; });
                });
                cell(row, "").appendChild(button);
              });
              if (!body.rows.length) cell(body.insertRow(-1), "No dead deliveries.").colSpan = 5;
            }).catch(function () { return; });
          }
          var actions = document.getElementById("delivery-actions");
          if (actions) {
            actions.removeAttribute("hidden");
            document.getElementById("purge-deliveries").addEventListener("click", function () {
              act("/admin/deliveries/purge", "Purge delivered and dead deliveries older than storage.retention?",
                function (b) { return "Purged " + b.purged + "."; });
            });
            loadDead();
          }
          refresh();
          setInterval(refresh, 5000);
          listen();
        })();

        """
}

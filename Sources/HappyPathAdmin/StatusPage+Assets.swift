import HappyPathCore
import HappyPathPolicies

/// `/status.css` and `/status.js`: served by the admin listener beside the
/// page, so its `Content-Security-Policy` needs no inline style or script.
/// (The admin listener adds `X-Content-Type-Options: nosniff` and
/// `Cache-Control: no-store` to both, as to every answer.)
extension StatusPage {
    public static let scriptHeaders: [(String, String)] = [("Content-Type", "text/javascript; charset=utf-8")]

    public static let styleHeaders: [(String, String)] = [("Content-Type", "text/css; charset=utf-8")]

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
        .actions { margin: 0 0 8px; }
        .actions button, td button { font: inherit; font-size: 13px; margin: 1px 0; white-space: nowrap; }
        .endpoints th { overflow-wrap: normal; }
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
            if (b.forced === "open") return ["bad", "forced open by an operator (refuses every try until released)"];
            if (b.forced === "closed") return ["warn", "forced closed by an operator (lets every try through, counts no failure)"];
            if (b.state === "open") return ["bad", "open until " + clock(new Date(Date.now() + b.open_for_s * 1000)) + " (" + secs(b.open_for_s) + ")"];
            if (b.state === "half_open") return ["warn", "half-open"];
            return ["ok", "closed"];
          }
          function healthWords(h) {
            if (!h) return "no health check has ended yet";
            return "last check " + (h.healthy_endpoints > 0 ? "passed " : "failed ") + secs(h.age_s) + " ago (" +
              h.healthy_endpoints + " of " + h.endpoints + " endpoint" + (h.endpoints === 1 ? "" : "s") + " answered)";
          }
          function rotationWords(e) {
            if (e.drained) return ["warn", "drained by an operator"];
            if (!e.ejected) return ["ok", "in rotation"];
            if (!e.ejected_until) return ["bad", "ejected"];
            var left = Math.max(0, (new Date(e.ejected_until).getTime() - Date.now()) / 1000);
            return ["bad", "ejected until " + clock(new Date(e.ejected_until)) + " (" + secs(left) + ")"];
          }
          function fixed(n, digits) { return typeof n === "number" ? n.toFixed(digits) : "-"; }
          function latency(s) {
            if (s === null || s === undefined) return "-";
            if (s === "+Inf") return "> 30 s";
            return s < 1 ? "\\u2264 " + parseFloat((s * 1000).toPrecision(6)) + " ms" : "\\u2264 " + parseFloat(s.toPrecision(6)) + " s";
          }
          // The same words as StatusPage.routeCells.
          function routeCells(r) {
            var w = r.window, cells = {};
            if (w) {
              cells["r-over"] = ["", "last " + secs(w.seconds)];
              cells["r-requests"] = ["", w.requests_per_s.toFixed(2) + "/s"];
              cells["r-errors"] = [w.error_ratio > 0 ? "warn" : "", typeof w.error_ratio === "number" ? (100 * w.error_ratio).toFixed(1) + "%" : "-"];
              cells["r-p50"] = ["", latency(w.p50_s)];
              cells["r-p99"] = ["", latency(w.p99_s)];
              cells["r-tries"] = ["", fixed(w.tries_per_request, 2)];
            } else {
              cells["r-over"] = ["", "since start"];
              cells["r-requests"] = ["", "" + r.requests];
              cells["r-errors"] = [r.errors > 0 ? "warn" : "", r.errors + (r.requests > 0 ? " (" + (100 * r.errors / r.requests).toFixed(1) + "%)" : "")];
              cells["r-p50"] = ["", latency(r.p50_s)];
              cells["r-p99"] = ["", latency(r.p99_s)];
              cells["r-tries"] = ["", r.requests > 0 ? (r.tries / r.requests).toFixed(2) : "-"];
            }
            cells["r-hedges"] = ["", r.hedges_won + " / " + r.hedges_lost];
            var kinds = Object.keys(r.fallbacks || {}).sort().filter(function (k) { return r.fallbacks[k] > 0; });
            var total = kinds.reduce(function (n, k) { return n + r.fallbacks[k]; }, 0);
            cells["r-fallbacks"] = ["", kinds.length ? total + " (" + kinds.map(function (k) { return r.fallbacks[k] + " " + k; }).join(", ") + ")" : "0"];
            cells["r-rate-limited"] = ["", "" + r.rate_limited];
            var c = r.coalesced || 0;
            cells["r-coalesced"] = ["", c > 0 && r.requests > 0 ? c + " of " + r.requests + " (" + (100 * c / r.requests).toFixed(1) + "%)" : "" + c];
            return cells;
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
              var health = k(card, "health_check"); if (health) health.textContent = healthWords(u.health_check);
              var w = breakerWords(u.circuit_breaker);
              put(k(card, "breaker"), w[0], w[1]);
              var f = u.breaker_failures;
              if (f) k(card, "failures").textContent = u.circuit_breaker.forced ? "not counted while forced" :
                (u.circuit_breaker.state === "closed" ? f.consecutive + " in a row; " : "") + f.failed + " of " + f.requests + " failed in the window";
              var total = 0, parts = [];
              Object.keys(u.parked || {}).forEach(function (r) { var n = u.parked[r]; total += n; if (n > 0) parts.push(n + " " + r); });
              put(k(card, "parked"), total > 0 ? "warn" : "ok", total + " parked", parts.length ? " (" + parts.join(", ") + ")" : "");
              if (typeof u.retries_left === "number") k(card, "retries_left").textContent = u.retries_left + " retries left";
              var c = u.concurrency;
              if (c && k(card, "slots")) {
                var slots = c.in_flight + " in flight of a limit of " + c.limit;
                if (c.adaptive) slots += c.baseline_ms ? " (learned: baseline " + c.baseline_ms + " ms, recent " + c.recent_ms + " ms)" : " (learned, no sample yet)";
                put(k(card, "slots"), c.queued > 0 ? "warn" : "ok", slots + "; " + c.queued + " queued");
              }
              var h2 = u.h2, h2k = k(card, "h2");
              if (h2 && h2k) {
                var n = function (c, w) { return c + " " + w + (c === 1 ? "" : "s"); };
                var words = n(h2.connections, "connection") + ", " + n(h2.streams, "stream");
                if (h2.connections > 0) words += " (" + Math.floor(h2.streams * 10 / h2.connections) / 10 + " a connection)";
                words += "; " + h2.connections_opened + " opened, " + n(h2.streams_replayed, "stream") + " sent again after a refusal, ";
                h2k.textContent = words + (h2.goaways === 1 ? "1 GOAWAY" : h2.goaways + " GOAWAYs");
              }
              var pause = "not paused";
              if (u.paused_until) {
                pause = "paused until " + clock(new Date(u.paused_until)) + " (" + secs((new Date(u.paused_until).getTime() - Date.now()) / 1000) + ")";
                if (u.pause_cause) pause += ", asked by a " + u.pause_cause;
              }
              if (u.paused_clients > 0) pause += "; " + u.paused_clients + " client" + (u.paused_clients === 1 ? "" : "s") + " paused";
              put(k(card, "pause"), u.paused_until ? "warn" : "ok", pause);
              var rows = card.querySelectorAll("table.endpoints tbody tr");
              (u.endpoints || []).forEach(function (e, j) {
                if (!rows[j]) return;
                var r = rotationWords(e);
                put(rows[j].cells[1], r[0], r[1]);
                var button = rows[j].querySelector("button[data-post]");
                if (!button) return;
                var path = button.getAttribute("data-post").replace(/(un)?drain$/, e.drained ? "undrain" : "drain");
                button.setAttribute("data-post", path);
                button.textContent = e.drained ? "Undrain" : "Drain";
                button.setAttribute("data-confirm", e.drained ? "Put " + e.url + " back in the rotation of " + u.name + "?" :
                  "Drain " + e.url + " (" + u.name + ")? New tries go to the other endpoints until it is undrained.");
              });
            });
            var routeRows = document.querySelectorAll("#route-totals tbody tr");
            (state.routes || []).forEach(function (r, i) {
              var row = routeRows[i];
              if (!row || row.cells[0].textContent !== r.route) return;
              var cells = routeCells(r);
              Object.keys(cells).forEach(function (key) {
                var c = k(row, key);
                if (c) { c.className = cells[key][0]; c.textContent = cells[key][1]; }
              });
            });
            var d = state.deliveries;
            if (d) {
              var backlog = (d.queued || 0) + (d.in_flight || 0);
              var b = k(document, "backlog");
              if (b && b.firstChild) { b.firstChild.className = backlog > 0 ? "warn" : "ok"; b.firstChild.textContent = backlog + " in the backlog"; }
              put(k(document, "store"), d.writable ? "ok" : "bad", d.writable ? "writable" : "cannot write", d.store_problem ? ": " + d.store_problem : "");
              ["queued", "in_flight", "delivered", "dead"].forEach(function (s) {
                var c = k(document, "delivery-" + s);
                if (c && typeof d[s] === "number") { c.textContent = d[s]; c.className = s === "dead" && d[s] > 0 ? "bad" : ""; }
              });
              if (d.pending) {
                var oldest = null;
                d.pending.forEach(function (p) { if (!oldest || p.oldest_s > oldest.oldest_s) oldest = p; });
                put(k(document, "oldest"), oldest && oldest.oldest_s > 0 ? "warn" : "ok", oldest ? secs(oldest.oldest_s) + " old (" + oldest.upstream + ")" : "none pending");
                var body = document.querySelector("#pending-deliveries tbody");
                if (body) {
                  body.textContent = "";
                  d.pending.forEach(function (p) { var row = body.insertRow(-1); cell(row, p.upstream); cell(row, "" + p.count); cell(row, secs(p.oldest_s)); });
                  if (!d.pending.length) cell(body.insertRow(-1), "None pending.").colSpan = 3;
                }
              }
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
          // Upstream actions (drain, breaker): each button says its POST and
          // its question; the answer is shown once, the state read again.
          Array.prototype.forEach.call(document.querySelectorAll("[data-script]"), function (e) { e.removeAttribute("hidden"); });
          function tell(text) { var out = document.getElementById("upstream-action-result"); if (out) out.textContent = text; }
          Array.prototype.forEach.call(document.querySelectorAll("button[data-post]"), function (button) {
            button.addEventListener("click", function () {
              if (!window.confirm(button.getAttribute("data-confirm"))) return;
              fetch(button.getAttribute("data-post"), { method: "POST", cache: "no-store" }).then(function (r) {
                return r.json().then(function (b) {
                  if (r.status !== 200) return tell("Refused (" + r.status + "): " + (b.detail || ""));
                  tell(b.url !== undefined ? b.url + " of " + b.upstream + ": " + (b.drained ? "drained" : "in rotation") + "." :
                    "Breaker of " + b.upstream + ": " + (b.forced ? "forced " + b.forced : "automatic, " + b.state) + ".");
                });
              }).catch(function () { tell("The admin listener did not answer."); }).then(refresh);
            });
          });
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

import Foundation
import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 49's proof in a real browser: headless Chromium on a page from
/// another origin (served by the test, no packages from outside) calls a
/// grpcio service through the proxy with gRPC-Web over HTTP/2 and TLS
/// (unary, server streaming, and the proxy's own RESOURCE_EXHAUSTED whose
/// RetryInfo the page decodes), then opens a WebSocket to an echo upstream
/// on the same HTTP/2 connection (RFC 8441).
@Suite(.serialized) struct BrowserTests {
    static let noChromium = "chromium is not installed (make test-deps installs it)"

    /// The page: `PROXY` is the proxy's origin. Its results go to `window.results`, then `window.done`.
    static func page(proxy: String) -> String {
        """
        <!doctype html><meta charset="utf-8"><title>gRPC-Web and WebSocket</title>
        <script>
        const P = "\(proxy)";
        window.results = {}; window.done = false;
        const enc = new TextEncoder(), dec = new TextDecoder();
        function frame(bytes) {
          const f = new Uint8Array(5 + bytes.length);
          new DataView(f.buffer).setUint32(1, bytes.length);
          f.set(bytes, 5);
          return f;
        }
        function parse(buf) {
          const out = { messages: [], trailers: {} }, dv = new DataView(buf.buffer);
          let at = 0;
          while (at + 5 <= buf.length) {
            const flag = buf[at], n = dv.getUint32(at + 1), p = buf.slice(at + 5, at + 5 + n);
            at += 5 + n;
            if (flag & 0x80) {
              for (const line of dec.decode(p).split("\\r\\n")) {
                const i = line.indexOf(":");
                if (i > 0) out.trailers[line.slice(0, i).trim()] = line.slice(i + 1).trim();
              }
            } else out.messages.push(dec.decode(p));
          }
          return out;
        }
        async function call(path, text) {
          const r = await fetch(P + path, { method: "POST", credentials: "include",
            headers: { "content-type": "application/grpc-web+proto", "x-grpc-web": "1" }, body: frame(enc.encode(text)) });
          const body = parse(new Uint8Array(await r.arrayBuffer()));
          return { status: r.headers.get("grpc-status") ?? body.trailers["grpc-status"],
                   details: r.headers.get("grpc-status-details-bin"), ...body };
        }
        // google.rpc.Status { code = 1; message = 2; repeated Any details = 3 }, Any { type_url = 1; value = 2 },
        // RetryInfo { Duration retry_delay = 1 }, Duration { seconds = 1; nanos = 2 }.
        function varint(b, i) { let v = 0, s = 1; for (;;) { const c = b[i.at++]; v += (c & 0x7f) * s; s *= 128; if (!(c & 0x80)) return v; } }
        function fields(b) {
          const out = [], i = { at: 0 };
          while (i.at < b.length) {
            const key = varint(b, i), f = Math.floor(key / 8), t = key & 7;
            if (t === 0) out.push([f, varint(b, i)]);
            else if (t === 2) { const n = varint(b, i); out.push([f, b.slice(i.at, i.at + n)]); i.at += n; }
            else if (t === 5) i.at += 4; else if (t === 1) i.at += 8; else break;
          }
          return out;
        }
        function retryDelay(bin) {
          let s = bin.replace(/-/g, "+").replace(/_/g, "/");
          while (s.length % 4) s += "=";
          const b = Uint8Array.from(atob(s), c => c.charCodeAt(0));
          for (const [f, any] of fields(b)) {
            if (f !== 3) continue;
            let url = "", value = null;
            for (const [g, w] of fields(any)) { if (g === 1) url = dec.decode(w); if (g === 2) value = w; }
            if (!url.endsWith("google.rpc.RetryInfo")) continue;
            for (const [g, d] of fields(value)) {
              if (g !== 1) continue;
              let seconds = 0, nanos = 0;
              for (const [h, x] of fields(d)) { if (h === 1) seconds = x; if (h === 2) nanos = x; }
              return seconds + nanos / 1e9;
            }
          }
          return null;
        }
        (async () => {
          try {
            const u = await call("/t.S/U", "hi");
            results.unary = u.messages[0]; results.unaryStatus = u.status; results.trailer = u.trailers["x-trailer"];
            const s = await call("/t.S/SS", "");
            results.stream = s.messages; results.streamStatus = s.status;
            await call("/lim.S/U", "a");
            const l = await call("/lim.S/U", "b");
            results.limitedStatus = l.status;
            results.retryDelay = l.details ? retryDelay(l.details) : null;
            const ws = new WebSocket(P.replace("https:", "wss:") + "/ws/echo");
            window.ws = ws;
            await new Promise((ok, ko) => { ws.onopen = ok; ws.onerror = () => ko(new Error("the WebSocket failed")); });
            ws.send("ping");
            results.ws = await new Promise(ok => { ws.onmessage = e => ok(e.data); });
          } catch (e) { results.error = String(e); }
          window.done = true;
        })();
        </script>
        """
    }

    @Test(.enabled(if: HeadlessChromium.path != nil, Comment(rawValue: noChromium)))
    func aPageOnAnotherOriginCallsGRPCWebAndOpensAWebSocketOverHTTP2() throws {
        let serverLines = Locked<[String]>([])
        try PythonGRPC.withServer(GRPCWebProxyTests.server, lines: serverLines) { _, grpcPort in
            let ws = try WebSocketTests.Upstream()
            let certs = try TestCertificates()
            let pair = try certs.make("proxy", names: ["localhost"])
            // The page's own origin: a plain static server on another port.
            let pagePort = NginxUpstream.freePort()
            let origin = "http://127.0.0.1:\(pagePort)"
            let h = try ProxyHarness(
                """
                listen:
                  - { address: 127.0.0.1:0, tls: { certificates: [ { cert: \(pair.cert), key: \(pair.key) } ] } }
                admin: { listen: 127.0.0.1:0 }
                upstreams:
                  g: { endpoints: [http://127.0.0.1:\(grpcPort)], protocol: h2 }
                  ws: { endpoints: [http://127.0.0.1:\(ws.port)] }
                routes:
                  - match: { path_prefix: /lim.S/ }
                    upstream: g
                    grpc: {}
                    rate_limit: { rate: 1/m, burst: 1, over_limit: reject }
                    cors: { allow_origins: [\(origin)], allow_credentials: true }
                  - match: { path_prefix: /t.S/ }
                    upstream: g
                    grpc: {}
                    cors: { allow_origins: [\(origin)], allow_credentials: true }
                  - { match: { path_prefix: /ws/ }, upstream: ws, upgrades: [websocket] }
                """, holding: [ws])
            defer { h.stop() }
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("hp-page-\(UUID())")
            try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: dir) }
            try Self.page(proxy: "https://localhost:\(h.port)").write(
                to: dir.appendingPathComponent("index.html"), atomically: true, encoding: .utf8)
            let pages = Process()
            pages.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            pages.arguments = ["-m", "http.server", "\(pagePort)", "--bind", "127.0.0.1", "--directory", dir.path]
            pages.standardOutput = FileHandle.nullDevice
            pages.standardError = FileHandle.nullDevice
            try pages.run()
            defer {
                kill(pages.processIdentifier, SIGKILL)
                pages.waitUntilExit()
            }
            #expect(waitUntil("the page server listens") { (try? HTTP.request(port: pagePort, "/index.html").status) == 200 })

            let page = try HeadlessChromium.LivePage(
                url: "\(origin)/index.html", ready: "window.done === true", report: ["JSON.stringify(window.results)"],
                extraFlags: ["--ignore-certificate-errors"])
            let first = page.next()
            #expect(first["met"] as? Bool == true, "\(first)")
            let text = (first["report"] as? [Any])?.first as? String ?? "{}"
            let results = (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:]
            #expect(results["error"] == nil, "\(results)")
            #expect(results["unary"] as? String == "echo:hi", "\(results)")
            #expect(results["unaryStatus"] as? String == "0", "\(results)")
            #expect(results["trailer"] as? String == "t1", "\(results)")
            #expect(results["stream"] as? [String] == ["part0", "part1", "part2"], "\(results)")
            #expect(results["streamStatus"] as? String == "0", "\(results)")
            #expect(results["limitedStatus"] as? String == "8", "\(results)")
            #expect(((results["retryDelay"] as? Double) ?? 0) > 0, "\(results)")
            #expect(results["ws"] as? String == "ping", "\(results)")
            // The WebSocket is open on an HTTP/2 stream: every connection the browser holds is HTTP/2 (it
            // keeps preflights, which carry no credentials, on a connection of their own), and the one
            // stream open is the tunnel's.
            let admin = AdminProbe(port: h.adminPort)
            let m = try admin.metrics()
            let seen = m.filter { $0.key.contains("connections") || $0.key.contains("http2") || $0.key.contains("tunnel") }
            #expect(m["happypath_tunnels_open"] == 1, "\(seen)")
            #expect(m["happypath_http2_streams_open"] == 1, "\(seen)")
            #expect((m["happypath_client_connections"] ?? 0) >= 1, "\(seen)")
            #expect(m["happypath_client_connections"] == m["happypath_http2_connections"], "no HTTP/1.1 connection: \(seen)")
        }
    }
}
